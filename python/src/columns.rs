//! `seistomo.lsqr(A, B)` with B of k columns (SciPy cannot): k LSQR solves of one matrix that
//! share each pass over it (the batched solver, `seistomo::solver::lsqr_batch`, through
//! `seistomo::pipeline::batch`), on the CPU. Each column's result is the one its own
//! `seistomo.lsqr(A, B[:, j])` gives on the CPU, bit for bit.

use std::sync::atomic::AtomicBool;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use seistomo::comm::SerialComm;
use seistomo::grid::reorder::Reorder;
use seistomo::pipeline::batch::{solve_batch, BatchSystem, Member};
use seistomo::pipeline::options::{BackendChoice, SolveOptions};
use seistomo::solver::LsqrSolution;

use crate::{csr, f64s, finite, guarded, lsq_dict, lsq_params, py_err, solve_on};

/// LSQR for every column of `b` (k columns of A's m rows, one after another, as bytes) with
/// the same damping and tolerances; one dict a column, as `lsqr` returns.
#[pyfunction]
#[pyo3(signature = (b, k, shape, indptr, indices, data, tol, iter_lim, calc_var, reorder,
    threads=None))]
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
    let mut opts = SolveOptions::new(params.clone(), BackendChoice::Cpu);
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
    let what = format!("cpu: batched LSQR ({k} columns on one pass over A)");
    got.iter().map(|s| lsq_dict(py, s, what.clone())).collect()
}

/// Solve the members of a batch on the CPU with the GIL released: each member's solution.
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
            solve_batch(sys, rhs, members, opts, &SerialComm, &mut |j, o| {
                got[j] = Some(o.solution)
            })
            .map_err(py_err)?;
            Ok(got)
        })
    })?;
    got.into_iter()
        .map(|s| s.ok_or_else(|| PyValueError::new_err("a member of the batch gave no solution")))
        .collect()
}

/// The L-curve of min ||[G; w R] x - [d; 0]|| over `weights`, all weights as one batch
/// (`seistomo.lcurve`): per weight the solve's dict (as `lsqr` returns it) with ||G x - d||
/// (`residual_norm`) and ||R x|| (`model_norm`) added, and the corner (the weight of maximum
/// curvature of the log-log curve, as `seistomo lcurve` finds it; None with fewer than 3
/// usable points) and each point's curvature.
#[pyfunction]
#[pyo3(signature = (g, r, d, weights, tol, iter_lim, reorder, threads=None))]
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
) -> PyResult<(Vec<Bound<'py, PyDict>>, Option<f64>)> {
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
    let a = g
        .vstack_scaled(&r, 1.0)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut b = d.clone();
    b.resize(a.nrows(), 0.0);
    let rhs = vec![b; weights.len()];
    let mut opts = SolveOptions::new(params.clone(), BackendChoice::Cpu);
    opts.reorder = reorder.parse::<Reorder>().map_err(PyValueError::new_err)?;
    let members: Vec<Member> = weights
        .iter()
        .map(|&weight| Member {
            weight,
            damp: params.damp,
        })
        .collect();
    let sys = BatchSystem {
        a,
        reg_from: Some(g.nrows()),
    };
    let got = run_batch(py, sys, &rhs, &members, &opts, threads)?;
    let norms: Vec<(f64, f64)> = got
        .iter()
        .map(|s| {
            let gx = g.matvec(&s.x);
            let res = gx
                .iter()
                .zip(&d)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>();
            let rx = r.matvec(&s.x);
            (res.sqrt(), rx.iter().map(|v| v * v).sum::<f64>().sqrt())
        })
        .collect();
    let points: Vec<(f64, f64, f64)> = weights
        .iter()
        .zip(&norms)
        .map(|(&w, &(a, b))| (w, a, b))
        .collect();
    let (corner, curvature) = seistomo::model::lcurve::corner(&points);
    let what = format!(
        "cpu: batched LSQR ({} weights on one pass over [G; R])",
        weights.len()
    );
    let dicts = got
        .iter()
        .zip(norms.iter().zip(&curvature))
        .map(|(s, (&(res, model), &k))| {
            let dict = lsq_dict(py, s, what.clone())?;
            dict.set_item("residual_norm", res)?;
            dict.set_item("model_norm", model)?;
            dict.set_item("curvature", k)?;
            Ok(dict)
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok((dicts, corner.map(|i| weights[i])))
}

/// A CSR matrix from Python: (shape, indptr, indices, data) as bytes.
type CsrParts<'py> = (
    (usize, usize),
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
);
