//! `seistomo._native`: the Rust half of the Python module (the Python half, python/seistomo,
//! turns SciPy/NumPy inputs into plain arrays and shapes the results like SciPy's).
//!
//! Arrays cross as `bytes` in native byte order (row offsets u64, column indices u32, values
//! f64): the abi3 (limited) API has no buffer protocol before CPython 3.11, and the library's
//! CSR owns u64/u32/f64 vectors anyway, so one copy is made either way. The solve runs with
//! the GIL released; the monitor takes it back to run the callback and to check for signals
//! (Ctrl-C raises KeyboardInterrupt between iterations). Library errors become Python
//! exceptions with the library's one-line message; a panic becomes RuntimeError. Operators given
//! by their products in Python (LinearOperator, PyLops) run through products.rs; a matrix
//! prepared once for many solves (`seistomo.Operator`) through plan.rs.

mod columns;
mod console;
mod device;
mod plan;
mod products;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict};

use seistomo::backend::precond::{HostPreconditioner, Identity, OnHost, PivotPolicy, TriSolve};
use seistomo::backend::storage::Storage;
use seistomo::backend::{Backend, LsqrLoop, Precision, TransposeStrategy};
use seistomo::comm::SerialComm;
use seistomo::grid::reorder::Reorder;
use seistomo::partition::graph::RowPartition;
use seistomo::pipeline::operators::{choose_backend, resolve_storage, Engine, SquareSystem};
use seistomo::pipeline::options::{BackendChoice, OperatorSpec};
use seistomo::pipeline::prepare::{prepare, Layout, Prepared};
use seistomo::pipeline::solve::{solve, LsqrJob, Recorder, Watch};
use seistomo::pipeline::square::{gmres_square, gmres_square_host_precond};
use seistomo::solver::dist_square::SquarePrecond;
use seistomo::solver::gmres::{
    ConvergenceTest, GmresInfo, GmresMonitor, GmresParams, GmresRecord, Orthog, PrecondSide,
};
use seistomo::solver::{
    IterRecord, LeastSquares, LsqMethod, LsqrMonitor, LsqrParams, LsqrSolution,
};
use seistomo::sparse::{Csr, System};
use seistomo::Error;

/// The library's error as the Python exception a user expects.
fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Io { err, .. } if err.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        Error::Io { .. } | Error::Parse { .. } | Error::Format { .. } => PyOSError::new_err(msg),
        Error::Backend { .. } | Error::Device { .. } | Error::Comm(_) | Error::Rank { .. } => {
            PyRuntimeError::new_err(msg)
        }
        Error::Structure(_) | Error::Invalid(_) | Error::Config { .. } => {
            PyValueError::new_err(msg)
        }
    }
}

/// Run `f`, turning a panic into RuntimeError (never an abort of the interpreter).
fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown".into());
            Err(PyRuntimeError::new_err(format!(
                "seistomo internal error (panic): {what}"
            )))
        }
    }
}

fn words<'a, const W: usize>(
    b: &'a [u8],
    what: &str,
) -> PyResult<impl Iterator<Item = [u8; W]> + 'a> {
    if b.len() % W != 0 {
        return Err(PyValueError::new_err(format!(
            "{what}: {} bytes is not a whole number of {W}-byte values",
            b.len()
        )));
    }
    Ok(b.chunks_exact(W).map(|c| {
        let mut a = [0u8; W];
        a.copy_from_slice(c);
        a
    }))
}

fn f64s(b: &[u8], what: &str) -> PyResult<Vec<f64>> {
    Ok(words::<8>(b, what)?.map(f64::from_ne_bytes).collect())
}

fn u64s(b: &[u8], what: &str) -> PyResult<Vec<u64>> {
    Ok(words::<8>(b, what)?.map(u64::from_ne_bytes).collect())
}

fn u32s(b: &[u8], what: &str) -> PyResult<Vec<u32>> {
    Ok(words::<4>(b, what)?.map(u32::from_ne_bytes).collect())
}

fn f64_bytes<'py>(py: Python<'py>, v: &[f64]) -> Bound<'py, PyBytes> {
    // written in place: one copy of v, not two
    PyBytes::new_with(py, v.len() * 8, |out| {
        for (o, x) in out.chunks_exact_mut(8).zip(v) {
            o.copy_from_slice(&x.to_ne_bytes());
        }
        Ok(())
    })
    .expect("filling a new bytes object cannot fail")
}

/// A float64 vector the caller gives by address, `(ptr, len)`: `numpy.ndarray.ctypes.data` of
/// a C-contiguous, aligned float64 array and its length, which the caller keeps alive (and does
/// not change) during this call (the Python side passes such an array and holds it). Copied on
/// all threads and checked finite, with its name in the error: a large right-hand side costs
/// one parallel copy instead of `tobytes` and a copy from the bytes.
pub(crate) fn f64s_at((ptr, len): (usize, usize), what: &str) -> PyResult<Vec<f64>> {
    use rayon::prelude::*;
    if len == 0 {
        return Ok(Vec::new());
    }
    if ptr == 0 || ptr % std::mem::align_of::<f64>() != 0 {
        return Err(PyValueError::new_err(format!(
            "{what}: not an aligned float64 buffer"
        )));
    }
    // SAFETY: the Python caller passes the data address and length of a live, C-contiguous,
    // aligned float64 array that it references for the whole call (checked non-null and
    // aligned above), and nothing writes to it meanwhile: `len` f64s are readable there.
    let src = unsafe { std::slice::from_raw_parts(ptr as *const f64, len) };
    let v: Vec<f64> = src.par_iter().copied().collect();
    if !v.par_iter().all(|x| x.is_finite()) {
        return finite(v, what);
    }
    Ok(v)
}

/// A vector that must be finite, with its name in the error.
fn finite(v: Vec<f64>, what: &str) -> PyResult<Vec<f64>> {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "{what}[{i}] is not finite ({})",
            v[i]
        )));
    }
    Ok(v)
}

/// Build the validated CSR matrix (sorted unique columns, finite values, shape).
fn csr(shape: (usize, usize), indptr: &[u8], indices: &[u8], data: &[u8]) -> PyResult<Csr> {
    let (m, n) = shape;
    if m == 0 || n == 0 {
        return Err(PyValueError::new_err(format!(
            "the matrix is empty ({m} x {n})"
        )));
    }
    Csr::try_new(
        m,
        n,
        u64s(indptr, "indptr")?,
        u32s(indices, "indices")?,
        f64s(data, "data")?,
    )
    .map_err(|e| py_err(Error::Structure(e)))
}

fn backend_of(s: &str) -> PyResult<BackendChoice> {
    s.parse::<BackendChoice>().map_err(PyValueError::new_err)
}

