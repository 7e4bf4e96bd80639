//! LSMR (Fong & Saunders 2011, SIAM J. Sci. Comput. 33(5) 2950-2971), following SciPy's `lsmr`
//! step for step so that istop, iterations and norms agree with it.
//!
//! Solves min ||b - A x||^2 + damp^2 ||x - x0||^2 (with no x0, ||x||) by the same Golub-Kahan
//! bidiagonalisation as LSQR (`super::bidiag::Dist`: u split by rows over ranks, v, h, hbar
//! and x replicated; ||u|| a scalar sum and A^T u one vector reduction per iteration), with
//! x chosen to make ||A^T r|| decrease monotonically (MINRES on the normal equations) rather
//! than ||r||. It runs on any [`Backend`] with the host driving the scalar recurrences, or, on
//! one rank where the operator has one ([`crate::backend::Operator::lsmr_device`]: a GPU's),
//! in the backend's device loop, whole blocks of iterations with the scalars on the device
//! (kernels/lsmr.cu). Nothing here calls rayon, MPI or CUDA.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::bidiag::{istop_of, norms_finite, sym_ortho, Dist, Tests};
use super::lsqr::{check_params, stop_reason, LsqrInfo, LsqrMonitor, LsqrNorms};
use super::{IterRecord, LeastSquares, LsqrParams, LsqrSolution};
pub use crate::backend::lsmr::{LsmrLimits, LsmrScalars, LsmrVectors};
use crate::backend::{Backend, Operator, Scale};
use crate::error::{Error, Result};

/// What LSMR reports, with the names of SciPy's `lsmr` return tuple (x is downloaded
/// separately).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LsmrInfo {
    pub istop: u32,
    pub stop_reason: String,
    pub itn: usize,
    /// ||b - A x|| (with damping: of the damped system [A; damp I] x = [b; damp x0]).
    pub normr: f64,
    /// ||A^T (b - A x)|| (damped likewise).
    pub normar: f64,
    /// Estimate of the Frobenius norm of [A; damp I].
    pub norma: f64,
    /// Estimate of cond([A; damp I]).
    pub conda: f64,
    /// ||x||.
    pub normx: f64,
    /// Seconds of the iterations.
    pub seconds: f64,
}

impl LsmrInfo {
    /// The same stop in LSQR's report fields (the pipeline's one outcome type): r1norm and
    /// r2norm are normr, arnorm normar, anorm norma, acond conda, xnorm normx.
    pub fn to_lsqr_info(&self) -> LsqrInfo {
        LsqrInfo {
            istop: self.istop,
            stop_reason: self.stop_reason.clone(),
            itn: self.itn,
            norms: LsqrNorms {
                r1norm: self.normr,
                r2norm: self.normr,
                anorm: self.norma,
                acond: self.conda,
                arnorm: self.normar,
                xnorm: self.normx,
            },
            seconds: self.seconds,
            start_itn: 0,
        }
    }
}

/// The host-side result of an LSMR solve.
#[derive(Debug, Clone)]
pub struct LsmrSolution {
    pub x: Vec<f64>,
    pub info: LsmrInfo,
}

impl LsmrSolution {
    /// As the pipeline's LSQR-shaped solution (no var: LSMR has no variance estimate).
    pub fn into_lsqr(self) -> LsqrSolution {
        LsqrSolution {
            info: self.info.to_lsqr_info(),
            x: self.x,
            var: None,
        }
    }
}

type Vectors<V> = LsmrVectors<V>;
type State = LsmrScalars;

trait Info {
    fn info(&self, seconds: f64) -> LsmrInfo;
}

impl Info for State {
    fn info(&self, seconds: f64) -> LsmrInfo {
        LsmrInfo {
            istop: self.istop,
            stop_reason: stop_reason(self.istop).to_string(),
            itn: self.itn,
            normr: self.normr,
            normar: self.normar,
            norma: self.norma,
            conda: self.conda,
            normx: self.normx,
            seconds,
        }
    }
}

