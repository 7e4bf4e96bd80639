//! LSQR (Paige & Saunders 1982, ACM TOMS 8(1) 43-71), following SciPy's `lsqr` step for step so
//! that istop, iterations and norms agree with it.
//!
//! Solves min ||b - A x||^2 + damp^2 ||x - x0||^2 (with no x0, ||x||). Distributed over ranks the
//! paper's way (Huang et al. 2012): each rank holds its rows of A and of u, and a full copy of
//! x, v and w; ||u|| is a scalar sum over ranks and A^T u is summed over ranks with one vector
//! reduction per iteration. Nothing here calls rayon, MPI or CUDA: only [`Backend`], [`Operator`]
//! and [`Comm`].

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::bidiag::{istop_of, norms_finite, sym_ortho, Dist, Tests};
pub use crate::backend::lsqr::{IterRecord, LsqrParams, LsqrScalars, LsqrVectors};
use crate::backend::{Backend, Operator, Scale, XwState, XwStep};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// SciPy's istop words.
pub fn stop_reason(istop: u32) -> &'static str {
    match istop {
        0 => "the starting x (0, or x0) is already a solution: b - A x = 0, or A^T (b - A x) = 0 (a least-squares solution); no iterations were needed",
        1 => "Ax - b is small enough, given atol, btol",
        2 => "the least-squares solution is good enough, given atol",
        3 => "the estimate of cond(Abar) has exceeded conlim",
        4 => "Ax - b is small enough for this machine",
        5 => "the least-squares solution is good enough for this machine",
        6 => "cond(Abar) seems to be too large for this machine",
        7 => "the iteration limit has been reached",
        _ => "unknown stop code",
    }
}

/// LSQR's estimates at its stop, with SciPy's names: ||b - A x|| (r1norm), the damped
/// residual (r2norm), ||A|| (Frobenius, anorm), cond(A) (acond), ||A^T r|| (arnorm), ||x||.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LsqrNorms {
    pub r1norm: f64,
    pub r2norm: f64,
    pub anorm: f64,
    pub acond: f64,
    pub arnorm: f64,
    pub xnorm: f64,
}

/// What LSQR reports, as SciPy's `lsqr` returns it (x and var are downloaded separately).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LsqrInfo {
    pub istop: u32,
    pub stop_reason: String,
    pub itn: usize,
    #[serde(flatten)]
    pub norms: LsqrNorms,
    /// Seconds of the iterations run in this call.
    pub seconds: f64,
    /// The iteration this call started from (0, or where a resumed run picked up): `itn -
    /// start_itn` iterations took `seconds`.
    #[serde(default)]
    pub start_itn: usize,
}

/// Called with every iteration's record (from iteration 0) and, after each iteration, with the
/// full state (for checkpoints). Returning an error stops the solve with that error.
pub trait LsqrMonitor<B: Backend> {
    fn record(&mut self, _rec: &IterRecord) -> Result<()> {
        Ok(())
    }
    fn state(&mut self, _backend: &B, _s: &LsqrScalars, _v: &LsqrVectors<B::Vector>) -> Result<()> {
        Ok(())
    }
    /// Iterations at which `state` must see the vectors (checkpoints; 0: none). A device loop
    /// ends its blocks there.
    fn checkpoint_every(&self) -> usize {
        0
    }
    /// LSMR's iterate x after iteration `itn`, after every iteration (LSQR shows its vectors
    /// through `state`). The Python module's `callback_type="x"`; the default ignores it.
    fn lsmr_iterate(&mut self, _backend: &B, _itn: usize, _x: &B::Vector) -> Result<()> {
        Ok(())
    }
}

/// A monitor that does nothing.
pub struct NoMonitor;
impl<B: Backend> LsqrMonitor<B> for NoMonitor {}

/// A monitor that keeps the history in memory.
#[derive(Default)]
pub struct History(pub Vec<IterRecord>);
impl<B: Backend> LsqrMonitor<B> for History {
    fn record(&mut self, rec: &IterRecord) -> Result<()> {
        self.0.push(*rec);
        Ok(())
    }
}

