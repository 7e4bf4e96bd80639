//! Prepared operators that last (`seistomo.Operator`): the matrix is copied, checked, laid out
//! (storage, reordering) and its operator built on the backend once, by the same stages and
//! factory as `lsqr(A, ...)` and the CLI ([`prepare`], [`Engine::lsqr`]); then any number of
//! LSQR and LSMR solves run on it, each with its own b, x0, damp and stopping tests, without
//! copying A again or redoing the set-up.
//!
//! The factory hands its operator to a visitor and never gives it out (its type depends on the
//! backend and storage), so the operator lives in a worker thread of its own: the visitor
//! answers solve requests from a channel until the Python object is closed or collected, and
//! the operator (and the GPU's memory and context) go with the thread. Everything a backend
//! does runs on that one thread, as a CUDA context likes it. The caller waits with the GIL
//! released and checks for signals every 50 ms (Python sees them on its main thread only); on
//! Ctrl-C it tells the worker to stop between iterations and raises KeyboardInterrupt. Each
//! request's solution is mapped back to A's row and column order as the pipeline's [`solve`]
//! does: b into the stored row order, x0 into the new columns, x and var back
//! ([`Unmap::restore`]).
//!
//! [`solve`]: seistomo::pipeline::solve::solve

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use seistomo::backend::{Backend, Operator};
use seistomo::comm::SerialComm;
use seistomo::pipeline::operators::{choose_backend, use_device_loop, LsqrVisitor};
use seistomo::pipeline::prepare::{prepare, Unmap};
use seistomo::solver::{LeastSquares, LsqMethod, LsqrParams, LsqrSolution};
use seistomo::sparse::{Csr, System};

use crate::{
    csr, engine_for, guarded, layout_for, lsq_dict, lsq_layout, py_err, LsqLayout, PyMonitor,
};

/// One solve asked of the worker: b and x0 in A's order, the parameters, the callback.
struct Job {
    method: LsqMethod,
    params: LsqrParams,
    b: Vec<f64>,
    x0: Option<Vec<f64>>,
    callback: Option<Py<PyAny>>,
    every: usize,
    /// The callback gets x (in A's column order) instead of the iteration's scalars (LSQR).
    callback_x: bool,
    cancel: Arc<AtomicBool>,
    reply: Sender<PyResult<(LsqrSolution, String)>>,
}

/// What the set-up made, for the Python object's properties.
#[derive(Clone, Default)]
struct Built {
    m: usize,
    n: usize,
    nnz: usize,
    /// "cpu" or "cuda".
    backend: String,
    /// As lsqr's `last_info["backend"]`: the backend, its detail and why it was chosen.
    backend_detail: String,
    /// "csr" or "compact": what the operator stores (the GPU may fall back to CSR).
    storage: String,
    precision: String,
    /// The row (and column) order, in words.
    ordering: String,
    /// Seconds from the call to the operator built (the check of A, the backend started, the
    /// layout, the operator's storage and uploads).
    seconds: f64,
}

/// The worker's visitor: announces the operator, then serves solves until the channel closes.
struct Serve {
    built: Built,
    started: Instant,
    unmap: Unmap,
    ready: Sender<PyResult<Built>>,
    jobs: Receiver<Job>,
}

impl LsqrVisitor for Serve {
    type Output = ();
    fn visit<B: Backend, O: Operator<B>>(self, be: &B, op: &O) -> seistomo::Result<()> {
        let Serve {
            mut built,
            started,
            unmap,
            ready,
            jobs,
        } = self;
        // The factory's operator types are named by storage (CpuCsrOperator,
        // CudaCompactOperator, ...): on the GPU `auto` may have kept CSR after all.
        let ty = std::any::type_name::<O>();
        if ty.contains("Compact") {
            built.storage = "compact".into();
        } else if ty.contains("Csr") {
            built.storage = "csr".into();
        }
        built.seconds = started.elapsed().as_secs_f64();
        if ready.send(Ok(built.clone())).is_err() {
            return Ok(()); // the caller is gone
        }
        drop(ready);
        while let Ok(job) = jobs.recv() {
            let reply = job.reply.clone();
            let what = built.backend_detail.clone();
            let out =
                guarded(|| run(be, op, &unmap, (built.m, built.n), job)).map(|sol| (sol, what));
            let _ = reply.send(out);
        }
        Ok(())
    }
}

