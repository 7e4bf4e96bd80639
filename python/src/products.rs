//! Operators and preconditioners given by their products in Python (a SciPy `LinearOperator`, a
//! PyLops operator, anything with `matvec`/`rmatvec` and `shape`; a callable M): the solver runs
//! natively on the CPU backend and calls back into Python for each product only.
//!
//! The Python half (`seistomo._Products`) wraps the user's object: its `matvec(buf)` and
//! `rmatvec(buf)` take a `bytearray` of native-endian f64 (seen by NumPy without a copy, as a
//! writable array), call the user's product, check the result's shape and values (a
//! ValueError/TypeError naming the operator) and return it as `bytes`, which are read here
//! without a copy. So one copy goes each way besides the product itself (the abi3 API of
//! CPython 3.9 has no buffer protocol to share the vectors). The GIL is taken for the call
//! only. A Python exception is kept and the solve stops with it; never a panic.

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use seistomo::backend::cpu::CpuBackend;
use seistomo::backend::precond::HostPreconditioner;
use seistomo::backend::{Operator, Scale};
use seistomo::Error;

/// A Python object's product `method` of `input` into `out` as `out = alpha P + beta out` (out
/// is not read where beta is 0). The Python error, if any, is returned as is.
fn call_product(
    obj: &Py<PyAny>,
    method: &str,
    input: &[f64],
    (alpha, beta): (f64, f64),
    out: &mut [f64],
) -> PyResult<()> {
    Python::with_gil(|py| {
        let buf = PyByteArray::new_with(py, input.len() * 8, |b| {
            for (c, v) in b.chunks_exact_mut(8).zip(input) {
                c.copy_from_slice(&v.to_ne_bytes());
            }
            Ok(())
        })?;
        let res = obj.call_method1(py, method, (buf,))?;
        let bytes = res.downcast_bound::<PyBytes>(py)?.as_bytes();
        if bytes.len() != out.len() * 8 {
            return Err(PyValueError::new_err(format!(
                "{method} returned {} values, expected {}",
                bytes.len() / 8,
                out.len()
            )));
        }
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            let v = f64::from_ne_bytes(w);
            *o = if beta == 0.0 {
                alpha * v
            } else {
                alpha * v + beta * *o
            };
        }
        Ok(())
    })
}

/// The first Python error of a solve, kept for the caller (the solver itself sees a library
/// error and stops).
#[derive(Default)]
pub struct Kept(Mutex<Option<PyErr>>);

impl Kept {
    /// Keep `e` (the first one) and turn it into the library error that stops the solve.
    fn keep(&self, e: PyErr, what: &str) -> Error {
        if let Ok(mut k) = self.0.lock() {
            k.get_or_insert(e);
        }
        Error::Invalid(format!("{what} raised an exception in Python"))
    }
    /// The kept Python error, if any.
    pub fn take(&self) -> Option<PyErr> {
        self.0.lock().ok().and_then(|mut k| k.take())
    }
}

/// A matrix given by its products in Python, as an operator of the CPU backend.
pub struct PyOperator {
    /// The `seistomo._Products` wrapper.
    obj: Py<PyAny>,
    m: usize,
    n: usize,
    pub errors: Kept,
}

impl PyOperator {
    pub fn new(obj: Py<PyAny>, (m, n): (usize, usize)) -> Self {
        PyOperator {
            obj,
            m,
            n,
            errors: Kept::default(),
        }
    }
    fn product(
        &self,
        method: &str,
        s: Scale,
        input: &[f64],
        out: &mut [f64],
    ) -> seistomo::Result<()> {
        call_product(&self.obj, method, input, (s.alpha, s.beta), out)
            .map_err(|e| self.errors.keep(e, method))
    }
}

impl Operator<CpuBackend> for PyOperator {
    fn nrows(&self) -> usize {
        self.m
    }
    fn ncols(&self) -> usize {
        self.n
    }
    fn apply(
        &self,
        _be: &CpuBackend,
        s: Scale,
        x: &Vec<f64>,
        y: &mut Vec<f64>,
    ) -> seistomo::Result<()> {
        self.product("matvec", s, x, y)
    }
    fn apply_t(
        &self,
        _be: &CpuBackend,
        s: Scale,
        y: &Vec<f64>,
        x: &mut Vec<f64>,
    ) -> seistomo::Result<()> {
        self.product("rmatvec", s, y, x)
    }
}

/// GMRES's M given in Python (z = M r by its `matvec`), applied on the host; errors are kept
/// in a shared [`Kept`].
pub struct PyPrecond {
    obj: Py<PyAny>,
    name: String,
    errors: std::sync::Arc<Kept>,
}

impl PyPrecond {
    pub fn new(obj: Py<PyAny>, name: String, errors: std::sync::Arc<Kept>) -> Self {
        PyPrecond { obj, name, errors }
    }
}

impl HostPreconditioner for PyPrecond {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn apply(&mut self, r: &[f64], z: &mut [f64]) -> seistomo::Result<()> {
        call_product(&self.obj, "matvec", r, (1.0, 0.0), z)
            .map_err(|e| self.errors.keep(e, "M.matvec"))
    }
}
