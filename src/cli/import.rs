//! `seistomo import`: a dataset from Matrix Market / text files.

use std::path::PathBuf;

use clap::Args;

use crate::grid::Grid;
use crate::io::binfmt::Precision;
use crate::io::dataset::{write_dataset, DatasetSpec};
use crate::io::manifest::Layout;
use crate::io::mtx;

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
    if !(a.lambda.is_finite() && a.lambda >= 0.0) {
        anyhow::bail!("--lambda must be finite and >= 0 (got {})", a.lambda);
    }
    // Before any work: the dataset directory is none of the inputs.
    let mut paths = crate::io::outpaths::PathCheck::new();
    paths
        .input("--matrix", &a.matrix)
        .input_opt("--rhs", a.rhs.as_deref())
        .input_opt("--reg", a.reg.as_deref())
        .input_opt("--weights", a.weights.as_deref())
        .input_opt("--sigma", a.sigma.as_deref())
        .output_dir("--out", &a.out);
    paths.check()?;
    let g = mtx::read_matrix(&a.matrix)?;
    let b = match &a.rhs {
        Some(p) => {
            let b = mtx::read_vector(p)?;
            if b.len() != g.nrows() {
                anyhow::bail!(
                    "{}: {} values but the matrix {} has {} rows",
                    p.display(),
                    b.len(),
                    a.matrix.display(),
                    g.nrows()
                );
            }
            b
        }
        None => g.matvec(&vec![1.0; g.ncols()]),
    };
    let read_rows = |p: &PathBuf| -> anyhow::Result<Vec<f64>> {
        let v = mtx::read_vector(p)?;
        if v.len() != g.nrows() {
            anyhow::bail!(
                "{}: {} values but the matrix has {} rows",
                p.display(),
                v.len(),
                g.nrows()
            );
        }
        Ok(v)
    };
    let weights = a.weights.as_ref().map(read_rows).transpose()?;
    let sigma = a.sigma.as_ref().map(read_rows).transpose()?;
    let reg = a.reg.as_ref().map(mtx::read_matrix).transpose()?;
    let grid = a.grid.map(|n| Grid::new(n, a.origin, a.spacing));
    let mut spec = DatasetSpec::new(&g, &b);
    spec.name = a.name.clone().unwrap_or_else(|| {
        a.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    spec.description = format!("imported from {}", a.matrix.display());
    spec.weights = weights.as_deref();
    spec.sigma = sigma.as_deref();
    spec.damping = reg.as_ref();
    spec.damping_weight = a.lambda;
    spec.damping_blocks = a.damping_blocks;
    spec.grid = grid;
    spec.layout = a.layout;
    spec.precision = a.precision;
    spec.pack_bytes = a.pack_mib.max(1) << 20;
    let m = write_dataset(&a.out, &spec, true)?;
    eprintln!(
        "import: {} x {} kernel, {} nonzeros{}; written to {}",
        g.nrows(),
        g.ncols(),
        g.nnz(),
        reg.as_ref()
            .map(|r| format!(", {} damping rows (lambda {})", r.nrows(), a.lambda))
            .unwrap_or_default(),
        m.display()
    );
    Ok(())
}
