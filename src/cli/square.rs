//! `seistomo square`: write a generated square test system as Matrix Market, or as a binary
//! dataset directory (docs/formats.md) that `solve --method gmres --matrix DIR` reads at disk
//! speed.

use std::path::PathBuf;

use clap::Args;

use crate::testproblems::square::{stencil7, SquareKind, DEFAULT_PECLET};

#[derive(Debug, Args)]
pub struct SquareArgs {
    /// Which system: 3-D Poisson or convection-diffusion (7-point stencil, central
    /// differences).
    #[arg(long, default_value = "convdiff", value_parser = super::args::pick::square_kind())]
    kind: SquareKind,
    /// Grid points per side (n^3 rows), unless --nx/--ny/--nz are given.
    #[arg(long, default_value_t = 32)]
    n: usize,
    /// Grid points along x (default: --n).
    #[arg(long)]
    nx: Option<usize>,
    /// Grid points along y (default: --n).
    #[arg(long)]
    ny: Option<usize>,
    /// Grid points along z (default: --n).
    #[arg(long)]
    nz: Option<usize>,
    /// Cell Peclet numbers along x,y,z (convdiff), comma-separated: e.g. --peclet 1,2,3.
    #[arg(long, value_parser = super::args::triple::<f64>, allow_negative_numbers = true)]
    peclet: Option<[f64; 3]>,
    /// Output: a Matrix Market file (.mtx; .mtx.gz compresses) or a dataset directory
    /// (binary, read much faster; `solve --method gmres --matrix DIR`), as --format says.
    #[arg(short = 'o', long, alias = "output")]
    out: PathBuf,
    /// Output format: mtx, dataset, or auto (mtx when -o ends in .mtx or .mtx.gz, else a
    /// dataset directory).
    #[arg(long, default_value = "auto", value_parser = super::args::words(&["auto", "mtx", "dataset"]))]
    format: String,
}

impl SquareArgs {
    /// Whether -o is a dataset directory.
    fn dataset(&self) -> bool {
        match self.format.as_str() {
            "dataset" => true,
            "mtx" => false,
            _ => {
                let name = self.out.to_string_lossy();
                !(name.ends_with(".mtx") || name.ends_with(".mtx.gz"))
            }
        }
    }
}

pub fn run(a: SquareArgs) -> anyhow::Result<()> {
    let dataset = a.dataset();
    let mut paths = crate::io::outpaths::PathCheck::new();
    if dataset {
        paths.output_dir("-o", &a.out);
    } else {
        paths.output("-o", &a.out);
    }
    paths.check()?;
    let (nx, ny, nz) = (
        a.nx.unwrap_or(a.n),
        a.ny.unwrap_or(a.n),
        a.nz.unwrap_or(a.n),
    );
    let p = a.peclet.unwrap_or(DEFAULT_PECLET);
    let t = std::time::Instant::now();
    let m = stencil7(a.kind, nx, ny, nz, p)?;
    let gen = t.elapsed().as_secs_f64();
    let comment = format!(
        "seistomo square --kind {:?} grid {nx}x{ny}x{nz} peclet {:?} (7-point, scaled by h^2)",
        a.kind, p
    )
    .to_lowercase();
    // Writing (gzip above all) takes most of the time: say so before, and keep a spinner (or a
    // line every 10 s off a terminal) while it runs.
    if crate::ui::progress::mode() != crate::ui::progress::Mode::Quiet {
        eprintln!(
            "square: {nx}x{ny}x{nz} {}: {} rows, {} nonzeros; writing {}",
            format!("{:?}", a.kind).to_lowercase(),
            m.nrows(),
            m.nnz(),
            a.out.display()
        );
    }
    let pb = crate::ui::progress::open_ended("writing");
    pb.set_message(a.out.display().to_string());
    let t = std::time::Instant::now();
    let written = if dataset {
        // b = ones, as `solve --method gmres` takes without an rhs
        let b = vec![1.0; m.nrows()];
        let mut spec = crate::io::dataset::DatasetSpec::new(&m, &b);
        spec.name = a
            .out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        spec.description = comment;
        crate::io::dataset::write_dataset(&a.out, &spec, false).map(drop)
    } else {
        crate::io::mtx::write_matrix(&a.out, &m, &comment)
    };
    pb.finish_and_clear();
    written?;
    eprintln!(
        "wrote {}: {} x {}, {} nonzeros (generated in {gen:.3} s, written in {:.3} s)",
        a.out.display(),
        m.nrows(),
        m.ncols(),
        m.nnz(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
