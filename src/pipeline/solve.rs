//! One LSQR solve of a loaded system: options, backend choice, storage, column scaling, the
//! host or device loop, checkpoints; the outcome goes to [`super::outputs`].

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use crate::backend::cpu::{on_pool, CpuBackend, CpuCompactOperator, CpuCsrOperator};
use crate::backend::cuda::{CudaBackend, CudaCompactOperator, CudaCsrOperator};
use crate::backend::{Backend, Operator, Precision, TransposeStrategy};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::io::mtx;
use crate::model::report::{Outcome, Report, ReportHeader, Seconds};
use crate::solver::{self, IterRecord, LsqrInfo, LsqrMonitor, LsqrParams, LsqrSolution};
use crate::sparse::{Csr, System};

/// On the GPU, `storage = "auto"` picks compact storage from this many stored nonzeros on one
/// rank: below it the products are latency-bound and CSR through cuSPARSE measured faster
/// (australia, docs/gpu.md).
const GPU_COMPACT_MIN_NNZ: usize = 1_000_000;

/// Which compute backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// CUDA when a usable GPU is present, else the CPU.
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
    /// A dataset directory (docs/formats.md), loaded as rank 0 of 1 by [`SystemSource::load`].
    Dataset {
        path: PathBuf,
        options: crate::io::LoadOptions,
    },
}

/// Solver settings beyond the system itself.
#[derive(Debug, Clone)]
pub struct SolveOptions {
    pub params: LsqrParams,
    /// Scale every column of the system to unit norm (right diagonal preconditioning); the
    /// solution and var are scaled back.
    pub col_scale: bool,
    pub x0: Option<PathBuf>,
    pub backend: BackendChoice,
    pub transpose: TransposeStrategy,
    /// CPU threads (default: rayon's, i.e. the cores or RAYON_NUM_THREADS).
    pub threads: Option<usize>,
    /// Matrix value precision (GPU; the CPU with compact storage; vectors stay f64).
    pub precision: Precision,
    /// GPU runs on several ranks: how A^T u is summed over ranks.
    pub allreduce: crate::backend::AllreducePath,
    /// Row/column reordering for locality (src/grid/reorder.rs).
    pub reorder: crate::grid::reorder::Reorder,
    /// Matrix storage: CSR, or compact (16-bit column deltas, grid damping rows as stencils;
    /// src/backend/storage.rs).
    pub storage: crate::backend::storage::Storage,
    /// GPU: LSQR's iterations driven from the host or by a CUDA graph on the device.
    pub lsqr_loop: crate::backend::LsqrLoop,
    /// Cells along x, y, z when the unknowns are a regular grid's cells (set by `invert` from
    /// the dataset or `[model]`; lets `reorder = "auto"` number the cells in Morton order).
    pub grid: Option<[usize; 3]>,
}

/// Output files; `None` skips one.
#[derive(Debug, Clone, Default)]
pub struct OutputPaths {
    pub solution: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub history: Option<PathBuf>,
    pub variance: Option<PathBuf>,
}

impl SolveOptions {
    /// The value precision a backend uses: CSR on the CPU is always f64.
    pub fn precision_for(&self, kind: BackendChoice) -> crate::backend::Precision {
        match kind {
            BackendChoice::Cuda => self.precision,
            _ if self.storage == crate::backend::storage::Storage::Csr => {
                crate::backend::Precision::F64
            }
            _ => self.precision,
        }
    }
}

impl SystemSource {
    /// A Matrix Market system with regularisation rows.
    pub fn has_reg(&self) -> bool {
        matches!(self, SystemSource::Mtx { reg: Some(_), .. })
    }
    pub fn load(&self) -> Result<System> {
        match self {
            SystemSource::Mtx {
                matrix,
                rhs,
                reg,
                reg_weight,
            } => crate::io::mtx::load_system(matrix, rhs.as_deref(), reg.as_deref(), *reg_weight),
            SystemSource::Dataset { path, options } => {
                crate::io::load_dataset_with(path, 0, 1, options).map(|(s, _)| s)
            }
        }
    }
}