/// The parameter checks LSMR makes: LSQR's, and no variance estimate.
pub fn check_lsmr_params(p: &LsqrParams) -> Result<()> {
    check_params(p)?;
    if p.calc_var {
        return Err(Error::Invalid(
            "LSMR has no variance estimate (calc_var / --variance are LSQR's)".into(),
        ));
    }
    Ok(())
}

/// LSMR on the problem `p`, run to a stop; x downloaded. `params.iter_lim` defaults to min(m, n) (SciPy's `maxiter`).
/// The monitor sees every iteration's record (from iteration 0) in LSQR's fields (r1norm =
/// r2norm = normr, arnorm = normar); its `state` is not called (no checkpoints).
pub fn lsmr<B: Backend, O: Operator<B>>(
    p: &LeastSquares<'_, B, O>,
    params: &LsqrParams,
    monitor: &mut dyn LsqrMonitor<B>,
) -> Result<LsmrSolution> {
    check_lsmr_params(params)?;
    let LeastSquares {
        be,
        op,
        comm,
        b,
        x0,
    } = *p;
    let (m, n) = (op.nrows(), op.ncols());
    if b.len() != m {
        return Err(Error::Invalid(format!(
            "right-hand side has {} entries but the matrix has {m} rows here",
            b.len()
        )));
    }
    if let Some(x0) = x0 {
        if x0.len() != n {
            return Err(Error::Invalid(format!(
                "x0 has {} entries but the matrix has {n} columns",
                x0.len()
            )));
        }
    }
    let maxiter = match params.iter_lim {
        Some(k) => k,
        // min(m, n) over all rows of every rank
        None => (comm.allreduce_scalar(m as f64)? as usize).min(n),
    };
    let mut d = Dist::new(be, op, comm)?;
    let (mut s, mut vecs) = start(&mut d, b, x0)?;
    let t0 = Instant::now();
    monitor.record(&s.record(0.0))?;
    // SciPy returns here with istop 0: x (= x0) solves the system (A^T r = 0, not where the
    // product alpha beta merely underflows), or b = 0 (then x = 0).
    if s.alpha == 0.0 || s.beta == 0.0 {
        return finish(be, &vecs, &s, t0);
    }
    if s.normb == 0.0 {
        be.fill(&mut vecs.x, 0.0)?;
        return finish(be, &vecs, &s, t0);
    }
    let lim = Limits {
        maxiter,
        damp: params.damp,
        atol: params.atol,
        btol: params.btol,
        ctol: if params.conlim > 0.0 {
            1.0 / params.conlim
        } else {
            0.0
        },
    };
    if let Some(dev) = op.lsmr_device().filter(|_| comm.size() == 1) {
        // whole blocks on the device; x shown where the monitor asks (its checkpoint interval)
        let every = monitor.checkpoint_every();
        dev.iterate_lsmr(be, &lim, (&mut s, &mut vecs), every, &mut |recs, st, v| {
            let t = t0.elapsed().as_secs_f64();
            for r in recs {
                monitor.record(&IterRecord { seconds: t, ..*r })?;
            }
            monitor.lsmr_iterate(be, st.itn, &v.x)
        })?;
        // (the loop's last step sets istop 7 at maxiter; with maxiter 0 no step runs and istop
        // stays 0, as in the host loop and SciPy)
        return finish(be, &vecs, &s, t0);
    }
    while s.itn < lim.maxiter {
        step(&mut d, &lim, &mut s, &mut vecs)?;
        monitor.record(&s.record(t0.elapsed().as_secs_f64()))?;
        monitor.lsmr_iterate(be, s.itn, &vecs.x)?;
        if s.istop != 0 {
            break;
        }
    }
    finish(be, &vecs, &s, t0)
}

