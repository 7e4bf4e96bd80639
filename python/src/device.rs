//! lsqr and lsmr on a matrix that lies on the GPU already: CuPy's `cupyx.scipy.sparse`
//! matrices (issue 33 item 4). The Python side hands over the device addresses of A's CSR
//! arrays and of its transpose's (`A.T.tocsr()`, made by CuPy on the GPU), holding both for the
//! call; the library copies them device to device into its own storage
//! (`seistomo::pipeline::solve::solve_device`), so the matrix never passes through the host.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use seistomo::backend::storage::DeviceCsr;
use seistomo::backend::{LsqrLoop, Precision};
use seistomo::pipeline::operators::choose_backend;
use seistomo::pipeline::options::{BackendChoice, OperatorSpec};
use seistomo::pipeline::solve::{solve_device, LsqrJob, Watch};

use crate::{guarded, lsq_dict, lsq_params, py_err, vectors, PyMonitor};

/// A CSR matrix's arrays on the GPU as they cross from Python: (row offsets' address, bytes
/// per offset (4 or 8), columns' address (int32), values' address).
type DeviceParts = (u64, usize, u64, u64);

/// The matrix `parts` describe, checked as far as the addresses allow.
fn device_csr(
    shape: (usize, usize),
    nnz: usize,
    (indptr, width, indices, values): DeviceParts,
    precision: Precision,
) -> PyResult<DeviceCsr> {
    // SAFETY: the Python caller (seistomo._lsq_device) passes the `.data.ptr` of CuPy arrays
    // of these lengths and dtypes (row offsets of `width` bytes, int32 columns, values of
    // `precision`) on the current device, holds them for the whole call, and has synchronised
    // its stream, so no work on them is pending.
    unsafe { DeviceCsr::new(shape, nnz, (indptr, width), indices, values, precision) }
        .map_err(py_err)
}

/// `seistomo.lsqr` / `lsmr` on a CuPy CSR matrix `a` (shape, nnz) and its transpose `at`, both
/// on GPU `ordinal`, with values of `precision`; b and x0 as bytes (host). Returns what the
/// host-matrix call returns.
#[pyfunction]
#[pyo3(signature = (shape, nnz, a, at, precision, ordinal, b, tol, iter_lim, calc_var, x0,
    lsqr_loop, callback, callback_every, method))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn lsqr_device<'py>(
    py: Python<'py>,
    shape: (usize, usize),
    nnz: usize,
    a: DeviceParts,
    at: DeviceParts,
    precision: &str,
    ordinal: usize,
    b: &[u8],
    tol: (f64, f64, f64, f64),
    iter_lim: Option<usize>,
    calc_var: bool,
    x0: Option<&[u8]>,
    lsqr_loop: &str,
    callback: Option<Py<PyAny>>,
    callback_every: usize,
    method: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let (method, params) = lsq_params(method, tol, iter_lim, calc_var)?;
    let precision: Precision = precision.parse().map_err(PyValueError::new_err)?;
    let (m, n) = shape;
    let a = device_csr(shape, nnz, a, precision)?;
    let at = device_csr((n, m), nnz, at, precision)?;
    let (b, x0) = vectors(m, n, b, x0)?;
    let spec = OperatorSpec {
        backend: BackendChoice::Cuda,
        precision,
        lsqr_loop: lsqr_loop
            .parse::<LsqrLoop>()
            .map_err(PyValueError::new_err)?,
        ..Default::default()
    };
    let mut mon = PyMonitor::new(callback, callback_every);
    mon.keep_iterate = true;
    let out = py.allow_threads(|| {
        guarded(|| {
            let (_, why) = choose_backend(BackendChoice::Cuda).map_err(py_err)?;
            let engine = seistomo::pipeline::operators::Engine::gpu(ordinal).map_err(py_err)?;
            let job = LsqrJob {
                method,
                params: &params,
                spec: &spec,
                checkpoint: None,
                setup_started: std::time::Instant::now(),
            };
            let watch = Watch::Recorder(&mut mon);
            let o = solve_device(&engine, &why, (&a, &at), &b, x0.as_deref(), &job, watch);
            let o = o.map_err(|e| mon.error(e))?;
            let (itn, x) = (o.solution.info.itn, &o.solution.x);
            if let Some(e) = mon.stopped_at_end(itn, x) {
                return Err(e);
            }
            let what = format!(
                "{}: {} ({why}; the matrix given on the GPU)",
                engine.name(),
                engine.describe()
            );
            Ok((o.solution, what))
        })
    });
    let (sol, backend_used) = out?;
    lsq_dict(py, &sol, backend_used)
}
