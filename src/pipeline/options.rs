//! What a run is asked to do, as plain data: where the system comes from ([`SystemSource`]),
//! which backend ([`BackendChoice`]), the LSQR settings and how the matrix is laid out
//! ([`SolveOptions`]), and which files to write ([`OutputPaths`]). The CLI, configs and the
//! Python module fill these; the stages (load, prepare, solve, publish) read them.

use std::path::PathBuf;

use serde::Serialize;

use crate::backend::storage::Storage;
use crate::backend::{AllreducePath, LsqrLoop, Precision, TransposeStrategy};
use crate::grid::reorder::Reorder;
use crate::settings::tuning::Tuning;
use crate::solver::{LsqMethod, LsqrParams};

/// Which compute backend to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// CUDA when a usable GPU is present, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

choice_from_str!(BackendChoice, "backend", "auto" => Self::Auto, "cpu" => Self::Cpu, "cuda" | "gpu" => Self::Cuda);

/// Where the system comes from.
#[derive(Debug, Clone)]
pub enum SystemSource {
    /// Matrix Market files: the system is [A; w R] x = [b; 0] (b = A 1 without an rhs file).
    Mtx {
        matrix: PathBuf,
        rhs: Option<PathBuf>,
        reg: Option<PathBuf>,
        reg_weight: f64,
    },
    /// A dataset directory (docs/formats.md).
    Dataset {
        path: PathBuf,
        options: crate::io::LoadOptions,
        /// Whether `invert` reads the dataset's prepared storage when it has a valid one.
        prepared: UsePrepared,
    },
}

impl SystemSource {
    /// A Matrix Market system with regularisation rows.
    pub fn has_reg(&self) -> bool {
        matches!(self, SystemSource::Mtx { reg: Some(_), .. })
    }
}

/// How the matrix is stored and applied: backend, storage, value precision, transpose, the
/// GPU's LSQR loop and allreduce path, and the tuning knobs. The operator factory
/// ([`super::operators`]) turns it into a concrete operator.
#[derive(Debug, Clone, Default)]
pub struct OperatorSpec {
    pub backend: BackendChoice,
    pub storage: Storage,
    /// Matrix value precision (GPU; the CPU with compact storage; vectors stay f64).
    pub precision: Precision,
    pub transpose: TransposeStrategy,
    /// GPU: LSQR's iterations driven from the host or by a CUDA graph on the device.
    pub lsqr_loop: LsqrLoop,
    /// GPU runs on several ranks: how A^T u (LSQR) or the halo (GMRES) crosses between ranks.
    pub allreduce: AllreducePath,
    pub tuning: Tuning,
}

/// Solver settings beyond the system itself.
#[derive(Debug, Clone)]
pub struct SolveOptions {
    /// LSQR (the default) or LSMR.
    pub method: LsqMethod,
    pub params: LsqrParams,
    /// Scale every column of the system to unit norm (right diagonal preconditioning); the
    /// solution and var are scaled back.
    pub col_scale: bool,
    pub x0: Option<PathBuf>,
    /// Backend, storage, precision, transpose, loop, allreduce path and tuning.
    pub operator: OperatorSpec,
    /// CPU threads (default: rayon's, i.e. the cores or RAYON_NUM_THREADS).
    pub threads: Option<usize>,
    /// Row/column reordering for locality (src/grid/reorder.rs).
    pub reorder: Reorder,
    /// Cells along x, y, z when the unknowns are a regular grid's cells (set by `invert` from
    /// the dataset or `[model]`; lets `reorder = "auto"` number the cells in Morton order).
    pub grid: Option<[usize; 3]>,
    /// Each solution's kernel-row product G x and regularisation norm made on the operator it
    /// was solved on (`Outcome::fit`), where the run can: many solves of one system on one
    /// process (an L-curve's members). Off by default.
    pub fit: bool,
}

impl SolveOptions {
    /// `params` on `backend`, every other setting at its default (tests, tools).
    pub fn new(params: LsqrParams, backend: BackendChoice) -> Self {
        SolveOptions {
            method: LsqMethod::Lsqr,
            params,
            col_scale: false,
            x0: None,
            operator: OperatorSpec {
                backend,
                ..Default::default()
            },
            threads: None,
            reorder: Reorder::None,
            grid: None,
            fit: false,
        }
    }
}

/// Output files; `None` skips one.
#[derive(Debug, Clone, Default)]
pub struct OutputPaths {
    pub solution: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub history: Option<PathBuf>,
    pub variance: Option<PathBuf>,
}

/// Whether a run uses a dataset's prepared storage (`[dataset] prepared`;
/// [`crate::pipeline::prepared`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsePrepared {
    /// Use a valid prepared file when there is one (the default).
    #[default]
    Auto,
    /// Always set up from the rows.
    Off,
}

choice_from_str!(UsePrepared, "prepared", "auto" => Self::Auto, "off" => Self::Off);
