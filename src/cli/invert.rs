//! `seistomo invert CONFIG.toml`: the TOML form of a run ([`crate::pipeline::invert::invert`]).

use clap::Args;
use std::path::PathBuf;

use crate::comm::Comm;

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
    #[command(flatten)]
    tune: super::args::TuneArgs,
}

pub fn run(a: InvertArgs, comm: &dyn Comm) -> anyhow::Result<()> {
    let done =
        crate::pipeline::invert::invert(&a.config, &a.tune.tune, comm, a.progress, a.resume)?;
    if let Some((o, out)) = done {
        eprintln!("{}", super::summary(&o));
        if let Some(p) = &out.solution {
            eprintln!("solution vector written to {}", p.display());
        }
    }
    Ok(())
}
