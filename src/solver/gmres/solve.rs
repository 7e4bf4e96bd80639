//! The restarted GMRES(m) driver (Ginkgo's `apply_dense_impl`): the initial residual, then
//! cycles of Arnoldi steps ([`super::arnoldi`]), the least-squares update of x
//! ([`super::lsq`]) and the verdict on the recomputed residual ([`super::stopping`]).

use std::time::Instant;

use super::arnoldi::{Cycle, CycleEnd, Problem};
use super::stopping::{Outcome, Progress, StopRule};
use super::workspace::{gnorm, GmresWorkspace};
use super::{ArnoldiLoop, GmresInfo, GmresMonitor, GmresParams, Orthog, PrecondSide};
use crate::backend::precond::Preconditioner;
use crate::backend::{Backend, Operator};
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
    B: Backend,
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
    let bnorm = gnorm(be, comm, b)?;
    let out = Outcome {
        t0,
        bnorm,
        arnoldi_loop,
    };
    if bnorm == 0.0 {
        be.fill(x, 0.0)?;
        let mut progress = Progress {
            monitor,
            t0,
            pbnorm: 1.0,
            its: 0,
        };
        progress.record(0, 0, 0.0, 0.0)?;
        let why = "b = 0: x = 0 is the exact solution";
        return Ok(out.finish((true, why.into()), 0, 0, 0.0, 0.0));
    }
    let mut prob = Problem {
        be,
        op,
        pc,
        comm,
        left,
    };
    let pbnorm = precond_rhs_norm(&mut prob, b, &mut ws.t, bnorm)?;
    let mut progress = Progress {
        monitor,
        t0,
        pbnorm,
        its: 0,
    };
    let mut rule = StopRule::new(params, bnorm, pbnorm);
    let (mut rnorm, mut beta) = prob.residual(b, x, &mut ws.r, &mut ws.v[0])?;
    progress.record(0, 0, beta, progress.seconds())?;
    if rule.met(rnorm, beta) {
        let why = "the initial guess already satisfies the tolerance";
        return Ok(out.finish((true, why.into()), 0, 0, rnorm, beta / pbnorm));
    }
    let mut cycles = 0usize;
    loop {
        let its = progress.its;
        if !(beta.is_finite() && rnorm.is_finite()) {
            return Err(Error::Invalid(format!(
                "GMRES: residual became non-finite after {its} iterations (operator or preconditioner produces NaN/Inf)"
            )));
        }
        cycles += 1;
        let cyc = Cycle {
            number: cycles,
            orthog: params.orthog,
            inner_tol: rule.inner_tol(),
            max_iter: params.max_iter,
            beta,
            device: deferred,
        };
        let CycleEnd { k, est, breakdown } = prob.cycle(ws, &cyc, &mut progress)?;
        prob.update_x(ws, x, k)?;
        let its = progress.its;
        (rnorm, beta) = prob.residual(b, x, &mut ws.r, &mut ws.v[0])?;
        if let Some(verdict) = rule.verdict((its, cycles), breakdown, rnorm, beta) {
            return Ok(out.finish(verdict, its, cycles, rnorm, beta / pbnorm));
        }
        rule.adapt(est, rnorm);
    }
}

/// The parameter checks and that the operator, b, x and the workspace fit together.
fn check_sizes<B: Backend, O: Operator<B>>(
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
fn device_loop<B: Backend>(be: &B, params: &GmresParams) -> bool {
    match params.arnoldi_loop {
        ArnoldiLoop::Host => false,
        ArnoldiLoop::Device => true,
        ArnoldiLoop::Auto => {
            be.defers_scalars() && matches!(params.orthog, Orthog::Cgs | Orthog::Cgs2)
        }
    }
}

/// Norm of the preconditioned right-hand side (the residual of x = 0): ||M^-1 b|| (left,
/// with `t` as scratch) or ||b||. An error when it is zero or not finite.
fn precond_rhs_norm<B, O, P>(
    prob: &mut Problem<'_, B, O, P>,
    b: &B::Vector,
    t: &mut B::Vector,
    bnorm: f64,
) -> Result<f64>
where
    B: Backend,
    O: Operator<B>,
    P: Preconditioner<B> + ?Sized,
{
    let pbnorm = if prob.left {
        prob.pc.apply(prob.be, b, t)?;
        gnorm(prob.be, prob.comm, t)?
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
