//! report.json: what was solved, how, and the outcome; [`Outcome`] is everything a run produced.

use serde::Serialize;

use crate::solver::{IterRecord, LsqrSolution};

/// Wall-clock seconds of each phase (LSQR and GMRES reports).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Seconds {
    pub load: f64,
    pub setup: f64,
    pub solve: f64,
    pub total: f64,
    /// `invert`: from the process's start to the load (the config read, the outputs locked,
    /// the GPU probed); not in `total`.
    #[serde(skip_serializing_if = "is_zero")]
    pub start: f64,
    /// `invert`: writing the outputs staged before report.json (which is written last); not in
    /// `total`.
    #[serde(skip_serializing_if = "is_zero")]
    pub write: f64,
    /// From the process's start to report.json (written last): the time to solution a user
    /// waits for, everything but the process's exit (`total` leaves out `start`, `write` and
    /// the model side's checks before the set-up).
    #[serde(skip_serializing_if = "is_zero")]
    pub elapsed: f64,
}

impl Seconds {
    /// The phases of a solve, `total` their sum (`start` and `write` left for `invert`).
    pub fn new(load: f64, setup: f64, solve: f64) -> Seconds {
        Seconds {
            load,
            setup,
            solve,
            total: load + setup + solve,
            ..Default::default()
        }
    }
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// The first keys of every report.json: the program, its version and the method that ran.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ReportHeader {
    pub program: &'static str,
    pub version: &'static str,
    pub method: &'static str,
}

impl ReportHeader {
    pub fn new(method: &'static str) -> Self {
        Self {
            program: "seistomo",
            version: crate::VERSION,
            method,
        }
    }
}

/// report.json: what was solved, how, and the outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub header: ReportHeader,
    pub backend: String,
    pub backend_detail: String,
    /// Why this backend was chosen (e.g. "auto: CUDA usable, GPU 0 of 1: ...").
    pub backend_reason: String,
    pub transpose: String,
    /// Where LSQR's iterations ran: "device" (the GPU's loop, a CUDA graph of a block of
    /// iterations; on several ranks with the sums over them inside it) or "host" (the host
    /// loop).
    pub lsqr_loop: String,
    /// How vectors are summed over the GPU ranks (`[backend] allreduce`), in words; absent on
    /// one rank and on the CPU.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub allreduce: String,
    /// The row/column reordering applied (src/grid/reorder.rs).
    pub reorder: String,
    /// The matrix storage, with bytes per nonzero (src/backend/storage.rs).
    pub storage: String,
    /// The tuning knobs of the run (src/settings/tuning.rs; null: chosen automatically).
    pub tuning: crate::settings::tuning::Tuning,
    pub ranks: usize,
    pub threads: usize,
    pub m: usize,
    pub n: usize,
    pub nnz: usize,
    pub damp: f64,
    pub atol: f64,
    pub btol: f64,
    pub conlim: f64,
    pub iter_lim: usize,
    pub col_scale: bool,
    pub istop: u32,
    pub stop_reason: String,
    pub iterations: usize,
    #[serde(flatten)]
    pub norms: crate::solver::LsqrNorms,
    pub seconds: Seconds,
    /// The set-up's phases on rank 0, seconds each (src/ui/phases.rs): read (the load),
    /// backend, nvrtc, module, stencil, order, permute, scale, layout, encode, transpose, upload.
    pub setup_phases: crate::ui::phases::Phases,
    /// `invert`: the phases of `seconds.write`: solution, hdf5 (the model file built in memory,
    /// its fields and provenance included), model.h5 (written and synced).
    #[serde(skip_serializing_if = "crate::ui::phases::Phases::is_empty")]
    pub write_phases: crate::ui::phases::Phases,
    pub ms_per_iter: f64,
    /// Per-rank load / compute / allreduce seconds (filled by the distributed pipeline).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rank_timing: Vec<crate::comm::RankTiming>,
    /// How dataset rows were read: "mmap" or "mpiio" (empty, and left out, for other inputs).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub load_io: String,
    /// Prepared storage (`seistomo prepare`): "used FILE (read in S s)", or why a file that
    /// exists was not used (left out where there was none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prepared: String,
    /// The run id of the output set this report belongs to (src/io/publish.rs).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub run_id: String,
    /// The regularisation weight chosen from several tried (`lcurve`; `invert` with `[solver]
    /// weight = "lcurve" | "gcv" | "discrepancy"`): every rule's choice and the one used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_choice: Option<crate::model::weight::WeightChoice>,
}

impl Report {
    /// The report of a solution computed elsewhere (Python's `seistomo.write_model`): what its
    /// solver reported (`info`, with `method`'s name) and the unknowns `n`; how it ran is not
    /// known here, so the run's fields are empty or zero.
    pub fn of_solution(method: &'static str, n: usize, info: &crate::solver::LsqrInfo) -> Report {
        Report {
            header: ReportHeader::new(method),
            backend: String::new(),
            backend_detail: String::new(),
            backend_reason: String::new(),
            transpose: String::new(),
            lsqr_loop: String::new(),
            allreduce: String::new(),
            reorder: String::new(),
            storage: String::new(),
            tuning: Default::default(),
            ranks: 1,
            threads: 0,
            m: 0,
            n,
            nnz: 0,
            damp: 0.0,
            atol: 0.0,
            btol: 0.0,
            conlim: 0.0,
            iter_lim: 0,
            col_scale: false,
            istop: info.istop,
            stop_reason: info.stop_reason.clone(),
            iterations: info.itn,
            norms: info.norms,
            seconds: Seconds::new(0.0, 0.0, info.seconds),
            setup_phases: Default::default(),
            write_phases: Default::default(),
            ms_per_iter: if info.itn > 0 {
                1e3 * info.seconds / info.itn as f64
            } else {
                0.0
            },
            rank_timing: Vec::new(),
            load_io: String::new(),
            prepared: String::new(),
            run_id: String::new(),
            weight_choice: None,
        }
    }
}

/// Everything a run produced.
pub struct Outcome {
    pub solution: LsqrSolution,
    pub history: Vec<IterRecord>,
    pub report: Report,
    /// This rank's products and vector sum timed alone before the solve.
    pub calibration: Calibration,
    /// The ray coverage of this rank's kernel rows where the run left it to the operator's
    /// build ([`crate::backend::storage::Deferred::coverage`]), computed meanwhile.
    pub coverage: Option<crate::grid::PendingCoverage>,
    /// The solution's products on the operator it was solved on, where the run was asked for
    /// them (`SolveOptions::fit`).
    pub fit: Option<Fit>,
}

/// A solution x's products made on the operator it was solved on, before the operator was
/// dropped: what an L-curve's point and GCV's trace need, without a pass over the kernel rows
/// on the host (on the GPU: one product, against 0.6 s on 16 host cores for 16 points of the
/// 101M-nonzero system).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fit {
    /// G x: the kernel rows' product, in the system's row order.
    pub gx: Vec<f64>,
    /// The norm of the other rows' product as the solved matrix has them: ||w R x|| for
    /// [G; w R].
    pub reg_norm: f64,
}

/// One rank's products and vector sum, timed alone before the solve (report.json
/// `rank_timing`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Calibration {
    /// One A x and one A^T y, milliseconds (median of 5).
    pub product_ms: f64,
    /// One allreduce of the n-vector, milliseconds (median of 5, each after a barrier; 0 on
    /// one rank).
    pub allreduce_ms: f64,
    /// Rows this rank applies as grid stencils (its damping rows, when they are whole stencil
    /// blocks and the storage is compact).
    pub stencil_rows: usize,
}