/// Set up LSQR: u = b - A x0 normalised, v = A^T u normalised, w = v. `b` holds this rank's
/// rows; `x0` (all columns) defaults to zero.
pub fn lsqr_start<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    comm: &dyn Comm,
    b: &B::Vector,
    x0: Option<&B::Vector>,
    params: &LsqrParams,
) -> Result<(LsqrScalars, LsqrVectors<B::Vector>)> {
    let (m, n) = (op.nrows(), op.ncols());
    if be.len(b) != m {
        return Err(Error::Invalid(format!(
            "right-hand side has {} entries but the matrix has {m} rows here",
            be.len(b)
        )));
    }
    check_params(params)?;
    let mut d = Dist {
        be,
        op,
        comm,
        tmp: None,
    };
    let mut u = be.zeros(m)?;
    be.copy(b, &mut u)?;
    let bnorm = d.row_norm(&u)?;
    let mut x = be.zeros(n)?;
    let beta = match x0 {
        None => bnorm,
        Some(x0) => {
            if be.len(x0) != n {
                return Err(Error::Invalid(format!(
                    "x0 has {} entries but the matrix has {n} columns",
                    be.len(x0)
                )));
            }
            be.copy(x0, &mut x)?;
            op.apply(be, Scale::new(-1.0, 1.0), &x, &mut u)?;
            d.row_norm(&u)?
        }
    };
    if comm.size() > 1 {
        d.tmp = Some(be.zeros(n)?);
    }
    let (v, alpha) = d.start(&mut u, beta, Some(&x))?;
    let mut w = be.zeros(n)?;
    be.copy(&v, &mut w)?;
    let var = if params.calc_var {
        Some(be.zeros(n)?)
    } else {
        None
    };
    let s = LsqrScalars {
        alpha,
        beta,
        rhobar: alpha,
        phibar: beta,
        bnorm,
        cs2: -1.0,
        rnorm: beta,
        r1norm: beta,
        r2norm: beta,
        arnorm: alpha * beta,
        ..Default::default()
    };
    Ok((s, LsqrVectors { u, v, w, x, var }))
}

/// The parameter checks LSQR makes (the MPI pipeline runs them up front on every rank).
/// The largest damping LSQR accepts: damp^2 times any norm of a sane system stays finite.
pub const MAX_DAMP: f64 = 1e100;

pub fn check_params(p: &LsqrParams) -> Result<()> {
    for (name, v) in [
        ("damp", p.damp),
        ("atol", p.atol),
        ("btol", p.btol),
        ("conlim", p.conlim),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Error::Invalid(format!(
                "LSQR parameter {name} must be finite and >= 0 (got {v})"
            )));
        }
    }
    if p.damp > MAX_DAMP {
        return Err(Error::Invalid(format!(
            "LSQR parameter damp must be <= {MAX_DAMP:e} (got {:e}): its square would overflow",
            p.damp
        )));
    }
    Ok(())
}

/// SciPy's stopping tests on this iteration's estimates, in its order (later tests override
/// earlier ones), into `s.istop`. One change (issue 35): test2 = ||A^T r|| / (||A|| ||r|| +
/// eps) is scale-free where ||A|| ||r|| >= eps only; below (a tiny b, not a solved system) it
/// is ||A^T r|| / (||A|| ||r||), else a b of 1e-20 would pass istop 2 at once.
fn stopping_tests(s: &mut LsqrScalars, params: &LsqrParams, iter_lim: usize, ctol: f64) {
    let eps = f64::EPSILON;
    let den = s.anorm * s.rnorm;
    let test1 = s.rnorm / s.bnorm;
    let test2 = if den > 0.0 && den < eps {
        s.arnorm / den
    } else {
        s.arnorm / (den + eps)
    };
    let test3 = 1.0 / (s.acond + eps);
    let tests = Tests {
        test1,
        test2,
        test3,
        t1: test1 / (1.0 + s.anorm * s.xnorm / s.bnorm),
        rtol: params.btol + params.atol * s.anorm * s.xnorm / s.bnorm,
    };
    s.istop = istop_of(&tests, params.atol, ctol, s.itn >= iter_lim);
}

/// The constants of one call's iterations.
pub(crate) struct Limits {
    pub(crate) iter_lim: usize,
    pub(crate) damp: f64,
    pub(crate) dampsq: f64,
    /// 1 / conlim (0 where conlim is 0: no condition limit).
    ctol: f64,
}

impl Limits {
    pub(crate) fn new(params: &LsqrParams, n: usize) -> Limits {
        Limits {
            iter_lim: params.iter_lim.unwrap_or(2 * n),
            damp: params.damp,
            dampsq: params.damp * params.damp,
            ctol: if params.conlim > 0.0 {
                1.0 / params.conlim
            } else {
                0.0
            },
        }
    }
}

/// The history record of the state `s`, `t` seconds into the call.
pub(crate) fn record_of(s: &LsqrScalars, t: f64) -> IterRecord {
    IterRecord {
        itn: s.itn,
        r1norm: s.r1norm,
        r2norm: s.r2norm,
        arnorm: s.arnorm,
        anorm: s.anorm,
        acond: s.acond,
        xnorm: s.xnorm,
        seconds: t,
    }
}