/// Resolve `Auto` and check that the chosen backend can run here; the string says why.
pub fn choose_backend(choice: BackendChoice) -> Result<(BackendChoice, String)> {
    match choice {
        BackendChoice::Cpu => Ok((BackendChoice::Cpu, "cpu requested".into())),
        BackendChoice::Cuda => match crate::backend::cuda::probe() {
            Ok(dev) => Ok((BackendChoice::Cuda, format!("cuda requested: {dev}"))),
            Err(why) => Err(Error::backend(
                "cuda",
                format!("no usable CUDA GPU ({why}); use --backend cpu"),
            )),
        },
        BackendChoice::Auto => match crate::backend::cuda::probe() {
            Ok(dev) => Ok((BackendChoice::Cuda, format!("auto: CUDA usable, {dev}"))),
            Err(why) => Ok((
                BackendChoice::Cpu,
                format!("auto: no usable CUDA GPU ({why}), using the CPU"),
            )),
        },
    }
}

/// Column scale factors 1/||A_:j|| over all ranks (1 for empty columns).
pub fn column_scaling(a: &Csr, comm: &dyn Comm) -> Result<Vec<f64>> {
    let mut sq: Vec<f64> = a.column_norms().iter().map(|v| v * v).collect();
    comm.allreduce_sum(&mut sq)?;
    Ok(sq
        .iter()
        .map(|&s| if s > 0.0 { 1.0 / s.sqrt() } else { 1.0 })
        .collect())
}

/// Monitor that records the history and, when asked, prints progress to stderr.
struct CliMonitor {
    history: Vec<IterRecord>,
    every: usize,
    /// Progress by default (src/progress.rs) when no --progress N lines were asked for.
    bar: Option<IterBar>,
}

impl<B: Backend> LsqrMonitor<B> for CliMonitor {
    fn record(&mut self, rec: &IterRecord) -> Result<()> {
        if self.every > 0 && rec.itn % self.every == 0 {
            eprintln!(
                "  itn {:>7}  r1norm {:.6e}  arnorm {:.3e}  xnorm {:.6e}  acond {:.3e}",
                rec.itn, rec.r1norm, rec.arnorm, rec.xnorm, rec.acond
            );
        }
        if let Some(b) = &mut self.bar {
            b.record(rec);
        }
        self.history.push(*rec);
        Ok(())
    }
}

/// LSQR's progress: iteration, ||r|| relative to the start, the stopping tests against their
/// tolerances, the rate, and an ETA only from a steady trend of a stopping test.
struct IterBar {
    pb: indicatif::ProgressBar,
    t0: std::time::Instant,
    first: Option<(usize, f64)>,
    test1: Vec<f64>,
    test2: Vec<f64>,
    atol: f64,
    btol: f64,
    iter_lim: usize,
    /// The message is redrawn at most every 100 ms (formatting it every iteration would cost
    /// a few percent of a 0.06 ms GPU iteration).
    shown: Option<std::time::Instant>,
}

impl IterBar {
    fn new(params: &LsqrParams, n: usize) -> IterBar {
        IterBar {
            pb: crate::ui::progress::open_ended("lsqr"),
            t0: std::time::Instant::now(),
            first: None,
            test1: Vec::new(),
            test2: Vec::new(),
            atol: params.atol,
            btol: params.btol,
            iter_lim: params.iter_lim.unwrap_or(2 * n),
            shown: None,
        }
    }

    fn record(&mut self, r: &IterRecord) {
        let (it0, rn0) = *self.first.get_or_insert((r.itn, r.r2norm));
        let rel = if rn0 > 0.0 { r.r2norm / rn0 } else { 0.0 };
        self.test1.push(rel);
        self.test2
            .push(r.arnorm / (r.anorm * r.r2norm).max(f64::MIN_POSITIVE));
        if self
            .shown
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_millis(100))
        {
            return;
        }
        self.shown = Some(std::time::Instant::now());
        let done = r.itn - it0;
        let secs = self.t0.elapsed().as_secs_f64();
        let per_iter = if done > 0 { secs / done as f64 } else { 0.0 };
        let left = self.iter_lim.saturating_sub(r.itn);
        let rtol = self.btol + self.atol * r.anorm * r.xnorm / rn0.max(f64::MIN_POSITIVE);
        let eta = [
            crate::ui::progress::eta_from_trend(&self.test1, rtol, per_iter, left),
            crate::ui::progress::eta_from_trend(&self.test2, self.atol, per_iter, left),
        ]
        .into_iter()
        .flatten()
        .min();
        let eta = crate::ui::progress::eta_text(eta);
        let t2 = match self.test2.last() {
            Some(t) if r.anorm > 0.0 => format!("{t:.1e}"),
            _ => "-".into(),
        };
        self.pb.set_position(r.itn as u64);
        // Each stopping test, then its tolerance: LSQR stops when either reaches it.
        self.pb.set_message(format!(
            "itn {}  |r| {:.4e}  |r|/|r0| {:.1e}/{:.0e}  |A'r|/(|A||r|) {t2}/{:.0e}  {:.0} it/s  {eta}",
            r.itn,
            r.r1norm,
            rel,
            rtol,
            self.atol,
            if per_iter > 0.0 { 1.0 / per_iter } else { 0.0 },
        ));
    }
}