fn precision_of(s: &str) -> PyResult<Precision> {
    match s {
        "f64" | "float64" => Ok(Precision::F64),
        "f32" | "float32" => Ok(Precision::F32),
        _ => Err(PyValueError::new_err(format!(
            "unknown precision '{s}' (f64, f32)"
        ))),
    }
}

/// A pool of `threads` rayon workers for the calls that ask for that many (`threads=`), built
/// once per count and kept for the process.
fn pool_of(threads: usize) -> PyResult<Arc<rayon::ThreadPool>> {
    static POOLS: Mutex<BTreeMap<usize, Arc<rayon::ThreadPool>>> = Mutex::new(BTreeMap::new());
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = pools.get(&threads) {
        return Ok(p.clone());
    }
    let pool = Arc::new(new_pool(threads)?);
    pools.insert(threads, pool.clone());
    Ok(pool)
}

/// A new pool of `threads` rayon workers (1..=MAX_THREADS, as the CLI's --threads).
fn new_pool(threads: usize) -> PyResult<rayon::ThreadPool> {
    let max = seistomo::backend::cpu::MAX_THREADS;
    if !(1..=max).contains(&threads) {
        return Err(PyValueError::new_err(format!(
            "threads must be in 1..={max} (got {threads})"
        )));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("seistomo-{i}"))
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start {threads} threads: {e}")))
}

/// Run a solve `f` with the GIL released: on the calling thread and rayon's global pool
/// (RAYON_NUM_THREADS or the cores) without `threads`; with them, on a pool of that many
/// workers while the calling thread waits, checking for signals (Python sees them on its main
/// thread only) and setting `cancel` on one, which the solve's monitor reads.
fn solve_on<T: Send>(
    py: Python<'_>,
    threads: Option<usize>,
    cancel: &AtomicBool,
    f: impl FnOnce() -> PyResult<T> + Send,
) -> PyResult<T> {
    let Some(t) = threads else {
        return py.allow_threads(f);
    };
    let pool = pool_of(t)?;
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        s.spawn(move || {
            let _ = tx.send(pool.install(f));
        });
        plan::wait(py, rx, cancel)
    })
}

/// What the caller watches a GMRES solve with: (callback, call it every so many iterations,
/// call it with x after every cycle instead).
type GmresWatch = (Option<Py<PyAny>>, usize, bool);

/// Takes the GIL back every `every` iterations (callback) and at most every 50 ms (signals).
/// With `wants_x` (GMRES's `callback_type="x"`) the callback gets x after every cycle instead
/// of the iteration records.
struct PyMonitor {
    callback: Option<Py<PyAny>>,
    every: usize,
    last_check: Instant,
    err: Option<PyErr>,
    wants_x: bool,
    /// Set by the thread that waits for a solve run elsewhere (a prepared `Operator`'s worker):
    /// that thread checks for signals (Python sees them on its main thread only), this one
    /// stops between iterations once it is set.
    cancel: Option<Arc<AtomicBool>>,
    /// LSQR's x (`callback_type="x"`) in the stored column order is put back into A's by this.
    ordering: Option<seistomo::grid::reorder::Ordering>,
    /// The solve hands over its iterate when Python stops it (Ctrl-C, a callback's exception):
    /// the exception then carries it (`.x`, `.itn`). Set where the monitor sees the solver's
    /// state ([`seistomo::pipeline::solve::Recorder::wants_iterate`]).
    keep_iterate: bool,
    /// Python stopped the solve; the next iterate ends it.
    stopping: bool,
    /// The iterate when it stopped (A's column order) and its iteration.
    iterate: Option<(usize, Vec<f64>)>,
}

impl PyMonitor {
    fn new(callback: Option<Py<PyAny>>, every: usize) -> Self {
        PyMonitor {
            callback,
            every: every.max(1),
            last_check: Instant::now(),
            err: None,
            wants_x: false,
            cancel: None,
            ordering: None,
            keep_iterate: false,
            stopping: false,
            iterate: None,
        }
    }

    /// GMRES's monitor for a `watch` (callback, every, x wanted) and the flag that stops it
    /// when the solve runs on a worker thread (`elsewhere`).
    fn watching(
        (callback, every, wants_x): GmresWatch,
        elsewhere: bool,
    ) -> (Self, Arc<AtomicBool>) {
        let mut mon = PyMonitor::new(callback, every);
        mon.wants_x = wants_x;
        let cancel = mon.stop_from_waiter(elsewhere);
        (mon, cancel)
    }

    /// The callback called with x (bytes; the Python half makes it an array).
    fn call_x(&mut self, x: &[f64]) -> seistomo::Result<()> {
        let Some(cb) = self.callback.as_ref() else {
            return Ok(());
        };
        let r = Python::with_gil(|py| -> PyResult<()> {
            if self.cancel.is_none() {
                py.check_signals()?;
            }
            cb.call1(py, (f64_bytes(py, x),))?;
            Ok(())
        });
        self.last_check = Instant::now();
        r.map_err(|e| {
            self.err = Some(e);
            Error::Invalid("stopped from Python".into())
        })
    }

    /// `args` is built only when the callback is due.
    fn poll<A>(&mut self, itn: usize, args: impl FnOnce() -> A) -> seistomo::Result<()>
    where
        A: for<'py> IntoPyObject<'py, Target = pyo3::types::PyTuple>,
    {
        if let Some(c) = &self.cancel {
            if c.load(AtomicOrdering::Relaxed) {
                return Err(Error::Invalid("stopped from Python (interrupted)".into()));
            }
        }
        let due_cb = self.callback.is_some() && !self.wants_x && itn % self.every == 0;
        // the waiting thread checks for signals where the solve runs on another one
        let due_sig =
            self.cancel.is_none() && self.last_check.elapsed() >= Duration::from_millis(50);
        if !due_cb && !due_sig {
            return Ok(());
        }
        self.last_check = Instant::now();
        let cb = self.callback.as_ref();
        let r = Python::with_gil(|py| -> PyResult<()> {
            py.check_signals()?;
            if let (true, Some(cb)) = (due_cb, cb) {
                cb.call1(py, args())?;
            }
            Ok(())
        });
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                self.err = Some(e);
                if self.keep_iterate {
                    // stop at the iterate this record belongs to, which the solver hands over next
                    self.stopping = true;
                    return Ok(());
                }
                Err(Error::Invalid("stopped from Python".into()))
            }
        }
    }

    /// Where the solve runs on another thread than the caller's (`elsewhere`): the caller
    /// checks for signals and sets the returned flag, which this monitor reads between
    /// iterations. Otherwise the flag is unused and this monitor checks for signals itself.
    fn stop_from_waiter(&mut self, elsewhere: bool) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        if elsewhere {
            self.cancel = Some(flag.clone());
        }
        flag
    }

    /// The Python error that stopped the solve (carrying the iterate as `.x` and `.itn` where
    /// the solve handed it over), else the library error.
    fn error(&mut self, e: Error) -> PyErr {
        let err = self.err.take().unwrap_or_else(|| py_err(e));
        if let Some((itn, x)) = self.iterate.take() {
            Python::with_gil(|py| {
                let v = err.value(py);
                // best effort: an exception that takes no attributes is raised as it is
                let _ = v.setattr("x", f64_bytes(py, &x));
                let _ = v.setattr("itn", itn);
            });
        }
        err
    }

    /// After a solve that returned: the Python error that asked it to stop, carrying the
    /// solution it returned (it stopped at its last iteration before it could hand over).
    fn stopped_at_end(&mut self, itn: usize, x: &[f64]) -> Option<PyErr> {
        if !self.stopping || self.err.is_none() {
            return None;
        }
        self.iterate = Some((itn, x.to_vec()));
        Some(self.error(Error::Invalid("stopped from Python".into())))
    }

    /// The error of a solve whose products or M called back into Python: a Python exception
    /// raised there (kept in `kept`) or by the callback, else the library error.
    fn error_with(&mut self, kept: Option<PyErr>, e: Error) -> PyErr {
        kept.unwrap_or_else(|| self.error(e))
    }
}

