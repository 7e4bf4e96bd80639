//! One Arnoldi cycle of GMRES(m), in either loop: the host loop ([`Problem::host_cycle`]: each
//! step's scalars come back as they are computed, the stopping test after every step) and the
//! device loop ([`Problem::device_cycle`]: a whole cycle launched with its scalars kept on the
//! backend, then the host loop's decisions replayed step by step on the same numbers); and the
//! products a solve needs around the cycles (the residual, the update of x).

use super::lsq::solve_krylov;
use super::orthog::orthogonalize;
use super::stopping::Progress;
use super::workspace::{gnorm_robust, sc_stride, GmresWorkspace};
use super::Orthog;
use crate::backend::precond::Preconditioner;
use crate::backend::{Measure, Operator, ScalarSlots, Scale};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// The operator, the preconditioner and the communicator of a solve, and the side M^-1 is
/// applied on.
pub(super) struct Problem<'a, B: ScalarSlots, O, P: ?Sized> {
    pub(super) be: &'a B,
    pub(super) op: &'a O,
    pub(super) pc: &'a mut P,
    pub(super) comm: &'a dyn Comm,
    pub(super) left: bool,
}

/// Steps of a device-loop cycle launched before the host reads their scalars and runs their
/// tests ([`Problem::device_cycle`]). A whole GMRES(16) cycle (the default restart) is one
/// launch, as before; a longer cycle stops at most 15 steps after its test fires instead of
/// running to m (GMRES(64) on 16.8M rows, one H100: the last cycle's wasted steps had made the
/// device loop 8.6 % slower per step than the host loop, 4.22 against 3.89 ms).
const DEVICE_STEPS: usize = 16;

/// What a cycle needs to know besides the problem and the workspace.
pub(super) struct Cycle {
    /// Cycle number, from 1.
    pub(super) number: usize,
    pub(super) orthog: Orthog,
    /// The cycle ends once the residual estimate is at or below this.
    pub(super) inner_tol: f64,
    /// Limit on the total inner iterations.
    pub(super) max_iter: usize,
    /// Norm of the residual the cycle starts from (V_0 before its normalisation).
    pub(super) beta: f64,
    /// Run it in the device loop (else the host loop).
    pub(super) device: bool,
}

/// How a cycle ended: k columns of H built, the last residual estimate (beta when none) and
/// whether the Krylov space broke down.
pub(super) struct CycleEnd {
    pub(super) k: usize,
    pub(super) est: f64,
    pub(super) breakdown: bool,
}

impl CycleEnd {
    fn start(beta: f64) -> Self {
        CycleEnd {
            k: 0,
            est: beta,
            breakdown: false,
        }
    }
    /// Step j ended with residual estimate `est`: record it; true when the cycle stops here.
    fn step(
        &mut self,
        (j, seconds): (usize, f64),
        (est, breakdown): (f64, bool),
        cyc: &Cycle,
        progress: &mut Progress<'_>,
    ) -> Result<bool> {
        *self = CycleEnd {
            k: j + 1,
            est,
            breakdown,
        };
        progress.record(progress.its, cyc.number - 1, est, seconds)?;
        Ok(est <= cyc.inner_tol || breakdown)
    }
}

