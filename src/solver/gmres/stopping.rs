//! The convergence checks of GMRES and what a solve reports: the stopping rule (the cycle's
//! tolerance, the verdict after each cycle, SciPy's adaptive inner tolerance), the history
//! records and the final [`GmresInfo`].

use std::time::Instant;

use super::{ArnoldiLoop, ConvergenceTest, GmresInfo, GmresMonitor, GmresParams, GmresRecord};
use super::{GmresStop, PrecondSide};
use crate::error::Result;

/// Where the history goes: the monitor, the solve's clock, and the norm that makes a residual
/// relative (||M^-1 b|| with left preconditioning, ||b|| with right).
pub(super) struct Progress<'m> {
    pub(super) monitor: &'m mut dyn GmresMonitor,
    pub(super) t0: Instant,
    pub(super) pbnorm: f64,
    /// Inner (Arnoldi) iterations so far.
    pub(super) its: usize,
}

impl Progress<'_> {
    /// Seconds since the solve started.
    pub(super) fn seconds(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
    /// One line of history.
    pub(super) fn record(
        &mut self,
        iteration: usize,
        cycle: usize,
        resnorm: f64,
        seconds: f64,
    ) -> Result<()> {
        self.monitor.record(&GmresRecord {
            iteration,
            cycle,
            resnorm,
            relres: resnorm / self.pbnorm,
            seconds,
        })
    }
}

/// What every verdict reports besides its own numbers.
pub(super) struct Outcome {
    pub(super) t0: Instant,
    pub(super) bnorm: f64,
    pub(super) arnoldi_loop: ArnoldiLoop,
}

/// A verdict: converged or not, and why.
pub(super) type Verdict = (bool, String);

impl Outcome {
    /// The info of a solve that stops after `its` iterations in `cycles` cycles with true
    /// residual norm `rnorm` and relative preconditioned residual `prel`.
    pub(super) fn finish(
        &self,
        (converged, reason): Verdict,
        its: usize,
        cycles: usize,
        rnorm: f64,
        prel: f64,
    ) -> GmresInfo {
        let seconds = self.t0.elapsed().as_secs_f64();
        let bnorm = self.bnorm;
        GmresInfo {
            stop: GmresStop {
                converged,
                reason,
                iterations: its,
                restarts: cycles.saturating_sub(1),
                relres: if bnorm > 0.0 { rnorm / bnorm } else { 0.0 },
                precond_relres: prel,
            },
            bnorm,
            seconds,
            ms_per_iter: if its > 0 {
                1e3 * seconds / its as f64
            } else {
                0.0
            },
            arnoldi_loop: self.arnoldi_loop,
        }
    }
}

/// The stopping rule of a solve: its tolerances, limits and (for
/// [`ConvergenceTest::Scipy`]) the adaptive inner tolerance.
pub(super) struct StopRule {
    scipy: bool,
    left: bool,
    /// max(atol, rtol ||b||).
    true_tol: f64,
    /// max(atol, rtol ||M^-1 b||) (left) or max(atol, rtol ||b||) (right).
    pc_tol: f64,
    /// SciPy 1.10's adaptive inner tolerance and its factor.
    ptol: f64,
    ptol_factor: f64,
    m: usize,
    max_iter: usize,
    max_cycles: Option<usize>,
}

impl StopRule {
    pub(super) fn new(params: &GmresParams, bnorm: f64, pbnorm: f64) -> Self {
        let true_tol = params.atol.max(params.rtol * bnorm);
        StopRule {
            scipy: params.test == ConvergenceTest::Scipy,
            left: params.side == PrecondSide::Left,
            true_tol,
            pc_tol: params.atol.max(params.rtol * pbnorm),
            ptol: pbnorm * (true_tol / bnorm).min(1.0),
            ptol_factor: 1.0,
            m: params.restart,
            max_iter: params.max_iter,
            max_cycles: params.max_cycles,
        }
    }

    /// Whether the recomputed residual (true norm `rnorm`, preconditioned `beta`) meets the
    /// tolerance.
    pub(super) fn met(&self, rnorm: f64, beta: f64) -> bool {
        if self.scipy {
            rnorm <= self.true_tol
        } else {
            beta <= self.pc_tol
        }
    }

    /// The tolerance a cycle's residual estimate is tested against.
    pub(super) fn inner_tol(&self) -> f64 {
        if self.scipy {
            self.ptol
        } else {
            self.pc_tol
        }
    }

    /// After a cycle of `its` iterations (`cycles` so far) whose last step broke down or not,
    /// with the residual recomputed: the verdict, or None to restart.
    pub(super) fn verdict(
        &self,
        (its, cycles): (usize, usize),
        breakdown: bool,
        rnorm: f64,
        beta: f64,
    ) -> Option<Verdict> {
        if self.met(rnorm, beta) {
            let reason = if breakdown {
                "happy breakdown: the Krylov space is invariant and the residual meets the tolerance"
            } else if self.scipy {
                "true residual ||b - A x|| <= rtol ||b||"
            } else if self.left {
                "preconditioned residual ||M^-1 (b - A x)|| <= rtol ||M^-1 b||"
            } else {
                "residual ||b - A x|| <= rtol ||b||"
            };
            return Some((true, reason.into()));
        }
        let m = self.m;
        let why = if breakdown {
            format!(
                "breakdown: the Krylov space became invariant at iteration {its} but the residual is still above the tolerance (singular or ill-conditioned operator/preconditioner)"
            )
        } else if its >= self.max_iter {
            format!("iteration limit: {its} iterations without reaching the tolerance")
        } else if self.max_cycles.is_some_and(|mc| cycles >= mc) {
            format!(
                "cycle limit: {cycles} cycles of GMRES({m}) ({its} iterations) without reaching the tolerance"
            )
        } else {
            return None;
        };
        Some((false, why))
    }

    /// SciPy 1.10's adaptation of the inner tolerance after a cycle that ended with residual
    /// estimate `est` and recomputed true residual `rnorm` (nothing for the other rule).
    pub(super) fn adapt(&mut self, est: f64, rnorm: f64) {
        if !self.scipy {
            return;
        }
        if est > self.ptol {
            self.ptol_factor = (1.5 * self.ptol_factor).min(1.0);
        } else {
            self.ptol_factor = (0.25 * self.ptol_factor).max(1e-16);
        }
        self.ptol = if rnorm != 0.0 {
            est * self.ptol_factor.min(self.true_tol / rnorm)
        } else {
            est * self.ptol_factor
        };
    }
}