impl<B: Backend> LsqrMonitor<B> for PyMonitor {
    fn record(&mut self, r: &IterRecord) -> seistomo::Result<()> {
        Recorder::record(self, r)
    }
    /// `callback_type="x"`: x every `every` iterations (LSQR's host loop shows every
    /// iteration's vectors here; its device loop ends its blocks where `checkpoint_every`
    /// says).
    fn state(
        &mut self,
        be: &B,
        s: &seistomo::solver::LsqrScalars,
        v: &seistomo::solver::LsqrVectors<B::Vector>,
    ) -> seistomo::Result<()> {
        self.x_due(be, s.itn, &v.x)
    }
    fn lsmr_iterate(&mut self, be: &B, itn: usize, x: &B::Vector) -> seistomo::Result<()> {
        self.x_due(be, itn, x)
    }
    fn checkpoint_every(&self) -> usize {
        if self.wants_x && self.callback.is_some() {
            self.every
        } else {
            0
        }
    }
}

impl PyMonitor {
    /// `callback_type="x"`: the callback gets x (in A's column order) every `every` iterations.
    fn x_due<B: Backend>(&mut self, be: &B, itn: usize, x: &B::Vector) -> seistomo::Result<()> {
        if !self.wants_x || self.callback.is_none() || itn == 0 || itn % self.every != 0 {
            return Ok(());
        }
        let x = be.to_host(x)?;
        let x = match &self.ordering {
            Some(o) => o.to_old(&x),
            None => x,
        };
        self.call_x(&x)
    }
}

impl Recorder for PyMonitor {
    fn record(&mut self, r: &IterRecord) -> seistomo::Result<()> {
        if r.itn == 0 || self.stopping {
            return Ok(());
        }
        let r = *r;
        self.poll(r.itn, move || {
            (
                r.itn, r.r1norm, r.r2norm, r.anorm, r.acond, r.arnorm, r.xnorm,
            )
        })
    }
    fn wants_iterate(&self) -> bool {
        self.stopping
    }
    fn iterate(&mut self, itn: usize, x: &[f64]) -> seistomo::Result<()> {
        let x = match &self.ordering {
            Some(o) => o.to_old(x),
            None => x.to_vec(),
        };
        self.iterate = Some((itn, x));
        Err(Error::Invalid("stopped from Python".into()))
    }
}

impl GmresMonitor for PyMonitor {
    fn record(&mut self, r: &GmresRecord) -> seistomo::Result<()> {
        if r.iteration == 0 {
            return Ok(());
        }
        let r = *r;
        self.poll(r.iteration, move || (r.iteration, r.resnorm, r.relres))
    }
    fn wants_iterate(&self) -> bool {
        self.wants_x && self.callback.is_some()
    }
    /// The callback gets x (bytes; the Python half makes it an array).
    fn iterate(&mut self, x: &[f64]) -> seistomo::Result<()> {
        self.call_x(x)
    }
}

/// The method and its parameters (`tol`: damp, atol, btol, conlim), checked as the CLI checks
/// them: LSQR's iter_lim = 0 is an
/// error as in the CLI and the config, LSMR's maxiter = 0 is SciPy's (no iteration), and LSMR
/// has no variance estimate.
pub(crate) fn lsq_params(
    method: &str,
    (damp, atol, btol, conlim): (f64, f64, f64, f64),
    iter_lim: Option<usize>,
    calc_var: bool,
) -> PyResult<(LsqMethod, LsqrParams)> {
    let method = method.parse::<LsqMethod>().map_err(PyValueError::new_err)?;
    if iter_lim == Some(0) && method == LsqMethod::Lsqr {
        return Err(PyValueError::new_err("iter_lim must be >= 1 (got 0)"));
    }
    let params = LsqrParams {
        damp,
        atol,
        btol,
        conlim,
        iter_lim,
        calc_var,
    };
    match method {
        LsqMethod::Lsqr => seistomo::solver::lsqr::check_params(&params),
        LsqMethod::Lsmr => seistomo::solver::lsmr::check_lsmr_params(&params),
    }
    .map_err(py_err)?;
    Ok((method, params))
}

/// LSQR on one process. Returns a dict: x (bytes), var (bytes or None), istop, itn, r1norm,
/// r2norm, anorm, acond, arnorm, xnorm, seconds, backend.
#[pyfunction]
#[pyo3(signature = (shape, indptr, indices, data, b, tol, iter_lim, calc_var, x0, layout,
    callback, callback_every, method="lsqr", threads=None))]
