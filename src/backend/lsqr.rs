//! LSQR's plain data: parameters, the scalar state, the vectors and one history record. They
//! live here, below the solver, because a backend may run whole blocks of LSQR iterations on its
//! device ([`LsqrDevice`]); src/solver/lsqr.rs re-exports them and holds the algorithm.

use serde::{Deserialize, Serialize};

use super::Backend;
use crate::error::Result;

/// LSQR parameters, with SciPy's meanings and defaults.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LsqrParams {
    pub damp: f64,
    pub atol: f64,
    pub btol: f64,
    /// Stop when the condition estimate exceeds this (0 disables the test).
    pub conlim: f64,
    /// Default: 2 n (SciPy's).
    pub iter_lim: Option<usize>,
    /// Accumulate the `var` estimate of diag((A^T A + damp^2 I)^-1).
    pub calc_var: bool,
}

impl Default for LsqrParams {
    fn default() -> Self {
        LsqrParams {
            damp: 0.0,
            atol: 1e-6,
            btol: 1e-6,
            conlim: 1e8,
            iter_lim: None,
            calc_var: false,
        }
    }
}

/// The scalar state of LSQR: everything besides the vectors u, v, w, x (and var) that an
/// iteration needs, so that a run can be checkpointed and resumed exactly.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LsqrScalars {
    pub itn: usize,
    pub istop: u32,
    pub alpha: f64,
    pub beta: f64,
    pub rhobar: f64,
    pub phibar: f64,
    pub bnorm: f64,
    pub anorm: f64,
    pub acond: f64,
    pub ddnorm: f64,
    pub res2: f64,
    pub xnorm: f64,
    pub xxnorm: f64,
    pub z: f64,
    pub cs2: f64,
    pub sn2: f64,
    pub rnorm: f64,
    pub r1norm: f64,
    pub r2norm: f64,
    pub arnorm: f64,
}

/// The vectors of LSQR on a backend. `u` has this rank's rows; the others have all columns.
pub struct LsqrVectors<V> {
    pub u: V,
    pub v: V,
    pub w: V,
    pub x: V,
    pub var: Option<V>,
}

/// One line of the convergence history (iteration 0 is the start).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct IterRecord {
    pub itn: usize,
    pub r1norm: f64,
    pub r2norm: f64,
    pub arnorm: f64,
    pub anorm: f64,
    pub acond: f64,
    pub xnorm: f64,
    /// Seconds since the solve started.
    pub seconds: f64,
}

/// Called after each block of device iterations with the block's records, the scalars and
/// the vectors at the block's end (monitoring, checkpoints).
pub type BlockCallback<'a, V> =
    dyn FnMut(&[IterRecord], &LsqrScalars, &LsqrVectors<V>) -> Result<()> + 'a;

/// A backend's device-resident LSQR loop for one operator: iterations run with the scalars on
/// the device and come back to the host in blocks (one synchronisation per block instead of
/// three per iteration). It follows src/solver/lsqr.rs `lsqr_iterate` step for step; the
/// solver hands over to it where it [`LsqrDevice::runs_on`] the job's ranks (see
/// [`super::Operator::lsqr_device`]): with several ranks `v` holds the replicated columns and
/// `u` this rank's rows, and the loop sums A^T u and ||u||^2 over the ranks itself.
pub trait LsqrDevice<B: Backend> {
    /// Iterate from the started (or resumed) `state` (scalars, vectors) until a stopping test
    /// fires, on the ranks of `boundary_comm.1` (collective: every rank calls it). After each
    /// block, `on_block` gets the block's history records, the state and the vectors (u and v
    /// normalised, as the host loop keeps them). Blocks end at every multiple of
    /// `boundary_comm.0` (when > 0: checkpoints land there) and are otherwise the loop's own
    /// size.
    fn iterate(
        &self,
        be: &B,
        params: &LsqrParams,
        state: (&mut LsqrScalars, &mut LsqrVectors<B::Vector>),
        boundary_comm: (usize, &dyn crate::comm::Comm),
        on_block: &mut BlockCallback<'_, B::Vector>,
    ) -> Result<()>;
    /// Whether this loop can run LSQR on `ranks` ranks with `be` (one rank always; several
    /// where the backend sums vectors over the ranks on the device, inside the loop).
    fn runs_on(&self, _be: &B, ranks: usize) -> bool {
        ranks == 1
    }
}
