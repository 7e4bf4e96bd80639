//! Batched LSQR: k independent LSQR solves that share one matrix and each pass over it.
//!
//! Member j solves min ||b_j - A_j x||^2 + damp_j^2 ||x||^2 with A_j = [G; w_j R] (the rows a
//! [`BlockOperator`] calls weighted, times w_j) or, without weighted rows, A_j = A. The members
//! keep their own scalars (alpha, beta, rho, phi, ..., the stopping tests, istop, itn: the
//! single solver's recurrence, [`super::lsqr()`], called per member), while their vectors live in
//! blocks (u: this rank's rows x k, v, w, x: n x k, row-major) so each product reads a nonzero
//! once for all members. A member that stops leaves the blocks: the products stop computing it.
//!
//! Over ranks it is the single solver's scheme: u split by rows, v, w, x replicated; the k
//! norms of u are one scalar allreduce of k values, A^T U one allreduce of the n x k block.
//! Each member's numbers are those of its own single solve (the block kernels sum in the
//! single kernels' order), so istop, itn and x agree with it.

use std::time::Instant;

use super::lsqr::{
    begin_update, check_params, finish_update, info_of, record_of, take_bidiag, Limits,
};
use super::{BIG, SMALL};
use crate::backend::batch::{BatchBackend, BlockOperator, BlockScale, Side};
use crate::backend::lsqr::{IterRecord, LsqrParams, LsqrScalars, LsqrVectors};
use crate::backend::{Backend, Operator, XwStep};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::solver::{download_solution, lsqr_iterate, History, LsqrInfo, LsqrSolution};

/// What makes one member of a batch: its row weight (the weighted rows' factor) and damping.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Member {
    /// Factor of the operator's weighted rows (ignored where it has none).
    pub weight: f64,
    /// LSQR's damping of this member.
    pub damp: f64,
}

/// A member's result: the solution (x, var, info, as [`super::lsqr()`] returns it) and its
/// history from iteration 0.
#[derive(Debug, Clone)]
pub struct MemberResult {
    pub solution: LsqrSolution,
    pub history: Vec<IterRecord>,
}

/// A member the batch handed over to the single solver ([`resume`]) once few were left (a
/// batch of one or two costs more than their single solves): its state after `scalars.itn`
/// iterations, its vectors (u: this rank's rows), its history so far and the seconds spent.
#[derive(Debug, Clone)]
pub struct Handover {
    pub scalars: LsqrScalars,
    pub u: Vec<f64>,
    pub v: Vec<f64>,
    pub w: Vec<f64>,
    pub x: Vec<f64>,
    pub var: Option<Vec<f64>>,
    pub history: Vec<IterRecord>,
    pub seconds: f64,
}

/// How a member left the batch.
#[derive(Debug, Clone)]
pub enum MemberEnd {
    /// Stopped in the batch.
    Done(MemberResult),
    /// Handed over to go on alone ([`resume`]).
    Handed(Box<Handover>),
}

/// Go on with a handed-over member on the single solver's operator `op` (member j's matrix,
/// [`BlockOperator::member_matrix`], stored as its own solve stores it): its iterations go on
/// where the batch left them, so the result is its single solve's. `params` with its damping.
pub fn resume<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    comm: &dyn Comm,
    h: Handover,
    params: &LsqrParams,
) -> Result<MemberResult> {
    let mut vecs = LsqrVectors {
        u: be.upload(&h.u)?,
        v: be.upload(&h.v)?,
        w: be.upload(&h.w)?,
        x: be.upload(&h.x)?,
        var: h.var.as_deref().map(|v| be.upload(v)).transpose()?,
    };
    let mut s = h.scalars;
    let itn0 = s.itn;
    let mut mon = History::default();
    let info = lsqr_iterate(be, op, comm, params, &mut s, &mut vecs, &mut mon)?;
    let mut history = h.history;
    history.extend(
        mon.0
            .into_iter()
            .filter(|r| r.itn > itn0)
            .map(|r| IterRecord {
                seconds: r.seconds + h.seconds,
                ..r
            }),
    );
    let info = LsqrInfo {
        start_itn: 0,
        seconds: h.seconds + info.seconds,
        ..info
    };
    Ok(MemberResult {
        solution: download_solution(be, &vecs, info)?,
        history,
    })
}

