//! `seistomo import`: a dataset from Matrix Market / text files (kernel G, data d, optional
//! weights or standard deviations, and regularisation rows R stored as damping blocks).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::grid::Grid;
use crate::io::dataset::binfmt::Precision;
use crate::io::dataset::manifest::Layout;
use crate::io::dataset::{write_dataset, DatasetSpec};
use crate::io::mtx;
use crate::pipeline::config::{dataset_run_text, ModelHints};

/// What to import and how to store it.
pub struct ImportJob<'a> {
    /// Kernel matrix G (Matrix Market, .gz allowed).
    pub matrix: &'a Path,
    /// Data vector d (one value per kernel row). None: d = G 1.
    pub rhs: Option<&'a Path>,
    /// Regularisation / damping matrix R, with weight `lambda`: [G; λ R] x = [d; 0].
    pub reg: Option<&'a Path>,
    pub lambda: f64,
    /// Per-row data weights, or standard deviations (rows are divided by them).
    pub weights: Option<&'a Path>,
    pub sigma: Option<&'a Path>,
    pub grid: Option<Grid>,
    /// The dataset directory (must not exist or be empty).
    pub out: &'a Path,
    pub layout: Layout,
    pub precision: Precision,
    pub damping_blocks: usize,
    pub pack_bytes: u64,
    /// Dataset name (default: the directory's name).
    pub name: Option<String>,
    /// A cell table for maps (one line per column: lat_min lat_max lon_min lon_max, degrees),
    /// named by the run config written beside the dataset.
    pub cells: Option<&'a Path>,
    /// What the unknowns are: the `[model]` table of that run config (its `cells` is set from
    /// `cells`).
    pub model: ModelHints,
}

/// What an import wrote.
pub struct ImportSummary {
    pub nrows: usize,
    pub ncols: usize,
    pub nnz: usize,
    pub damping_rows: Option<usize>,
    /// The dataset's manifest.
    pub manifest: PathBuf,
    /// The run config written beside it (`DIR/invert.toml`).
    pub run_config: PathBuf,
}

/// Import a dataset. The output directory is checked against the inputs before any work.
pub fn import(job: &ImportJob) -> Result<ImportSummary> {
    if !(job.lambda.is_finite() && job.lambda >= 0.0) {
        return Err(Error::Invalid(format!(
            "--lambda must be finite and >= 0 (got {})",
            job.lambda
        )));
    }
    let mut paths = crate::io::outpaths::PathCheck::new();
    paths
        .input("--matrix", job.matrix)
        .input_opt("--rhs", job.rhs)
        .input_opt("--reg", job.reg)
        .input_opt("--weights", job.weights)
        .input_opt("--sigma", job.sigma)
        .input_opt("--cells", job.cells)
        .output_dir("--out", job.out);
    paths.check()?;
    let g = mtx::read_matrix(job.matrix)?;
    // A vector with one value per kernel row.
    let per_row = |p: &Path| -> Result<Vec<f64>> {
        let v = mtx::read_vector(p)?;
        if v.len() != g.nrows() {
            return Err(Error::format(
                p,
                format!(
                    "{} values but the matrix {} has {} rows",
                    v.len(),
                    job.matrix.display(),
                    g.nrows()
                ),
            ));
        }
        Ok(v)
    };
    let b = match job.rhs {
        Some(p) => per_row(p)?,
        None => g.matvec(&vec![1.0; g.ncols()]),
    };
    let weights = job.weights.map(per_row).transpose()?;
    let sigma = job.sigma.map(per_row).transpose()?;
    let reg = job.reg.map(mtx::read_matrix).transpose()?;
    if let Some(p) = job.cells {
        let cells = crate::model::spec::read_cell_table(
            p,
            ["lat_min", "lat_max", "lon_min", "lon_max"]
                .map(String::from)
                .to_vec(),
            "degrees",
        )?;
        if cells.rows.len() != g.ncols() {
            return Err(Error::format(
                p,
                format!(
                    "{} cells but the matrix {} has {} columns (one line per column)",
                    cells.rows.len(),
                    job.matrix.display(),
                    g.ncols()
                ),
            ));
        }
    }
    let mut spec = DatasetSpec::new(&g, &b);
    spec.name = job.name.clone().unwrap_or_else(|| {
        job.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    spec.description = format!("imported from {}", job.matrix.display());
    spec.weights = weights.as_deref();
    spec.sigma = sigma.as_deref();
    spec.damping = reg.as_ref();
    spec.damping_weight = job.lambda;
    spec.damping_blocks = job.damping_blocks;
    spec.grid = job.grid.clone();
    spec.layout = job.layout;
    spec.precision = job.precision;
    spec.pack_bytes = job.pack_bytes;
    spec.sources = crate::io::dataset::SpecSources {
        kernel: Some(job.matrix),
        // Without --rhs, b = G 1 comes from the matrix.
        rhs: Some(job.rhs.unwrap_or(job.matrix)),
        weights: job.weights,
        sigma: job.sigma,
        damping: job.reg,
        true_model: None,
    };
    let manifest = write_dataset(job.out, &spec, true)?;
    let run_config = write_run_config(job)?;
    Ok(ImportSummary {
        nrows: g.nrows(),
        ncols: g.ncols(),
        nnz: g.nnz(),
        damping_rows: reg.as_ref().map(|r| r.nrows()),
        manifest,
        run_config,
    })
}

/// `DIR/invert.toml`: the dataset's run config (config::dataset_run_text), outputs in
/// `NAME-inversion` beside the dataset, the cell table named relative to the config.
fn write_run_config(job: &ImportJob) -> Result<PathBuf> {
    let name = std::fs::canonicalize(job.out)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "dataset".into());
    let mut model = job.model.clone();
    model.cells = job
        .cells
        .map(|c| relative_to(job.out, c).to_string_lossy().into_owned());
    let text = dataset_run_text("seistomo import", &format!("{name}-inversion"), &model);
    let path = job.out.join("invert.toml");
    crate::io::write_atomic(&path, |w| w.write_all(text.as_bytes()))?;
    Ok(crate::io::tidy(path))
}

/// `to` as seen from the directory `from` (both resolved; absolute when they share nothing
/// below the root).
fn relative_to(from: &Path, to: &Path) -> PathBuf {
    let (Ok(from), Ok(to)) = (std::fs::canonicalize(from), std::fs::canonicalize(to)) else {
        return std::path::absolute(to).unwrap_or_else(|_| to.to_path_buf());
    };
    let (f, t): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    if common <= 1 {
        return to; // only the root in common: the absolute path reads better
    }
    let mut out: PathBuf = f[common..].iter().map(|_| "..").collect();
    out.extend(&t[common..]);
    out
}
