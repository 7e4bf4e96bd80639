//! The restarted GMRES(m) driver (Ginkgo's `apply_dense_impl`): the initial residual, then
//! cycles of Arnoldi steps ([`super::arnoldi`]), the least-squares update of x
//! ([`super::lsq`]) and the verdict on the recomputed residual ([`super::stopping`]).

use std::time::Instant;

use super::arnoldi::{Cycle, CycleEnd, Problem};
use super::stopping::{Outcome, Progress, Residuals, StopRule};
use super::workspace::{gnorm_robust, GmresWorkspace};
use super::{ArnoldiLoop, GmresInfo, GmresMonitor, GmresParams, Orthog, PrecondSide};
use crate::backend::precond::Preconditioner;
use crate::backend::{Operator, ScalarSlots};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// Solve A x = b by GMRES(m). `b` and `x` hold this rank's rows; `x` is the starting guess on
/// entry and the iterate on return. `ws` must come from [`GmresWorkspace::new`] with the same
/// backend, the operator's local size and `params.restart`.
#[allow(clippy::too_many_arguments)]
pub fn gmres_solve<B, O, P>(
    be: &B,
    op: &O,
    pc: &mut P,
    comm: &dyn Comm,
    b: &B::Vector,
    x: &mut B::Vector,
    params: &GmresParams,
    ws: &mut GmresWorkspace<B>,
    monitor: &mut dyn GmresMonitor,
) -> Result<GmresInfo>
where
    B: ScalarSlots,
    O: Operator<B>,
    P: Preconditioner<B> + ?Sized,
{
    check_sizes(be, op, b, x, params, ws)?;
    let t0 = Instant::now();
    let left = params.side == PrecondSide::Left;
    let deferred = device_loop(be, params);
    let arnoldi_loop = if deferred {
        ArnoldiLoop::Device
    } else {
        ArnoldiLoop::Host
    };
    let bnorm = gnorm_robust(be, comm, b, &mut ws.w)?;
    let mut out = Outcome {
        t0,
        bnorm,
        pbnorm: 1.0,
        arnoldi_loop,
        orthog: params.orthog,
    };
    if bnorm == 0.0 {
        return zero_rhs(be, x, params, &out, monitor);
    }
    let mut prob = Problem {
        be,
        op,
        pc,
        comm,
        left,
    };
    out.pbnorm = precond_rhs_norm(&mut prob, b, ws, bnorm)?;
    let mut progress = Progress {
        monitor,
        t0,
        pbnorm: out.pbnorm,
        its: 0,
    };
    let mut rule = StopRule::new(params, bnorm, out.pbnorm);
    let (rnorm, beta) = prob.residual(ws, b, x)?;
    let mut res = Residuals {
        rnorm,
        beta,
        est: beta,
    };
    progress.record(0, 0, beta, progress.seconds())?;
    if let Some(verdict) = rule.initial(rnorm, beta) {
        return Ok(out.finish(verdict, (0, 0), res, &rule));
    }
    let mut cycles = 0usize;
    loop {
        if !(res.beta.is_finite() && res.rnorm.is_finite()) {
            return Err(Error::Invalid(format!(
                "GMRES: residual became non-finite after {} iterations (operator or preconditioner produces NaN/Inf)",
                progress.its
            )));
        }
        cycles += 1;
        let cyc = Cycle {
            number: cycles,
            orthog: params.orthog,
            inner_tol: rule.inner_tol(),
            max_iter: params.max_iter,
            beta: res.beta,
            device: deferred,
        };
        let CycleEnd { k, est, breakdown } = prob.cycle(ws, &cyc, &mut progress)?;
        prob.update_x(ws, x, k)?;
        if progress.monitor.wants_iterate() {
            progress.monitor.iterate(&be.to_host(x)?)?;
        }
        let (rnorm, beta) = prob.residual(ws, b, x)?;
        res = Residuals { rnorm, beta, est };
        let its = progress.its;
        if let Some(verdict) = rule.verdict((its, cycles), breakdown, rnorm, beta) {
            return Ok(out.finish(verdict, (its, cycles), res, &rule));
        }
        rule.adapt(est, rnorm);
    }
}

/// b = 0: x = 0 is the exact solution (one record of history, iteration 0).
fn zero_rhs<B: ScalarSlots>(
    be: &B,
    x: &mut B::Vector,
    params: &GmresParams,
    out: &Outcome,
    monitor: &mut dyn GmresMonitor,
) -> Result<GmresInfo> {
    be.fill(x, 0.0)?;
    let mut progress = Progress {
        monitor,
        t0: out.t0,
        pbnorm: 1.0,
        its: 0,
    };
    progress.record(0, 0, 0.0, 0.0)?;
    let why = "b = 0: x = 0 is the exact solution";
    let zero = Residuals {
        rnorm: 0.0,
        beta: 0.0,
        est: 0.0,
    };
    let rule = StopRule::new(params, 0.0, 1.0);
    Ok(out.finish((true, why.into()), (0, 0), zero, &rule))
}

/// The parameter checks and that the operator, b, x and the workspace fit together.
fn check_sizes<B: ScalarSlots, O: Operator<B>>(
    be: &B,
    op: &O,
    b: &B::Vector,
    x: &B::Vector,
    params: &GmresParams,
    ws: &GmresWorkspace<B>,
) -> Result<()> {
    params.check()?;
    let n = op.nrows();
    if op.ncols() != n {
        return Err(Error::Invalid(format!(
            "GMRES needs a square (locally square) operator; got {} x {}",
            n,
            op.ncols()
        )));
    }
    if be.len(b) != n || be.len(x) != n {
        return Err(Error::Invalid(format!(
            "GMRES: b has {} and x has {} entries but the operator has {n} local rows",
            be.len(b),
            be.len(x)
        )));
    }
    if ws.n != n || ws.m != params.restart {
        return Err(Error::Invalid(format!(
            "GMRES workspace sized for n = {}, m = {} but the solve has n = {n}, m = {}",
            ws.n, ws.m, params.restart
        )));
    }
    Ok(())
}

/// Whether the cycles run in the device loop (asked for, or `auto` on a backend that keeps
/// its scalars away from the host, with cgs or cgs2).
fn device_loop<B: ScalarSlots>(be: &B, params: &GmresParams) -> bool {
    match params.arnoldi_loop {
        ArnoldiLoop::Host => false,
        ArnoldiLoop::Device => true,
        ArnoldiLoop::Auto => {
            be.defers_scalars() && matches!(params.orthog, Orthog::Cgs | Orthog::Cgs2)
        }
    }
}

/// Norm of the preconditioned right-hand side (the residual of x = 0): ||M^-1 b|| (left, in
/// the workspace's t) or ||b||. An error when it is zero or not finite.
fn precond_rhs_norm<B, O, P>(
    prob: &mut Problem<'_, B, O, P>,
    b: &B::Vector,
    ws: &mut GmresWorkspace<B>,
    bnorm: f64,
) -> Result<f64>
where
    B: ScalarSlots,
    O: Operator<B>,
    P: Preconditioner<B> + ?Sized,
{
    let pbnorm = if prob.left {
        prob.pc.apply(prob.be, b, &mut ws.t)?;
        gnorm_robust(prob.be, prob.comm, &ws.t, &mut ws.w)?
    } else {
        bnorm
    };
    if !pbnorm.is_finite() || pbnorm == 0.0 {
        return Err(Error::Invalid(format!(
            "GMRES: the preconditioned right-hand side has norm {pbnorm} (singular or invalid preconditioner)"
        )));
    }
    Ok(pbnorm)
}
