//! The convergence checks of GMRES and what a solve reports: the stopping rule (the cycle's
//! tolerance, the verdict after each cycle, SciPy's adaptive inner tolerance), the history
//! records and the final [`GmresInfo`].

use std::time::Instant;

use super::{ArnoldiLoop, ConvergenceTest, GmresInfo, GmresMonitor, GmresParams, GmresRecord};
use super::{GmresStop, PrecondSide, MAX_TIGHTENINGS};
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
    /// ||M^-1 b|| (left) or ||b||: what the preconditioned residuals are relative to.
    pub(super) pbnorm: f64,
    pub(super) arnoldi_loop: ArnoldiLoop,
    /// The orthogonalisation that runs (`auto` resolved).
    pub(super) orthog: super::Orthog,
}

/// A verdict: converged or not, and why.
pub(super) type Verdict = (bool, String);

/// The residual norms of an iterate: the true ||b - A x||, the recomputed preconditioned
/// ||M^-1 (b - A x)|| (left; the true one with right), and the Arnoldi recurrence's estimate.
#[derive(Debug, Clone, Copy)]
pub(super) struct Residuals {
    pub(super) rnorm: f64,
    pub(super) beta: f64,
    pub(super) est: f64,
}

impl Outcome {
    /// The info of a solve that stops after `its` iterations in `cycles` cycles with the
    /// residuals `res`, and what the stopping rule did.
    pub(super) fn finish(
        &self,
        (converged, reason): Verdict,
        (its, cycles): (usize, usize),
        res: Residuals,
        rule: &StopRule,
    ) -> GmresInfo {
        let seconds = self.t0.elapsed().as_secs_f64();
        let (bnorm, pbnorm) = (self.bnorm, self.pbnorm);
        GmresInfo {
            stop: GmresStop {
                converged,
                reason,
                iterations: its,
                restarts: cycles.saturating_sub(1),
                relres: if bnorm > 0.0 { res.rnorm / bnorm } else { 0.0 },
                precond_relres: res.beta / pbnorm,
                implicit_relres: res.est / pbnorm,
                explicit_checks: rule.explicit_checks,
                tightenings: rule.tightenings,
                implicit_rtol: rule.inner_tol() / pbnorm,
            },
            bnorm,
            seconds,
            ms_per_iter: if its > 0 {
                1e3 * seconds / its as f64
            } else {
                0.0
            },
            arnoldi_loop: self.arnoldi_loop,
            orthog: self.orthog,
        }
    }
}

/// A relative preconditioned residual below this is rounding: an implicit target tightened
/// below it cannot be met.
const ATTAINABLE: f64 = 16.0 * f64::EPSILON;

/// What the test of a recomputed residual found.
enum Test {
    Met,
    NotMet,
    /// The solve cannot go on to an honest verdict (loss of accuracy).
    Lost(String),
}

/// The stopping rule of a solve: its tolerances, limits, the implicit target of
/// [`ConvergenceTest::Preconditioned`] and the adaptive inner tolerance of
/// [`ConvergenceTest::Scipy`].
pub(super) struct StopRule {
    test: ConvergenceTest,
    left: bool,
    rtol: f64,
    /// ||b|| and ||M^-1 b|| (left; ||b|| with right): what the residuals are relative to.
    bnorm: f64,
    pbnorm: f64,
    /// max(atol, rtol ||b||): what converged means.
    true_tol: f64,
    /// max(atol, rtol ||M^-1 b||) (left) or max(atol, rtol ||b||) (right).
    pc_tol: f64,
    /// The implicit target for the preconditioned residual: pc_tol, tightened where the true
    /// residual failed.
    imp_tol: f64,
    /// SciPy 1.10's adaptive inner tolerance and its factor.
    ptol: f64,
    ptol_factor: f64,
    m: usize,
    max_iter: usize,
    max_cycles: Option<usize>,
    /// How many times the true residual decided, and how many times imp_tol was tightened.
    explicit_checks: usize,
    tightenings: usize,
}

impl StopRule {
    pub(super) fn new(params: &GmresParams, bnorm: f64, pbnorm: f64) -> Self {
        let true_tol = params.atol.max(params.rtol * bnorm);
        let pc_tol = params.atol.max(params.rtol * pbnorm);
        StopRule {
            test: params.test,
            left: params.side == PrecondSide::Left,
            rtol: params.rtol,
            bnorm,
            pbnorm,
            true_tol,
            pc_tol,
            imp_tol: pc_tol,
            ptol: pbnorm * (true_tol / bnorm).min(1.0),
            ptol_factor: 1.0,
            m: params.restart,
            max_iter: params.max_iter,
            max_cycles: params.max_cycles,
            explicit_checks: 0,
            tightenings: 0,
        }
    }