#[allow(clippy::too_many_arguments)]
fn lsqr<'py>(
    py: Python<'py>,
    shape: (usize, usize),
    indptr: &[u8],
    indices: &[u8],
    data: &[u8],
    b: &[u8],
    tol: (f64, f64, f64, f64),
    iter_lim: Option<usize>,
    calc_var: bool,
    x0: Option<&[u8]>,
    layout: LsqLayout,
    callback: Option<Py<PyAny>>,
    callback_every: usize,
    method: &str,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    // RAYON_NUM_THREADS checked as the CLI checks it, before rayon reads it unchecked.
    seistomo::backend::cpu::init_threads(None).map_err(py_err)?;
    let (method, params) = lsq_params(method, tol, iter_lim, calc_var)?;
    let a = csr(shape, indptr, indices, data)?;
    let (b, x0) = vectors(a.nrows(), a.ncols(), b, x0)?;
    let (spec, reorder) = lsq_layout(layout)?;
    let mut mon = PyMonitor::new(callback, callback_every);
    let cancel = mon.stop_from_waiter(threads.is_some());
    // Stopped by Python on this thread (Ctrl-C, a callback's exception): the exception
    // carries the iterate (with threads=, the waiting thread raises it and it carries none).
    mon.keep_iterate = threads.is_none();
    let out = solve_on(py, threads, &cancel, || {
        guarded(|| {
            let (engine, why, mut p, setup_started) = prepare_on(&spec, reorder, a, b)?;
            p.x0 = x0.as_deref().map(|x| p.unmap.ordering.to_new(x));
            mon.ordering = Some(p.unmap.ordering.clone());
            let job = LsqrJob {
                method,
                params: &params,
                spec: &spec,
                checkpoint: None,
                setup_started,
            };
            let watch = Watch::Recorder(&mut mon);
            let o = solve(&engine, &why, p, &job, &SerialComm, 0.0, watch);
            let o = o.map_err(|e| mon.error(e))?;
            let (itn, x) = (o.solution.info.itn, &o.solution.x);
            if let Some(e) = mon.stopped_at_end(itn, x) {
                return Err(e);
            }
            let what = format!("{}: {} ({why})", engine.name(), engine.describe());
            Ok((o.solution, what))
        })
    });
    let (sol, backend_used) = out?;
    lsq_dict(py, &sol, backend_used)
}

/// The layout options of lsqr, lsmr and `Operator` as they cross from Python: (backend,
/// precision, transpose, lsqr_loop, storage, reorder).
pub(crate) type LsqLayout = (String, String, String, String, String, String);

/// The operator and layout options of lsqr and lsmr on a matrix (and of a prepared
/// `Operator`), checked: the spec and the reordering.
fn lsq_layout(
    (backend, precision, transpose, lsqr_loop, storage, reorder): LsqLayout,
) -> PyResult<(OperatorSpec, Reorder)> {
    let choice = backend_of(&backend)?;
    let prec = precision_of(&precision)?;
    let strategy = transpose
        .parse::<TransposeStrategy>()
        .map_err(PyValueError::new_err)?;
    let lsqr_loop = lsqr_loop
        .parse::<LsqrLoop>()
        .map_err(PyValueError::new_err)?;
    let storage = storage.parse::<Storage>().map_err(PyValueError::new_err)?;
    let reorder = reorder.parse::<Reorder>().map_err(PyValueError::new_err)?;
    if choice == BackendChoice::Cpu && prec == Precision::F32 && storage == Storage::Csr {
        return Err(PyValueError::new_err(
            "precision f32: the CPU backend stores f64 values only with storage=\"csr\" (use storage=\"compact\")",
        ));
    }
    let spec = OperatorSpec {
        backend: choice,
        storage,
        precision: prec,
        transpose: strategy,
        lsqr_loop,
        ..Default::default()
    };
    Ok((spec, reorder))
}

/// The CLI's stages for one rank on `kind`: the storage resolved for the backend and size, the
/// reordering asked for (the solution is mapped back), no grid, no column scaling.
fn layout_for(kind: BackendChoice, spec: &OperatorSpec, reorder: Reorder, nnz: usize) -> Layout {
    Layout {
        storage: resolve_storage(kind, spec.storage, spec.transpose, nnz),
        reorder,
        grid: None,
        col_scale: false,
        x0: None,
        // on the GPU the rows are reordered where they are encoded (as the CLI does)
        deferred: seistomo::backend::storage::Deferred {
            permute: kind == BackendChoice::Cuda && spec.tuning.gpu_encode != Some(false),
            coverage: false,
        },
    }
}

/// What lsqr and lsmr return to the Python half (lsmr's normr etc. in LSQR's fields).
fn lsq_dict<'py>(
    py: Python<'py>,
    sol: &LsqrSolution,
    backend_used: String,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("x", f64_bytes(py, &sol.x))?;
    d.set_item("var", sol.var.as_ref().map(|v| f64_bytes(py, v)))?;
    let i = &sol.info;
    d.set_item("istop", i.istop)?;
    d.set_item("stop_reason", &i.stop_reason)?;
    d.set_item("itn", i.itn)?;
    d.set_item("r1norm", i.norms.r1norm)?;
    d.set_item("r2norm", i.norms.r2norm)?;
    d.set_item("anorm", i.norms.anorm)?;
    d.set_item("acond", i.norms.acond)?;
    d.set_item("arnorm", i.norms.arnorm)?;
    d.set_item("xnorm", i.norms.xnorm)?;
    d.set_item("seconds", i.seconds)?;
    d.set_item("backend", backend_used)?;
    Ok(d)
}

/// A finite f64 vector of `len` entries (A's `len` rows or columns: `dim`), named in errors.
pub(crate) fn vector(v: &[u8], what: &str, len: usize, dim: &str) -> PyResult<Vec<f64>> {
    let v = finite(f64s(v, what)?, what)?;
    check_len(v, what, len, dim)
}

/// `v` of `len` entries (A's rows or columns: `dim`), or the error that names it.
pub(crate) fn check_len(v: Vec<f64>, what: &str, len: usize, dim: &str) -> PyResult<Vec<f64>> {
    if v.len() != len {
        return Err(PyValueError::new_err(format!(
            "shape mismatch: {what} has {} entries but A has {len} {dim}",
            v.len()
        )));
    }
    Ok(v)
}

/// b and x0 as f64 vectors, finite and of A's row (m) and column (n) counts.
fn vectors(
    m: usize,
    n: usize,
    b: &[u8],
    x0: Option<&[u8]>,
) -> PyResult<(Vec<f64>, Option<Vec<f64>>)> {
    let b = vector(b, "b", m, "rows")?;
    let x0 = x0.map(|x| vector(x, "x0", n, "columns")).transpose()?;
    Ok((b, x0))
}

/// LSQR or LSMR (`method`) on an operator given by its products in Python (`products`: the
/// `seistomo._Products` wrapper), on the CPU backend, one process. Returns lsqr's dict.
#[pyfunction]
#[pyo3(signature = (products, shape, b, method, tol, iter_lim, calc_var, x0, backend, callback,
    callback_every, threads=None, callback_x=false))]
