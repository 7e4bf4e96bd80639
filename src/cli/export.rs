//! `seistomo export`: the exact system seistomo solves — a dataset's assembled [W G; λ R] x =
//! [W d; 0], a Matrix Market system [A; w R], or a config's system with its column scaling and
//! damping rows applied — as Matrix Market, NumPy or PETSc binary files.

use std::path::PathBuf;

use clap::Args;

use crate::io::npy::write_npy;
use crate::io::{load_dataset_with, LoadOptions};
use crate::sparse::mtx;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A dataset (dataset.toml or its directory), a run config (.toml: its system with column
    /// scaling and damp*I rows applied) or a matrix (.mtx / .mtx.gz, with --rhs/--reg).
    dataset: PathBuf,
    /// mtx (A.mtx + b.mtx), npy (indptr, indices, data, b, shape .npy) or petsc (A.petsc +
    /// b.petsc: PETSc binary Mat/Vec, read by MatLoad/VecLoad).
    #[arg(long, default_value = "mtx", value_parser = super::args::words(&["mtx", "npy", "petsc"]))]
    format: String,
    /// Output directory (created; must not exist or be empty).
    #[arg(short = 'o', long)]
    out: PathBuf,
    /// With a matrix: right-hand side (default b = A 1).
    #[arg(long)]
    rhs: Option<PathBuf>,
    /// With a matrix: regularisation rows [A; w R].
    #[arg(long)]
    reg: Option<PathBuf>,
    /// With a matrix and --reg: the weight w of the regularisation rows.
    #[arg(long, default_value_t = 1.0, requires = "reg")]
    reg_weight: f64,
}

/// The system a config solves, as one matrix: column scaling applied and damp*I rows appended
/// (so a peer without a damping option, PETSc's KSPLSQR, solves the same problem).
fn config_system(path: &std::path::Path) -> anyhow::Result<crate::run::System> {
    let cfg = crate::config::RunConfig::load(path)?;
    let mut sys = cfg.system.load()?;
    if cfg.options.col_scale {
        let d = crate::run::column_scaling(&sys.a, &crate::comm::SerialComm)?;
        sys.a.scale_columns(&d);
        eprintln!(
            "export: columns scaled to unit norm (the exported system's unknowns are D^-1 x)"
        );
    }
    let damp = cfg.options.params.damp;
    if damp > 0.0 {
        let n = sys.a.ncols();
        let idx: Vec<u64> = (0..n as u64).collect();
        let eye = crate::sparse::Csr::from_triplets(n, n, &idx, &idx, &vec![1.0; n])?;
        sys.a = sys.a.vstack_scaled(&eye, damp)?;
        sys.b.resize(sys.a.nrows(), 0.0);
    }
    Ok(sys)
}

pub fn run(a: ExportArgs) -> anyhow::Result<()> {
    if !matches!(a.format.as_str(), "mtx" | "npy" | "petsc") {
        anyhow::bail!("--format '{}': expected mtx, npy or petsc", a.format);
    }
    // Like synth and import: never write into a directory that holds something already.
    let occupied = std::fs::read_dir(&a.out).is_ok_and(|mut d| d.next().is_some());
    if occupied || a.out.is_file() {
        return Err(crate::Error::format(
            crate::io::tidy(&a.out),
            "exists and is not empty (remove it or choose another output directory)",
        )
        .into());
    }
    let name = a.dataset.to_string_lossy();
    let sys = if name.ends_with(".mtx") || name.ends_with(".mtx.gz") {
        crate::run::load_mtx_system(&a.dataset, a.rhs.as_deref(), a.reg.as_deref(), a.reg_weight)?
    } else if name.ends_with(".toml") && !name.ends_with("dataset.toml") {
        config_system(&a.dataset)?
    } else {
        let opts = LoadOptions {
            progress: true,
            ..Default::default()
        };
        load_dataset_with(&a.dataset, 0, 1, &opts)?.0
    };
    std::fs::create_dir_all(&a.out).map_err(|e| crate::Error::io(&a.out, e))?;
    let s = &sys.a;
    if a.format == "mtx" {
        mtx::write_matrix(a.out.join("A.mtx"), s, "exported by seistomo")?;
        mtx::write_vector_mtx(a.out.join("b.mtx"), &sys.b)?;
    } else if a.format == "petsc" {
        crate::io::petsc::write_mat(&a.out.join("A.petsc"), s)?;
        crate::io::petsc::write_vec(&a.out.join("b.petsc"), &sys.b)?;
    } else {
        let ip: Vec<i64> = s.indptr().iter().map(|&p| p as i64).collect();
        write_npy(&a.out.join("indptr.npy"), &ip)?;
        if s.ncols() <= i32::MAX as usize {
            let ix: Vec<i32> = s.indices().iter().map(|&c| c as i32).collect();
            write_npy(&a.out.join("indices.npy"), &ix)?;
        } else {
            let ix: Vec<i64> = s.indices().iter().map(|&c| c as i64).collect();
            write_npy(&a.out.join("indices.npy"), &ix)?;
        }
        write_npy(&a.out.join("data.npy"), s.data())?;
        write_npy(&a.out.join("b.npy"), &sys.b)?;
        write_npy(
            &a.out.join("shape.npy"),
            &[s.nrows() as i64, s.ncols() as i64],
        )?;
    }
    eprintln!(
        "export: {} x {} system ({} kernel rows), {} nonzeros -> {} ({})",
        s.nrows(),
        s.ncols(),
        sys.kernel_rows,
        s.nnz(),
        crate::io::tidy(&a.out).display(),
        a.format
    );
    Ok(())
}