impl<B, O, P> Problem<'_, B, O, P>
where
    B: ScalarSlots,
    O: Operator<B>,
    P: Preconditioner<B> + ?Sized,
{
    /// w = M^-1 A x (left) or A M^-1 x (right); a diagonal M^-1 on the left is folded into the
    /// product's rows ([`Operator::apply_scaled_rows`]). `t` is scratch.
    pub(super) fn product(
        &mut self,
        x: &B::Vector,
        t: &mut B::Vector,
        w: &mut B::Vector,
    ) -> Result<()> {
        let (be, op) = (self.be, self.op);
        if self.left {
            if let Some(d) = self.pc.diagonal() {
                return op.apply_scaled_rows(be, x, d.scale(), t, w);
            }
            op.apply(be, Scale::SET, x, t)?;
            self.pc.apply(be, t, w)
        } else {
            self.pc.apply(be, x, t)?;
            op.apply(be, Scale::SET, t, w)
        }
    }

    /// r = b - A x, V_0 = M^-1 r (left) or r (in the workspace); returns (||r||, ||V_0||),
    /// norms that neither underflow nor overflow ([`gnorm_robust`], w as its scratch).
    pub(super) fn residual(
        &mut self,
        ws: &mut GmresWorkspace<B>,
        b: &B::Vector,
        x: &B::Vector,
    ) -> Result<(f64, f64)> {
        let (be, comm) = (self.be, self.comm);
        let GmresWorkspace { v, w, r, .. } = ws;
        be.copy(b, r)?;
        self.op.apply(be, Scale::new(-1.0, 1.0), x, r)?;
        let rn = gnorm_robust(be, comm, r, w)?;
        if self.left {
            self.pc.apply(be, r, &mut v[0])?;
            Ok((rn, gnorm_robust(be, comm, &v[0], w)?))
        } else {
            be.copy(r, &mut v[0])?;
            Ok((rn, rn))
        }
    }

    /// x += V y (left) or M^-1 V y (right), y solving the leading k x k triangle of the
    /// rotated Hessenberg system H y = g of the cycle just run.
    pub(super) fn update_x(
        &mut self,
        ws: &mut GmresWorkspace<B>,
        x: &mut B::Vector,
        k: usize,
    ) -> Result<()> {
        if k == 0 {
            return Ok(());
        }
        let be = self.be;
        let ld = ws.m + 1;
        let GmresWorkspace {
            v,
            w,
            t,
            h,
            rot,
            y,
            coef,
            ..
        } = ws;
        solve_krylov(h, ld, &rot.g, (y, coef), k);
        if self.left {
            be.multi_axpy(&coef[..k], &v[..k], x)?;
        } else {
            be.fill(t, 0.0)?;
            be.multi_axpy(&coef[..k], &v[..k], t)?;
            self.pc.apply(be, t, w)?;
            be.axpby(1.0, w, 1.0, x)?;
        }
        Ok(())
    }

    /// Cycle `cyc.number` from the residual in V_0 (norm `cyc.beta`), in the host or the
    /// device loop; `progress` counts the iterations and records each.
    pub(super) fn cycle(
        &mut self,
        ws: &mut GmresWorkspace<B>,
        cyc: &Cycle,
        progress: &mut Progress<'_>,
    ) -> Result<CycleEnd> {
        self.be.scale(&mut ws.v[0], 1.0 / cyc.beta)?;
        ws.rot.start(cyc.beta);
        if cyc.device {
            self.device_cycle(ws, cyc, progress)
        } else {
            self.host_cycle(ws, cyc, progress)
        }
    }

    /// Arnoldi step j in the host loop: w = M^-1 A v_j (left) or A M^-1 v_j (right), its
    /// orthogonalisation, rotation j, v_{j+1} (unless the Krylov space broke down). DCGS2
    /// writes the product into v_{j+1} (orthogonalised and normalised in place), so that one
    /// batched pass over v_0..v_{j+1} gives V^T w and ||w||^2 together. Returns the residual
    /// estimate and whether the Krylov space broke down.
    fn host_step(
        &mut self,
        ws: &mut GmresWorkspace<B>,
        orthog: Orthog,
        j: usize,
        its: &mut usize,
    ) -> Result<(f64, bool)> {
        let dc = orthog == Orthog::Dcgs2;
        {
            let (vl, vr) = ws.v.split_at_mut(j + 1);
            let dst = if dc { &mut vr[0] } else { &mut ws.w };
            self.product(&vl[j], &mut ws.t, dst)?;
        }
        *its += 1;
        let (hn, wfac) = orthogonalize(self.be, self.comm, orthog, ws, j, *its)?;
        let ld = ws.m + 1;
        let GmresWorkspace {
            v, w, h, rot, hraw, ..
        } = ws;
        let col = &mut h[j * ld..(j + 1) * ld];
        let (est, breakdown) = rot.end_step(col, &mut hraw[j * ld + j + 1], hn, j, *its)?;
        if !breakdown {
            if dc {
                self.be.scale(&mut v[j + 1], 1.0 / (hn * wfac))?;
            } else {
                self.be.copy_scaled(1.0 / hn, w, &mut v[j + 1])?;
            }
        }
        Ok((est, breakdown))
    }

    /// The host loop: Arnoldi steps until the estimate meets the cycle's tolerance, the
    /// Krylov space breaks down, m steps or the iteration limit. `its` counts the inner
    /// iterations.
    fn host_cycle(
        &mut self,
        ws: &mut GmresWorkspace<B>,
        cyc: &Cycle,
        progress: &mut Progress<'_>,
    ) -> Result<CycleEnd> {
        let mut end = CycleEnd::start(cyc.beta);
        while end.k < ws.m && progress.its < cyc.max_iter {
            let j = end.k;
            let step = self.host_step(ws, cyc.orthog, j, &mut progress.its)?;
            if end.step((j, progress.seconds()), step, cyc, progress)? {
                break;
            }
        }
        Ok(end)
    }

    /// Launch Arnoldi steps `j0..j1` of a cycle of `steps` steps, classical Gram-Schmidt (once,
    /// or twice for `Orthog::Cgs2`) with every scalar kept on the backend
    /// (`ArnoldiLoop::Device`): step j writes V^T w at sc[j * stride], CGS2's second pass at
    /// sc[j * stride + m + 1] and ||w||^2 at sc[j * stride + 2 (m + 1)], and v_{j+1} = w /
    /// ||w||. `pending` (returned for the next launch of the cycle): with a diagonal M^-1 on
    /// the left, v_j (j >= 1) is normalised by the product that reads it
    /// (Operator::apply_normalized_scaled_rows), and this is the scalar slot of ||w||^2 while w
    /// still holds v_j unnormalised: the same numbers as a pass of its own. Nothing here waits
    /// for the device (except a host allreduce on several ranks without NCCL).
    fn launch_device_steps(
        &mut self,
        ws: &mut GmresWorkspace<B>,
        orthog: Orthog,
        (j0, j1, steps): (usize, usize, usize),
        mut pending: Option<usize>,
    ) -> Result<Option<usize>> {
        let (be, op, comm) = (self.be, self.op, self.comm);
        let GmresWorkspace { v, w, t, sc, .. } = ws;
        let ld = v.len(); // m + 1
        let stride = sc_stride(ld - 1);
        let fuse = self.left && self.pc.diagonal().is_some();
        for j in j0..j1 {
            let (vl, vr) = v.split_at_mut(j + 1);
            match (pending.take(), self.pc.diagonal()) {
                (Some(at), Some(d)) => {
                    op.apply_normalized_scaled_rows(be, (&*sc, at), w, &mut vl[j], d.scale(), t)?;
                    // the product is in t: it is w from here on (the workspace's two
                    // vectors trade places, so the next launch of the cycle sees it too)
                    std::mem::swap(&mut *w, &mut *t);
                }
                (None, _) => self.product(&vl[j], t, w)?,
                (Some(_), None) => return Err(Error::Invalid(
                    "GMRES device loop: a vector left unnormalised without a diagonal preconditioner"
                        .into(),
                )),
            }
            let (c, nsq) = (j * stride, j * stride + 2 * ld);
            be.multi_dot_to(vl, w, sc, c)?;
            be.allreduce_scalars(comm, sc, c, j + 1)?;
            let last = if orthog == Orthog::Cgs2 {
                be.multi_axpy_measure_to(vl, w, sc, (c, c + ld), Measure::Dots)?;
                be.allreduce_scalars(comm, sc, c + ld, j + 1)?;
                c + ld
            } else {
                c
            };
            be.multi_axpy_measure_to(vl, w, sc, (last, nsq), Measure::NormSq)?;
            be.allreduce_scalars(comm, sc, nsq, 1)?;
            if fuse && j + 1 < steps {
                pending = Some(nsq);
            } else {
                be.copy_inv_sqrt(sc, nsq, w, &mut vr[0])?;
            }
        }
        Ok(pending)
    }

    /// The device loop (cgs and cgs2): a cycle's steps launched on the backend
    /// [`DEVICE_STEPS`] at a time, their scalars read to the host once per launch, then the
    /// host loop's decisions step by step on the same numbers. The cycle ends at the step
    /// whose test fires: the steps after it in the same launch are discarded, and no later
    /// launch is made (so a cycle that converges early does not run to m steps).
    fn device_cycle(
        &mut self,
        ws: &mut GmresWorkspace<B>,
        cyc: &Cycle,
        progress: &mut Progress<'_>,
    ) -> Result<CycleEnd> {
        let m = ws.m;
        let ld = m + 1;
        let steps = m.min(cyc.max_iter - progress.its);
        let stride = sc_stride(m);
        let mut end = CycleEnd::start(cyc.beta);
        let mut pending = None;
        let mut j0 = 0;
        while j0 < steps {
            let j1 = (j0 + DEVICE_STEPS).min(steps);
            pending = self.launch_device_steps(ws, cyc.orthog, (j0, j1, steps), pending)?;
            let GmresWorkspace {
                h,
                rot,
                hraw,
                sc,
                sc_host,
                ..
            } = &mut *ws;
            self.be
                .read_scalars(sc, j0 * stride, &mut sc_host[j0 * stride..j1 * stride])?;
            let seconds = progress.seconds();
            for j in j0..j1 {
                progress.its += 1;
                let its = progress.its;
                let r = &sc_host[j * stride..(j + 1) * stride];
                let col = &mut h[j * ld..(j + 1) * ld];
                if cyc.orthog == Orthog::Cgs2 {
                    for ((hi, a), b) in col[..=j].iter_mut().zip(r).zip(&r[ld..]) {
                        *hi = a + b;
                    }
                } else {
                    col[..=j].copy_from_slice(&r[..=j]);
                }
                let hn = r[2 * ld].max(0.0).sqrt();
                let step = rot.end_step(col, &mut hraw[j * ld + j + 1], hn, j, its)?;
                if end.step((j, seconds), step, cyc, progress)? {
                    return Ok(end);
                }
            }
            j0 = j1;
        }
        Ok(end)
    }
}