#[allow(clippy::too_many_arguments)]
fn lsq_operator<'py>(
    py: Python<'py>,
    products: Py<PyAny>,
    shape: (usize, usize),
    b: &[u8],
    method: &str,
    tol: (f64, f64, f64, f64),
    iter_lim: Option<usize>,
    calc_var: bool,
    x0: Option<&[u8]>,
    backend: &str,
    callback: Option<Py<PyAny>>,
    callback_every: usize,
    threads: Option<usize>,
    callback_x: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let (method, params) = lsq_params(method, tol, iter_lim, calc_var)?;
    let (m, n) = nonempty(shape)?;
    let (b, x0) = vectors(m, n, b, x0)?;
    operator_backend(backend)?;
    let op = products::PyOperator::new(products, (m, n));
    let (mut mon, cancel) =
        PyMonitor::watching((callback, callback_every, callback_x), threads.is_some());
    let out = solve_on(py, threads, &cancel, || {
        guarded(|| {
            let engine = Engine::cpu_on_calling_thread();
            let be = engine.cpu_backend().map_err(py_err)?;
            let (x0, comm) = (x0.as_deref(), &SerialComm);
            let sol = match method {
                LsqMethod::Lsqr => seistomo::solver::lsqr(
                    &LeastSquares::new(be, &op, comm, &b).x0(x0),
                    &params,
                    &mut mon,
                ),
                LsqMethod::Lsmr => seistomo::solver::lsmr(
                    &LeastSquares::new(be, &op, comm, &b).x0(x0),
                    &params,
                    &mut mon,
                )
                .map(|s| s.into_lsqr()),
            };
            let sol = sol.map_err(|e| mon.error_with(op.errors.take(), e))?;
            Ok((
                sol,
                format!("cpu: {} (products in Python)", engine.describe()),
            ))
        })
    });
    let (sol, backend_used) = out?;
    lsq_dict(py, &sol, backend_used)
}

/// A shape with rows and columns.
fn nonempty((m, n): (usize, usize)) -> PyResult<(usize, usize)> {
    if m == 0 || n == 0 {
        return Err(PyValueError::new_err(format!(
            "the operator is empty ({m} x {n})"
        )));
    }
    Ok((m, n))
}

/// Operators given by their products run on the CPU backend.
fn operator_backend(backend: &str) -> PyResult<()> {
    match backend_of(backend)? {
        BackendChoice::Cuda => Err(PyValueError::new_err(
            "backend='cuda': an operator given by its products (matvec/rmatvec in Python) runs on the CPU backend; use backend='cpu' or 'auto', or pass a sparse matrix",
        )),
        _ => Ok(()),
    }
}

/// The engine of one process: a GPU, or the CPU driven from the calling thread (Python sees
/// Ctrl-C on its main thread only).
/// The CLI's stages for one rank, on the backend `spec` asks for: the engine, why it was
/// chosen, the system [A; b] prepared (laid out and reordered as `layout_for` says) and when
/// the set-up started.
pub(crate) fn prepare_on(
    spec: &OperatorSpec,
    reorder: Reorder,
    a: Csr,
    b: Vec<f64>,
) -> PyResult<(Engine, String, Prepared, std::time::Instant)> {
    let (kind, why) = choose_backend(spec.backend).map_err(py_err)?;
    let engine = engine_for(kind).map_err(py_err)?;
    let layout = layout_for(kind, spec, reorder, a.nnz());
    let kernel_rows = a.nrows();
    let sys = System { a, b, kernel_rows };
    let setup_started = std::time::Instant::now();
    let p = prepare(sys, &layout, &SerialComm).map_err(py_err)?;
    Ok((engine, why, p, setup_started))
}

fn engine_for(kind: BackendChoice) -> seistomo::Result<Engine> {
    match kind {
        BackendChoice::Cuda => Engine::gpu(0),
        _ => Ok(Engine::cpu_on_calling_thread()),
    }
}

/// Restarted GMRES (SciPy 1.10's stopping rule, left preconditioning) on one process. `M`:
/// `precond` names one of seistomo's ("none", "jacobi", "block-ilu0"), or `m_products` (the
/// `seistomo._Products` wrapper of a LinearOperator or callable) applies the caller's on the
/// host. `max_iter` limits inner iterations, `max_cycles` cycles. With `callback_x` the
/// callback gets x (bytes) after every cycle instead of the iteration records.
#[pyfunction]
#[pyo3(signature = (n, indptr, indices, data, b, x0, limits, precond, backend, precision,
    watch, storage="auto", m_products=None, threads=None))]
#[allow(clippy::too_many_arguments)]
fn gmres<'py>(
    py: Python<'py>,
    n: usize,
    indptr: &[u8],
    indices: &[u8],
    data: &[u8],
    b: &[u8],
    x0: Option<&[u8]>,
    limits: GmresLimits,
    precond: &str,
    backend: &str,
    precision: &str,
    watch: GmresWatch,
    storage: &str,
    m_products: Option<Py<PyAny>>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    seistomo::backend::cpu::init_threads(None).map_err(py_err)?;
    let a = csr((n, n), indptr, indices, data)?;
    let storage = storage.parse::<Storage>().map_err(PyValueError::new_err)?;
    let (b, x0) = vectors(n, n, b, x0)?;
    let pc = square_precond_of(precond)?;
    let params = gmres_params(limits)?;
    let choice = backend_of(backend)?;
    let prec = precision_of(precision)?;
    if prec == Precision::F32 && choice == BackendChoice::Cpu {
        return Err(PyValueError::new_err(
            "precision f32: the CPU backend stores f64 values only",
        ));
    }
    if storage == Storage::Compact && choice == BackendChoice::Cpu {
        return Err(PyValueError::new_err(
            "storage compact: GMRES's compact storage (row patterns) is for the GPU; the CPU backend stores CSR",
        ));
    }
    let kept = std::sync::Arc::new(products::Kept::default());
    let m = m_products.map(|obj| {
        Box::new(products::PyPrecond::new(
            obj,
            "M (Python)".into(),
            kept.clone(),
        )) as Box<dyn HostPreconditioner>
    });
    let (mut mon, cancel) = PyMonitor::watching(watch, threads.is_some());
    let out = solve_on(py, threads, &cancel, || {
        guarded(|| {
            let (kind, why) = choose_backend(choice).map_err(py_err)?;
            let engine = engine_for(kind).map_err(py_err)?;
            // backend="auto" without a GPU: the CPU's f64 CSR, whatever was asked for the GPU
            let spec = match kind {
                BackendChoice::Cuda => OperatorSpec {
                    backend: kind,
                    precision: prec,
                    storage,
                    ..Default::default()
                },
                _ => OperatorSpec::default(),
            };
            let part = RowPartition::contiguous(n, 1);
            let sys = SquareSystem {
                rows: &a,
                part: &part,
                b: &b,
                x0: x0.as_deref(),
            };
            let sol = match m {
                Some(m) => gmres_square_host_precond(
                    &engine,
                    &SerialComm,
                    sys,
                    m,
                    &spec,
                    &params,
                    &mut mon,
                ),
                None => gmres_square(&engine, &SerialComm, sys, pc, &spec, &params, &mut mon),
            };
            let sol = sol.map_err(|e| mon.error_with(kept.take(), e))?;
            let what = match kind {
                BackendChoice::Cuda => format!("cuda: {} ({why})", engine.describe()),
                _ => format!("cpu: {} ({why})", engine.describe()),
            };
            Ok((sol.x_local, sol.info, sol.precond, what))
        })
    });
    gmres_dict(py, out?)
}

