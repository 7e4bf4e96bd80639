//! `seistomo.lsqr(A, B)` with B of k columns (SciPy cannot): k LSQR solves of one matrix that
//! share each pass over it (the batched solver, `seistomo::solver::lsqr_batch`, through
//! `seistomo::pipeline::batch`), on the CPU or a GPU. On the CPU each column's result is the one
//! its own `seistomo.lsqr(A, B[:, j])` gives there, bit for bit; on a GPU the batch's products
//! sum in their own order, so a column agrees with its single GPU solve within rounding.

use std::sync::atomic::AtomicBool;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use seistomo::backend::Precision;
use seistomo::comm::SerialComm;
use seistomo::grid::reorder::Reorder;
use seistomo::pipeline::batch::{solve_batch, BatchSystem, Member};
use seistomo::pipeline::lcurve::{Sweep, SweepMode};
use seistomo::pipeline::options::{BackendChoice, SolveOptions};
use seistomo::solver::LsqrSolution;

use crate::{
    backend_of, csr, f64s, finite, guarded, lsq_dict, lsq_params, precision_of, py_err, solve_on,
};

/// The batch's options on the backend asked for (`cpu`, `cuda`, or `auto`: CUDA where a GPU is
/// usable), and where it runs ("cuda" or "cpu", for its report): on a GPU the batch runs
/// whatever the size (the Python side decides batch against one solve after another,
/// `gpu_batch_min_nnz`) in `precision`; the CPU's batch is f64.
fn batch_options(
    params: seistomo::solver::LsqrParams,
    backend: &str,
    precision: &str,
    force_gpu_batch: bool,
) -> PyResult<(SolveOptions, &'static str)> {
    let choice = backend_of(backend)?;
    let prec = precision_of(precision)?;
    let mut opts = SolveOptions::new(params, choice);
    let kind = seistomo::pipeline::operators::choose_backend(choice)
        .map_err(py_err)?
        .0;
    if kind == BackendChoice::Cuda {
        opts.operator.precision = prec;
        if force_gpu_batch {
            opts.operator.tuning.gpu_batch = Some(true);
        }
        return Ok((opts, "cuda"));
    }
    if prec != Precision::F64 {
        return Err(PyValueError::new_err(format!(
            "precision={precision:?}: the CPU's batch is f64 (f32 runs on a GPU: backend=\"cuda\")"
        )));
    }
    Ok((opts, "cpu"))
}

/// Nonzeros from which a GPU solves many right-hand sides or weights as one batch rather than
/// one solve after another (the CLI's rule, `pipeline::batch::GPU_BATCH_MIN_NNZ`).
#[pyfunction]
pub(crate) fn gpu_batch_min_nnz() -> usize {
    seistomo::pipeline::batch::GPU_BATCH_MIN_NNZ
}

/// LSQR for every column of `b` (k columns of A's m rows, one after another, as bytes) with
/// the same damping and tolerances; one dict a column, as `lsqr` returns.
#[pyfunction]
#[pyo3(signature = (b, k, shape, indptr, indices, data, tol, iter_lim, calc_var, reorder,
    threads=None, backend="cpu", precision="f64"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn lsqr_columns<'py>(
    py: Python<'py>,
    b: &[u8],
    k: usize,
    shape: (usize, usize),
    indptr: &[u8],
    indices: &[u8],
    data: &[u8],
    tol: (f64, f64, f64, f64),
    iter_lim: Option<usize>,
    calc_var: bool,
    reorder: &str,
    threads: Option<usize>,
    backend: &str,
    precision: &str,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    seistomo::backend::cpu::init_threads(None).map_err(py_err)?;
    let (_, params) = lsq_params("lsqr", tol, iter_lim, calc_var)?;
    let a = csr(shape, indptr, indices, data)?;
    let m = a.nrows();
    let all = finite(f64s(b, "B")?, "B")?;
    if k == 0 || all.len() != m * k {
        return Err(PyValueError::new_err(format!(
            "shape mismatch: B has {} values, A has {m} rows and B {k} columns",
            all.len()
        )));
    }
    let rhs: Vec<Vec<f64>> = all.chunks(m).map(<[f64]>::to_vec).collect();
    drop(all);
    let (mut opts, ran) = batch_options(params.clone(), backend, precision, true)?;
    opts.reorder = reorder.parse::<Reorder>().map_err(PyValueError::new_err)?;
    let members: Vec<Member> = (0..k)
        .map(|_| Member {
            weight: 1.0,
            damp: params.damp,
        })
        .collect();
    let got = run_batch(
        py,
        BatchSystem { a, reg_from: None },
        &rhs,
        &members,
        &opts,
        threads,
    )?;
    let what = format!("{ran}: batched LSQR ({k} columns on one pass over A)");
    got.iter().map(|s| lsq_dict(py, s, what.clone())).collect()
}

