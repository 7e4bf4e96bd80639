//! `seistomo prepare CONFIG`: lay the config's dataset out as `invert` would and keep the result
//! in the dataset (`<dataset>/prepared/`), so that the next runs read it instead of setting up
//! ([`crate::pipeline::prepared`]). Under `mpirun -np N` each rank writes its own file, for runs
//! on N ranks.

use std::path::PathBuf;

use clap::Args;

use crate::comm::Comm;
use crate::pipeline::config::RunConfig;
use crate::pipeline::options::BackendChoice;

#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// Run configuration (TOML) whose dataset and options the runs will use, or a dataset
    /// directory (its invert.toml, else the defaults).
    config: PathBuf,
    /// The backend the runs will use (default: as `invert` chooses here). Lets a machine
    /// without a GPU prepare for GPU runs.
    #[arg(long, value_parser = super::args::pick::backend())]
    backend: Option<BackendChoice>,
}

pub fn run(a: PrepareArgs, comm: &dyn Comm) -> anyhow::Result<()> {
    let cfg = crate::comm::agree(comm, RunConfig::load(&a.config))?;
    super::init_threads(cfg.options.threads)?;
    let kind = match a.backend {
        Some(BackendChoice::Auto) | None => None,
        k => k,
    };
    let w = crate::pipeline::prepared::prepare_dataset(&cfg, kind, comm)?;
    if comm.is_root() {
        println!(
            "prepared storage written to {} ({:.1} MB, {}; rank 0 of {}) in {:.2} s; `invert` with this config reads it instead of setting up",
            crate::io::tidy(&w.path).display(),
            w.bytes as f64 / 1e6,
            w.storage,
            comm.size(),
            w.seconds
        );
    }
    Ok(())
}