/// The blocks of the active members.
struct Blocks<V> {
    u: V,
    v: V,
    w: V,
    x: V,
    var: Option<V>,
    /// A^T U before the sum over ranks (None on one rank).
    tmp: Option<V>,
}

/// The state of the batch: the blocks, and per active column its member and scalars.
struct Batch<'a, B: BatchBackend, O: BlockOperator<B>> {
    be: &'a B,
    op: &'a O,
    comm: &'a dyn Comm,
    blocks: Blocks<B::Block>,
    /// Member index of each column.
    cols: Vec<usize>,
    scalars: Vec<LsqrScalars>,
}

/// The row weights and damping parameters of the batch's members, checked.
fn member_params(params: &LsqrParams, members: &[Member]) -> Result<Vec<LsqrParams>> {
    members
        .iter()
        .map(|m| {
            if !(m.weight.is_finite() && m.weight >= 0.0) {
                return Err(Error::Invalid(format!(
                    "batched LSQR: row weight must be finite and >= 0 (got {})",
                    m.weight
                )));
            }
            let p = LsqrParams {
                damp: m.damp,
                ..params.clone()
            };
            check_params(&p)?;
            Ok(p)
        })
        .collect()
}

/// Solve the members of a batch: `rhs[j]` is member j's right-hand side (this rank's rows),
/// `params` the settings all members share (its `damp` is replaced by each member's).
/// `finished(j, result)` is called as each member stops. Results come in member order.
pub fn lsqr_batch<B: BatchBackend, O: BlockOperator<B>>(
    be: &B,
    op: &O,
    comm: &dyn Comm,
    rhs: &[&[f64]],
    members: &[Member],
    params: &LsqrParams,
    finished: &mut dyn FnMut(usize, &MemberResult),
) -> Result<Vec<MemberResult>> {
    lsqr_batch_handoff(be, op, comm, (rhs, members), params, 0, finished)?
        .into_iter()
        .map(|e| match e {
            MemberEnd::Done(r) => Ok(r),
            MemberEnd::Handed(_) => Err(Error::Invalid(
                "batched LSQR: a member was handed over".into(),
            )),
        })
        .collect()
}

/// [`lsqr_batch`], handing the members over ([`MemberEnd::Handed`], to go on with [`resume`])
/// once no more than `handoff` are left (0: never).
pub fn lsqr_batch_handoff<B: BatchBackend, O: BlockOperator<B>>(
    be: &B,
    op: &O,
    comm: &dyn Comm,
    (rhs, members): (&[&[f64]], &[Member]),
    params: &LsqrParams,
    handoff: usize,
    finished: &mut dyn FnMut(usize, &MemberResult),
) -> Result<Vec<MemberEnd>> {
    let k = members.len();
    if rhs.len() != k {
        return Err(Error::Invalid(format!(
            "batched LSQR: {} right-hand sides for {k} members",
            rhs.len()
        )));
    }
    let per = member_params(params, members)?;
    let start = Instant::now();
    let weights: Vec<f64> = members.iter().map(|m| m.weight).collect();
    let mut batch = Batch::start(be, op, comm, rhs, (&weights, params.calc_var))?;
    let n = op.ncols();
    let lims: Vec<Limits> = per.iter().map(|p| Limits::new(p, n)).collect();
    let mut hist: Vec<Vec<IterRecord>> = batch
        .scalars
        .iter()
        .map(|s| vec![record_of(s, 0.0)])
        .collect();
    let mut results: Vec<Option<MemberEnd>> = vec![None; k];
    // Solved at the start (alpha or beta 0) or no iterations allowed: done before the loop.
    let done: Vec<bool> = (0..k)
        .map(|j| {
            let s = &mut batch.scalars[j];
            let solved = s.alpha == 0.0 || s.beta == 0.0;
            if !solved && lims[j].iter_lim == 0 {
                s.istop = 7;
            }
            solved || lims[j].iter_lim == 0
        })
        .collect();
    batch.retire(&done, &mut hist, &mut results, start, finished)?;
    while batch.cols.len() > handoff {
        batch.iteration(members, &lims, &per)?;
        let t = start.elapsed().as_secs_f64();
        let mut stop = vec![false; batch.cols.len()];
        for (c, &j) in batch.cols.iter().enumerate() {
            let s = &batch.scalars[c];
            hist[j].push(record_of(s, t));
            stop[c] = s.istop != 0;
        }
        batch.retire(&stop, &mut hist, &mut results, start, finished)?;
    }
    batch.hand_over(&mut hist, &mut results, start)?;
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| Error::Invalid("batched LSQR: a member has no result".into())))
        .collect()
}