/// Solve the members of a batch with the GIL released: each member's solution.
fn run_batch(
    py: Python<'_>,
    sys: BatchSystem,
    rhs: &[Vec<f64>],
    members: &[Member],
    opts: &SolveOptions,
    threads: Option<usize>,
) -> PyResult<Vec<LsqrSolution>> {
    // The batch checks for signals between no iterations: Ctrl-C ends it when it returns.
    let cancel = AtomicBool::new(false);
    let got = solve_on(py, threads, &cancel, || {
        guarded(|| {
            let mut got: Vec<Option<LsqrSolution>> = members.iter().map(|_| None).collect();
            let refs: Vec<&[f64]> = rhs.iter().map(|b| b.as_slice()).collect();
            solve_batch(sys, &refs, members, opts, &SerialComm, &mut |group| {
                for (j, o) in group {
                    got[j] = Some(o.solution)
                }
            })
            .map_err(py_err)?;
            Ok(got)
        })
    })?;
    got.into_iter()
        .map(|s| s.ok_or_else(|| PyValueError::new_err("a member of the batch gave no solution")))
        .collect()
}

/// The L-curve of min ||[G; w R] x - [d; 0]|| over `weights` (`seistomo.lcurve`), run as the
/// CLI's `seistomo lcurve` runs it (`pipeline::lcurve::Sweep::run`): every weight, and
/// `gcv_probes` GCV probes per weight, as one batch. Returns per weight the solve's dict (as
/// `lsqr` returns it) with ||G x - d|| (`residual_norm`), ||R x|| (`model_norm`), the curvature,
/// GCV's trace estimate and value (NaN without probes) added, and the rules' choices: the corner
/// (maximum curvature), GCV's minimum and the discrepancy principle's weight (for
/// `noise_norm`, the target ||G x - d||), each None where it finds none.
#[pyfunction]
#[pyo3(signature = (g, r, d, weights, tol, iter_lim, reorder, threads=None, gcv_probes=0,
    noise_norm=None, backend="cpu", precision="f64"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn lcurve_batch<'py>(
    py: Python<'py>,
    g: CsrParts<'py>,
    r: CsrParts<'py>,
    d: &[u8],
    weights: Vec<f64>,
    tol: (f64, f64, f64, f64),
    iter_lim: Option<usize>,
    reorder: &str,
    threads: Option<usize>,
    gcv_probes: usize,
    noise_norm: Option<f64>,
    backend: &str,
    precision: &str,
) -> PyResult<(Vec<Bound<'py, PyDict>>, Choices)> {
    seistomo::backend::cpu::init_threads(None).map_err(py_err)?;
    let (_, params) = lsq_params("lsqr", tol, iter_lim, false)?;
    let matrix =
        |(shape, ip, ix, v): CsrParts<'py>| csr(shape, ip.as_bytes(), ix.as_bytes(), v.as_bytes());
    let (g, r) = (matrix(g)?, matrix(r)?);
    let d = finite(f64s(d, "d")?, "d")?;
    if d.len() != g.nrows() || r.ncols() != g.ncols() || weights.is_empty() {
        return Err(PyValueError::new_err(format!(
            "shape mismatch: G is {} x {}, R is {} x {}, d has {} values, {} weights",
            g.nrows(),
            g.ncols(),
            r.nrows(),
            r.ncols(),
            d.len(),
            weights.len()
        )));
    }
    if let Some(w) = weights.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
        return Err(PyValueError::new_err(format!(
            "weights must be finite and >= 0 (got {w})"
        )));
    }
    if let Some(t) = noise_norm.filter(|t| !(t.is_finite() && *t > 0.0)) {
        return Err(PyValueError::new_err(format!(
            "noise: the target ||G x - d|| must be finite and > 0 (got {t})"
        )));
    }
    // On a GPU the CLI's rule: one batch from GPU_BATCH_MIN_NNZ nonzeros, else one solve
    // after another.
    let (mut opts, ran) = batch_options(params, backend, precision, false)?;
    opts.reorder = reorder.parse::<Reorder>().map_err(PyValueError::new_err)?;
    let blocked = seistomo::pipeline::batch::batch_blocker(&opts, g.nnz() + r.nnz());
    let sweep = Sweep {
        g,
        d,
        r: Some(r),
        grid: None,
        true_model: None,
        on_damp: false,
    };
    let mode = SweepMode {
        separate: false,
        gcv_probes,
        noise_norm,
    };
    // The batch checks for signals between no iterations: Ctrl-C ends it when it returns.
    let cancel = AtomicBool::new(false);
    let curve = solve_on(py, threads, &cancel, || {
        guarded(|| {
            sweep
                .run(&weights, &opts, &SerialComm, mode, |_, _| {})
                .map_err(py_err)
        })
    })?;
    let solves = format!(
        "{} weights{}",
        weights.len(),
        if gcv_probes > 0 {
            format!(" and {} GCV probes each", gcv_probes)
        } else {
            String::new()
        }
    );
    let what = match blocked {
        None => format!("{ran}: batched LSQR ({solves} on one pass over [G; R])"),
        // (the reason without the run config's setting, which Python does not take)
        Some(why) => format!(
            "{ran}: LSQR, one solve after another ({solves}; {})",
            why.reason
        ),
    };
    let dicts = curve
        .points
        .iter()
        .map(|p| {
            let dict = lsq_dict(py, &p.outcome.solution, what.clone())?;
            dict.set_item("residual_norm", p.residual_norm)?;
            dict.set_item("model_norm", p.model_norm)?;
            dict.set_item("curvature", p.curvature)?;
            dict.set_item("trace", p.trace)?;
            dict.set_item("gcv", p.gcv)?;
            Ok(dict)
        })
        .collect::<PyResult<Vec<_>>>()?;
    let c = &curve.choice;
    Ok((dicts, (c.corner, c.gcv, c.discrepancy)))
}

