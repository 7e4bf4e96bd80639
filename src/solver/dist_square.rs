//! Distributed sparse products for square systems (GMRES): rows of A, and the entries of x and b,
//! are split into contiguous blocks, one per rank. Each rank receives only the x entries its rows
//! reference ("ghosts"), packed into one compressed buffer placed right after its own entries;
//! its local columns are renumbered (owned columns 0..n_local, ghosts n_local..) so that the
//! received values are used in place by the local CSR product (Khodja et al. 2014).
//!
//! Set-up: [`localize`] renumbers a rank's rows (pure function); [`build_halo`] asks every owner
//! for its ghosts with one [`Comm::alltoallv_u64`]; [`plan_all`] does the same for P simulated
//! ranks at once (pure; used for tests and for the communication volume of a partition).
//! [`ThreadComm`] runs P ranks as threads in one process, for tests of the whole distributed
//! solve without MPI.

use std::sync::Mutex;

use rayon::prelude::*;

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, Operator};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::partition::graph::{RowPartition, SquarePartition};
use crate::solver::gmres::{gmres, GmresInfo, GmresMonitor, GmresParams};
use crate::solver::precond::{BlockIlu0, Identity, Jacobi, PivotPolicy, Preconditioner, TriSolve};
use crate::sparse::Csr;

/// A rank's rows with renumbered columns and what it receives.
#[derive(Debug, Clone)]
pub struct LocalRows {
    /// n_local x (n_local + ghosts.len()).
    pub a: Csr,
    /// Global index of each ghost column, sorted (hence grouped by owner rank).
    pub ghosts: Vec<u64>,
    /// Ghost counts received from each rank.
    pub recv_counts: Vec<usize>,
}

/// Renumber the columns of `rows` (this rank's rows, global column indices) for `rank`.
pub fn localize(rows: &Csr, part: &RowPartition, rank: usize) -> Result<LocalRows> {
    let own = part.range(rank);
    let nl = own.len();
    if rows.nrows() != nl || rows.ncols() != *part.bounds.last().unwrap_or(&0) {
        return Err(Error::Invalid(format!(
            "rank {rank}: {} x {} local rows do not match the partition ({nl} rows of {})",
            rows.nrows(),
            rows.ncols(),
            part.bounds.last().unwrap_or(&0)
        )));
    }
    let mut ghosts: Vec<u64> = rows
        .indices()
        .iter()
        .map(|&c| c as usize)
        .filter(|c| !own.contains(c))
        .map(|c| c as u64)
        .collect();
    ghosts.sort_unstable();
    ghosts.dedup();
    let mut recv_counts = vec![0usize; part.parts()];
    for &g in &ghosts {
        recv_counts[part.owner(g as usize)] += 1;
    }
    let ncols = nl + ghosts.len();
    let mut indptr = Vec::with_capacity(nl + 1);
    let mut idx = Vec::with_capacity(rows.nnz());
    let mut val = Vec::with_capacity(rows.nnz());
    let mut pairs: Vec<(u32, f64)> = Vec::new();
    indptr.push(0u64);
    for i in 0..nl {
        let (c, v) = rows.row(i);
        pairs.clear();
        for (&j, &x) in c.iter().zip(v) {
            let j = j as usize;
            let lj = if own.contains(&j) {
                j - own.start
            } else {
                nl + ghosts.binary_search(&(j as u64)).unwrap_or(0)
            };
            pairs.push((lj as u32, x));
        }
        pairs.sort_unstable_by_key(|p| p.0);
        for &(j, x) in &pairs {
            idx.push(j);
            val.push(x);
        }
        indptr.push(idx.len() as u64);
    }
    let a = Csr::try_new(nl, ncols, indptr, idx, val)?;
    Ok(LocalRows {
        a,
        ghosts,
        recv_counts,
    })
}

/// The halo exchange of one rank.
#[derive(Debug, Clone)]
pub struct HaloPlan {
    pub n_local: usize,
    /// Local indices of the x entries to send to each rank.
    pub send_idx: Vec<Vec<u32>>,
    /// Entries received from each rank (in the order of the ghost columns).
    pub recv_counts: Vec<usize>,
}