/// seistomo's preconditioner named by `M`.
fn square_precond_of(precond: &str) -> PyResult<SquarePrecond> {
    match precond {
        "none" => Ok(SquarePrecond::None),
        "jacobi" => Ok(SquarePrecond::Jacobi),
        "block-ilu0" | "ilu0" => Ok(SquarePrecond::BlockIlu0 {
            pivot: PivotPolicy::Error,
            tri: TriSolve::Exact,
        }),
        _ => Err(PyValueError::new_err(format!(
            "unknown preconditioner M='{precond}' (None, 'jacobi', 'block-ilu0', a LinearOperator or a callable)"
        ))),
    }
}

/// GMRES's limits as they cross from Python: (rtol, atol, restart, max inner iterations,
/// max cycles, orthogonalisation).
type GmresLimits = (f64, f64, usize, usize, Option<usize>, String);

/// GMRES's parameters as SciPy 1.10 runs it: left preconditioning, its stopping rule;
/// `max_iter` inner iterations and `max_cycles` cycles at most.
fn gmres_params(
    (rtol, atol, restart, max_iter, max_cycles, orthog): GmresLimits,
) -> PyResult<GmresParams> {
    if restart == 0 {
        return Err(PyValueError::new_err("restart must be >= 1"));
    }
    Ok(GmresParams {
        restart,
        rtol,
        atol,
        max_iter,
        max_cycles,
        orthog: orthog.parse::<Orthog>().map_err(PyValueError::new_err)?,
        side: PrecondSide::Left,
        test: ConvergenceTest::Scipy,
        arnoldi_loop: Default::default(),
    })
}

/// What gmres returns to the Python half: x, the stop, the backend and preconditioner used.
fn gmres_dict(
    py: Python<'_>,
    (x, info, precond, backend_used): (Vec<f64>, GmresInfo, String, String),
) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("x", f64_bytes(py, &x))?;
    d.set_item("converged", info.stop.converged)?;
    d.set_item("reason", &info.stop.reason)?;
    d.set_item("iterations", info.stop.iterations)?;
    d.set_item("cycles", info.stop.restarts + 1)?;
    d.set_item("relres", info.stop.relres)?;
    d.set_item("precond_relres", info.stop.precond_relres)?;
    d.set_item("seconds", info.seconds)?;
    d.set_item("backend", backend_used)?;
    d.set_item("precond", precond)?;
    Ok(d)
}

/// GMRES on an operator given by its products in Python (`products`), on the CPU backend:
/// M none, or the caller's (`m_products`); otherwise as [`gmres`].
#[pyfunction]
#[pyo3(signature = (products, n, b, x0, limits, precond, backend, watch, m_products=None,
    threads=None))]
#[allow(clippy::too_many_arguments)]
fn gmres_operator<'py>(
    py: Python<'py>,
    products: Py<PyAny>,
    n: usize,
    b: &[u8],
    x0: Option<&[u8]>,
    limits: GmresLimits,
    precond: &str,
    backend: &str,
    watch: GmresWatch,
    m_products: Option<Py<PyAny>>,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let (n, _) = nonempty((n, n))?;
    let (b, x0) = vectors(n, n, b, x0)?;
    if precond != "none" {
        return Err(PyValueError::new_err(format!(
            "M='{precond}' needs the matrix's entries; with A given by its products pass M as a LinearOperator or a callable"
        )));
    }
    let params = gmres_params(limits)?;
    operator_backend(backend)?;
    let op = products::PyOperator::new(products, (n, n));
    let kept = std::sync::Arc::new(products::Kept::default());
    let m = m_products.map(|obj| products::PyPrecond::new(obj, "M (Python)".into(), kept.clone()));
    let pc_name = if m.is_some() { "M (Python)" } else { "none" };
    let (mut mon, cancel) = PyMonitor::watching(watch, threads.is_some());
    let out = solve_on(py, threads, &cancel, || {
        guarded(|| {
            let engine = Engine::cpu_on_calling_thread();
            let be = engine.cpu_backend().map_err(py_err)?;
            let (comm, x0) = (&SerialComm, x0.as_deref());
            let sol = match m {
                Some(m) => {
                    let mut pc = OnHost::new(m, n);
                    seistomo::solver::gmres::gmres(
                        be, &op, &mut pc, comm, &b, x0, &params, &mut mon,
                    )
                }
                None => seistomo::solver::gmres::gmres(
                    be,
                    &op,
                    &mut Identity,
                    comm,
                    &b,
                    x0,
                    &params,
                    &mut mon,
                ),
            };
            let sol = sol.map_err(|e| {
                let kept = op.errors.take().or_else(|| kept.take());
                mon.error_with(kept, e)
            })?;
            let what = format!("cpu: {} (products in Python)", engine.describe());
            Ok((sol.x, sol.info, pc_name.to_string(), what))
        })
    });
    gmres_dict(py, out?)
}

/// A CSR matrix as it crosses from Python: shape, row offsets, columns, values.
type CsrBytes = ((usize, usize), Vec<u8>, Vec<u8>, Vec<u8>);
/// A grid as it crosses from Python: n, origin, spacing, axes, units.
type GridTuple = ([usize; 3], [f64; 3], [f64; 3], [String; 3], String);

/// Write a dataset directory. The grid, when given, is (n, origin, spacing, axes, units).
#[pyfunction]
#[pyo3(signature = (path, shape, indptr, indices, data, d, damping, lam, grid, weights,
    sigma, true_model, name, description))]
