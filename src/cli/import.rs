//! `seistomo import`: a dataset from Matrix Market / text files.

use std::path::PathBuf;

use clap::Args;

use crate::grid::Grid;
use crate::io::dataset::binfmt::Precision;
use crate::io::dataset::manifest::Layout;
use crate::pipeline::import::{import, ImportJob};

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Kernel matrix G (Matrix Market, .gz allowed).
    #[arg(long)]
    matrix: PathBuf,
    /// Data vector d (Matrix Market array or text, one value per line). Default: b = G 1.
    #[arg(long)]
    rhs: Option<PathBuf>,
    /// Regularisation / damping matrix R (stored as damping blocks).
    #[arg(long)]
    reg: Option<PathBuf>,
    /// Weight λ of the damping rows: the system is [G; λ R] x = [d; 0].
    #[arg(long, default_value_t = 1.0, requires = "reg")]
    lambda: f64,
    /// Per-row data weights (one per kernel row).
    #[arg(long, conflicts_with = "sigma")]
    weights: Option<PathBuf>,
    /// Per-row data standard deviations (rows are divided by them).
    #[arg(long)]
    sigma: Option<PathBuf>,
    /// Model grid cells along x,y,z (optional; must match the columns).
    #[arg(long, value_parser = super::args::triple::<usize>)]
    grid: Option<[usize; 3]>,
    /// With --grid: cell size along x,y,z (km).
    #[arg(long, default_value = "1,1,1", value_parser = super::args::triple::<f64>)]
    spacing: [f64; 3],
    /// With --grid: corner of cell (0,0,0) along x,y,z (km).
    #[arg(long, default_value = "0,0,0", value_parser = super::args::triple::<f64>)]
    origin: [f64; 3],
    /// Output dataset directory (must not exist or be empty).
    #[arg(short = 'o', long)]
    out: PathBuf,
    /// Kernel layout: many rows per pack file, or one file per row.
    #[arg(long, default_value = "packed", value_parser = super::args::pick::layout())]
    layout: Layout,
    /// Value precision of the kernel and damping files.
    #[arg(long, default_value = "f64", value_parser = super::args::pick::file_precision())]
    precision: Precision,
    /// Number of damping block files.
    #[arg(long, default_value_t = 4)]
    damping_blocks: usize,
    /// Target pack file size (MiB).
    #[arg(long, default_value_t = 64)]
    pack_mib: u64,
    /// Dataset name.
    #[arg(long)]
    name: Option<String>,
}

pub fn run(a: ImportArgs) -> anyhow::Result<()> {
    let job = ImportJob {
        matrix: &a.matrix,
        rhs: a.rhs.as_deref(),
        reg: a.reg.as_deref(),
        lambda: a.lambda,
        weights: a.weights.as_deref(),
        sigma: a.sigma.as_deref(),
        grid: a.grid.map(|n| Grid::new(n, a.origin, a.spacing)),
        out: &a.out,
        layout: a.layout,
        precision: a.precision,
        damping_blocks: a.damping_blocks,
        pack_bytes: a.pack_mib.max(1) << 20,
        name: a.name.clone(),
    };
    let s = import(&job)?;
    eprintln!(
        "import: {} x {} kernel, {} nonzeros{}; written to {}",
        s.nrows,
        s.ncols,
        s.nnz,
        s.damping_rows
            .map(|r| format!(", {r} damping rows (lambda {})", a.lambda))
            .unwrap_or_default(),
        s.manifest.display()
    );
    Ok(())
}