impl HaloPlan {
    /// Values this rank receives per product.
    pub fn recv_volume(&self) -> usize {
        self.recv_counts.iter().sum()
    }
    /// Ranks this rank receives from.
    pub fn recv_messages(&self) -> usize {
        self.recv_counts.iter().filter(|&&c| c > 0).count()
    }
}

/// Build this rank's halo plan: ask each owner for the ghosts (one all-to-all of indices).
pub fn build_halo(comm: &dyn Comm, local: &LocalRows, part: &RowPartition) -> Result<HaloPlan> {
    let p = comm.size();
    if part.parts() != p {
        return Err(Error::Invalid(format!(
            "partition has {} parts but the job has {p} ranks",
            part.parts()
        )));
    }
    let mut req: Vec<Vec<u64>> = vec![Vec::new(); p];
    for &g in &local.ghosts {
        req[part.owner(g as usize)].push(g);
    }
    let asked = comm.alltoallv_u64(&req)?;
    let own = part.range(comm.rank());
    let mut send_idx = Vec::with_capacity(p);
    for (r, list) in asked.iter().enumerate() {
        let mut s = Vec::with_capacity(list.len());
        for &g in list {
            if !own.contains(&(g as usize)) {
                return Err(Error::Comm(format!(
                    "rank {r} asked rank {} for x[{g}], which it does not own",
                    comm.rank()
                )));
            }
            s.push((g as usize - own.start) as u32);
        }
        send_idx.push(s);
    }
    Ok(HaloPlan {
        n_local: own.len(),
        send_idx,
        recv_counts: local.recv_counts.clone(),
    })
}

/// Set-up for P simulated ranks of the whole matrix `a` (pure; no communication).
pub fn plan_all(a: &Csr, part: &RowPartition) -> Result<Vec<(LocalRows, HaloPlan)>> {
    let p = part.parts();
    let locals = (0..p)
        .map(|r| {
            let rows: Vec<usize> = part.range(r).collect();
            localize(&a.select_rows(&rows), part, r)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::with_capacity(p);
    for (r, l) in locals.iter().enumerate() {
        let own = part.range(r);
        let send_idx = locals
            .iter()
            .map(|other| {
                other
                    .ghosts
                    .iter()
                    .filter(|&&g| own.contains(&(g as usize)))
                    .map(|&g| (g as usize - own.start) as u32)
                    .collect()
            })
            .collect();
        out.push((
            l.clone(),
            HaloPlan {
                n_local: own.len(),
                send_idx,
                recv_counts: l.recv_counts.clone(),
            },
        ));
    }
    Ok(out)
}

/// Communication of one distributed product for a partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CommVolume {
    pub parts: usize,
    /// Values received per product, summed over ranks.
    pub total_values: usize,
    /// The largest count one rank receives.
    pub max_values: usize,
    /// Point-to-point messages per product.
    pub messages: usize,
    /// Largest and smallest nonzeros held by one rank.
    pub max_nnz: usize,
    pub min_nnz: usize,
}

/// Communication volume of a partition of `a`.
pub fn comm_volume(a: &Csr, part: &RowPartition) -> Result<CommVolume> {
    let plans = plan_all(a, part)?;
    let nnz: Vec<usize> = plans.iter().map(|(l, _)| l.a.nnz()).collect();
    Ok(CommVolume {
        parts: part.parts(),
        total_values: plans.iter().map(|(_, h)| h.recv_volume()).sum(),
        max_values: plans
            .iter()
            .map(|(_, h)| h.recv_volume())
            .max()
            .unwrap_or(0),
        messages: plans.iter().map(|(_, h)| h.recv_messages()).sum(),
        max_nnz: nnz.iter().copied().max().unwrap_or(0),
        min_nnz: nnz.iter().copied().min().unwrap_or(0),
    })
}

impl SquarePartition {
    /// Communication of one distributed product under this partition.
    pub fn comm_volume(&self, a: &Csr) -> Result<CommVolume> {
        if self.perm.is_identity() {
            comm_volume(a, &self.part)
        } else {
            comm_volume(&self.perm.apply_symmetric(a)?, &self.part)
        }
    }
}

/// This rank's rows of a square matrix on the CPU, with the halo exchange built in: `apply` takes
/// and returns vectors of this rank's n_local entries.
pub struct DistSquareOperator<'c> {
    a: Csr,
    plan: HaloPlan,
    comm: &'c dyn Comm,
    /// [x_local, ghosts] and the send buffers, allocated once.
    ext: Mutex<(Vec<f64>, Vec<Vec<f64>>)>,
}