    /// The tolerance a cycle's residual estimate is tested against.
    pub(super) fn inner_tol(&self) -> f64 {
        match self.test {
            ConvergenceTest::Scipy => self.ptol,
            _ => self.imp_tol,
        }
    }

    /// Test the recomputed residual (true norm `rnorm`, preconditioned `beta`). For
    /// Preconditioned: the implicit test on beta first; where it passes, the true residual
    /// decides, and where that fails the implicit target becomes beta (true_tol / rnorm): the
    /// preconditioned residual at which the true one would pass if their ratio held.
    fn test(&mut self, rnorm: f64, beta: f64) -> Test {
        let met = |ok: bool| if ok { Test::Met } else { Test::NotMet };
        match self.test {
            ConvergenceTest::PreconditionedOnly => met(beta <= self.pc_tol),
            ConvergenceTest::Scipy => {
                self.explicit_checks += 1;
                met(rnorm <= self.true_tol)
            }
            ConvergenceTest::Preconditioned => {
                let implicit_passed = beta <= self.imp_tol;
                // (a non-finite residual is the driver's error, not a verdict)
                if !implicit_passed || !rnorm.is_finite() {
                    return Test::NotMet;
                }
                self.explicit_checks += 1;
                if rnorm <= self.true_tol {
                    return Test::Met;
                }
                let target = beta * (self.true_tol / rnorm);
                let attainable = target > ATTAINABLE * self.pbnorm;
                if self.tightenings == MAX_TIGHTENINGS || !attainable {
                    return Test::Lost(self.loss_of_accuracy(rnorm, beta, target));
                }
                self.tightenings += 1;
                self.imp_tol = target.min(self.imp_tol);
                Test::NotMet
            }
        }
    }

    /// Why the solve stops where the preconditioned residual passes and the true one does not
    /// (`target`: what the implicit target would have to become).
    fn loss_of_accuracy(&self, rnorm: f64, beta: f64, target: f64) -> String {
        let (n, trel, rtol) = (self.explicit_checks, rnorm / self.bnorm, self.rtol);
        let (tn, want) = (self.tightenings, target / self.pbnorm);
        if beta == 0.0 {
            format!(
                "the preconditioned residual ||M^-1 (b - A x)|| is 0 but the true residual ||b - A x|| / ||b|| = {trel:.3e} is above rtol {rtol:e} (singular preconditioner?)"
            )
        } else if tn == MAX_TIGHTENINGS {
            format!(
                "loss of accuracy: the preconditioned residual met its target {n} times (tightened {tn} times, the last to {:.3e} relative), but the true residual ||b - A x|| / ||b|| = {trel:.3e} stayed above rtol {rtol:e}",
                self.imp_tol / self.pbnorm
            )
        } else {
            format!(
                "loss of accuracy: the true residual ||b - A x|| / ||b|| = {trel:.3e} is above rtol {rtol:e} where the preconditioned one is {:.3e}; meeting rtol would take a preconditioned residual of {want:.3e} relative, below what double precision resolves",
                beta / self.pbnorm
            )
        }
    }

    /// Whether the initial guess already meets the rule: Some(verdict) to stop.
    pub(super) fn initial(&mut self, rnorm: f64, beta: f64) -> Option<Verdict> {
        match self.test(rnorm, beta) {
            Test::Met => {
                let why = "the initial guess already satisfies the tolerance";
                Some((true, why.into()))
            }
            Test::Lost(why) => Some((false, why)),
            Test::NotMet => None,
        }
    }