#[allow(clippy::too_many_arguments)]
fn dataset_create(
    py: Python<'_>,
    path: PathBuf,
    shape: (usize, usize),
    indptr: &[u8],
    indices: &[u8],
    data: &[u8],
    d: &[u8],
    damping: Option<CsrBytes>,
    lam: f64,
    grid: Option<GridTuple>,
    weights: Option<&[u8]>,
    sigma: Option<&[u8]>,
    true_model: Option<&[u8]>,
    name: String,
    description: String,
) -> PyResult<String> {
    let g = csr(shape, indptr, indices, data)?;
    let d = finite(f64s(d, "d")?, "d")?;
    let r = match &damping {
        Some((s, ip, ix, v)) => Some(csr(*s, ip, ix, v)?),
        None => None,
    };
    let vec_opt = |v: Option<&[u8]>, what: &str| -> PyResult<Option<Vec<f64>>> {
        v.map(|b| f64s(b, what).and_then(|x| finite(x, what)))
            .transpose()
    };
    let weights = vec_opt(weights, "weights")?;
    let sigma = vec_opt(sigma, "sigma")?;
    let true_model = vec_opt(true_model, "true_model")?;
    let grid = grid.map(|(n, origin, spacing, axes, units)| seistomo::grid::Grid {
        n,
        origin,
        spacing,
        axes,
        units,
    });
    let mut spec = seistomo::io::dataset::DatasetSpec::new(&g, &d);
    spec.name = name;
    spec.description = description;
    spec.weights = weights.as_deref();
    spec.sigma = sigma.as_deref();
    spec.damping = r.as_ref();
    spec.damping_weight = lam;
    spec.grid = grid;
    spec.true_model = true_model.as_deref();
    let out = py.allow_threads(|| {
        guarded(|| seistomo::io::dataset::write_dataset(&path, &spec, false).map_err(py_err))
    })?;
    Ok(out.display().to_string())
}

/// A dataset's manifest as JSON (the Python `Dataset` reads its properties from it).
#[pyfunction]
fn dataset_info(path: PathBuf) -> PyResult<String> {
    guarded(|| {
        let opts = seistomo::io::LoadOptions::default();
        let ds = seistomo::io::dataset::OpenDataset::open(&path, &opts).map_err(py_err)?;
        let mut v = serde_json::to_value(&ds.manifest.m)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        v["damping_rows"] =
            (ds.damping_rows() + ds.generated.as_ref().map_or(0, |g| g.nrows() as u64)).into();
        v["damping_weight"] = ds.damping_weight.into();
        v["dir"] = ds.manifest.dir.display().to_string().into();
        Ok(v.to_string())
    })
}

/// Load a dataset's whole system [G; λ R], [d; 0] (weights and sigma applied).
#[pyfunction]
fn dataset_system<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let sys = py.allow_threads(|| {
        guarded(|| {
            let opts = seistomo::io::LoadOptions::default();
            let ds = seistomo::io::dataset::OpenDataset::open(&path, &opts).map_err(py_err)?;
            ds.load(0, 1, false).map(|(s, _)| s).map_err(py_err)
        })
    })?;
    let d = csr_dict(py, sys.a)?;
    d.set_item("b", f64_bytes(py, &sys.b))?;
    d.set_item("kernel_rows", sys.kernel_rows)?;
    Ok(d)
}

/// A new bytearray of `v`'s values in native byte order (`N` bytes each), written in place: the
/// one copy of `v` (NumPy views a bytearray writable, without a copy of its own).
fn ne_bytearray<'py, T: Copy, const N: usize>(
    py: Python<'py>,
    v: &[T],
    ne: impl Fn(T) -> [u8; N],
) -> PyResult<Bound<'py, PyByteArray>> {
    PyByteArray::new_with(py, v.len() * N, |out| {
        for (o, &x) in out.chunks_exact_mut(N).zip(v) {
            o.copy_from_slice(&ne(x));
        }
        Ok(())
    })
}

/// `a` as a dict of its shape and CSR arrays (bytearrays: indptr u64, indices u32, data f64).
fn csr_dict(py: Python<'_>, a: Csr) -> PyResult<Bound<'_, PyDict>> {
    let (m, n, indptr, indices, data) = a.into_parts();
    let d = PyDict::new(py);
    d.set_item("shape", (m, n))?;
    d.set_item("indptr", ne_bytearray(py, &indptr, u64::to_ne_bytes)?)?;
    drop(indptr);
    d.set_item("indices", ne_bytearray(py, &indices, u32::to_ne_bytes)?)?;
    drop(indices);
    d.set_item("data", ne_bytearray(py, &data, f64::to_ne_bytes)?)?;
    Ok(d)
}

/// A Matrix Market matrix (`.gz` allowed) read as `seistomo solve` reads it: in parallel, the
/// members of seistomo's own `.gz` files decoded in parallel; its CSR arrays ([`csr_dict`]).
#[pyfunction]
fn mtx_read(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let a =
        py.allow_threads(|| guarded(|| seistomo::io::mtx::read_matrix(&path).map_err(py_err)))?;
    csr_dict(py, a)
}

/// A CSR matrix written as Matrix Market (`coordinate real general`, shortest round-trip
/// values; a `.gz` name compressed in parallel into members read back in parallel), complete
/// or not at all.
#[pyfunction]
fn mtx_write(
    py: Python<'_>,
    path: PathBuf,
    shape: (usize, usize),
    indptr: &[u8],
    indices: &[u8],
    data: &[u8],
    comment: String,
) -> PyResult<()> {
    let a = csr(shape, indptr, indices, data)?;
    py.allow_threads(|| {
        guarded(|| seistomo::io::mtx::write_matrix(&path, &a, &comment).map_err(py_err))
    })
}

/// Run a TOML configuration as `seistomo invert` does (one process); returns report.json.
#[pyfunction]
#[pyo3(signature = (config, progress=0, resume=false))]
fn invert(py: Python<'_>, config: PathBuf, progress: usize, resume: bool) -> PyResult<String> {
    py.allow_threads(|| {
        guarded(|| {
            let done =
                seistomo::pipeline::invert::invert(&config, &[], &SerialComm, progress, resume)
                    .map_err(py_err)?;
            let (o, _) =
                done.ok_or_else(|| PyRuntimeError::new_err("the run produced no outcome"))?;
            serde_json::to_string(&o.report).map_err(|e| PyRuntimeError::new_err(e.to_string()))
        })
    })
}

/// Run configuration text as `seistomo invert` runs a config file (Python's `invert(dict)`):
/// `path` names it in messages and its directory resolves relative paths (no file there is
/// read). Returns report.json.
#[pyfunction]
#[pyo3(signature = (path, text, progress=0, resume=false))]
fn invert_text(
    py: Python<'_>,
    path: PathBuf,
    text: String,
    progress: usize,
    resume: bool,
) -> PyResult<String> {
    let p = path.clone();
    py.allow_threads(|| {
        guarded(|| {
            let done = seistomo::pipeline::invert::invert_text(
                &path,
                &text,
                &[],
                &SerialComm,
                progress,
                resume,
            )
            .map_err(|e| match e {
                // the dict's own keys and values: its TOML lines are not the caller's
                Error::Parse { path, msg, .. } if path == p => {
                    PyValueError::new_err(format!("config: {msg}"))
                }
                e => py_err(e),
            })?;
            let (o, _) =
                done.ok_or_else(|| PyRuntimeError::new_err("the run produced no outcome"))?;
            serde_json::to_string(&o.report).map_err(|e| PyRuntimeError::new_err(e.to_string()))
        })
    })
}

fn model_meta<'py>(
    py: Python<'py>,
    mf: &seistomo::model::hdf5::ModelFile,
) -> PyResult<Bound<'py, PyDict>> {
    let meta = PyDict::new(py);
    meta.set_item("parameterisation", &mf.parameterisation)?;
    meta.set_item("unknowns", &mf.unknowns)?;
    meta.set_item("velocity_unit", &mf.velocity_unit)?;
    meta.set_item("istop", mf.istop)?;
    meta.set_item("stop_reason", &mf.stop_reason)?;
    if let Some(g) = &mf.grid {
        meta.set_item(
            "grid",
            (g.n, g.origin, g.spacing, g.axes.clone(), g.units.clone()),
        )?;
    }
    if !mf.cells.is_empty() {
        meta.set_item("cell_columns", mf.cell_columns.clone())?;
        meta.set_item("cells", mf.cells.clone())?;
    }
    Ok(meta)
}