impl<'a, B: BatchBackend, O: BlockOperator<B>> Batch<'a, B, O> {
    /// LSQR's start for every member (lsqr_start's steps on the blocks): u = b / ||b||,
    /// v = A^T u / ||A^T u||, w = v, x = 0.
    /// `(w, calc_var)`: the members' row weights, and whether var is accumulated.
    fn start(
        be: &'a B,
        op: &'a O,
        comm: &'a dyn Comm,
        rhs: &[&[f64]],
        (w, calc_var): (&[f64], bool),
    ) -> Result<Self> {
        let (m, n, k) = (op.nrows(), op.ncols(), rhs.len());
        let mut u = be.block_zeros(m, k)?;
        for (j, b) in rhs.iter().enumerate() {
            if b.len() != m {
                return Err(Error::Invalid(format!(
                    "right-hand side {j} has {} entries but the matrix has {m} rows here",
                    b.len()
                )));
            }
            be.block_set_column(&mut u, j, b)?;
        }
        let tmp = if comm.size() > 1 {
            Some(be.block_zeros(n, k)?)
        } else {
            None
        };
        let blocks = Blocks {
            u,
            v: be.block_zeros(n, k)?,
            w: be.block_zeros(n, k)?,
            x: be.block_zeros(n, k)?,
            var: if calc_var {
                Some(be.block_zeros(n, k)?)
            } else {
                None
            },
            tmp,
        };
        let mut b = Batch {
            be,
            op,
            comm,
            blocks,
            cols: (0..k).collect(),
            scalars: Vec::new(),
        };
        let bnorm = b.norms(true)?;
        let beta = bnorm.clone();
        b.scale_where_positive(true, &beta)?;
        // v = A^T u where beta > 0 (a zero u gives v = 0 = x, as the single start copies).
        b.apply_t(w, &vec![0.0; k])?;
        let alpha = b.norms(false)?;
        b.scale_where_positive(false, &alpha)?;
        be.block_axpby(1.0, &b.blocks.v, &vec![0.0; k], &mut b.blocks.w)?;
        b.scalars = (0..k)
            .map(|j| LsqrScalars {
                alpha: alpha[j],
                beta: beta[j],
                rhobar: alpha[j],
                phibar: beta[j],
                bnorm: bnorm[j],
                cs2: -1.0,
                rnorm: beta[j],
                r1norm: beta[j],
                r2norm: beta[j],
                arnorm: alpha[j] * beta[j],
                ..Default::default()
            })
            .collect();
        Ok(b)
    }

    /// The norms of u's columns (over ranks) or v's, as the single solver's `robust_norm`:
    /// rescaled by 2^600 or 2^-600 once more where a sum of squares is out of range.
    fn norms(&self, of_u: bool) -> Result<Vec<f64>> {
        let (be, comm) = (self.be, self.comm);
        let x = if of_u { &self.blocks.u } else { &self.blocks.v };
        let k = self.cols.len();
        let reduce = |s: &mut Vec<f64>| {
            if of_u && comm.size() > 1 {
                comm.allreduce_sum(s)
            } else {
                Ok(())
            }
        };
        let mut s = vec![0.0; k];
        be.block_norms_sq(x, None, &mut s)?;
        reduce(&mut s)?;
        let mut up = vec![1.0; k];
        let mut down = vec![f64::NAN; k];
        for j in 0..k {
            if s[j] == f64::INFINITY {
                (up[j], down[j]) = (SMALL, BIG);
            } else if s[j] < SMALL {
                (up[j], down[j]) = (BIG, SMALL);
            }
        }
        if down.iter().all(|d| d.is_nan()) {
            return Ok(s.iter().map(|v| v.sqrt()).collect());
        }
        let mut s2 = vec![0.0; k];
        be.block_norms_sq(x, Some(&up), &mut s2)?;
        reduce(&mut s2)?;
        Ok((0..k)
            .map(|j| {
                if s[j].is_nan() || down[j].is_nan() {
                    s[j].sqrt()
                } else {
                    s2[j].max(0.0).sqrt() * down[j]
                }
            })
            .collect())
    }

