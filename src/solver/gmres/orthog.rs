//! The orthogonalisations of an Arnoldi step in the host loop (Ginkgo's `orthogonalize` kernels,
//! one function each): once w = Op(v_j) is computed, make it orthogonal to v_0..v_j, write
//! column j of the Hessenberg matrix (entries 0..=j) and return the new vector's norm.
//!
//! - [`orthogonalize_mgs`]: modified Gram-Schmidt, j+1 dependent inner products, one reduction
//!   each.
//! - [`orthogonalize_cgs`]: classical Gram-Schmidt once, two passes over the basis.
//! - [`orthogonalize_cgs2`]: classical Gram-Schmidt twice, three passes, one reduction each.
//! - [`orthogonalize_dcgs2`]: CGS2 with delayed reorthogonalisation and lagged normalisation,
//!   one reduction per step; it also finishes v_j and column j-1 (see [`Orthog::Dcgs2`]).

use super::lsq::Givens;
use super::workspace::{gnorm, GmresWorkspace};
use super::Orthog;
use crate::backend::{Backend, Measure};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// Orthogonalise the new vector of step j with `orthog` (w; v_{j+1} for DCGS2, which the
/// product wrote there) and write column j of H. Returns (hn, wfac): the new vector is scaled
/// by 1 / (hn wfac) into v_{j+1} (wfac = 1 except for DCGS2). `its` is for error messages.
pub(super) fn orthogonalize<B: Backend>(
    be: &B,
    comm: &dyn Comm,
    orthog: Orthog,
    ws: &mut GmresWorkspace<B>,
    j: usize,
    its: usize,
) -> Result<(f64, f64)> {
    if orthog == Orthog::Dcgs2 {
        return orthogonalize_dcgs2(be, comm, ws, j, its);
    }
    let ld = ws.m + 1;
    let GmresWorkspace { v, w, h, coef, .. } = ws;
    let col = &mut h[j * ld..(j + 1) * ld];
    let s = GsStep {
        be,
        comm,
        basis: &v[..=j],
        w,
    };
    let hn = match orthog {
        Orthog::Mgs => orthogonalize_mgs(s, col)?,
        Orthog::Cgs => orthogonalize_cgs(s, col, &mut coef[..=j])?,
        _ => {
            let (c, c2) = coef.split_at_mut(ld);
            orthogonalize_cgs2(s, col, (&mut c[..=j], &mut c2[..=j]))?
        }
    };
    Ok((hn, 1.0))
}

/// A Gram-Schmidt step: the new vector w and the basis v_0..v_j it is orthogonalised against.
pub(super) struct GsStep<'a, B: Backend> {
    pub(super) be: &'a B,
    pub(super) comm: &'a dyn Comm,
    pub(super) basis: &'a [B::Vector],
    pub(super) w: &'a mut B::Vector,
}

impl<B: Backend> GsStep<'_, B> {
    /// w -= V c, then ||w|| (one fused pass, one reduction).
    fn subtract_and_norm(&mut self, c: &[f64]) -> Result<f64> {
        let mut nsq = [0.0];
        self.be
            .multi_axpy_measure(Measure::NormSq, c, self.basis, self.w, &mut nsq)?;
        let nsq = nsq[0];
        Ok(self.comm.allreduce_scalar(nsq)?.max(0.0).sqrt())
    }
}

/// Modified Gram-Schmidt: for each basis vector in turn, h_i = v_i . w (one reduction) and
/// w -= h_i v_i. Writes h into `col`; returns ||w||.
pub(super) fn orthogonalize_mgs<B: Backend>(s: GsStep<'_, B>, col: &mut [f64]) -> Result<f64> {
    let GsStep { be, comm, basis, w } = s;
    for (vi, hij) in basis.iter().zip(col.iter_mut()) {
        *hij = comm.allreduce_scalar(be.dot(vi, w)?)?;
        be.axpby(-*hij, vi, 1.0, w)?;
    }
    gnorm(be, comm, w)
}