/// x downloaded and the info at the stop.
fn finish<B: Backend>(
    be: &B,
    vecs: &Vectors<B::Vector>,
    s: &State,
    t0: Instant,
) -> Result<LsmrSolution> {
    Ok(LsmrSolution {
        x: be.to_host(&vecs.x)?,
        info: s.info(t0.elapsed().as_secs_f64()),
    })
}

type Limits = LsmrLimits;

/// Set up: u = b - A x0 normalised (beta), v = A^T u normalised (alpha), h = v, hbar = 0;
/// every vector allocated here, none in the iterations.
fn start<B: Backend, O: Operator<B>>(
    d: &mut Dist<'_, B, O>,
    b: &[f64],
    x0: Option<&[f64]>,
) -> Result<(State, Vectors<B::Vector>)> {
    let be = d.be;
    let n = d.op.ncols();
    let mut u = be.upload(b)?;
    let normb = d.row_norm(&u)?;
    let x = match x0 {
        Some(x0) => be.upload(x0)?,
        None => be.zeros(n)?,
    };
    let beta = match x0 {
        None => normb,
        Some(_) => {
            d.op.apply(be, Scale::new(-1.0, 1.0), &x, &mut u)?;
            d.row_norm(&u)?
        }
    };
    let (v, alpha) = d.start(&mut u, beta, None)?;
    let mut h = be.zeros(n)?;
    be.copy(&v, &mut h)?;
    let hbar = be.zeros(n)?;
    let s = State {
        alpha,
        beta,
        normb,
        zetabar: alpha * beta,
        alphabar: alpha,
        rho: 1.0,
        rhobar: 1.0,
        cbar: 1.0,
        sbar: 0.0,
        betadd: beta,
        rhodold: 1.0,
        norma2: alpha * alpha,
        minrbar: 1e100,
        norma: alpha,
        conda: 1.0,
        normr: beta,
        normar: alpha * beta,
        ..Default::default()
    };
    Ok((s, Vectors { u, v, h, hbar, x }))
}

/// One LSMR iteration in SciPy's order: the bidiagonalisation, the rotations, the updates of
/// h, hbar and x, the estimates and the stopping tests. A norm that is not finite is an
/// error.
fn step<B: Backend, O: Operator<B>>(
    d: &mut Dist<'_, B, O>,
    lim: &Limits,
    s: &mut State,
    vecs: &mut Vectors<B::Vector>,
) -> Result<()> {
    s.itn += 1;
    let (beta, alpha) = d.step(s.alpha, &mut vecs.u, &mut vecs.v)?;
    (s.beta, s.alpha) = (beta, alpha);
    let r = rotations(s, lim.damp);
    // hbar = h - (thetabar rho / (rhoold rhobarold)) hbar; x += zeta / (rho rhobar) hbar;
    // h = v - (thetanew / rho) h
    let be = d.be;
    let c_hbar = -(r.thetabar * s.rho / (r.rhoold * r.rhobarold));
    be.axpby(1.0, &vecs.h, c_hbar, &mut vecs.hbar)?;
    be.axpby(s.zeta / (s.rho * s.rhobar), &vecs.hbar, 1.0, &mut vecs.x)?;
    be.axpby(1.0, &vecs.v, -(r.thetanew / s.rho), &mut vecs.h)?;
    estimate_normr(s, &r);
    // ||A||: beta of this step, then alpha; cond(A) from the rotations' diagonal
    s.norma2 += s.beta * s.beta;
    s.norma = s.norma2.sqrt();
    s.norma2 += s.alpha * s.alpha;
    s.maxrbar = s.maxrbar.max(r.rhobarold);
    if s.itn > 1 {
        s.minrbar = s.minrbar.min(r.rhobarold);
    }
    s.conda = s.maxrbar.max(r.rhotemp) / s.minrbar.min(r.rhotemp);
    s.normar = s.zetabar.abs();
    s.normx = d.col_norm(&vecs.x)?;
    norms_finite("LSMR", s.itn, [s.normr, s.normar, s.normx, s.norma])?;
    stopping_tests(s, lim);
    Ok(())
}

