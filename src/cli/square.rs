//! `seistomo square`: write a generated square test system as Matrix Market.

use std::path::PathBuf;

use clap::Args;

use crate::squaregen::{stencil7, SquareKind, DEFAULT_PECLET};

#[derive(Debug, Args)]
pub struct SquareArgs {
    /// poisson or convdiff (7-point stencil, central differences).
    #[arg(long, default_value = "convdiff")]
    kind: SquareKind,
    /// Grid points per side (n^3 rows), unless --nx/--ny/--nz are given.
    #[arg(long, default_value_t = 32)]
    n: usize,
    #[arg(long)]
    nx: Option<usize>,
    #[arg(long)]
    ny: Option<usize>,
    #[arg(long)]
    nz: Option<usize>,
    /// Cell Peclet numbers in x, y, z (convdiff), comma-separated.
    #[arg(long, value_delimiter = ',', num_args = 3)]
    peclet: Option<Vec<f64>>,
    /// Output Matrix Market file (.gz compresses).
    #[arg(short, long)]
    output: PathBuf,
}

pub fn run(a: SquareArgs) -> anyhow::Result<()> {
    let mut paths = crate::io::outpaths::PathCheck::new();
    paths.output("--output", &a.output);
    paths.check()?;
    let (nx, ny, nz) = (
        a.nx.unwrap_or(a.n),
        a.ny.unwrap_or(a.n),
        a.nz.unwrap_or(a.n),
    );
    let p = match a.peclet.as_deref() {
        Some([x, y, z]) => [*x, *y, *z],
        Some(_) => anyhow::bail!("--peclet takes three values"),
        None => DEFAULT_PECLET,
    };
    let t = std::time::Instant::now();
    let m = stencil7(a.kind, nx, ny, nz, p)?;
    let gen = t.elapsed().as_secs_f64();
    let comment = format!(
        "seistomo square --kind {:?} grid {nx}x{ny}x{nz} peclet {:?} (7-point, scaled by h^2)",
        a.kind, p
    )
    .to_lowercase();
    let t = std::time::Instant::now();
    crate::sparse::mtx::write_matrix(&a.output, &m, &comment)?;
    eprintln!(
        "wrote {}: {} x {}, {} nonzeros (generated in {gen:.3} s, written in {:.3} s)",
        a.output.display(),
        m.nrows(),
        m.ncols(),
        m.nnz(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