/// What a call that started at `start_itn` reports at the state `s`, after `t` seconds.
pub(crate) fn info_of(s: &LsqrScalars, start_itn: usize, t: f64) -> LsqrInfo {
    LsqrInfo {
        start_itn,
        istop: s.istop,
        stop_reason: stop_reason(s.istop).to_string(),
        itn: s.itn,
        norms: LsqrNorms {
            r1norm: s.r1norm,
            r2norm: s.r2norm,
            anorm: s.anorm,
            acond: s.acond,
            arnorm: s.arnorm,
            xnorm: s.xnorm,
        },
        seconds: t,
    }
}

/// Run LSQR iterations from a started (or resumed) state until a stopping test fires.
pub fn lsqr_iterate<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    comm: &dyn Comm,
    params: &LsqrParams,
    s: &mut LsqrScalars,
    vecs: &mut LsqrVectors<B::Vector>,
    monitor: &mut dyn LsqrMonitor<B>,
) -> Result<LsqrInfo> {
    check_params(params)?;
    let start = Instant::now();
    let n = op.ncols();
    let lim = Limits::new(params, n);
    let mut d = Dist::new(be, op, comm)?;
    if s.itn == 0 {
        monitor.record(&record_of(s, 0.0))?;
    }
    let start_itn = s.itn;
    // At the start ||A^T r|| = alpha beta is 0 where alpha or beta is (not where the product
    // underflows); a resumed run stops where its last estimate was 0.
    let solved = if s.itn == 0 {
        s.alpha == 0.0 || s.beta == 0.0
    } else {
        s.arnorm == 0.0
    };
    if solved || s.istop != 0 {
        return Ok(info_of(s, start_itn, 0.0));
    }
    let device = op.lsqr_device().filter(|d| d.runs_on(be, comm.size()));
    if let Some(dev) = device {
        let every = (monitor.checkpoint_every(), comm);
        dev.iterate(be, params, (s, vecs), every, &mut |recs, st, v| {
            let t = start.elapsed().as_secs_f64();
            for r in recs {
                monitor.record(&IterRecord { seconds: t, ..*r })?;
            }
            monitor.state(be, st, v)
        })?;
    } else {
        while s.itn < lim.iter_lim {
            lsqr_step(&mut d, &lim, params, s, vecs)?;
            let t = start.elapsed().as_secs_f64();
            monitor.record(&record_of(s, t))?;
            monitor.state(be, s, vecs)?;
            if s.istop != 0 {
                break;
            }
        }
    }
    if s.istop == 0 && s.itn >= lim.iter_lim {
        s.istop = 7;
    }
    Ok(info_of(s, start_itn, start.elapsed().as_secs_f64()))
}

/// One LSQR iteration on the host, in SciPy's order (kernels/lsqr.cu's device loop does the
/// same steps): the bidiagonalisation, the rotations, the x and w update, the estimates and the
/// stopping tests. A norm that is not finite is an error.
fn lsqr_step<B: Backend, O: Operator<B>>(
    d: &mut Dist<'_, B, O>,
    lim: &Limits,
    params: &LsqrParams,
    s: &mut LsqrScalars,
    vecs: &mut LsqrVectors<B::Vector>,
) -> Result<()> {
    s.itn += 1;
    bidiagonalise(d, lim.dampsq, s, vecs)?;
    let (r, k) = begin_update(s, lim);
    let xw = XwState {
        x: &mut vecs.x,
        w: &mut vecs.w,
        var: vecs.var.as_mut(),
    };
    let dk2 = d.be.lsqr_update(k, &vecs.v, xw)?;
    finish_update(s, &r, dk2, lim, params)
}

/// The scalar side of the Golub-Kahan step: the new beta and alpha (from [`Dist::step`] or a
/// batch's block step) and ||A||'s estimate.
pub(crate) fn take_bidiag(s: &mut LsqrScalars, (beta, new_alpha): (f64, f64), dampsq: f64) {
    let alpha = s.alpha;
    s.beta = beta;
    if beta > 0.0 {
        s.anorm = (s.anorm * s.anorm + alpha * alpha + beta * beta + dampsq).sqrt();
    }
    s.alpha = new_alpha;
}