/// A model file's description (checks that it is a seistomo model file).
#[pyfunction]
fn model_info<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let mf = guarded(|| seistomo::model::hdf5::ModelFile::open(&path).map_err(py_err))?;
    model_meta(py, &mf)
}

/// Every field of a model file's /model group (for `open_model` without xarray):
/// {name: (shape, bytes)} plus "__meta__" (what [`model_info`] returns).
#[pyfunction]
fn model_fields<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let mf = guarded(|| seistomo::model::hdf5::ModelFile::open(&path).map_err(py_err))?;
    let out = PyDict::new(py);
    for name in seistomo::model::cf::field_names(&path).map_err(py_err)? {
        let (v, shape) = mf.field(&name).map_err(py_err)?;
        out.set_item(name, (shape, f64_bytes(py, &v)))?;
    }
    out.set_item("__meta__", model_meta(py, &mf)?)?;
    Ok(out)
}

/// A cell table as it crosses from Python: column names, units, one row of bounds per cell.
type CellsTuple = (Vec<String>, String, Vec<Vec<f64>>);

/// Write x (with var and its solver's report as JSON, where given) as a model file and, for a
/// grid, its XDMF sidecar: `seistomo.write_model`. The reference is a velocity, "mean" or a
/// profile of (depth, velocity) points (grids only).
#[pyfunction]
#[pyo3(signature = (path, x, var, info, method, grid, cells, unknowns, slowness_unit,
    reference, reference_profile, true_model))]
#[allow(clippy::too_many_arguments)]
fn write_model(
    py: Python<'_>,
    path: PathBuf,
    x: &[u8],
    var: Option<&[u8]>,
    info: Option<String>,
    method: String,
    grid: Option<GridTuple>,
    cells: Option<CellsTuple>,
    unknowns: String,
    slowness_unit: String,
    reference: Option<f64>,
    reference_profile: Option<Vec<[f64; 2]>>,
    true_model: Option<&[u8]>,
) -> PyResult<()> {
    use seistomo::model::spec::{CellTable, ModelSpec, Parameterisation, RawReference, Reference};
    let x = finite(f64s(x, "x")?, "x")?;
    let var = var.map(|v| f64s(v, "var")).transpose()?;
    let true_model = true_model
        .map(|v| f64s(v, "true_model").and_then(|t| finite(t, "true_model")))
        .transpose()?;
    let info: Option<seistomo::solver::LsqrInfo> = info
        .map(|j| serde_json::from_str(&j))
        .transpose()
        .map_err(|e| PyValueError::new_err(format!("info: {e}")))?;
    let method = match method.as_str() {
        "lsqr" => "lsqr",
        "lsmr" => "lsmr",
        _ => "unknown",
    };
    let param = match (grid, cells) {
        (Some(_), Some(_)) => return Err(PyValueError::new_err("give grid or cells, not both")),
        (Some((n, origin, spacing, axes, units)), None) => {
            Parameterisation::Grid(seistomo::grid::Grid {
                n,
                origin,
                spacing,
                axes,
                units,
            })
        }
        (None, Some((columns, units, rows))) => {
            if let Some((i, r)) = rows
                .iter()
                .enumerate()
                .find(|(_, r)| r.len() != columns.len())
            {
                return Err(PyValueError::new_err(format!(
                    "cells: row {i} has {} bounds but there are {} columns",
                    r.len(),
                    columns.len()
                )));
            }
            Parameterisation::Cells(CellTable {
                columns,
                units,
                rows,
            })
        }
        (None, None) => Parameterisation::Vector,
    };
    let reference = Reference::from_raw(
        reference.map(RawReference::Velocity).as_ref(),
        reference_profile.as_deref(),
    )
    .map_err(PyValueError::new_err)?;
    if matches!(reference, Reference::Profile(_)) && !matches!(param, Parameterisation::Grid(_)) {
        return Err(PyValueError::new_err(
            "reference_profile needs a grid (its depth axis is axis 2)",
        ));
    }
    let spec = ModelSpec {
        param,
        unknowns: unknowns.parse().map_err(PyValueError::new_err)?,
        slowness_unit,
        reference,
        true_model,
    };
    let solved = seistomo::pipeline::model::Solved {
        x,
        var,
        info,
        method,
    };
    py.allow_threads(|| {
        guarded(|| seistomo::pipeline::model::write_solution(&path, &spec, solved).map_err(py_err))
    })
}

/// Whether a usable CUDA GPU is present, and which (or why not).
#[pyfunction]
fn cuda_available() -> (bool, String) {
    match seistomo::pipeline::operators::gpu_here() {
        Ok(d) => (true, d),
        Err(why) => (false, why),
    }
}

/// `m.add_function(wrap_pyfunction!(f, m)?)?` for every `f`.
macro_rules! add_functions {
    ($m:ident, $($f:path),+ $(,)?) => {
        $($m.add_function(wrap_pyfunction!($f, $m)?)?;)+
    };
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", seistomo::VERSION)?;
    add_functions!(
        m,
        lsqr,
        gmres,
        lsq_operator,
        gmres_operator,
        dataset_create,
        dataset_info,
        dataset_system,
        mtx_read,
        mtx_write,
        invert,
        invert_text,
        model_fields,
        model_info,
        write_model,
        cuda_available,
        columns::lsqr_columns,
        columns::lsqr_damps,
        device::lsqr_device,
        columns::lcurve_batch,
        columns::gpu_batch_min_nnz,
        console::console_to_python,
        console::console_drain,
    );
    m.add_class::<plan::Plan>()?;
    Ok(())
}
