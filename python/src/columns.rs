//! `seistomo.lsqr(A, B)` with B of k columns (SciPy cannot): k LSQR solves of one matrix that
//! share each pass over it (the batched solver, `seistomo::solver::lsqr_batch`, through
//! `seistomo::pipeline::batch`), on the CPU. Each column's result is the one its own
//! `seistomo.lsqr(A, B[:, j])` gives on the CPU, bit for bit.

use std::sync::atomic::AtomicBool;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

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
    // The batch checks for signals between no iterations: Ctrl-C ends it when it returns.
    let cancel = AtomicBool::new(false);
    let got = solve_on(py, threads, &cancel, || {
        guarded(|| {
            let mut got: Vec<Option<LsqrSolution>> = (0..k).map(|_| None).collect();
            let sys = BatchSystem { a, reg_from: None };
            solve_batch(sys, &rhs, &members, &opts, &SerialComm, &mut |j, o| {
                got[j] = Some(o.solution)
            })
            .map_err(py_err)?;
            Ok(got)
        })
    })?;
    let what = format!("cpu: batched LSQR ({k} columns on one pass over A)");
    got.into_iter()
        .map(|s| match s {
            Some(s) => lsq_dict(py, &s, what.clone()),
            None => Err(PyValueError::new_err(
                "a column of the batch gave no solution",
            )),
        })
        .collect()
}