/// One solve on the prepared operator, as the pipeline's solve stage runs it: LSMR's
/// parameters checked and its iteration limit resolved to min(m, n), b and x0 into the
/// stored order, x and var back to A's.
fn run<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    unmap: &Unmap,
    (m, n): (usize, usize),
    job: Job,
) -> PyResult<LsqrSolution> {
    let Job {
        method,
        mut params,
        b,
        x0,
        callback,
        every,
        callback_x,
        cancel,
        reply: _,
    } = job;
    if method == LsqMethod::Lsmr {
        seistomo::solver::lsmr::check_lsmr_params(&params).map_err(py_err)?;
        params.iter_lim = Some(params.iter_lim.unwrap_or(m.min(n)));
    }
    // as storage::prepare moved b with the rows (Ordering::apply)
    let b = match &unmap.ordering.rows {
        Some(rows) => rows.iter().map(|&i| b[i]).collect(),
        None => b,
    };
    let x0 = x0.map(|x| unmap.ordering.to_new(&x));
    let mut mon = PyMonitor::new(callback, every);
    mon.cancel = Some(cancel);
    mon.wants_x = callback_x;
    mon.ordering = Some(unmap.ordering.clone());
    let comm = &SerialComm;
    let sol = match method {
        LsqMethod::Lsqr => seistomo::solver::lsqr(
            &LeastSquares::new(be, op, comm, &b).x0(x0.as_deref()),
            &params,
            &mut mon,
        ),
        LsqMethod::Lsmr => seistomo::solver::lsmr(
            &LeastSquares::new(be, op, comm, &b).x0(x0.as_deref()),
            &params,
            &mut mon,
        )
        .map(|s| s.into_lsqr()),
    };
    let mut sol = sol.map_err(|e| mon.error(e))?;
    unmap.restore(&mut sol.x, sol.var.as_mut());
    Ok(sol)
}

/// Wait for `rx` with the GIL released, checking for signals every 50 ms: on one (Ctrl-C, a
/// test's alarm) the worker is told to stop and the signal's exception is raised once it has.
pub(crate) fn wait<T: Send>(
    py: Python<'_>,
    rx: Receiver<PyResult<T>>,
    cancel: &AtomicBool,
) -> PyResult<T> {
    let mut raised: Option<PyErr> = None;
    let mut rx = rx;
    loop {
        let (got, back) = py.allow_threads(move || {
            let got = rx.recv_timeout(Duration::from_millis(50));
            (got, rx)
        });
        rx = back;
        match got {
            Ok(r) => return raised.map_or(r, Err),
            Err(RecvTimeoutError::Timeout) => {
                crate::console::flush(py);
                if raised.is_none() {
                    if let Err(e) = py.check_signals() {
                        cancel.store(true, Ordering::Relaxed);
                        raised = Some(e);
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(raised.unwrap_or_else(|| {
                    PyRuntimeError::new_err("seistomo internal error: the solve's thread ended")
                }))
            }
        }
    }
}

/// A matrix prepared once for LSQR and LSMR solves (`seistomo.Operator`'s native half).
#[pyclass(module = "seistomo._native", name = "Plan", frozen)]
pub struct Plan {
    jobs: Mutex<Option<Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    built: Built,
}

#[pymethods]
impl Plan {
    /// Copy and check A (CSR as bytes, as `lsqr` takes it), start the backend, lay A out and
    /// build its operator, with lsqr's options; returns once the operator is ready.
    #[new]
    #[pyo3(signature = (shape, indptr, indices, data, layout, threads=None))]
    fn new(
        py: Python<'_>,
        shape: (usize, usize),
        indptr: &[u8],
        indices: &[u8],
        data: &[u8],
        layout: LsqLayout,
        threads: Option<usize>,
    ) -> PyResult<Plan> {
        let started = Instant::now();
        seistomo::backend::cpu::init_threads(None).map_err(py_err)?;
        // its own pool: the serving loop waits on one of its workers between solves
        let pool = threads.map(crate::new_pool).transpose()?;
        let (spec, reorder) = lsq_layout(layout)?;
        let a = csr(shape, indptr, indices, data)?;
        let (ready_tx, ready_rx) = channel::<PyResult<Built>>();
        let (jobs_tx, jobs_rx) = channel::<Job>();
        let fail = ready_tx.clone();
        let worker = std::thread::Builder::new()
            .name("seistomo-operator".into())
            .spawn(move || {
                let work =
                    move || guarded(|| set_up(a, &spec, reorder, started, ready_tx, jobs_rx));
                let r = match pool {
                    Some(pool) => pool.install(work),
                    None => work(),
                };
                if let Err(e) = r {
                    let _ = fail.send(Err(e)); // the caller waits only until the set-up ends
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))?;
        let never = AtomicBool::new(false);
        let built = match wait(py, ready_rx, &never) {
            Ok(b) => b,
            Err(e) => {
                drop(jobs_tx);
                let _ = py.allow_threads(|| worker.join());
                return Err(e);
            }
        };
        Ok(Plan {
            jobs: Mutex::new(Some(jobs_tx)),
            worker: Mutex::new(Some(worker)),
            built,
        })
    }

    /// LSQR or LSMR (`method`) on the prepared operator; returns lsqr's dict.
    #[pyo3(signature = (method, b, tol, iter_lim, calc_var, x0, callback, callback_every,
        callback_x=false))]
    #[allow(clippy::too_many_arguments)]
    fn solve<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        b: (usize, usize),
        tol: (f64, f64, f64, f64),
        iter_lim: Option<usize>,
        calc_var: bool,
        x0: Option<&[u8]>,
        callback: Option<Py<PyAny>>,
        callback_every: usize,
        callback_x: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (method, params) = crate::lsq_params(method, tol, iter_lim, calc_var)?;
        let (m, n) = (self.built.m, self.built.n);
        let b = crate::check_len(crate::f64s_at(b, "b")?, "b", m, "rows")?;
        let x0 = x0
            .map(|x| crate::vector(x, "x0", n, "columns"))
            .transpose()?;
        let jobs = self
            .jobs
            .lock()
            .map_err(|_| PyRuntimeError::new_err("seistomo internal error: a poisoned lock"))?
            .clone()
            .ok_or_else(|| PyValueError::new_err("the Operator is closed"))?;
        let cancel = Arc::new(AtomicBool::new(false));
        let (reply, rx) = channel();
        let job = Job {
            method,
            params,
            b,
            x0,
            callback,
            every: callback_every,
            callback_x,
            cancel: cancel.clone(),
            reply,
        };
        jobs.send(job).map_err(|_| {
            PyRuntimeError::new_err("seistomo internal error: the operator's thread ended")
        })?;
        drop(jobs);
        let (sol, what) = wait(py, rx, &cancel)?;
        lsq_dict(py, &sol, what)
    }

    /// What the set-up made: shape, nnz, backend, storage, precision, ordering, seconds.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = &self.built;
        let d = PyDict::new(py);
        d.set_item("shape", (b.m, b.n))?;
        d.set_item("nnz", b.nnz)?;
        d.set_item("backend", &b.backend)?;
        d.set_item("backend_detail", &b.backend_detail)?;
        d.set_item("storage", &b.storage)?;
        d.set_item("precision", &b.precision)?;
        d.set_item("ordering", &b.ordering)?;
        d.set_item("seconds", b.seconds)?;
        Ok(d)
    }

    /// Free the operator (and its GPU memory) now; later solves raise ValueError. Waits for a
    /// solve in flight on another thread to end.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.shut(py);
        Ok(())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.jobs.lock().map(|j| j.is_none()).unwrap_or(true)
    }
}