/// The rules' choices of weight: (corner, GCV's minimum, the discrepancy principle's).
type Choices = (Option<f64>, Option<f64>, Option<f64>);

/// A CSR matrix from Python: (shape, indptr, indices, data) as bytes.
type CsrParts<'py> = (
    (usize, usize),
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);

/// LSQR of one b at every damping of `damps` (`seistomo.lsqr(A, b, damp=[...])`): one
/// Golub-Kahan bidiagonalisation for all of them (`seistomo::solver::lsqr_damps`), each its
/// own host-loop solve bit for bit, on the CPU or a GPU, laid out as `lsqr` lays A out; one
/// dict a damping, as `lsqr` returns.
#[pyfunction]
#[pyo3(signature = (shape, indptr, indices, data, b, damps, tol, iter_lim, calc_var, layout,
    threads=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn lsqr_damps<'py>(
    py: Python<'py>,
    shape: (usize, usize),
    indptr: &[u8],
    indices: &[u8],
    data: &[u8],
    b: &[u8],
    damps: Vec<f64>,
    tol: (f64, f64, f64),
    iter_lim: Option<usize>,
    calc_var: bool,
    layout: crate::LsqLayout,
    threads: Option<usize>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    use seistomo::pipeline::solve::{solve_many, LsqrJob, ManySolves};
    seistomo::backend::cpu::init_threads(None).map_err(py_err)?;
    if damps.is_empty() {
        return Err(PyValueError::new_err("damp: give at least one damping"));
    }
    let (atol, btol, conlim) = tol;
    let (method, params) = lsq_params("lsqr", (damps[0], atol, btol, conlim), iter_lim, calc_var)?;
    // every damping checked as the single solve checks its own
    for &d in &damps {
        lsq_params("lsqr", (d, atol, btol, conlim), iter_lim, calc_var)?;
    }
    let a = csr(shape, indptr, indices, data)?;
    let (b, _) = crate::vectors(a.nrows(), a.ncols(), b, None)?;
    let (spec, reorder) = crate::lsq_layout(layout)?;
    let cancel = AtomicBool::new(false);
    let got = solve_on(py, threads, &cancel, || {
        guarded(|| {
            let (engine, why, p, setup_started) = crate::prepare_on(&spec, reorder, a, b)?;
            let job = LsqrJob {
                method,
                params: &params,
                spec: &spec,
                checkpoint: None,
                setup_started,
            };
            let rhs = [p.b.clone()];
            let of = vec![0; damps.len()];
            let outs = solve_many(
                &engine,
                &why,
                p,
                &job,
                &SerialComm,
                ManySolves {
                    rhs: &rhs,
                    of: &of,
                    damps: &damps,
                    share: true,
                    fit: None,
                },
            )
            .map_err(py_err)?;
            let what = format!(
                "{}: {} ({why}); {} dampings in one bidiagonalisation",
                engine.name(),
                engine.describe(),
                damps.len()
            );
            let sols: Vec<LsqrSolution> = outs.into_iter().map(|o| o.solution).collect();
            Ok((sols, what))
        })
    })?;
    let (sols, what) = got;
    sols.iter().map(|s| lsq_dict(py, s, what.clone())).collect()
}