/// Classical Gram-Schmidt once, two passes over the basis: c = V^T w; [w -= V c, ||w||^2]
/// (`c` is scratch of the basis' length). Writes c into `col`; returns ||w||.
pub(super) fn orthogonalize_cgs<B: Backend>(
    mut s: GsStep<'_, B>,
    col: &mut [f64],
    c: &mut [f64],
) -> Result<f64> {
    s.be.multi_dot(s.basis, s.w, c)?;
    s.comm.allreduce_sum(c)?;
    col[..c.len()].copy_from_slice(c);
    s.subtract_and_norm(c)
}

/// Classical Gram-Schmidt twice, three passes over the basis, one reduction each: c = V^T w;
/// [w -= V c, c2 = V^T w]; [w -= V c2, ||w||^2]. Writes c + c2 into `col`; returns ||w||.
pub(super) fn orthogonalize_cgs2<B: Backend>(
    mut s: GsStep<'_, B>,
    col: &mut [f64],
    (c, c2): (&mut [f64], &mut [f64]),
) -> Result<f64> {
    s.be.multi_dot(s.basis, s.w, c)?;
    s.comm.allreduce_sum(c)?;
    s.be.multi_axpy_measure(Measure::Dots, c, s.basis, s.w, c2)?;
    s.comm.allreduce_sum(c2)?;
    for ((hi, a), b) in col.iter_mut().zip(c.iter()).zip(c2.iter()) {
        *hi = a + b;
    }
    s.subtract_and_norm(c2)
}

/// DCGS2 step j: v_{j+1} = z = Op(p) with p = v_j provisional (once orthogonalised, normalised
/// by a Pythagorean norm) for j >= 1; v_0 is final. One reduction of [V_0..j^T z, z.z,
/// V_0..j-1^T p, p.p]; then v_j is re-orthogonalised and normalised, column j-1 corrected and
/// its rotation redone, and column j and v_{j+1} (unnormalised) follow from the same numbers.
/// Returns (eta, s): H[j+1, j] and the norm of v_j before its normalisation.
pub(super) fn orthogonalize_dcgs2<B: Backend>(
    be: &B,
    comm: &dyn Comm,
    ws: &mut GmresWorkspace<B>,
    j: usize,
    its: usize,
) -> Result<(f64, f64)> {
    let ld = ws.m + 1;
    let GmresWorkspace {
        v,
        h,
        rot,
        coef,
        hraw,
        red,
        ..
    } = ws;
    let nr = if j == 0 { 2 } else { 2 * j + 3 };
    let red = &mut red[..nr];
    be.multi_dot(&v[..=j + 1], &v[j + 1], &mut red[..=j + 1])?;
    if j > 0 {
        be.multi_dot(&v[..=j], &v[j], &mut red[j + 2..])?;
    }
    comm.allreduce_sum(red)?;
    let (a, rest) = red.split_at(j + 1);
    let zz = rest[0];
    let d = if j > 0 { &rest[1..=j] } else { &rest[..0] };
    let (hprev, hcur) = h.split_at_mut(j * ld);
    let mut step = Dcgs2Step {
        be,
        comm,
        v,
        hraw,
        ld,
        j,
    };
    let s = if j > 0 {
        let pcol = &mut hprev[(j - 1) * ld..j * ld];
        step.finish_previous((d, rest[j + 1]), its, pcol, rot)?
    } else {
        1.0
    };
    let eta = step.new_column((a, zz, d), s, coef, &mut hcur[..ld])?;
    Ok((eta, s))
}

/// What DCGS2's step j works on besides the reduced numbers: the basis and the Hessenberg
/// matrix before the rotations.
struct Dcgs2Step<'a, B: Backend> {
    be: &'a B,
    comm: &'a dyn Comm,
    v: &'a mut [B::Vector],
    hraw: &'a mut [f64],
    ld: usize,
    j: usize,
}