impl Drop for IterBar {
    fn drop(&mut self) {
        self.pb.finish_and_clear();
    }
}

/// One rank's LSQR solve on any backend and operator: the system's right-hand side, start and
/// settings, progress (lines every `progress_every` iterations or a bar) and checkpoints.
struct Run<'a> {
    comm: &'a dyn Comm,
    b: &'a [f64],
    x0: Option<&'a [f64]>,
    params: &'a LsqrParams,
    progress_every: usize,
    ckpt: Option<(&'a crate::model::checkpoint::Checkpointing, &'a str)>,
}

impl Run<'_> {
    fn solve<B: Backend, O: Operator<B>>(
        &self,
        be: &B,
        op: &O,
    ) -> Result<(LsqrSolution, Vec<IterRecord>)> {
        let (comm, params) = (self.comm, self.params);
        let mut mon = CliMonitor {
            history: Vec::new(),
            every: if comm.is_root() {
                self.progress_every
            } else {
                0
            },
            bar: (comm.is_root()
                && self.progress_every == 0
                && crate::ui::progress::mode() != crate::ui::progress::Mode::Quiet)
                .then(|| IterBar::new(params, op.ncols())),
        };
        if let Some(ckpt) = self.ckpt {
            // The resume message is printed there, once, before the solve.
            let (sol, h) = crate::pipeline::checkpoint::lsqr_checkpointed(
                be, op, comm, ckpt, self.b, self.x0, params, &mut mon,
            )?;
            return Ok((sol, h.history));
        }
        let sol = solver::lsqr(be, op, comm, self.b, self.x0, params, &mut mon)?;
        Ok((sol, mon.history))
    }
}

/// The storage a run uses. On the GPU `auto` is compact for systems of >= 1M stored nonzeros on
/// one rank (measured faster there, docs/gpu.md) and CSR for small, latency-bound ones and under
/// MPI. On the CPU `auto` is CSR: decoding 16-bit deltas measured 11 % slower than CSR on
/// australia's products on one core, 0.369 against 0.331 ms, where the system is cache-resident
/// and compact's fewer bytes buy nothing; out of cache, on `bench --size medium`, compact took
/// 50-64 against 31-35 ms per iteration, its A^T y about twice CSR's (the stencil's transposed
/// terms gather y's damping part in Morton order; docs/performance.md, 2026-11-25, 09:53 UTC). `auto`
/// with `transpose = "library"` or `"scatter"` is CSR (compact builds its own explicit
/// transpose).
pub fn resolve_storage(
    kind: BackendChoice,
    storage: crate::backend::storage::Storage,
    transpose: TransposeStrategy,
    ranks: usize,
    nnz: usize,
) -> crate::backend::storage::Storage {
    match (kind, storage) {
        (BackendChoice::Cuda, crate::backend::storage::Storage::Auto)
            if ranks > 1 || nnz < GPU_COMPACT_MIN_NNZ =>
        {
            crate::backend::storage::Storage::Csr
        }
        (BackendChoice::Cpu | BackendChoice::Auto, crate::backend::storage::Storage::Auto) => {
            crate::backend::storage::Storage::Csr
        }
        (_, s) => s.resolve(matches!(
            transpose,
            TransposeStrategy::Library | TransposeStrategy::Scatter
        )),
    }
}

