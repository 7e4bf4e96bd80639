//! What LSQR and LSMR share: the Golub-Kahan bidiagonalisation over ranks ([`Dist`]: u split
//! by rows, v replicated; ||u|| a scalar sum over ranks, A^T u one vector reduction), SciPy's
//! stable plane rotation ([`sym_ortho`]) and the stopping cascade that turns the tests into
//! istop ([`istop_of`]).

use super::robust_norm;
use crate::backend::{Backend, Operator, Scale};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// The global operations LSQR and LSMR need, built from a backend, a rank-local operator and
/// a Comm.
pub(crate) struct Dist<'a, B: Backend, O: Operator<B>> {
    pub(crate) be: &'a B,
    pub(crate) op: &'a O,
    pub(crate) comm: &'a dyn Comm,
    /// Scratch for A^T u before the reduction over ranks (None on one rank).
    pub(crate) tmp: Option<B::Vector>,
}

impl<'a, B: Backend, O: Operator<B>> Dist<'a, B, O> {
    /// The operations on `op`, with the reduction's scratch allocated on several ranks.
    pub(crate) fn new(be: &'a B, op: &'a O, comm: &'a dyn Comm) -> Result<Self> {
        let tmp = if comm.size() > 1 {
            Some(be.zeros(op.ncols())?)
        } else {
            None
        };
        Ok(Dist { be, op, comm, tmp })
    }
    /// ||u|| over all ranks (u is distributed by rows). Neither underflows nor overflows
    /// ([`robust_norm`]: a b with entries of 1e-170 has a norm, not 0).
    pub(crate) fn row_norm(&self, u: &B::Vector) -> Result<f64> {
        robust_norm(self.be, u, &|s| self.comm.allreduce_scalar(s), None)
    }
    /// ||v|| (v is replicated on every rank), as robust.
    pub(crate) fn col_norm(&self, v: &B::Vector) -> Result<f64> {
        robust_norm(self.be, v, &|s| Ok(s), None)
    }
    /// x = A^T u + beta x, A^T u summed over ranks.
    pub(crate) fn apply_t(&mut self, u: &B::Vector, beta: f64, x: &mut B::Vector) -> Result<()> {
        match self.tmp.as_mut() {
            None => self.op.apply_t(self.be, Scale::new(1.0, beta), u, x),
            Some(t) => {
                self.op.apply_t(self.be, Scale::SET, u, t)?;
                self.be.allreduce_sum(self.comm, t)?;
                self.be.axpby(1.0, t, beta, x)
            }
        }
    }
    /// The bidiagonalisation's start from u = b - A x0 (its norm `beta`): u normalised, and
    /// alpha v = A^T u. Returns (v, alpha). Where beta = 0, v is `at_zero` (LSQR: x0) or zero.
    pub(crate) fn start(
        &mut self,
        u: &mut B::Vector,
        beta: f64,
        at_zero: Option<&B::Vector>,
    ) -> Result<(B::Vector, f64)> {
        let mut v = self.be.zeros(self.op.ncols())?;
        let mut alpha = 0.0;
        if beta > 0.0 {
            self.be.scale(u, 1.0 / beta)?;
            self.apply_t(u, 0.0, &mut v)?;
            alpha = self.col_norm(&v)?;
        } else if let Some(x) = at_zero {
            self.be.copy(x, &mut v)?;
        }
        if alpha > 0.0 {
            self.be.scale(&mut v, 1.0 / alpha)?;
        }
        Ok((v, alpha))
    }
    /// One Golub-Kahan step from the normalised u, v and the last alpha: beta u = A v - alpha
    /// u, then (where beta > 0) alpha v = A^T u - beta v. Returns (beta, alpha); alpha stays
    /// the last one where beta = 0 (SciPy's lsqr and lsmr alike).
    pub(crate) fn step(
        &mut self,
        alpha: f64,
        u: &mut B::Vector,
        v: &mut B::Vector,
    ) -> Result<(f64, f64)> {
        let be = self.be;
        self.op.apply(be, Scale::new(1.0, -alpha), v, u)?;
        let beta = self.row_norm(u)?;
        let mut alpha = alpha;
        if beta > 0.0 {
            be.scale(u, 1.0 / beta)?;
            self.apply_t(u, -beta, v)?;
            alpha = self.col_norm(v)?;
            if alpha > 0.0 {
                be.scale(v, 1.0 / alpha)?;
            }
        }
        Ok((beta, alpha))
    }
}

/// SciPy's `_sym_ortho`: a stable plane rotation (c, s, r) with c a + s b = r, -s a + c b = 0.
pub(crate) fn sym_ortho(a: f64, b: f64) -> (f64, f64, f64) {
    let sign = |x: f64| {
        if x > 0.0 {
            1.0
        } else if x < 0.0 {
            -1.0
        } else {
            0.0
        }
    };
    if b == 0.0 {
        (sign(a), 0.0, a.abs())
    } else if a == 0.0 {
        (0.0, sign(b), b.abs())
    } else if b.abs() > a.abs() {
        let tau = a / b;
        let s = sign(b) / (1.0 + tau * tau).sqrt();
        let c = s * tau;
        (c, s, b / s)
    } else {
        let tau = b / a;
        let c = sign(a) / (1.0 + tau * tau).sqrt();
        let s = c * tau;
        (c, s, a / c)
    }
}

/// The quantities both solvers stop on (SciPy's names): test1 = ||r|| / ||b||, test2 (the
/// least-squares test, ||A^T r|| / (||A|| ||r||)), test3 = 1 / cond(A), t1 = test1 / (1 +
/// ||A|| ||x|| / ||b||) and rtol = btol + atol ||A|| ||x|| / ||b||.
pub(crate) struct Tests {
    pub(crate) test1: f64,
    pub(crate) test2: f64,
    pub(crate) test3: f64,
    pub(crate) t1: f64,
    pub(crate) rtol: f64,
}

/// SciPy's stopping cascade, in its order (later tests override earlier ones): the machine
/// limits (istop 4-6, the user's tolerances set to eps), then the user's (1-3); 7 at the
/// iteration limit; 0 while none fires.
pub(crate) fn istop_of(t: &Tests, atol: f64, ctol: f64, limit_reached: bool) -> u32 {
    let mut istop = 0;
    if limit_reached {
        istop = 7;
    }
    if 1.0 + t.test3 <= 1.0 {
        istop = 6;
    }
    if 1.0 + t.test2 <= 1.0 {
        istop = 5;
    }
    if 1.0 + t.t1 <= 1.0 {
        istop = 4;
    }
    if t.test3 <= ctol {
        istop = 3;
    }
    if t.test2 <= atol {
        istop = 2;
    }
    if t.test1 <= t.rtol {
        istop = 1;
    }
    istop
}

/// A norm that overflowed (or a NaN) ends the solve: never a result. `norms` are ||r||,
/// ||A^T r||, ||x|| and ||A|| after iteration `itn` of `method`.
pub(crate) fn norms_finite(method: &str, itn: usize, norms: [f64; 4]) -> Result<()> {
    if norms.iter().all(|v| v.is_finite()) {
        return Ok(());
    }
    let [r, ar, x, a] = norms;
    Err(Error::Invalid(format!(
        "{method} iteration {itn}: a norm is not finite (||r|| {r:e}, ||A^T r|| {ar:e}, ||x|| {x:e}, ||A|| {a:e}); the system or damp exceeds double precision"
    )))
}
