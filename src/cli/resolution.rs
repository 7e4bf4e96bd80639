//! `seistomo resolution CONFIG`: the config's `[resolution]` tests (checkerboards at several
//! cell sizes, spikes) and its data inverted as one batch; writes model.h5 (the data's model
//! with a /resolution group per test), resolution.csv, a figure per test and report.json.

use std::path::PathBuf;

use clap::Args;

use crate::pipeline::config::RunConfig;
use crate::pipeline::resolution::resolution;

#[derive(Debug, Args)]
pub struct ResolutionArgs {
    /// Run configuration (TOML) with a [resolution] table.
    config: PathBuf,
    /// Solve the data and the tests one after another instead of as one batch (the same
    /// models; slower where the batch runs).
    #[arg(long)]
    separate: bool,
    /// Output directory (default: the config's output dir + /resolution).
    #[arg(short = 'o', long, alias = "output")]
    out: Option<PathBuf>,
}

pub fn run(a: ResolutionArgs) -> anyhow::Result<()> {
    let cfg = RunConfig::load(&a.config)?;
    crate::pipeline::config::note_config(&cfg);
    super::init_threads(cfg.options.threads)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| super::output_subdir(&cfg, "resolution"));
    let (run, files) = resolution(&cfg, &out, a.separate, |name, o| {
        eprintln!(
            "  {name}: {} iterations, istop {}",
            o.report.iterations, o.report.istop
        );
    })?;
    eprintln!(
        "solved the data and {} test(s) in {:.2} s{}",
        run.tests.len(),
        run.seconds,
        if a.separate {
            ", one after another"
        } else {
            ""
        }
    );
    for t in &run.tests {
        let spike = t.spike.map_or(String::new(), |s| {
            format!(
                "; peak {:.3}, spread {:.2} cells (the spike's own {:.2}), leakage {:.3}",
                s.peak, s.spread, s.true_spread, s.leakage
            )
        });
        let (min, _) = crate::model::resolution::min_mean(&t.depth_correlation);
        eprintln!(
            "{}: correlation {:.3} (per depth layer: min {min:.3}){spike}",
            t.name, t.correlation
        );
    }
    eprintln!(
        "wrote {}, {} and {} figure(s)",
        crate::io::tidy(&files.model).display(),
        crate::io::tidy(&files.csv).display(),
        files.figures.len()
    );
    Ok(())
}