impl Plan {
    /// Close the channel and wait for the worker to free the operator.
    fn shut(&self, py: Python<'_>) {
        if let Ok(mut j) = self.jobs.lock() {
            j.take();
        }
        let worker = self.worker.lock().ok().and_then(|mut w| w.take());
        if let Some(w) = worker {
            let _ = py.allow_threads(|| w.join());
        }
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        Python::with_gil(|py| self.shut(py));
    }
}

/// The worker's set-up (as `lsqr` does it for one call), then the visit that serves solves.
fn set_up(
    a: Csr,
    spec: &seistomo::pipeline::options::OperatorSpec,
    reorder: seistomo::grid::reorder::Reorder,
    started: Instant,
    ready: Sender<PyResult<Built>>,
    jobs: Receiver<Job>,
) -> PyResult<()> {
    let (kind, why) = choose_backend(spec.backend).map_err(py_err)?;
    let engine = engine_for(kind).map_err(py_err)?;
    let layout = layout_for(kind, spec, reorder, a.nnz());
    let (m, n) = (a.nrows(), a.ncols());
    let sys = System {
        a,
        b: vec![0.0; m],
        kernel_rows: m,
    };
    let p = prepare(sys, &layout, &SerialComm).map_err(py_err)?;
    let precision = match (kind, p.matrix.storage) {
        (seistomo::pipeline::options::BackendChoice::Cuda, _)
        | (_, seistomo::backend::storage::Storage::Compact) => spec.precision,
        _ => seistomo::backend::Precision::F64,
    };
    let built = Built {
        m,
        n,
        nnz: p.nnz,
        backend: engine.name().into(),
        backend_detail: format!("{}: {} ({why})", engine.name(), engine.describe()),
        storage: p.matrix.storage.to_string(),
        precision: precision.to_string(),
        ordering: p.unmap.ordering.what.clone(),
        seconds: 0.0,
    };
    let serve = Serve {
        built,
        started,
        unmap: p.unmap,
        ready,
        jobs,
    };
    let device_loop = use_device_loop(spec.lsqr_loop);
    engine
        .lsqr(spec, &SerialComm, p.matrix, device_loop, serve)
        .map_err(py_err)?;
    Ok(())
}