/// After the bidiagonalisation: the rotations and the scalars of the x and w update.
pub(crate) fn begin_update(s: &mut LsqrScalars, lim: &Limits) -> (Rotations, XwStep) {
    let r = rotations(s, lim.damp, lim.dampsq);
    // Update x and w (one fused pass); ||dk||^2 = ||w||^2 / rho^2.
    let k = XwStep {
        t1: r.phi / r.rho,
        t2: -r.theta / r.rho,
        inv_rho: 1.0 / r.rho,
    };
    (r, k)
}

/// After the x and w update (`dk2` = ||d_k||^2 it returned): the estimates and the stopping
/// tests. A norm that is not finite is an error.
pub(crate) fn finish_update(
    s: &mut LsqrScalars,
    r: &Rotations,
    dk2: f64,
    lim: &Limits,
    params: &LsqrParams,
) -> Result<()> {
    s.ddnorm += dk2;
    estimate_xnorm(s, r);
    estimate_norms(s, r, lim.damp, lim.dampsq);
    stopping_tests(s, params, lim.iter_lim, lim.ctol);
    norms_finite("LSQR", s.itn, [s.rnorm, s.arnorm, s.xnorm, s.anorm])
}

/// The Golub-Kahan step: beta u = A v - alpha u; alpha v = A^T u - beta v (and ||A||'s
/// estimate).
fn bidiagonalise<B: Backend, O: Operator<B>>(
    d: &mut Dist<'_, B, O>,
    dampsq: f64,
    s: &mut LsqrScalars,
    vecs: &mut LsqrVectors<B::Vector>,
) -> Result<()> {
    let ba = d.step(s.alpha, &mut vecs.u, &mut vecs.v)?;
    take_bidiag(s, ba, dampsq);
    Ok(())
}

/// An iteration's plane rotations (SciPy's names).
pub(crate) struct Rotations {
    rho: f64,
    theta: f64,
    phi: f64,
    tau: f64,
    psi: f64,
}

/// Eliminate the damping parameter, then the subdiagonal element beta, with plane rotations
/// (updating rhobar and phibar).
fn rotations(s: &mut LsqrScalars, damp: f64, dampsq: f64) -> Rotations {
    let (rhobar1, psi) = if damp > 0.0 {
        let rhobar1 = (s.rhobar * s.rhobar + dampsq).sqrt();
        let cs1 = s.rhobar / rhobar1;
        let sn1 = damp / rhobar1;
        let psi = sn1 * s.phibar;
        s.phibar *= cs1;
        (rhobar1, psi)
    } else {
        (s.rhobar, 0.0)
    };
    let (cs, sn, rho) = sym_ortho(rhobar1, s.beta);
    let theta = sn * s.alpha;
    s.rhobar = -cs * s.alpha;
    let phi = cs * s.phibar;
    s.phibar *= sn;
    let tau = sn * phi;
    Rotations {
        rho,
        theta,
        phi,
        tau,
        psi,
    }
}

/// Estimate ||x|| with a rotation on the right.
fn estimate_xnorm(s: &mut LsqrScalars, r: &Rotations) {
    let delta = s.sn2 * r.rho;
    let gambar = -s.cs2 * r.rho;
    let rhs = r.phi - delta * s.z;
    let zbar = rhs / gambar;
    s.xnorm = (s.xxnorm + zbar * zbar).sqrt();
    let gamma = (gambar * gambar + r.theta * r.theta).sqrt();
    s.cs2 = gambar / gamma;
    s.sn2 = r.theta / gamma;
    s.z = rhs / gamma;
    s.xxnorm += s.z * s.z;
}

/// The norm and condition estimates: cond(A), ||r||, ||A^T r||, r1norm and r2norm.
fn estimate_norms(s: &mut LsqrScalars, r: &Rotations, damp: f64, dampsq: f64) {
    s.acond = s.anorm * s.ddnorm.sqrt();
    let res1 = s.phibar * s.phibar;
    s.res2 += r.psi * r.psi;
    s.rnorm = if res1 < f64::MIN_POSITIVE && s.phibar != 0.0 {
        // phibar^2 underflowed (a tiny b): ||r|| is not 0 (issue 35)
        s.phibar.hypot(s.res2.sqrt())
    } else {
        (res1 + s.res2).sqrt()
    };
    s.arnorm = s.alpha * r.tau.abs();
    if damp > 0.0 {
        let r1sq = s.rnorm * s.rnorm - dampsq * s.xxnorm;
        s.r1norm = r1sq.abs().sqrt();
        if r1sq < 0.0 {
            s.r1norm = -s.r1norm;
        }
    } else {
        s.r1norm = s.rnorm;
    }
    s.r2norm = s.rnorm;
}
