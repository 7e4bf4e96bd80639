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
    /// Continue from the last checkpoint ([output] checkpoint_every) when there is one.
    #[arg(long)]
    resume: bool,
}

pub fn run(a: InvertArgs) -> anyhow::Result<()> {
    let cfg = RunConfig::load(&a.config)?;
    super::init_threads(cfg.options.threads)?;
    let t = Instant::now();
    let sys = cfg.system.load()?;
    let load = t.elapsed().as_secs_f64();
    let model = crate::model::RunModel::prepare(&cfg, &sys, a.resume)?;
    let o = run::solve_system_checkpointed(
        sys,
        &cfg.options,
        &SerialComm,
        load,
        a.progress,
        model.checkpointing(),
    )?;
    run::write_outputs(&cfg.output, &o)?;
    model.finish(&cfg, &o)?;
    eprintln!("{}", super::summary(&o));
    if let Some(p) = &cfg.output.solution {
        eprintln!("solution vector written to {}", p.display());
    }
    Ok(())
}
