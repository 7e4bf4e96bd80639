//! `seistomo invert CONFIG.toml`: the TOML form of a run.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::comm::SerialComm;
use crate::config::RunConfig;
use crate::run;

#[derive(Debug, Args)]
pub struct InvertArgs {
    /// Run configuration (TOML).
    config: PathBuf,
    /// Print progress every N iterations (0: never).
    #[arg(long, default_value_t = 0)]
    progress: usize,
}

pub fn run(a: InvertArgs) -> anyhow::Result<()> {
    let cfg = RunConfig::load(&a.config)?;
    super::init_threads(cfg.options.threads)?;
    let t = Instant::now();
    let sys = cfg.system.load()?;
    let load = t.elapsed().as_secs_f64();
    let o = run::solve_system(sys, &cfg.options, &SerialComm, load, a.progress)?;
    run::write_outputs(&cfg.output, &o)?;
    eprintln!("{}", super::summary(&o));
    if let Some(p) = &cfg.output.solution {
        eprintln!("model written to {}", p.display());
    }
    Ok(())
}
