//! Draw docs/images/performance.png (the README's chart) from docs/performance.csv, whose rows
//! are the measured figures of docs/performance.md:
//!     cargo run --release --example performance_chart
use std::path::Path;

use seistomo::model::plot::{bars_png, BarPanel};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let csv = root.join("docs/performance.csv");
    let text = std::fs::read_to_string(&csv)?;
    let mut panels: Vec<BarPanel> = Vec::new();
    for (k, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 4 {
            return Err(format!("{}:{}: expected 4 fields", csv.display(), k + 1).into());
        }
        let v: f64 = f[2]
            .parse()
            .map_err(|_| format!("{}:{}: bad number", csv.display(), k + 1))?;
        if panels.last().is_none_or(|p| p.title != f[0]) {
            panels.push(BarPanel {
                title: f[0].to_string(),
                bars: Vec::new(),
            });
        }
        panels
            .last_mut()
            .expect("pushed")
            .bars
            .push((f[1].to_string(), v, f[3].trim() == "1"));
    }
    let out = root.join("docs/images/performance.png");
    bars_png(
        &out,
        &panels,
        "ms per iteration (LSQR; GMRES: per inner iteration)",
    )?;
    eprintln!("wrote {}", out.display());
    Ok(())
}
