//! LSQR for several dampings of one system at about the cost of one solve.
//!
//! LSQR's Golub-Kahan bidiagonalisation of A from b (u, v, alpha, beta) does not depend on the
//! damping: damp enters only the plane rotations that follow it (Paige & Saunders 1982, §2.4;
//! `rotations` in src/solver/lsqr.rs). So members that share A and b and differ in `damp` (an
//! L-curve over LSQR's damping, GCV's probes at every damping) share one bidiagonalisation: one
//! A v and one A^T u per iteration for all of them, while each member keeps its own rotations,
//! x, w (and var), estimates and stopping tests, and leaves when its own test fires. Every
//! member's iterations are its single host-loop solve's, operation for operation (the same
//! products, the same update kernel, the same scalar code), so istop, itn, x and var are that
//! solve's bit for bit. The bidiagonalisation goes on while any member does.

use std::time::Instant;

use super::bidiag::Dist;
use super::lsqr::{
    begin_update, check_params, finish_update, info_of, lsqr_start, record_of, take_bidiag, Limits,
};
use super::{IterRecord, LeastSquares, LsqrParams, LsqrScalars, LsqrSolution};
use crate::backend::lsqr::LsqrVectors;
use crate::backend::{Backend, Operator, XwState};
use crate::error::Result;

/// One member's own part: its scalars, x, w (var), limits, history and seconds at its stop.
struct Own<V> {
    s: LsqrScalars,
    x: V,
    w: V,
    var: Option<V>,
    lim: Limits,
    history: Vec<IterRecord>,
    seconds: f64,
}

impl<V> Own<V> {
    fn active(&self) -> bool {
        self.s.istop == 0 && self.s.itn < self.lim.iter_lim
    }
}