/// What the rotations of one iteration hand on to the updates and estimates.
struct Rotations {
    /// Qhat: the damping folded in.
    qhat: Givens,
    /// Q: B to R.
    q: Givens,
    rhoold: f64,
    rhobarold: f64,
    zetaold: f64,
    thetanew: f64,
    thetabar: f64,
    rhotemp: f64,
}

/// One plane rotation: cosine and sine.
#[derive(Clone, Copy)]
struct Givens {
    c: f64,
    s: f64,
}

/// Qhat (the damping), Q (B to R) and Qbar (R^T to Rbar), updating rho, rhobar, cbar, sbar,
/// zeta and zetabar.
fn rotations(st: &mut State, damp: f64) -> Rotations {
    let (chat, shat, alphahat) = sym_ortho(st.alphabar, damp);
    let rhoold = st.rho;
    let (c, s, rho) = sym_ortho(alphahat, st.beta);
    st.rho = rho;
    let thetanew = s * st.alpha;
    st.alphabar = c * st.alpha;
    let (rhobarold, zetaold) = (st.rhobar, st.zeta);
    let thetabar = st.sbar * rho;
    let rhotemp = st.cbar * rho;
    let (cbar, sbar, rhobar) = sym_ortho(st.cbar * rho, thetanew);
    (st.cbar, st.sbar, st.rhobar) = (cbar, sbar, rhobar);
    st.zeta = cbar * st.zetabar;
    st.zetabar *= -sbar;
    Rotations {
        rhoold,
        rhobarold,
        qhat: Givens { c: chat, s: shat },
        zetaold,
        thetanew,
        q: Givens { c, s },
        thetabar,
        rhotemp,
    }
}

/// The estimate of ||r|| (Qhat, Q, then Qtilde applied to the right-hand side).
fn estimate_normr(st: &mut State, r: &Rotations) {
    let betaacute = r.qhat.c * st.betadd;
    let betacheck = -r.qhat.s * st.betadd;
    let betahat = r.q.c * betaacute;
    st.betadd = -r.q.s * betaacute;
    let thetatildeold = st.thetatilde;
    let (ctildeold, stildeold, rhotildeold) = sym_ortho(st.rhodold, r.thetabar);
    st.thetatilde = stildeold * st.rhobar;
    st.rhodold = ctildeold * st.rhobar;
    st.betad = -stildeold * st.betad + ctildeold * betahat;
    st.tautildeold = (r.zetaold - thetatildeold * st.tautildeold) / rhotildeold;
    let taud = (st.zeta - st.thetatilde * st.tautildeold) / st.rhodold;
    st.d += betacheck * betacheck;
    let e = st.betad - taud;
    let sq = st.d + e * e + st.betadd * st.betadd;
    st.normr = if sq < f64::MIN_POSITIVE && (e != 0.0 || st.betadd != 0.0) {
        // the squares underflowed (a tiny b): ||r|| is not 0 (as LSQR, issue 35)
        e.hypot(st.betadd).hypot(st.d.sqrt())
    } else {
        sq.sqrt()
    };
}

/// SciPy's tests (test2 = ||A^T r|| / (||A|| ||r||), infinite where the product is 0) in its
/// cascade, into `s.istop`.
fn stopping_tests(s: &mut State, lim: &Limits) {
    let test1 = s.normr / s.normb;
    let den = s.norma * s.normr;
    let test2 = if den != 0.0 {
        s.normar / den
    } else {
        f64::INFINITY
    };
    let t = Tests {
        test1,
        test2,
        test3: 1.0 / s.conda,
        t1: test1 / (1.0 + s.norma * s.normx / s.normb),
        rtol: lim.btol + lim.atol * s.norma * s.normx / s.normb,
    };
    s.istop = istop_of(&t, lim.atol, lim.ctol, s.itn >= lim.maxiter);
}
