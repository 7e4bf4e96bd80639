//! LSMR's plain data: the scalar state (SciPy's names), the vectors and the limits. They live
//! here, below the solver, because a backend may run whole blocks of LSMR iterations on its
//! device ([`LsmrDevice`]), as it may LSQR's (src/backend/lsqr.rs); src/solver/lsmr.rs holds
//! the algorithm.

use super::lsqr::IterRecord;
use super::Backend;
use crate::error::Result;

/// LSMR's scalars (SciPy's names).
#[derive(Debug, Clone, Default)]
pub struct LsmrScalars {
    pub itn: usize,
    pub istop: u32,
    pub alpha: f64,
    pub beta: f64,
    pub normb: f64,
    // the rotations
    pub zetabar: f64,
    pub alphabar: f64,
    pub rho: f64,
    pub rhobar: f64,
    pub cbar: f64,
    pub sbar: f64,
    pub zeta: f64,
    // the estimate of ||r||
    pub betadd: f64,
    pub betad: f64,
    pub rhodold: f64,
    pub tautildeold: f64,
    pub thetatilde: f64,
    pub d: f64,
    // the estimates of ||A|| and cond(A)
    pub norma2: f64,
    pub maxrbar: f64,
    pub minrbar: f64,
    pub norma: f64,
    pub conda: f64,
    pub normx: f64,
    pub normr: f64,
    pub normar: f64,
}

impl LsmrScalars {
    /// The history record of the current iteration, in LSQR's fields (r1norm = r2norm =
    /// normr, arnorm = normar).
    pub fn record(&self, seconds: f64) -> IterRecord {
        IterRecord {
            itn: self.itn,
            r1norm: self.normr,
            r2norm: self.normr,
            arnorm: self.normar,
            anorm: self.norma,
            acond: self.conda,
            xnorm: self.normx,
            seconds,
        }
    }
}

/// LSMR's vectors: u this rank's rows, the others all columns.
#[derive(Debug, Clone)]
pub struct LsmrVectors<V> {
    pub u: V,
    pub v: V,
    pub h: V,
    pub hbar: V,
    pub x: V,
}

/// The constants of LSMR's iterations.
#[derive(Debug, Clone, Copy)]
pub struct LsmrLimits {
    pub maxiter: usize,
    pub damp: f64,
    pub atol: f64,
    pub btol: f64,
    /// 1 / conlim (0 where conlim is 0: no condition limit).
    pub ctol: f64,
}

/// What a device loop hands back after each block: the block's history records, the state
/// and the vectors (u and v normalised, as the host loop keeps them).
pub type LsmrBlockCallback<'a, V> =
    dyn FnMut(&[IterRecord], &LsmrScalars, &LsmrVectors<V>) -> Result<()> + 'a;

/// A backend's device-resident LSMR loop for one operator (one rank): iterations run with the
/// scalars on the device and come back in blocks, one synchronisation per block instead of
/// three per iteration. It follows src/solver/lsmr.rs `step` step for step.
pub trait LsmrDevice<B: Backend> {
    /// Iterate from the started `state` until a stopping test fires or `lim.maxiter`. Blocks
    /// end at every multiple of `boundary` (when > 0: where the caller wants to see x) and are
    /// otherwise the loop's own size; `on_block` gets each block.
    fn iterate_lsmr(
        &self,
        be: &B,
        lim: &LsmrLimits,
        state: (&mut LsmrScalars, &mut LsmrVectors<B::Vector>),
        boundary: usize,
        on_block: &mut LsmrBlockCallback<'_, B::Vector>,
    ) -> Result<()>;
}
