//! `seistomo invert CONFIG.toml`: the TOML form of a run.

use clap::Args;
use std::path::PathBuf;

use crate::comm::{agree, Comm};
use crate::config::RunConfig;
use crate::distributed;

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

pub fn run(a: InvertArgs, comm: &dyn Comm) -> anyhow::Result<()> {
    // Every rank reads and checks the config; an error on any rank ends the job on every rank.
    let cfg = agree(comm, RunConfig::load(&a.config))?;
    super::init_threads(
        cfg.options
            .threads
            .or_else(crate::comm::default_threads_per_rank),
    )?;
    super::log_job(comm);
    let load = || cfg.system.load();
    if let Some(o) = distributed::run_lsqr(
        comm,
        load,
        &cfg.options,
        &cfg.output,
        a.progress,
        Some((&cfg, a.resume)),
    )? {
        eprintln!("{}", super::summary(&o));
        if let Some(p) = &cfg.output.solution {
            eprintln!("solution vector written to {}", p.display());
        }
    }
    Ok(())
}