/// Whether the GPU runs LSQR's device loop: `auto` = on one rank, with either storage (CSR
/// with the explicit transpose; a CSR operator with another transpose runs the host loop).
/// Measured on an H100 (docs/gpu.md): australia 0.030 ms/iter against 0.065 with the host loop,
/// the 100.7M system 1.01 against 1.09 ms. Under MPI every iteration's allreduce goes through
/// the host, so the host loop stays.
pub fn use_device_loop(lsqr_loop: crate::backend::LsqrLoop, ranks: usize) -> bool {
    match lsqr_loop {
        crate::backend::LsqrLoop::Device => true,
        crate::backend::LsqrLoop::Host => false,
        crate::backend::LsqrLoop::Auto => ranks == 1,
    }
}

/// Solve a loaded system with LSQR.
pub fn solve_system(
    sys: System,
    opts: &SolveOptions,
    comm: &dyn Comm,
    load_seconds: f64,
    progress_every: usize,
) -> Result<Outcome> {
    solve_system_checkpointed(sys, opts, comm, load_seconds, progress_every, None)
}

/// [`solve_system`] with checkpoints every N iterations and resume (src/model/checkpoint.rs).
pub fn solve_system_checkpointed(
    sys: System,
    opts: &SolveOptions,
    comm: &dyn Comm,
    load_seconds: f64,
    progress_every: usize,
    ckpt: Option<&crate::model::checkpoint::Checkpointing>,
) -> Result<Outcome> {
    let t_setup = Instant::now();
    let (kind, why) = choose_backend(opts.backend)?;
    let System { a, b, kernel_rows } = sys;
    let storage = resolve_storage(kind, opts.storage, opts.transpose, comm.size(), a.nnz());
    let prepared = crate::backend::storage::prepare(
        a,
        b,
        kernel_rows,
        opts.grid,
        storage,
        opts.reorder,
        comm.size() == 1 && !opts.col_scale,
    );
    let storage_what = prepared.describe(opts.precision_for(kind));
    let fp_tag = prepared.stencil_tag();
    let crate::backend::storage::Prepared {
        stored: mut a,
        stencil,
        b,
        ordering,
        storage,
    } = prepared;
    let device_loop = use_device_loop(opts.lsqr_loop, comm.size());
    let m_local = a.nrows() + stencil.as_ref().map_or(0, |s| s.nrows());
    let nnz_local = a.nnz() + stencil.as_ref().map_or(0, |s| s.stencil().nnz());
    let n = a.ncols();
    let x0 = match &opts.x0 {
        Some(p) => {
            let x0 = mtx::read_vector(p)?;
            if x0.len() != n {
                return Err(Error::format(
                    p,
                    format!("x0 has {} values but the system has {n} columns", x0.len()),
                ));
            }
            Some(ordering.to_new(&x0))
        }
        None => None,
    };
    let scale = if opts.col_scale {
        Some(column_scaling(&a, comm)?)
    } else {
        None
    };
    let x0 = match (&scale, x0) {
        (Some(d), Some(x0)) => Some(x0.iter().zip(d).map(|(x, d)| x / d).collect::<Vec<_>>()),
        (_, x0) => x0,
    };
    if let Some(d) = &scale {
        a.scale_columns(d);
    }
    let m = comm.allreduce_scalar(m_local as f64)? as usize;
    let nnz = comm.allreduce_scalar(nnz_local as f64)? as usize;
    let fp = ckpt.map(|_| format!("{}:{fp_tag}", crate::model::checkpoint::fingerprint(&a, &b)));
    let run = Run {
        comm,
        b: &b,
        x0: x0.as_deref(),
        params: &opts.params,
        progress_every,
        ckpt: ckpt.zip(fp.as_deref()),
    };
    let (mut solution, history, backend_detail, transpose, setup) = match kind {
        BackendChoice::Cpu | BackendChoice::Auto => {
            let be = CpuBackend::new();
            if storage == crate::backend::storage::Storage::Compact {
                let op = CpuCompactOperator::new(&a, stencil, opts.precision);
                drop(a);
                let setup = t_setup.elapsed().as_secs_f64();
                let (s, h) = on_pool(comm, || run.solve(&be, &op))?;
                (s, h, be.describe(), "csc (compact transpose)".into(), setup)
            } else {
                let op = CpuCsrOperator::new(a, opts.transpose);
                let setup = t_setup.elapsed().as_secs_f64();
                let (s, h) = on_pool(comm, || run.solve(&be, &op))?;
                (s, h, be.describe(), op.strategy().to_string(), setup)
            }
        }
        BackendChoice::Cuda => {
            let be = CudaBackend::for_rank(comm)?;
            let path = be.setup_allreduce(comm, opts.allreduce)?;
            if comm.size() > 1 && comm.is_root() {
                eprintln!("allreduce of A^T u over ranks: {path}");
            }
            let compact = if storage == crate::backend::storage::Storage::Compact {
                match CudaCompactOperator::new(&be, &a, stencil.as_ref(), opts.precision) {
                    Ok(op) => {
                        op.set_device_loop(device_loop);
                        Some(op)
                    }
                    Err(e) if comm.is_root() => {
                        eprintln!("compact storage: {e}; using csr");
                        None
                    }
                    Err(_) => None,
                }
            } else {
                None
            };
            let setup_of = |t: &Instant| t.elapsed().as_secs_f64();
            if let Some(op) = compact {
                drop(a);
                let setup = setup_of(&t_setup);
                let (s, h) = run.solve(&be, &op)?;
                let strategy = format!("csc (compact transpose, {} values)", op.precision());
                (s, h, be.describe(), strategy, setup)
            } else {
                // CSR: the stencil rows (if any were split off) go back into the matrix.
                let a = match &stencil {
                    Some(st) => {
                        let d = st.stencil().to_csr();
                        let d = match st.new_of_old() {
                            Some(p) => d.permute_columns(p),
                            None => d,
                        };
                        a.vstack_scaled(&d, 1.0)
                            .map_err(|e| Error::Invalid(e.to_string()))?
                    }
                    None => a,
                };
                let op = CudaCsrOperator::new(&be, &a, opts.transpose, opts.precision)?;
                op.set_device_loop(device_loop);
                drop(a);
                let setup = setup_of(&t_setup);
                let (s, h) = run.solve(&be, &op)?;
                let strategy = if comm.size() > 1 {
                    format!(
                        "{} ({} values); allreduce: {path}",
                        op.strategy(),
                        op.precision()
                    )
                } else {
                    format!("{} ({} values)", op.strategy(), op.precision())
                };
                (s, h, be.describe(), strategy, setup)
            }
        }
    };
    if let Some(d) = &scale {
        solution.x.iter_mut().zip(d).for_each(|(x, d)| *x *= d);
        if let Some(var) = solution.var.as_mut() {
            var.iter_mut().zip(d).for_each(|(v, d)| *v *= d * d);
        }
    }
    if ordering.cols.is_some() {
        solution.x = ordering.to_old(&solution.x);
        if let Some(var) = solution.var.as_mut() {
            *var = ordering.to_old(var);
        }
    }
    let info: &LsqrInfo = &solution.info;
    let p = &opts.params;
    let report = Report {
        header: ReportHeader::new("lsqr"),
        backend: match kind {
            BackendChoice::Cuda => "cuda".into(),
            _ => "cpu".into(),
        },
        backend_detail,
        backend_reason: why,
        transpose,
        reorder: ordering.what.clone(),
        storage: storage_what,
        ranks: comm.size(),
        threads: rayon::current_num_threads(),
        m,
        n,
        nnz,
        damp: p.damp,
        atol: p.atol,
        btol: p.btol,
        conlim: p.conlim,
        iter_lim: p.iter_lim.unwrap_or(2 * n),
        col_scale: opts.col_scale,
        istop: info.istop,
        stop_reason: info.stop_reason.clone(),
        iterations: info.itn,
        norms: info.norms,
        seconds: Seconds {
            load: load_seconds,
            setup,
            solve: info.seconds,
            total: load_seconds + setup + info.seconds,
        },
        // Over the iterations run in this process (a resumed run started at start_itn).
        ms_per_iter: if info.itn > info.start_itn {
            1e3 * info.seconds / (info.itn - info.start_itn) as f64
        } else {
            0.0
        },
        rank_timing: Vec::new(),
        load_io: String::new(),
        run_id: String::new(),
    };
    Ok(Outcome {
        solution,
        history,
        report,
    })
}
