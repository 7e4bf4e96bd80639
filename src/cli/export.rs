//! `seistomo export`: the exact system seistomo solves — a dataset's assembled [W G; λ R] x =
//! [W d; 0], a Matrix Market system [A; w R], or a config's system with its column scaling and
//! damping rows applied — as Matrix Market, NumPy or PETSc binary files.

use std::path::PathBuf;

use clap::Args;

use crate::io::mtx;
use crate::io::{load_dataset_with, LoadOptions};

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
    #[command(flatten)]
    system: super::args::MtxSystemArgs,
}

/// The system a config solves, as one matrix: column scaling applied and damp*I rows appended
/// (so a peer without a damping option, PETSc's KSPLSQR, solves the same problem).
fn config_system(path: &std::path::Path) -> anyhow::Result<crate::sparse::System> {
    let cfg = crate::pipeline::config::RunConfig::load(path)?;
    let mut sys = cfg.system.load()?;
    if cfg.options.col_scale {
        let d = crate::pipeline::column_scaling(&sys.a, &crate::comm::SerialComm)?;
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
    let name = a.dataset.to_string_lossy();
    let is_mtx = name.ends_with(".mtx") || name.ends_with(".mtx.gz");
    let is_config = name.ends_with(".toml") && !name.ends_with("dataset.toml");
    // Before any work: the files written must not be inputs, nor lie inside the input dataset.
    let files: &[&str] = match a.format.as_str() {
        "mtx" => &["A.mtx", "b.mtx"],
        "petsc" => &["A.petsc", "b.petsc"],
        _ => &[
            "indptr.npy",
            "indices.npy",
            "data.npy",
            "b.npy",
            "shape.npy",
        ],
    };
    let mut paths = match (is_mtx, is_config) {
        (true, _) => {
            let mut c = crate::io::outpaths::PathCheck::new();
            c.input("matrix", &a.dataset);
            c
        }
        (_, true) => crate::pipeline::config::RunConfig::load(&a.dataset)?.input_paths(),
        _ => {
            let mut c = crate::io::outpaths::PathCheck::new();
            let dir = if a.dataset.is_dir() {
                a.dataset.clone()
            } else {
                a.dataset
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), PathBuf::from)
            };
            c.input_dir("dataset", &dir);
            c
        }
    };
    paths
        .input_opt("--rhs", a.system.rhs.as_deref())
        .input_opt("--reg", a.system.reg.as_deref())
        .output_dir("-o", &a.out);
    for f in files {
        paths.output("-o", &a.out.join(f));
    }
    // Inputs first (a clash is the clearer error), then: like synth and import, never write
    // into a directory that holds something already.
    paths.check()?;
    // Like synth and import: never write into a directory that holds something already.
    let occupied = std::fs::read_dir(&a.out).is_ok_and(|mut d| d.next().is_some());
    if occupied || a.out.is_file() {
        return Err(crate::Error::format(
            crate::io::tidy(&a.out),
            "exists and is not empty (remove it or choose another output directory)",
        )
        .into());
    }
    let _lock = crate::io::outpaths::check_and_lock(&paths)?;
    let sys = if is_mtx {
        a.system.load(&a.dataset)?
    } else if is_config {
        config_system(&a.dataset)?
    } else {
        let opts = LoadOptions {
            progress: true,
            ..Default::default()
        };
        load_dataset_with(&a.dataset, 0, 1, &opts)?.0
    };
    // One output set (src/io/publish.rs): on a full disk nothing is left but what was there.
    let mut publ = crate::io::publish::Publication::new("export");
    let s = &sys.a;
    let out = &a.out;
    if a.format == "mtx" {
        publ.write(&out.join("A.mtx"), |w| {
            mtx::write_matrix_to(w, s, "exported by seistomo")
        })?;
        publ.write(&out.join("b.mtx"), |w| mtx::write_vector_mtx_to(w, &sys.b))?;
    } else if a.format == "petsc" {
        let io = |e: crate::Error| std::io::Error::other(e.to_string());
        let (ap, bp) = (out.join("A.petsc"), out.join("b.petsc"));
        publ.write(&ap, |w| crate::io::petsc::mat_bytes(&ap, s, w).map_err(io))?;
        publ.write(&bp, |w| {
            crate::io::petsc::vec_bytes(&bp, &sys.b, w).map_err(io)
        })?;
    } else {
        use crate::io::npy::npy_to;
        let ip: Vec<i64> = s.indptr().iter().map(|&p| p as i64).collect();
        publ.write(&out.join("indptr.npy"), |w| npy_to(w, &ip))?;
        drop(ip);
        if s.ncols() <= i32::MAX as usize {
            let ix: Vec<i32> = s.indices().iter().map(|&c| c as i32).collect();
            publ.write(&out.join("indices.npy"), |w| npy_to(w, &ix))?;
        } else {
            let ix: Vec<i64> = s.indices().iter().map(|&c| c as i64).collect();
            publ.write(&out.join("indices.npy"), |w| npy_to(w, &ix))?;
        }
        publ.write(&out.join("data.npy"), |w| npy_to(w, s.data()))?;
        publ.write(&out.join("b.npy"), |w| npy_to(w, &sys.b))?;
        let shape = [s.nrows() as i64, s.ncols() as i64];
        publ.write(&out.join("shape.npy"), |w| npy_to(w, &shape))?;
    }
    publ.commit()?;
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