    /// After a cycle of `its` iterations (`cycles` so far) whose last step broke down or not,
    /// with the residual recomputed: the verdict, or None to restart.
    pub(super) fn verdict(
        &mut self,
        (its, cycles): (usize, usize),
        breakdown: bool,
        rnorm: f64,
        beta: f64,
    ) -> Option<Verdict> {
        match self.test(rnorm, beta) {
            Test::Met => return Some((true, self.reason(breakdown).into())),
            Test::Lost(why) => return Some((false, why)),
            Test::NotMet => {}
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

    /// Why a converged solve converged.
    fn reason(&self, breakdown: bool) -> &'static str {
        let petsc = self.test == ConvergenceTest::PreconditionedOnly;
        match (breakdown, petsc && self.left) {
            (true, false) => "happy breakdown: the Krylov space is invariant and the true residual meets the tolerance",
            (true, true) => "happy breakdown: the Krylov space is invariant and the preconditioned residual meets the tolerance (the true residual was not checked)",
            (false, true) => "preconditioned residual ||M^-1 (b - A x)|| <= rtol ||M^-1 b|| (PETSc's rule: the true residual ||b - A x|| was not checked)",
            (false, false) if self.test == ConvergenceTest::Scipy => "true residual ||b - A x|| <= rtol ||b||",
            (false, false) if self.left => "true residual ||b - A x|| <= rtol ||b||, checked once the preconditioned residual ||M^-1 (b - A x)|| met its target",
            (false, false) => "residual ||b - A x|| <= rtol ||b||",
        }
    }

    /// SciPy 1.10's adaptation of the inner tolerance after a cycle that ended with residual
    /// estimate `est` and recomputed true residual `rnorm` (nothing for the other rules).
    pub(super) fn adapt(&mut self, est: f64, rnorm: f64) {
        if self.test != ConvergenceTest::Scipy {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(test: ConvergenceTest) -> StopRule {
        let params = GmresParams {
            rtol: 1e-8,
            test,
            ..GmresParams::default()
        };
        // ||b|| = 1, ||M^-1 b|| = 1e-3
        StopRule::new(&params, 1.0, 1e-3)
    }

    /// The preconditioned residual passes every time, the true one never: the target is
    /// tightened by the ratio of the two each time, MAX_TIGHTENINGS times, then the solve
    /// stops with loss of accuracy.
    #[test]
    fn tightening_by_the_ratio_then_loss_of_accuracy() {
        let mut r = rule(ConvergenceTest::Preconditioned);
        assert_eq!(r.inner_tol(), 1e-8 * 1e-3);
        let (its, cycles) = (10, 1);
        for k in 0..MAX_TIGHTENINGS {
            let beta = 0.5 * r.inner_tol();
            // the true residual 4x its tolerance: the target becomes beta / 4
            assert!(r.verdict((its, cycles), false, 4e-8, beta).is_none());
            assert_eq!(r.tightenings, k + 1);
            assert_eq!(r.explicit_checks, k + 1);
            assert_eq!(r.inner_tol(), beta * 0.25);
        }
        let beta = 0.5 * r.inner_tol();
        let (conv, why) = r.verdict((its, cycles), false, 4e-8, beta).unwrap();
        assert!(!conv && why.contains("loss of accuracy"), "{why}");
        assert_eq!(r.explicit_checks, MAX_TIGHTENINGS + 1);
        // a preconditioned residual of exactly 0 with a true one above: no target to tighten to
        let mut r = rule(ConvergenceTest::Preconditioned);
        let (conv, why) = r.verdict((its, cycles), false, 1.0, 0.0).unwrap();
        assert!(!conv && why.contains("is 0"), "{why}");
    }

    /// The true residual decides for Preconditioned and Scipy; PETSc's rule converges on the
    /// preconditioned one and says that it did not check the true one.
    #[test]
    fn who_decides() {
        let (its, cycles) = (10, 1);
        let mut r = rule(ConvergenceTest::Preconditioned);
        let v = r.verdict((its, cycles), false, 1e-9, 1e-12).unwrap();
        assert!(v.0 && v.1.contains("true residual"), "{v:?}");
        assert_eq!((r.explicit_checks, r.tightenings), (1, 0));
        // the preconditioned residual above its target: no explicit check, restart
        let mut r = rule(ConvergenceTest::Preconditioned);
        assert!(r.verdict((its, cycles), false, 1e-9, 1e-10).is_none());
        assert_eq!(r.explicit_checks, 0);
        let mut r = rule(ConvergenceTest::PreconditionedOnly);
        let v = r.verdict((its, cycles), false, 1.0, 1e-12).unwrap();
        assert!(v.0 && v.1.contains("not checked"), "{v:?}");
        assert_eq!(r.explicit_checks, 0);
        let mut r = rule(ConvergenceTest::Scipy);
        assert!(r.verdict((its, cycles), false, 1e-7, 1e-14).is_none());
        assert!(r.verdict((its, cycles), false, 1e-9, 1.0).unwrap().0);
        assert_eq!(r.explicit_checks, 2);
        // NaN never converges
        let mut r = rule(ConvergenceTest::Preconditioned);
        assert!(r
            .verdict((its, cycles), false, f64::NAN, f64::NAN)
            .is_none());
    }
}
