//! Writes the checkerboard resolution test on australia's real ray geometry:
//! datasets/australia-checkerboard/{true_model.txt, d.txt}. The true model is a slowness of
//! 3.2e-4 s/m (3125 m/s) with +-5 % velocity anomalies in 3 x 3 degree squares; the data are
//! d = G m_true (noise-free). Run: `cargo run --example australia_checkerboard`, then
//! `seistomo invert configs/australia-checkerboard.toml`.

use std::path::Path;

use seistomo::io::mtx;
use seistomo::io::write_vector_text;
use seistomo::model::spec::read_cell_table;

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("datasets/australia");
    let out = root.join("datasets/australia-checkerboard");
    std::fs::create_dir_all(&out)?;
    let g = mtx::read_matrix(src.join("G.mtx.gz"))?;
    let cols = ["lat_min", "lat_max", "lon_min", "lon_max"]
        .map(String::from)
        .to_vec();
    let cells = read_cell_table(&src.join("cells.txt"), cols, "degrees")?;
    let v0 = 3125.0;
    let m: Vec<f64> = cells
        .rows
        .iter()
        .map(|r| {
            let lat = 0.5 * (r[0] + r[1]);
            let lon = 0.5 * (r[2] + r[3]);
            let sq = (lat / 3.0).floor() as i64 + (lon / 3.0).floor() as i64;
            let dv = if sq.rem_euclid(2) == 0 { 0.05 } else { -0.05 };
            1.0 / (v0 * (1.0 + dv))
        })
        .collect();
    let d = g.matvec(&m);
    write_vector_text(&out.join("true_model.txt"), &m)?;
    write_vector_text(&out.join("d.txt"), &d)?;
    println!(
        "wrote {} and {}",
        out.join("true_model.txt").display(),
        out.join("d.txt").display()
    );
    Ok(())
}
