//! `seistomo invert CONFIG.toml`: the TOML form of a run ([`crate::pipeline::invert::invert`]).
//! A dataset directory (or its dataset.toml) stands for the run config beside it, or for a run
//! with the defaults ([`crate::pipeline::config::dataset_run`]).

use clap::Args;
use std::path::{Path, PathBuf};

use crate::comm::Comm;
use crate::pipeline::config::{dataset_run, DatasetRun, RunConfig};

#[derive(Debug, Args)]
pub struct InvertArgs {
    /// Run configuration (TOML), or a dataset directory (its invert.toml, else the defaults).
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
    if comm.is_root() {
        say_which_config(&a.config);
    }
    let done =
        crate::pipeline::invert::invert(&a.config, &a.tune.tune, comm, a.progress, a.resume)?;
    if let Some((o, out)) = done {
        eprintln!("{}", super::summary(&o));
        if let Some(p) = &out.solution {
            eprintln!("solution vector written to {}", p.display());
        }
        // The config was read and checked by the run: here only for the model file's name.
        if let Some(model) = RunConfig::load(&a.config).ok().and_then(|c| c.model.path) {
            eprintln!("model file written to {}", model.display());
            eprintln!("{}", next_step(&model));
        }
    }
    Ok(())
}

/// For a dataset directory: which run config it stands for (errors are the run's to report).
fn say_which_config(path: &Path) {
    match dataset_run(path) {
        Ok(Some(DatasetRun::Config(p))) => eprintln!("run config: {}", p.display()),
        Ok(Some(DatasetRun::Defaults {
            manifest, out_dir, ..
        })) => eprintln!(
            "{} has no invert.toml: the defaults (LSQR to atol = btol = 1e-8 on the dataset's rows, outputs in {}); seistomo import writes an invert.toml to edit",
            manifest
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .display(),
            out_dir.display()
        ),
        _ => {}
    }
}

/// What to look at next: a map where the model has a grid or a cell table, else convergence.
fn next_step(model: &Path) -> String {
    let dir = model
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let param = ::hdf5::File::open(model)
        .and_then(|f| f.attr("parameterisation"))
        .and_then(|a| a.read_scalar::<::hdf5::types::VarLenUnicode>())
        .map(|s| s.as_str().to_string());
    match param.as_deref() {
        Ok("grid") | Ok("cells") => format!(
            "next: seistomo plot {} -o {}",
            model.display(),
            dir.join("map.png").display()
        ),
        _ => format!(
            "next: seistomo plot {} --convergence -o {} (no map: the model has no grid or cell table; [model] in docs/user-guide.md)",
            model.display(),
            dir.join("convergence.png").display()
        ),
    }
}
