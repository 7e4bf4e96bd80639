//! Preconditioners of a distributed square solve (GMRES): which one ([`SquarePrecond`]), its
//! collective set-up on any backend ([`square_precond`]) and the result of a solve
//! ([`SquareSolve`]). The halo exchange lives in [`crate::comm::halo`], the CPU operator in
//! [`crate::backend::cpu::square`], the drivers in `pipeline::square`.

use crate::backend::cpu::square::DistSquareOperator;
use crate::backend::precond::{BlockIlu0, Identity, Jacobi, PivotPolicy, Preconditioner, TriSolve};
use crate::backend::Backend;
use crate::comm::halo::CommVolume;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::solver::gmres::GmresInfo;

/// Preconditioner of a CPU square solve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SquarePrecond {
    None,
    Jacobi,
    /// One ILU(0) block per rank.
    BlockIlu0 {
        pivot: PivotPolicy,
        tri: TriSolve,
    },
}

/// The result of a square solve on one rank (`pipeline::square::gmres_square`).
#[derive(Debug, Clone)]
pub struct SquareSolve {
    /// This rank's entries of x.
    pub x_local: Vec<f64>,
    pub info: GmresInfo,
    pub precond: String,
    /// Summed over ranks.
    pub jacobi_zero_diagonals: Option<usize>,
    pub ilu_replaced_pivots: Option<usize>,
    pub ilu_inserted_diagonals: Option<usize>,
    /// Seconds to build the halo pattern, the local matrix and the preconditioner.
    pub setup_seconds: f64,
    /// The halo exchange of one product, over all ranks.
    pub halo: CommVolume,
    /// How the matrix rows were stored: "csr", or the GPU's row patterns described.
    pub storage: String,
}

/// What a preconditioner's set-up fixed up, summed over ranks (None: not this preconditioner).
#[derive(Debug, Clone, Copy, Default)]
pub struct PrecondCounts {
    pub zero_diagonals: Option<usize>,
    pub replaced_pivots: Option<usize>,
    pub inserted_diagonals: Option<usize>,
}

/// Set up one rank's preconditioner on backend `be` (collective: every rank calls it, and a
/// failed ILU(0) on any rank ends every rank with an error). `ilu` turns the host ILU(0)
/// factors into the backend's preconditioner (the factors themselves on the CPU; Jacobi sweeps
/// on the device for CUDA). `row0` is the global index of this rank's first row (messages).
pub fn square_precond<B: Backend + 'static>(
    be: &B,
    comm: &dyn Comm,
    op: &DistSquareOperator<'_>,
    row0: usize,
    precond: SquarePrecond,
    ilu: impl FnOnce(BlockIlu0) -> Result<Box<dyn Preconditioner<B>>>,
) -> Result<(Box<dyn Preconditioner<B>>, PrecondCounts)>
where
    B::Vector: 'static,
{
    let sum = |v: usize| -> Result<Option<usize>> {
        Ok(Some(comm.allreduce_scalar(v as f64)?.round() as usize))
    };
    let mut counts = PrecondCounts::default();
    let pc: Box<dyn Preconditioner<B>> = match precond {
        SquarePrecond::None => Box::new(Identity),
        SquarePrecond::Jacobi => {
            let j = Jacobi::new(be, &op.diagonal())?;
            counts.zero_diagonals = sum(j.zero_diagonals)?;
            Box::new(j)
        }
        SquarePrecond::BlockIlu0 { pivot, tri } => {
            let nl = op.plan().n_local;
            // every rank takes part in the reductions below, even when its set-up fails
            let f = BlockIlu0::new(op.local_matrix(), nl, row0, pivot, tri).and_then(|f| {
                let (r, i) = (f.replaced_pivots, f.inserted_diagonals);
                ilu(f).map(|p| (p, r, i))
            });
            let failed = comm.allreduce_scalar(if f.is_err() { 1.0 } else { 0.0 })?;
            let (p, r, i) = f?;
            if failed > 0.0 {
                return Err(Error::Invalid(
                    "block ILU(0) failed on another rank (see its message)".into(),
                ));
            }
            counts.replaced_pivots = sum(r)?;
            counts.inserted_diagonals = sum(i)?;
            p
        }
    };
    Ok((pc, counts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::square::DistSquareOperator;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::Operator;
    use crate::comm::halo::*;
    use crate::comm::ThreadComm;
    use crate::partition::graph::RowPartition;
    use crate::testproblems::random_square;

    #[test]
    fn partitions_cover_rows() {
        let a = random_square(1000, 10.0, 6, 3);
        for p in 1..6 {
            for part in [
                RowPartition::contiguous(1000, p),
                RowPartition::by_nnz(a.indptr(), p),
            ] {
                assert_eq!(part.parts(), p);
                assert_eq!(part.bounds[0], 0);
                assert_eq!(*part.bounds.last().unwrap(), 1000);
                assert!(part.bounds.windows(2).all(|w| w[0] <= w[1]));
                for g in [0usize, 1, 499, 999] {
                    assert!(part.range(part.owner(g)).contains(&g));
                }
            }
        }
    }

    #[test]
    fn pure_plans_reproduce_the_serial_product() {
        let n = 777;
        let a = random_square(n, 10.0, 6, 11);
        let x: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).cos()).collect();
        let want = a.matvec(&x);
        for p in [1usize, 2, 3, 5] {
            let part = RowPartition::by_nnz(a.indptr(), p);
            let plans = plan_all(&a, &part).unwrap();
            for (r, (l, h)) in plans.iter().enumerate() {
                // gather ghosts the way the exchange would: from each owner's send list to r
                let mut ext: Vec<f64> = x[part.range(r)].to_vec();
                for (s, (_, hs)) in plans.iter().enumerate() {
                    let o = part.range(s).start;
                    ext.extend(hs.send_idx[r].iter().map(|&i| x[o + i as usize]));
                }
                assert_eq!(ext.len(), l.a.ncols());
                assert_eq!(h.recv_volume(), l.ghosts.len());
                let y = l.a.matvec(&ext);
                for (k, yi) in y.iter().enumerate() {
                    let g = part.range(r).start + k;
                    assert!((yi - want[g]).abs() <= 1e-13 * (1.0 + want[g].abs()));
                }
            }
        }
    }

    #[test]
    fn threaded_ranks_reproduce_the_serial_product() {
        let n = 500;
        let a = random_square(n, 10.0, 6, 5);
        let x: Vec<f64> = (0..n).map(|i| 1.0 + (i % 7) as f64).collect();
        let want = a.matvec(&x);
        for p in [2usize, 4] {
            let part = RowPartition::contiguous(n, p);
            let comms = ThreadComm::create(p);
            let got: Vec<Vec<f64>> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| {
                        let (a, part, x) = (&a, &part, &x);
                        s.spawn(move || {
                            let rows: Vec<usize> = part.range(c.rank()).collect();
                            let op =
                                DistSquareOperator::distributed(&a.select_rows(&rows), part, c)
                                    .unwrap();
                            let xl = x[part.range(c.rank())].to_vec();
                            let mut y = vec![0.0; xl.len()];
                            op.apply(&CpuBackend::new(), crate::backend::Scale::SET, &xl, &mut y)
                                .unwrap();
                            y
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let y: Vec<f64> = got.concat();
            for (p, q) in y.iter().zip(&want) {
                assert!((p - q).abs() <= 1e-13 * (1.0 + q.abs()));
            }
        }
    }
}