impl<B: Backend> Dcgs2Step<'_, B> {
    /// Re-orthogonalise and normalise v_j: v_j = (p - V d) / s, with d = V_0..j-1^T p and
    /// `pp` = p.p; correct column j-1 (Op(v_{j-1}) = V c + eta p = V (c + eta d) + eta s v_j)
    /// into `pcol` and redo its rotation. Returns s.
    fn finish_previous(
        &mut self,
        (d, pp): (&[f64], f64),
        its: usize,
        pcol: &mut [f64],
        rot: &mut Givens,
    ) -> Result<f64> {
        let (be, j, ld) = (self.be, self.j, self.ld);
        let s2 = pp - d.iter().map(|x| x * x).sum::<f64>();
        let (vl, vr) = self.v.split_at_mut(j);
        be.multi_axpy(d, vl, &mut vr[0])?;
        let s = if s2 >= 0.25 * pp && s2 > 0.0 {
            s2.sqrt()
        } else {
            // p was mostly inside span(V): the Pythagorean norm cancelled; one extra
            // reduction (near breakdown only).
            gnorm(be, self.comm, &vr[0])?
        };
        if !(s.is_finite() && s > 0.0) {
            return Err(Error::Invalid(format!(
                "GMRES: Arnoldi vector became non-finite or zero at iteration {its} (operator or preconditioner produces NaN/Inf)"
            )));
        }
        be.scale(&mut vr[0], 1.0 / s)?;
        let hc = &mut self.hraw[(j - 1) * ld..j * ld];
        let eta = hc[j];
        for (hi, di) in hc[..j].iter_mut().zip(d) {
            *hi += eta * di;
        }
        hc[j] = eta * s;
        pcol[..=j].copy_from_slice(&hc[..=j]);
        rot.redo(pcol, j - 1);
        Ok(s)
    }

    /// Column j from the reduced numbers (a = V^T z, zz = z.z, d) and s: Op(v_j) = (z - Op(V
    /// d)) / s = (z - V e) / s with e = H[0..=j, 0..j] d, c = V^T Op(v_j) into `col` (and
    /// hraw); v_{j+1} = z - V (e + s c) = s (Op(v_j) - V c). Returns eta = ||Op(v_j) - V c||
    /// (Pythagorean, or one extra reduction where it cancels).
    fn new_column(
        &mut self,
        (a, zz, d): (&[f64], f64, &[f64]),
        s: f64,
        coef: &mut [f64],
        col: &mut [f64],
    ) -> Result<f64> {
        let (j, ld, hraw) = (self.j, self.ld, &mut *self.hraw);
        let (e, c) = coef.split_at_mut(ld);
        let (e, c) = (&mut e[..=j], &mut c[..=j]);
        for (i, ei) in e.iter_mut().enumerate() {
            *ei = (i.saturating_sub(1)..j)
                .map(|k| hraw[k * ld + i] * d[k])
                .sum();
        }
        let ad: f64 = a[..j].iter().zip(d).map(|(x, y)| x * y).sum();
        let vjz = (a[j] - ad) / s;
        for ((ci, ai), ei) in c[..j].iter_mut().zip(a).zip(e.iter()) {
            *ci = (ai - ei) / s;
        }
        c[j] = (vjz - e[j]) / s;
        let ae: f64 = a[..j].iter().zip(&e[..j]).map(|(x, y)| x * y).sum();
        let ee: f64 = e.iter().map(|x| x * x).sum();
        let ww = (zz - 2.0 * (ae + vjz * e[j]) + ee) / (s * s);
        let eta2 = ww - c.iter().map(|x| x * x).sum::<f64>();
        col[..=j].copy_from_slice(c);
        for (ei, ci) in e.iter_mut().zip(c.iter()) {
            *ei += s * *ci;
        }
        let (vl, vr) = self.v.split_at_mut(j + 1);
        self.be.multi_axpy(e, vl, &mut vr[0])?;
        let eta = if eta2 > 1e-10 * ww {
            eta2.sqrt()
        } else {
            // cancellation in the Pythagorean norm: one extra reduction
            gnorm(self.be, self.comm, &vr[0])? / s
        };
        let hc = &mut hraw[j * ld..(j + 1) * ld];
        hc[..=j].copy_from_slice(c);
        hc[j + 1] = eta;
        Ok(eta)
    }
}
