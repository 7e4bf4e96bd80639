//! Iterative solvers, written once over [`crate::backend::Backend`], [`crate::backend::Operator`]
//! and [`crate::comm::Comm`].

mod bidiag;
pub mod dist_square;
pub mod gmres;
pub mod lsmr;
pub mod lsqr;
pub mod lsqr_batch;
pub mod lsqr_damps;

pub use lsmr::{lsmr, LsmrInfo, LsmrSolution};
pub use lsqr::{
    lsqr_iterate, lsqr_start, History, IterRecord, LsqrInfo, LsqrMonitor, LsqrNorms, LsqrParams,
    LsqrScalars, LsqrVectors, NoMonitor,
};
pub use lsqr_damps::lsqr_damps;

use crate::backend::{Backend, Operator};
use crate::comm::Comm;
use crate::error::Result;

/// Which Golub-Kahan least-squares solver an LSQR-shaped job runs (`solve --method`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LsqMethod {
    /// LSQR (Paige & Saunders 1982): ||r|| decreases monotonically.
    #[default]
    Lsqr,
    /// LSMR (Fong & Saunders 2011): ||A^T r|| decreases monotonically.
    Lsmr,
}

choice_from_str!(LsqMethod, "least-squares method", "lsqr" => Self::Lsqr, "lsmr" => Self::Lsmr);

impl LsqMethod {
    /// "lsqr" or "lsmr" (report.json's `method`).
    pub fn name(self) -> &'static str {
        match self {
            LsqMethod::Lsqr => "lsqr",
            LsqMethod::Lsmr => "lsmr",
        }
    }
}

/// The host-side result of an LSQR solve.
#[derive(Debug, Clone)]
pub struct LsqrSolution {
    pub x: Vec<f64>,
    /// Diagonal estimate of (A^T A + damp^2 I)^-1 when asked for: a lower bound.
    pub var: Option<Vec<f64>>,
    pub info: LsqrInfo,
}

/// A least-squares problem as this rank holds it: min ||b - A x|| for A this rank's rows (`op`
/// on `be`), b this rank's entries and x0 over all columns (zero by default), the ranks joined
/// by `comm`. [`lsqr()`] and [`lsmr()`] solve it.
pub struct LeastSquares<'a, B, O> {
    pub be: &'a B,
    pub op: &'a O,
    pub comm: &'a dyn Comm,
    pub b: &'a [f64],
    pub x0: Option<&'a [f64]>,
}

impl<B, O> Clone for LeastSquares<'_, B, O> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B, O> Copy for LeastSquares<'_, B, O> {}

impl<'a, B, O> LeastSquares<'a, B, O> {
    /// The problem from x0 = 0.
    pub fn new(be: &'a B, op: &'a O, comm: &'a dyn Comm, b: &'a [f64]) -> Self {
        LeastSquares {
            be,
            op,
            comm,
            b,
            x0: None,
        }
    }
    /// The same problem from `x0` (None: zero).
    pub fn x0(self, x0: Option<&'a [f64]>) -> Self {
        LeastSquares { x0, ..self }
    }
}

/// Upload b (this rank's rows) and x0, run LSQR to a stop, download x (and var).
pub fn lsqr<B: Backend, O: Operator<B>>(
    p: &LeastSquares<'_, B, O>,
    params: &LsqrParams,
    monitor: &mut dyn LsqrMonitor<B>,
) -> Result<LsqrSolution> {
    let (be, op, comm) = (p.be, p.op, p.comm);
    let bd = be.upload(p.b)?;
    let x0d = p.x0.map(|x| be.upload(x)).transpose()?;
    let (mut s, mut v) = lsqr_start(be, op, comm, &bd, x0d.as_ref(), params)?;
    drop(bd);
    let info = lsqr_iterate(be, op, comm, params, &mut s, &mut v, monitor)?;
    download_solution(be, &v, info)
}

/// x (and var) of a finished LSQR, downloaded from the backend.
pub fn download_solution<B: Backend>(
    be: &B,
    v: &LsqrVectors<B::Vector>,
    info: LsqrInfo,
) -> Result<LsqrSolution> {
    let x = be.to_host(&v.x)?;
    let var = v.var.as_ref().map(|d| be.to_host(d)).transpose()?;
    Ok(LsqrSolution { x, var, info })
}

/// 2^600 and its inverse: exact scalings that bring any finite vector's squares into range.
const BIG: f64 = f64::from_bits((1023 + 600) << 52);
const SMALL: f64 = f64::from_bits((1023 - 600) << 52);

/// ||x||, with the sum of squares reduced by `reduce` (over ranks for a row-distributed
/// vector, the identity for a replicated one), such that it neither underflows nor overflows:
/// sqrt of the sum as usual (the same bits) wherever the sum is in [2^-600, inf); where it is
/// below (squares of entries under ~1e-154 are subnormal or zero) or infinite, once more on x
/// scaled by 2^600 or 2^-600 (exact) into `scratch`, or a vector allocated then if None. One
/// more reduction, only then, and on every rank alike (the sum is global). NaN stays NaN.
pub(crate) fn robust_norm<B: Backend>(
    be: &B,
    x: &B::Vector,
    reduce: &dyn Fn(f64) -> Result<f64>,
    scratch: Option<&mut B::Vector>,
) -> Result<f64> {
    let s = reduce(be.norm_sq(x)?)?;
    let (up, down) = if s.is_nan() {
        return Ok(f64::NAN);
    } else if s == f64::INFINITY {
        (SMALL, BIG)
    } else if s < SMALL {
        (BIG, SMALL)
    } else {
        return Ok(s.sqrt());
    };
    let mut own;
    let y = match scratch {
        Some(y) => y,
        None => {
            own = be.zeros(be.len(x))?;
            &mut own
        }
    };
    be.copy_scaled(up, x, y)?;
    Ok(reduce(be.norm_sq(y)?)?.max(0.0).sqrt() * down)
}
