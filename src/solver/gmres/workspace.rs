//! The vectors and host arrays of GMRES(m), allocated once before the first iteration.

use super::lsq::Givens;
use crate::backend::Backend;
use crate::comm::Comm;
use crate::error::Result;

/// The vectors and host arrays of GMRES(m), sized once for n local rows.
pub struct GmresWorkspace<B: Backend> {
    pub(super) m: usize,
    pub(super) n: usize,
    /// Krylov basis V_0..V_m.
    pub(super) v: Vec<B::Vector>,
    /// Arnoldi work vector.
    pub(super) w: B::Vector,
    /// Residual b - A x.
    pub(super) r: B::Vector,
    /// Temporary (A v before a left preconditioner, M^-1 v before A with a right one).
    pub(super) t: B::Vector,
    /// Hessenberg matrix, column-major (m+1) x m.
    pub(super) h: Vec<f64>,
    /// Givens rotations and the rotated right-hand side.
    pub(super) rot: Givens,
    pub(super) y: Vec<f64>,
    /// 2 (m+1) coefficients.
    pub(super) coef: Vec<f64>,
    /// DCGS2: the Hessenberg matrix before the rotations (column j-1 is corrected at step j).
    pub(super) hraw: Vec<f64>,
    /// DCGS2: the 2 (m+1) + 1 numbers of a step's single reduction.
    pub(super) red: Vec<f64>,
    /// Device Arnoldi loop: per step [V^T w (m+1) | CGS2's second pass (m+1) | ||w||^2] on the
    /// backend, and their host copy.
    pub(super) sc: B::Vector,
    pub(super) sc_host: Vec<f64>,
}

/// Entries per step in the device Arnoldi loop's scalars (see [`GmresWorkspace`]).
pub(super) fn sc_stride(m: usize) -> usize {
    2 * (m + 1) + 1
}

impl<B: Backend> GmresWorkspace<B> {
    /// Allocate everything GMRES(m) needs for vectors of `n` local entries.
    pub fn new(be: &B, n: usize, m: usize) -> Result<Self> {
        let m = m.max(1);
        let v = (0..=m).map(|_| be.zeros(n)).collect::<Result<Vec<_>>>()?;
        Ok(GmresWorkspace {
            m,
            n,
            v,
            w: be.zeros(n)?,
            r: be.zeros(n)?,
            t: be.zeros(n)?,
            h: vec![0.0; (m + 1) * m],
            rot: Givens::new(m),
            y: vec![0.0; m],
            // two columns of coefficients: CGS2's two passes
            coef: vec![0.0; 2 * (m + 1)],
            hraw: vec![0.0; (m + 1) * m],
            red: vec![0.0; 2 * (m + 1) + 1],
            sc: be.zeros(m * sc_stride(m))?,
            sc_host: vec![0.0; m * sc_stride(m)],
        })
    }
}

/// Global 2-norm of a row-distributed vector.
pub(super) fn gnorm<B: Backend>(be: &B, comm: &dyn Comm, x: &B::Vector) -> Result<f64> {
    Ok(comm.allreduce_scalar(be.norm_sq(x)?)?.max(0.0).sqrt())
}

/// Global 2-norm that neither underflows nor overflows ([`crate::solver::robust_norm`], with
/// `scratch` for its rescaled copy; the same bits as [`gnorm`] wherever that is in range, NaN
/// where [`gnorm`] says 0). For the norms the verdict is taken on (||b||, ||M^-1 b||, the
/// residuals).
pub(super) fn gnorm_robust<B: Backend>(
    be: &B,
    comm: &dyn Comm,
    x: &B::Vector,
    scratch: &mut B::Vector,
) -> Result<f64> {
    crate::solver::robust_norm(be, x, &|s| comm.allreduce_scalar(s), Some(scratch))
}