    /// u (or v) column j times 1 / norm[j] where norm[j] > 0 (times 1, exactly, elsewhere).
    fn scale_where_positive(&mut self, of_u: bool, norm: &[f64]) -> Result<()> {
        let f: Vec<f64> = norm
            .iter()
            .map(|&v| if v > 0.0 { 1.0 / v } else { 1.0 })
            .collect();
        let x = if of_u {
            &mut self.blocks.u
        } else {
            &mut self.blocks.v
        };
        self.be.block_scale(x, &f)
    }

    /// v_j = A_j^T u_j + beta[j] v_j summed over ranks (the single solver's `Dist::apply_t`).
    fn apply_t(&mut self, w: &[f64], beta: &[f64]) -> Result<()> {
        let (be, op, bl) = (self.be, self.op, &mut self.blocks);
        match bl.tmp.as_mut() {
            None => op.apply_block(be, Side::At, BlockScale::new(w, beta), &bl.u, &mut bl.v),
            Some(t) => {
                let zero = vec![0.0; beta.len()];
                op.apply_block(be, Side::At, BlockScale::new(w, &zero), &bl.u, t)?;
                be.block_allreduce_sum(self.comm, t)?;
                be.block_axpby(1.0, t, beta, &mut bl.v)
            }
        }
    }

    /// One LSQR iteration of every active member.
    fn iteration(&mut self, members: &[Member], lims: &[Limits], per: &[LsqrParams]) -> Result<()> {
        let be = self.be;
        let k = self.cols.len();
        let w: Vec<f64> = self.cols.iter().map(|&j| members[j].weight).collect();
        // The Golub-Kahan step: beta u = A v - alpha u; alpha v = A^T u - beta v.
        let neg_alpha: Vec<f64> = self.scalars.iter().map(|s| -s.alpha).collect();
        let bl = &mut self.blocks;
        let s = BlockScale::new(&w, &neg_alpha);
        self.op.apply_block(be, Side::A, s, &bl.v, &mut bl.u)?;
        let beta = self.norms(true)?;
        self.scale_where_positive(true, &beta)?;
        let positive = |v: f64| v > 0.0;
        // Where beta = 0 (or NaN) v stays (and alpha with it): those columns are put back after.
        let keep: Vec<(usize, Vec<f64>)> = (0..k)
            .filter(|&c| !positive(beta[c]))
            .map(|c| Ok((c, be.block_column(&self.blocks.v, c)?)))
            .collect::<Result<_>>()?;
        let neg_beta: Vec<f64> = beta.iter().map(|b| -b).collect();
        self.apply_t(&w, &neg_beta)?;
        for (c, col) in &keep {
            be.block_set_column(&mut self.blocks.v, *c, col)?;
        }
        let mut alpha = self.norms(false)?;
        for (c, _) in &keep {
            alpha[*c] = self.scalars[*c].alpha;
        }
        let scale: Vec<f64> = (0..k)
            .map(|c| if beta[c] > 0.0 { alpha[c] } else { 0.0 })
            .collect();
        self.scale_where_positive(false, &scale)?;
        // Each member's rotations, then one fused update of x and w for all.
        let mut steps = Vec::with_capacity(k);
        let mut rots = Vec::with_capacity(k);
        for (c, &j) in self.cols.iter().enumerate() {
            let s = &mut self.scalars[c];
            s.itn += 1;
            take_bidiag(s, (beta[c], alpha[c]), lims[j].dampsq);
            let (r, st) = begin_update(s, &lims[j]);
            rots.push(r);
            steps.push(st);
        }
        let mut dk2 = vec![0.0; k];
        let bl = &mut self.blocks;
        be.block_lsqr_update(
            &steps as &[XwStep],
            &bl.v,
            (&mut bl.x, &mut bl.w),
            bl.var.as_mut(),
            &mut dk2,
        )?;
        for (c, &j) in self.cols.iter().enumerate() {
            finish_update(&mut self.scalars[c], &rots[c], dk2[c], &lims[j], &per[j])
                .map_err(|e| Error::Invalid(format!("batch member {j}: {e}")))?;
        }
        Ok(())
    }