impl<'c> DistSquareOperator<'c> {
    pub fn new(local: LocalRows, plan: HaloPlan, comm: &'c dyn Comm) -> Self {
        let ncols = local.a.ncols();
        let sends = plan
            .send_idx
            .iter()
            .map(|s| Vec::with_capacity(s.len()))
            .collect();
        DistSquareOperator {
            a: local.a,
            plan,
            comm,
            ext: Mutex::new((vec![0.0; ncols], sends)),
        }
    }
    /// One rank holding the whole square matrix (no exchange).
    pub fn serial(a: Csr, comm: &'c dyn Comm) -> Result<Self> {
        if a.nrows() != a.ncols() {
            return Err(Error::Invalid(format!(
                "GMRES needs a square matrix; got {} x {}",
                a.nrows(),
                a.ncols()
            )));
        }
        let part = RowPartition::contiguous(a.nrows(), 1);
        let local = localize(&a, &part, 0)?;
        let plan = HaloPlan {
            n_local: a.nrows(),
            send_idx: vec![Vec::new()],
            recv_counts: vec![0],
        };
        Ok(Self::new(local, plan, comm))
    }
    /// Build from this rank's rows (global columns) with one index exchange.
    pub fn distributed(rows: &Csr, part: &RowPartition, comm: &'c dyn Comm) -> Result<Self> {
        let local = localize(rows, part, comm.rank())?;
        let plan = build_halo(comm, &local, part)?;
        Ok(Self::new(local, plan, comm))
    }
    /// The local matrix (owned columns first, then ghosts).
    pub fn local_matrix(&self) -> &Csr {
        &self.a
    }
    pub fn plan(&self) -> &HaloPlan {
        &self.plan
    }
    /// The communication of one product over all ranks (collective: every rank calls it).
    pub fn comm_volume(&self) -> Result<CommVolume> {
        let c = self.comm;
        let recv = self.plan.recv_volume();
        let mut sums = [recv as f64, self.plan.recv_messages() as f64];
        c.allreduce_sum(&mut sums)?;
        let nnz = self.a.nnz() as f64;
        Ok(CommVolume {
            parts: c.size(),
            total_values: sums[0].round() as usize,
            max_values: c.allreduce_max(recv as f64)?.round() as usize,
            messages: sums[1].round() as usize,
            max_nnz: c.allreduce_max(nnz)?.round() as usize,
            min_nnz: (-c.allreduce_max(-nnz)?).round() as usize,
        })
    }
    /// This rank's diagonal entries (0 where absent).
    pub fn diagonal(&self) -> Vec<f64> {
        let n = self.plan.n_local;
        (0..n)
            .map(|i| {
                let (c, v) = self.a.row(i);
                c.binary_search(&(i as u32)).map(|k| v[k]).unwrap_or(0.0)
            })
            .collect()
    }
}