/// Solve min ||b - A x||^2 + damp_j^2 ||x - x0||^2 for every `params[j]` (its damp, tolerances,
/// iteration limit and calc_var its own) with one bidiagonalisation: member j's result and
/// history (from iteration 0) are those of [`super::lsqr()`] with `params[j]` on the host loop
/// (the operator's device loop, where it has one, sums in another order). Collective over the
/// problem's ranks, as the single solve.
pub fn lsqr_damps<B: Backend, O: Operator<B>>(
    p: &LeastSquares<'_, B, O>,
    params: &[LsqrParams],
) -> Result<Vec<(LsqrSolution, Vec<IterRecord>)>> {
    let Some(first) = params.first() else {
        return Ok(Vec::new());
    };
    params.iter().try_for_each(check_params)?;
    let (be, op, comm) = (p.be, p.op, p.comm);
    let started = Instant::now();
    let bd = be.upload(p.b)?;
    let x0d = p.x0.map(|x| be.upload(x)).transpose()?;
    // The start does not depend on damp (nor var on more than whether it is kept).
    let start_params = LsqrParams {
        calc_var: false,
        ..first.clone()
    };
    let (s0, vecs) = lsqr_start(be, op, comm, &bd, x0d.as_ref(), &start_params)?;
    drop((bd, x0d));
    let n = op.ncols();
    let LsqrVectors {
        mut u, mut v, w, x, ..
    } = vecs;
    let mut own: Vec<Own<B::Vector>> = Vec::with_capacity(params.len());
    for q in params {
        let (mut xj, mut wj) = (be.zeros(n)?, be.zeros(n)?);
        be.copy(&x, &mut xj)?;
        be.copy(&w, &mut wj)?;
        own.push(Own {
            s: s0.clone(),
            x: xj,
            w: wj,
            var: q.calc_var.then(|| be.zeros(n)).transpose()?,
            lim: Limits::new(q, n),
            history: vec![record_of(&s0, 0.0)],
            seconds: 0.0,
        });
    }
    drop((x, w));
    // As the single solve: a start that is already a solution (alpha or beta 0) stops there.
    let solved = s0.alpha == 0.0 || s0.beta == 0.0;
    if !solved {
        let mut d = Dist::new(be, op, comm)?;
        let mut alpha = s0.alpha;
        while own.iter().any(Own::active) {
            let ba = d.step(alpha, &mut u, &mut v)?;
            alpha = ba.1;
            let mut steps = Vec::new();
            let mut rots = Vec::new();
            let mut states = Vec::new();
            let mut who = Vec::new();
            for (j, m) in own.iter_mut().enumerate().filter(|(_, m)| m.active()) {
                m.s.itn += 1;
                take_bidiag(&mut m.s, ba, m.lim.dampsq);
                let (r, k) = begin_update(&mut m.s, &m.lim);
                steps.push(k);
                rots.push(r);
                states.push(XwState {
                    x: &mut m.x,
                    w: &mut m.w,
                    var: m.var.as_mut(),
                });
                who.push(j);
            }
            let dk2 = be.lsqr_update_many(&steps, &v, states)?;
            let t = started.elapsed().as_secs_f64();
            for ((j, r), dk2) in who.into_iter().zip(rots).zip(dk2) {
                let m = &mut own[j];
                finish_update(&mut m.s, &r, dk2, &m.lim, &params[j])?;
                m.history.push(record_of(&m.s, t));
                m.seconds = t;
            }
        }
    }
    own.into_iter()
        .map(|mut m| {
            if !solved && m.s.istop == 0 && m.s.itn >= m.lim.iter_lim {
                m.s.istop = 7;
            }
            let solution = LsqrSolution {
                x: be.to_host(&m.x)?,
                var: m.var.as_ref().map(|d| be.to_host(d)).transpose()?,
                info: info_of(&m.s, 0, m.seconds),
            };
            Ok((solution, m.history))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{CpuBackend, CpuCsrOperator};
    use crate::backend::TransposeStrategy;
    use crate::comm::{Comm, SerialComm, ThreadComm};
    use crate::solver::{lsqr, History};

    use crate::testproblems::uniform_rows as random;

    fn bits(x: &[f64]) -> Vec<u64> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Every member equals its own single solve bit for bit: x, var, istop, itn, the norms and
    /// the history; members that stop at different iterations, on their own limits, with and
    /// without var, from x0.
    #[test]
    fn each_damping_equals_its_single_solve_bit_for_bit() {
        let a = random(300, 120, 6, 7);
        let mut rng = crate::grid::Rng::new(8);
        let b: Vec<f64> = (0..300).map(|_| rng.uniform() - 0.5).collect();
        let x0: Vec<f64> = (0..120).map(|_| 0.1 * (rng.uniform() - 0.5)).collect();
        let be = CpuBackend::new();
        let op = CpuCsrOperator::new(a.clone(), TransposeStrategy::Auto);
        let base = LsqrParams {
            atol: 1e-9,
            btol: 1e-9,
            conlim: 1e8,
            ..Default::default()
        };
        let ps: Vec<LsqrParams> = [
            (0.0, None, true),
            (0.4, None, false),
            (1.2, None, true),
            (1.0, Some(15), false),
            (3.0, None, false),
            (0.1, Some(0), true),
        ]
        .iter()
        .map(|&(damp, iter_lim, calc_var)| LsqrParams {
            damp,
            iter_lim,
            calc_var,
            ..base.clone()
        })
        .collect();
        for x0 in [None, Some(x0.as_slice())] {
            let prob = LeastSquares::new(&be, &op, &SerialComm, &b).x0(x0);
            let all = lsqr_damps(&prob, &ps).unwrap();
            let mut itns = Vec::new();
            for ((sol, hist), q) in all.iter().zip(&ps) {
                let mut h = History::default();
                let one = lsqr(&prob, q, &mut h).unwrap();
                assert_eq!(sol.info.istop, one.info.istop, "damp {}", q.damp);
                assert_eq!(sol.info.itn, one.info.itn, "damp {}", q.damp);
                assert_eq!(sol.info.norms, one.info.norms, "damp {}", q.damp);
                assert_eq!(bits(&sol.x), bits(&one.x), "damp {}", q.damp);
                assert_eq!(
                    sol.var.as_deref().map(bits),
                    one.var.as_deref().map(bits),
                    "damp {}",
                    q.damp
                );
                assert_eq!(hist.len(), h.0.len());
                for (p, o) in hist.iter().zip(&h.0) {
                    assert_eq!(
                        IterRecord { seconds: 0.0, ..*p },
                        IterRecord { seconds: 0.0, ..*o }
                    );
                }
                itns.push(sol.info.itn);
            }
            // the members really stopped apart: on tolerances at several iterations, one on
            // its limit of 15, one on its limit of 0
            assert_eq!(itns[3], 15);
            assert_eq!(itns[5], 0);
            assert_eq!(all[5].0.info.istop, 7);
            let mut tol: Vec<usize> = [0, 1, 2, 4].iter().map(|&j| itns[j]).collect();
            tol.dedup();
            assert!(tol.len() >= 3, "{itns:?}");
            assert!(itns.iter().all(|&i| i < 200), "{itns:?}");
        }
    }

    /// Over ranks (rows split, A^T u summed): each member equals its distributed single solve
    /// bit for bit.
    #[test]
    fn over_ranks_each_damping_equals_its_distributed_single_solve() {
        let a = random(420, 90, 5, 11);
        let b: Vec<f64> = (0..420).map(|i| (i as f64 * 0.37).sin()).collect();
        let ps: Vec<LsqrParams> = [0.0, 0.05, 0.5, 2.0]
            .iter()
            .map(|&damp| LsqrParams {
                damp,
                atol: 1e-10,
                btol: 1e-10,
                ..Default::default()
            })
            .collect();
        let bounds = [0usize, 100, 333, 420];
        let comms = ThreadComm::create(3);
        std::thread::scope(|sc| {
            for c in &comms {
                let (a, b, ps) = (&a, &b, &ps);
                sc.spawn(move || {
                    let rows: Vec<usize> = (bounds[c.rank()]..bounds[c.rank() + 1]).collect();
                    let op = CpuCsrOperator::new(a.select_rows(&rows), TransposeStrategy::Auto);
                    let bl = &b[rows[0]..rows[0] + rows.len()];
                    let be = CpuBackend::new();
                    let prob = LeastSquares::new(&be, &op, c, bl);
                    let all = lsqr_damps(&prob, ps).unwrap();
                    for ((sol, _), q) in all.iter().zip(ps) {
                        let one = lsqr(&prob, q, &mut History::default()).unwrap();
                        assert_eq!(
                            (sol.info.istop, sol.info.itn),
                            (one.info.istop, one.info.itn)
                        );
                        assert_eq!(bits(&sol.x), bits(&one.x), "damp {}", q.damp);
                    }
                });
            }
        });
    }

    /// A b of zeros is a solution at the start for every member (istop 0, no iterations), as
    /// each single solve says; no members, no results.
    #[test]
    fn zero_rhs_and_no_members() {
        let a = random(40, 10, 3, 1);
        let be = CpuBackend::new();
        let op = CpuCsrOperator::new(a.clone(), TransposeStrategy::Auto);
        let b = vec![0.0; 40];
        let prob = LeastSquares::new(&be, &op, &SerialComm, &b);
        let ps = vec![
            LsqrParams {
                damp: 0.5,
                ..Default::default()
            };
            2
        ];
        for (sol, h) in lsqr_damps(&prob, &ps).unwrap() {
            let one = lsqr(&prob, &ps[0], &mut History::default()).unwrap();
            assert_eq!((sol.info.istop, sol.info.itn), (one.info.istop, 0));
            assert_eq!(h.len(), 1);
            assert!(sol.x.iter().all(|&v| v == 0.0));
        }
        assert!(lsqr_damps(&prob, &[]).unwrap().is_empty());
        let bad = [LsqrParams {
            damp: -1.0,
            ..Default::default()
        }];
        assert!(lsqr_damps(&prob, &bad).is_err());
    }
}
