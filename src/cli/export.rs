//! `seistomo export`: the exact system seistomo solves — a dataset's assembled [W G; λ R] x =
//! [W d; 0], a Matrix Market system [A; w R], or a config's system with its column scaling and
//! damping rows applied — as Matrix Market, NumPy or PETSc binary files.

use std::path::PathBuf;

use clap::Args;

use crate::pipeline::export::{export, ExportFormat, ExportJob};

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A dataset (dataset.toml or its directory), a run config (.toml: its system with column
    /// scaling and damp*I rows applied) or a matrix (.mtx / .mtx.gz, with --rhs/--reg).
    dataset: PathBuf,
    /// mtx (A.mtx + b.mtx), mtx.gz (the same gzip-compressed, on every thread), npy (indptr,
    /// indices, data, b, shape .npy) or petsc (A.petsc + b.petsc: PETSc binary Mat/Vec, read by
    /// MatLoad/VecLoad).
    #[arg(long, default_value = "mtx", value_parser = super::args::words(&["mtx", "mtx.gz", "npy", "petsc"]))]
    format: String,
    /// Output directory (created; must not exist or be empty).
    #[arg(short = 'o', long)]
    out: PathBuf,
    #[command(flatten)]
    system: super::args::MtxSystemArgs,
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    let format: ExportFormat = a.format.parse().map_err(anyhow::Error::msg)?;
    // The reader policy before the input's kind is told from its name.
    if !a.dataset.is_dir() {
        crate::io::check_regular(&a.dataset)?;
    }
    let job = ExportJob {
        input: &a.dataset,
        mtx: a.system.parts(),
        format,
        out: &a.out,
    };
    let s = export(&job)?;
    if s.columns_scaled {
        eprintln!(
            "export: columns scaled to unit norm (the exported system's unknowns are D^-1 x)"
        );
    }
    eprintln!(
        "export: {} x {} system ({} kernel rows), {} nonzeros -> {} ({})",
        s.nrows,
        s.ncols,
        s.kernel_rows,
        s.nnz,
        crate::io::tidy(&a.out).display(),
        a.format
    );
    Ok(())
}