impl Operator<CpuBackend> for DistSquareOperator<'_> {
    fn nrows(&self) -> usize {
        self.plan.n_local
    }
    fn ncols(&self) -> usize {
        self.plan.n_local
    }
    fn apply(
        &self,
        _be: &CpuBackend,
        alpha: f64,
        x: &Vec<f64>,
        beta: f64,
        y: &mut Vec<f64>,
    ) -> Result<()> {
        let n = self.plan.n_local;
        assert!(x.len() == n && y.len() == n);
        let mut guard = self.ext.lock().unwrap_or_else(|e| e.into_inner());
        let (ext, sends) = &mut *guard;
        if self.a.ncols() > n {
            ext[..n].copy_from_slice(x);
        }
        if self.comm.size() > 1 {
            for (buf, idx) in sends.iter_mut().zip(&self.plan.send_idx) {
                buf.clear();
                buf.extend(idx.iter().map(|&i| x[i as usize]));
            }
            // The Comm trait returns fresh buffers: the one allocation per product.
            let recv = self.comm.alltoallv(sends)?;
            let mut off = n;
            for (r, (got, &want)) in recv.iter().zip(&self.plan.recv_counts).enumerate() {
                if got.len() != want {
                    return Err(Error::Comm(format!(
                        "halo exchange: rank {r} sent {} values, expected {want}",
                        got.len()
                    )));
                }
                ext[off..off + want].copy_from_slice(got);
                off += want;
            }
        }
        let a = &self.a;
        // Without ghosts the local columns are x itself: skip the copy.
        let ext: &[f64] = if a.ncols() == n { x } else { &ext[..] };
        let body = |(i, yi): (usize, &mut f64)| {
            let (c, v) = a.row(i);
            let mut s = 0.0;
            for (&j, &aij) in c.iter().zip(v) {
                s += aij * ext[j as usize];
            }
            *yi = if beta == 0.0 {
                alpha * s
            } else {
                alpha * s + beta * *yi
            };
        };
        if a.nnz() < 64 * 1024 {
            y.iter_mut().enumerate().for_each(body);
        } else {
            y.par_iter_mut()
                .with_min_len(4096)
                .enumerate()
                .for_each(body);
        }
        Ok(())
    }
    fn apply_t(
        &self,
        _be: &CpuBackend,
        _alpha: f64,
        _y: &Vec<f64>,
        _beta: f64,
        _x: &mut Vec<f64>,
    ) -> Result<()> {
        Err(Error::Invalid(
            "the distributed square operator has no transpose product (GMRES does not need one)"
                .into(),
        ))
    }
}

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

/// The result of [`gmres_square_cpu`] on one rank.
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
}

/// GMRES on the CPU for one rank of a job: `rows` are this rank's rows of the square matrix
/// (global column indices, rows `part.range(comm.rank())`), `b` and `x0` this rank's entries.
/// Every rank calls it; the same code runs on one rank with [`crate::comm::SerialComm`].
#[allow(clippy::too_many_arguments)]
pub fn gmres_square_cpu(
    comm: &dyn Comm,
    rows: &Csr,
    part: &RowPartition,
    b: &[f64],
    x0: Option<&[f64]>,
    precond: SquarePrecond,
    params: &GmresParams,
    monitor: &mut dyn GmresMonitor,
) -> Result<SquareSolve> {
    let t0 = std::time::Instant::now();
    let be = CpuBackend::new();
    let op = DistSquareOperator::distributed(rows, part, comm)?;
    let halo = op.comm_volume()?;
    let row0 = part.range(comm.rank()).start;
    let (mut pc, counts) = square_precond(&be, comm, &op, row0, precond, |f| Ok(Box::new(f)))?;
    let setup_seconds = t0.elapsed().as_secs_f64();
    let sol = gmres(&be, &op, pc.as_mut(), comm, b, x0, params, monitor)?;
    Ok(SquareSolve {
        x_local: sol.x,
        info: sol.info,
        precond: pc.name(),
        jacobi_zero_diagonals: counts.zero_diagonals,
        ilu_replaced_pivots: counts.replaced_pivots,
        ilu_inserted_diagonals: counts.inserted_diagonals,
        setup_seconds,
        halo,
    })
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
    use crate::comm::ThreadComm;
    use crate::grid::Rng;

    fn random_square(n: usize, seed: u64) -> Csr {
        let mut rng = Rng::new(seed);
        let (mut r, mut c, mut v) = (vec![], vec![], vec![]);
        for i in 0..n {
            r.push(i as u64);
            c.push(i as u64);
            v.push(10.0);
            for _ in 0..(rng.below(6)) {
                r.push(i as u64);
                c.push(rng.below(n as u64));
                v.push(rng.uniform() - 0.5);
            }
        }
        Csr::from_triplets(n, n, &r, &c, &v).unwrap()
    }

    #[test]
    fn partitions_cover_rows() {
        let a = random_square(1000, 3);
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
        let a = random_square(n, 11);
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
        let a = random_square(n, 5);
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
                            op.apply(&CpuBackend::new(), 1.0, &xl, 0.0, &mut y).unwrap();
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
