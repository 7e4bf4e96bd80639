//! `seistomo export`: the exact system seistomo solves — a dataset's assembled [W G; λ R] x =
//! [W d; 0], a Matrix Market system [A; w R], or a config's system with its column scaling and
//! damping rows applied — written as Matrix Market, NumPy or PETSc binary files.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::outpaths::PathCheck;
use crate::io::{load_dataset_with, mtx, LoadOptions};
use crate::pipeline::config::RunConfig;
use crate::sparse::{Csr, System};

/// The file format of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// A.mtx + b.mtx
    Mtx,
    /// A.mtx.gz + b.mtx.gz (compressed on every thread; read back on every thread)
    MtxGz,
    /// indptr, indices, data, b and shape as .npy (SciPy's CSR arrays)
    Npy,
    /// A.petsc + b.petsc: PETSc binary Mat/Vec, read by MatLoad/VecLoad
    Petsc,
}

choice_from_str!(ExportFormat, "export format", "mtx" => Self::Mtx, "mtx.gz" => Self::MtxGz, "npy" => Self::Npy, "petsc" => Self::Petsc);

impl ExportFormat {
    /// The files an export writes into its directory.
    pub fn files(self) -> &'static [&'static str] {
        match self {
            Self::Mtx => &["A.mtx", "b.mtx"],
            Self::MtxGz => &["A.mtx.gz", "b.mtx.gz"],
            Self::Petsc => &["A.petsc", "b.petsc"],
            Self::Npy => &[
                "indptr.npy",
                "indices.npy",
                "data.npy",
                "b.npy",
                "shape.npy",
            ],
        }
    }
}

/// What to export and where.
pub struct ExportJob<'a> {
    /// A dataset (dataset.toml or its directory), a run config (.toml) or a matrix (.mtx/.mtx.gz).
    pub input: &'a Path,
    /// With a matrix: its right-hand side and regularisation rows.
    pub mtx: mtx::MtxParts<'a>,
    pub format: ExportFormat,
    /// The output directory (created; must not exist or be empty).
    pub out: &'a Path,
}

/// What an export wrote.
pub struct ExportSummary {
    pub nrows: usize,
    pub ncols: usize,
    pub nnz: usize,
    pub kernel_rows: usize,
    /// A config asked for column scaling: the exported unknowns are D^-1 x.
    pub columns_scaled: bool,
}

/// The system a config solves, as one matrix: column scaling applied and damp*I rows appended
/// (so a peer without a damping option, PETSc's KSPLSQR, solves the same problem).
fn config_system(path: &Path) -> Result<(System, bool)> {
    let cfg = RunConfig::load(path)?;
    let mut sys = crate::pipeline::load::load_mtx(&cfg.system)?;
    if cfg.options.col_scale {
        let d = crate::pipeline::prepare::column_scaling(&sys.a, &crate::comm::SerialComm)?;
        sys.a.scale_columns(&d);
    }
    let damp = cfg.options.params.damp;
    if damp > 0.0 {
        let n = sys.a.ncols();
        let idx: Vec<u64> = (0..n as u64).collect();
        let eye = Csr::from_triplets(n, n, &idx, &idx, &vec![1.0; n])?;
        sys.a = sys.a.vstack_scaled(&eye, damp)?;
        sys.b.resize(sys.a.nrows(), 0.0);
    }
    Ok((sys, cfg.options.col_scale))
}

/// Export a system. Inputs and outputs are checked before any work (no output is an input or
/// lies inside the input dataset; the directory is empty); the files are published as one set.
pub fn export(job: &ExportJob) -> Result<ExportSummary> {
    let name = job.input.to_string_lossy();
    let is_mtx = name.ends_with(".mtx") || name.ends_with(".mtx.gz");
    let is_config = name.ends_with(".toml") && !name.ends_with("dataset.toml");
    let mut paths = match (is_mtx, is_config) {
        (true, _) => {
            let mut c = PathCheck::new();
            c.input("matrix", job.input);
            c
        }
        (_, true) => RunConfig::load(job.input)?.input_paths(),
        _ => {
            let mut c = PathCheck::new();
            let dir = if job.input.is_dir() {
                job.input.to_path_buf()
            } else {
                job.input
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), PathBuf::from)
            };
            c.input_dir("dataset", &dir);
            c
        }
    };
    paths
        .input_opt("--rhs", job.mtx.rhs)
        .input_opt("--reg", job.mtx.reg)
        .output_dir("-o", job.out);
    for f in job.format.files() {
        paths.output("-o", &job.out.join(f));
    }
    // Inputs first (a clash is the clearer error), then: like synth and import, never write
    // into a directory that holds something already.
    paths.check()?;
    let occupied = std::fs::read_dir(job.out).is_ok_and(|mut d| d.next().is_some());
    if occupied || job.out.is_file() {
        return Err(Error::format(
            crate::io::tidy(job.out),
            "exists and is not empty (remove it or choose another output directory)",
        ));
    }
    let _lock = crate::io::outpaths::check_and_lock(&paths)?;
    let (sys, columns_scaled) = if is_mtx {
        (job.mtx.load(job.input)?, false)
    } else if is_config {
        config_system(job.input)?
    } else {
        let opts = LoadOptions {
            progress: true,
            ..Default::default()
        };
        (load_dataset_with(job.input, 0, 1, &opts)?.0, false)
    };
    write_system(&sys, job.format, job.out)?;
    Ok(ExportSummary {
        nrows: sys.a.nrows(),
        ncols: sys.a.ncols(),
        nnz: sys.a.nnz(),
        kernel_rows: sys.kernel_rows,
        columns_scaled,
    })
}

/// One output set (src/io/publish.rs): on a full disk nothing is left but what was there.
fn write_system(sys: &System, format: ExportFormat, out: &Path) -> Result<()> {
    let mut publ = crate::io::publish::Publication::new("export");
    let s = &sys.a;
    match format {
        ExportFormat::Mtx | ExportFormat::MtxGz => {
            // (`.gz` names are compressed by the publication)
            let (a, b) = match format {
                ExportFormat::MtxGz => ("A.mtx.gz", "b.mtx.gz"),
                _ => ("A.mtx", "b.mtx"),
            };
            publ.write(&out.join(a), |w| {
                mtx::write_matrix_to(w, s, "exported by seistomo")
            })?;
            publ.write(&out.join(b), |w| mtx::write_vector_mtx_to(w, &sys.b))?;
        }
        ExportFormat::Petsc => {
            let io = |e: Error| std::io::Error::other(e.to_string());
            let (ap, bp) = (out.join("A.petsc"), out.join("b.petsc"));
            publ.write(&ap, |w| crate::io::petsc::mat_bytes(&ap, s, w).map_err(io))?;
            publ.write(&bp, |w| {
                crate::io::petsc::vec_bytes(&bp, &sys.b, w).map_err(io)
            })?;
        }
        ExportFormat::Npy => {
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
    }
    publ.commit()
}