    /// Every member still in the batch handed over with its state.
    fn hand_over(
        &mut self,
        hist: &mut [Vec<IterRecord>],
        results: &mut [Option<MemberEnd>],
        start: Instant,
    ) -> Result<()> {
        let be = self.be;
        let bl = &self.blocks;
        for (c, &j) in self.cols.iter().enumerate() {
            let h = Handover {
                scalars: self.scalars[c].clone(),
                u: be.block_column(&bl.u, c)?,
                v: be.block_column(&bl.v, c)?,
                w: be.block_column(&bl.w, c)?,
                x: be.block_column(&bl.x, c)?,
                var: bl.var.as_ref().map(|v| be.block_column(v, c)).transpose()?,
                history: std::mem::take(&mut hist[j]),
                seconds: start.elapsed().as_secs_f64(),
            };
            results[j] = Some(MemberEnd::Handed(Box::new(h)));
        }
        self.cols.clear();
        Ok(())
    }

    /// Take the columns where `stop` is true out of the batch: their results are made and
    /// handed to `finished`, the blocks keep the others.
    fn retire(
        &mut self,
        stop: &[bool],
        hist: &mut [Vec<IterRecord>],
        results: &mut [Option<MemberEnd>],
        start: Instant,
        finished: &mut dyn FnMut(usize, &MemberResult),
    ) -> Result<()> {
        if !stop.iter().any(|&s| s) {
            return Ok(());
        }
        let be = self.be;
        let t = start.elapsed().as_secs_f64();
        for (c, &j) in self.cols.iter().enumerate() {
            if !stop[c] {
                continue;
            }
            let s = &self.scalars[c];
            let info: LsqrInfo = info_of(s, 0, t);
            let x = be.block_column(&self.blocks.x, c)?;
            let var = match &self.blocks.var {
                Some(v) => Some(be.block_column(v, c)?),
                None => None,
            };
            let r = MemberResult {
                solution: LsqrSolution { x, var, info },
                history: std::mem::take(&mut hist[j]),
            };
            finished(j, &r);
            results[j] = Some(MemberEnd::Done(r));
        }
        let keep: Vec<usize> = (0..self.cols.len()).filter(|&c| !stop[c]).collect();
        let bl = &mut self.blocks;
        for blk in [&mut bl.u, &mut bl.v, &mut bl.w, &mut bl.x] {
            be.block_keep(blk, &keep)?;
        }
        for blk in [bl.var.as_mut(), bl.tmp.as_mut()].into_iter().flatten() {
            be.block_keep(blk, &keep)?;
        }
        self.cols = keep.iter().map(|&c| self.cols[c]).collect();
        self.scalars = keep.iter().map(|&c| self.scalars[c].clone()).collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{CpuBackend, CpuBlockOperator, CpuCsrOperator};
    use crate::backend::TransposeStrategy;
    use crate::comm::{SerialComm, ThreadComm};
    use crate::solver::{lsqr, LeastSquares, NoMonitor};
    use crate::sparse::Csr;

    use crate::testproblems::uniform_rows as random;

    fn bits(x: &[f64]) -> Vec<u64> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Member j's own single solve: [G; w_j R] (or G with damp_j) by the single LSQR.
    fn single(
        g: &Csr,
        r: Option<&Csr>,
        b: &[f64],
        m: Member,
        params: &LsqrParams,
        comm: &dyn crate::comm::Comm,
    ) -> LsqrSolution {
        let a = match r {
            Some(r) => g.vstack_scaled(r, m.weight).unwrap(),
            None => g.clone(),
        };
        let op = CpuCsrOperator::new(a, TransposeStrategy::Auto);
        let p = LsqrParams {
            damp: m.damp,
            ..params.clone()
        };
        let be = CpuBackend::new();
        lsqr(&LeastSquares::new(&be, &op, comm, b), &p, &mut NoMonitor).unwrap()
    }

    /// The batch of `members` on [G; R] (R's rows weighted) or G, against each member's single
    /// solve: bitwise the same x (and var), istop and itn. Returns the results.
    fn check_batch(
        g: &Csr,
        r: Option<&Csr>,
        rhs: &[Vec<f64>],
        members: &[Member],
        params: &LsqrParams,
    ) -> Vec<MemberResult> {
        let (a, weighted) = match r {
            Some(r) => {
                let a = g.vstack_scaled(r, 1.0).unwrap();
                let flags = (0..a.nrows()).map(|i| i >= g.nrows()).collect();
                (a, Some(flags))
            }
            None => (g.clone(), None),
        };
        let op = CpuBlockOperator::new(a, weighted).unwrap();
        let refs: Vec<&[f64]> = rhs.iter().map(|b| b.as_slice()).collect();
        let mut order = Vec::new();
        let got = lsqr_batch(
            &CpuBackend::new(),
            &op,
            &SerialComm,
            &refs,
            members,
            params,
            &mut |j, _| order.push(j),
        )
        .unwrap();
        assert_eq!(order.len(), members.len(), "every member finishes once");
        for (j, (res, m)) in got.iter().zip(members).enumerate() {
            let want = single(g, r, &rhs[j], *m, params, &SerialComm);
            let (gi, wi) = (&res.solution.info, &want.info);
            assert_eq!((gi.istop, gi.itn), (wi.istop, wi.itn), "member {j} {m:?}");
            assert_eq!(bits(&res.solution.x), bits(&want.x), "member {j} {m:?}");
            assert_eq!(gi.norms, wi.norms, "member {j}");
            assert_eq!(
                res.solution.var.as_deref().map(bits),
                want.var.as_deref().map(bits)
            );
            assert_eq!(res.history.len(), gi.itn + 1);
        }
        got
    }

    /// Members that weigh the rows by `ws` (no damping).
    fn weighted(ws: &[f64]) -> Vec<Member> {
        ws.iter()
            .map(|&w| Member {
                weight: w,
                damp: 0.0,
            })
            .collect()
    }

    fn params(iter_lim: Option<usize>) -> LsqrParams {
        LsqrParams {
            atol: 1e-10,
            btol: 1e-10,
            conlim: 1e12,
            iter_lim,
            ..Default::default()
        }
    }

    #[test]
    fn damped_members_equal_their_single_solves_and_stop_apart() {
        let g = random(400, 150, 6, 1);
        let b: Vec<f64> = (0..400).map(|i| (i as f64 * 0.37).sin()).collect();
        let members: Vec<Member> = [0.0, 1e-3, 0.1, 0.5, 2.0, 10.0, 0.03, 0.3, 1.0, 5.0]
            .iter()
            .map(|&d| Member {
                weight: 1.0,
                damp: d,
            })
            .collect();
        let rhs = vec![b; members.len()];
        let mut p = params(None);
        p.calc_var = true;
        let got = check_batch(&g, None, &rhs, &members, &p);
        let itns: std::collections::BTreeSet<usize> =
            got.iter().map(|r| r.solution.info.itn).collect();
        assert!(
            itns.len() >= 4,
            "members stop at different iterations: {itns:?}"
        );
    }

    #[test]
    fn weighted_rows_members_equal_their_single_solves_one_at_the_iteration_limit() {
        let g = random(300, 200, 5, 2);
        let r = random(250, 200, 3, 3);
        let b: Vec<f64> = (0..300).map(|i| (i as f64 * 0.11).cos()).collect();
        let mut rhs: Vec<f64> = b.clone();
        rhs.resize(550, 0.0);
        let members = weighted(&[1e-4, 0.01, 0.1, 1.0, 3.0]);
        // Free: each member's own stop; then a limit that only the slowest member reaches.
        let free = check_batch(&g, Some(&r), &vec![rhs.clone(); 5], &members, &params(None));
        let itns: Vec<usize> = free.iter().map(|r| r.solution.info.itn).collect();
        let mut sorted = itns.clone();
        sorted.sort_unstable();
        assert!(sorted[4] > sorted[3], "{itns:?}");
        let lim = sorted[3] + (sorted[4] - sorted[3]) / 2;
        let got = check_batch(&g, Some(&r), &vec![rhs; 5], &members, &params(Some(lim)));
        let stops: Vec<u32> = got.iter().map(|r| r.solution.info.istop).collect();
        assert_eq!(stops.iter().filter(|&&s| s == 7).count(), 1, "{stops:?}");
        assert!(got.iter().all(|r| r.solution.info.itn <= lim));
    }

    #[test]
    fn one_member_and_mixed_rhs_equal_single_solves() {
        let g = random(200, 80, 4, 4);
        let r = random(90, 80, 2, 5);
        let mut b: Vec<f64> = (0..290).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
        let one = [Member {
            weight: 0.2,
            damp: 0.05,
        }];
        check_batch(&g, Some(&r), std::slice::from_ref(&b), &one, &params(None));
        // Different right-hand sides and weights and damping together; one b = 0 (solved at
        // the start, istop 0 after no iterations).
        let zero = vec![0.0; 290];
        b[3] = 1e3;
        let c: Vec<f64> = (0..290).map(|i| (i as f64).sqrt()).collect();
        let members = [
            Member {
                weight: 0.2,
                damp: 0.0,
            },
            Member {
                weight: 0.5,
                damp: 0.1,
            },
            Member {
                weight: 2.0,
                damp: 0.0,
            },
        ];
        let got = check_batch(&g, Some(&r), &[b, zero, c], &members, &params(None));
        assert_eq!(
            (got[1].solution.info.istop, got[1].solution.info.itn),
            (0, 0)
        );
    }

    #[test]
    fn over_ranks_each_member_equals_its_distributed_single_solve() {
        let g = random(360, 120, 5, 6);
        let r = random(200, 120, 3, 7);
        let a = g.vstack_scaled(&r, 1.0).unwrap();
        let mut b: Vec<f64> = (0..360).map(|i| (i as f64 * 0.7).sin()).collect();
        b.resize(560, 0.0);
        let members = weighted(&[0.01, 0.1, 1.0]);
        let p = params(None);
        let serial = check_batch(&g, Some(&r), &vec![b.clone(); 3], &members, &p);
        let ranks = 3;
        let bounds = [0usize, 150, 400, 560];
        let comms = ThreadComm::create(ranks);
        let per_rank: Vec<(Vec<MemberResult>, Vec<LsqrSolution>)> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    let (a, b, g, members, p) = (&a, &b, &g, &members, &p);
                    s.spawn(move || {
                        let rows: Vec<usize> = (bounds[c.rank()]..bounds[c.rank() + 1]).collect();
                        let mine = a.select_rows(&rows);
                        let flags = rows.iter().map(|&i| i >= g.nrows()).collect();
                        let bl = b[rows[0]..rows[0] + rows.len()].to_vec();
                        let op = CpuBlockOperator::new(mine.clone(), Some(flags)).unwrap();
                        let refs = vec![bl.as_slice(); members.len()];
                        let be = CpuBackend::new();
                        let got =
                            lsqr_batch(&be, &op, c, &refs, members, p, &mut |_, _| {}).unwrap();
                        // each member's single solve over the same ranks
                        let singles = members
                            .iter()
                            .map(|m| {
                                let mut aw = mine.clone();
                                let scaled: Vec<f64> = (0..aw.nrows())
                                    .flat_map(|i| {
                                        let f = if rows[i] >= g.nrows() { m.weight } else { 1.0 };
                                        mine.row(i).1.iter().map(move |v| v * f).collect::<Vec<_>>()
                                    })
                                    .collect();
                                aw.data_mut().copy_from_slice(&scaled);
                                let op = CpuCsrOperator::new(aw, TransposeStrategy::Auto);
                                lsqr(&LeastSquares::new(&be, &op, c, &bl), p, &mut NoMonitor)
                                    .unwrap()
                            })
                            .collect();
                        (got, singles)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (got, singles) in &per_rank {
            for (j, (g, s)) in got.iter().zip(singles).enumerate() {
                let (gi, si) = (&g.solution.info, &s.info);
                assert_eq!((gi.istop, gi.itn), (si.istop, si.itn), "member {j}");
                assert_eq!(bits(&g.solution.x), bits(&s.x), "member {j}");
                // and close to the one-rank solve
                let x1 = &serial[j].solution.x;
                let d: f64 = x1.iter().zip(&s.x).map(|(p, q)| (p - q).powi(2)).sum();
                let nx: f64 = x1.iter().map(|p| p * p).sum();
                assert!(d.sqrt() <= 1e-10 * nx.sqrt(), "member {j}");
            }
        }
    }

    #[test]
    fn handed_over_members_go_on_alone_to_their_single_solves() {
        let g = random(300, 120, 5, 9);
        let r = random(150, 120, 2, 10);
        let a = g.vstack_scaled(&r, 1.0).unwrap();
        let flags = (0..a.nrows()).map(|i| i >= 300).collect();
        let op = CpuBlockOperator::new(a, Some(flags)).unwrap();
        let mut b: Vec<f64> = (0..300).map(|i| (i as f64 * 0.3).sin()).collect();
        b.resize(450, 0.0);
        let members = weighted(&[1e-3, 0.03, 0.3, 3.0, 30.0]);
        let p = params(None);
        let be = CpuBackend::new();
        let refs = vec![b.as_slice(); 5];
        let ends = lsqr_batch_handoff(
            &be,
            &op,
            &SerialComm,
            (&refs, &members),
            &p,
            2,
            &mut |_, _| {},
        )
        .unwrap();
        let handed = ends
            .iter()
            .filter(|e| matches!(e, MemberEnd::Handed(_)))
            .count();
        assert!(handed >= 1, "the test needs a member handed over");
        for (j, e) in ends.into_iter().enumerate() {
            let got = match e {
                MemberEnd::Done(r) => r,
                MemberEnd::Handed(h) => {
                    assert!(h.scalars.itn > 0);
                    let single = CpuCsrOperator::new(
                        op.member_matrix(members[j].weight),
                        TransposeStrategy::Auto,
                    );
                    resume(&be, &single, &SerialComm, *h, &p).unwrap()
                }
            };
            let want = single(&g, Some(&r), &b, members[j], &p, &SerialComm);
            let (gi, wi) = (&got.solution.info, &want.info);
            assert_eq!((gi.istop, gi.itn), (wi.istop, wi.itn), "member {j}");
            assert_eq!(bits(&got.solution.x), bits(&want.x), "member {j}");
            assert_eq!(got.history.len(), gi.itn + 1, "member {j}");
            assert!(got.history.iter().enumerate().all(|(i, h)| h.itn == i));
        }
    }

    #[test]
    fn bad_members_are_errors() {
        let g = random(20, 10, 3, 8);
        let op = CpuBlockOperator::new(g, None).unwrap();
        let b = vec![1.0; 20];
        let run = |m: Member| {
            lsqr_batch(
                &CpuBackend::new(),
                &op,
                &SerialComm,
                &[&b],
                &[m],
                &params(None),
                &mut |_, _| {},
            )
        };
        assert!(run(Member {
            weight: 1.0,
            damp: -1.0
        })
        .is_err());
        assert!(run(Member {
            weight: f64::NAN,
            damp: 0.0
        })
        .is_err());
        let short = vec![1.0; 3];
        assert!(lsqr_batch(
            &CpuBackend::new(),
            &op,
            &SerialComm,
            &[&short],
            &[Member {
                weight: 1.0,
                damp: 0.0
            }],
            &params(None),
            &mut |_, _| {},
        )
        .is_err());
    }
}
