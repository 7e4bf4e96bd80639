//! A [`Comm`] wrapper that measures the time spent in reductions, for the per-rank timing
//! breakdown of report.json (load, compute, allreduce).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use super::Comm;
use crate::error::Result;
use crate::io::rowio::RangeSource;

/// Forwards every call to `inner`, adding the wall time of reductions to its counters.
pub struct TimedComm<'a> {
    inner: &'a dyn Comm,
    vector_ns: AtomicU64,
    vector_calls: AtomicU64,
    vector_values: AtomicU64,
    scalar_ns: AtomicU64,
    scalar_calls: AtomicU64,
}

/// Totals measured by a [`TimedComm`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ReduceTotals {
    /// Seconds in vector reductions (A^T u summed over ranks: one per LSQR iteration).
    pub vector_s: f64,
    pub vector_calls: u64,
    /// Values summed in vector reductions, over all calls.
    pub vector_values: u64,
    /// Seconds in scalar reductions (||u|| and set-up sums).
    pub scalar_s: f64,
    pub scalar_calls: u64,
}

impl<'a> TimedComm<'a> {
    pub fn new(inner: &'a dyn Comm) -> Self {
        TimedComm {
            inner,
            vector_ns: AtomicU64::new(0),
            vector_calls: AtomicU64::new(0),
            vector_values: AtomicU64::new(0),
            scalar_ns: AtomicU64::new(0),
            scalar_calls: AtomicU64::new(0),
        }
    }

    /// What has been measured so far.
    pub fn totals(&self) -> ReduceTotals {
        ReduceTotals {
            vector_s: self.vector_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            vector_calls: self.vector_calls.load(Ordering::Relaxed),
            vector_values: self.vector_values.load(Ordering::Relaxed),
            scalar_s: self.scalar_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            scalar_calls: self.scalar_calls.load(Ordering::Relaxed),
        }
    }

    fn timed<T>(&self, ns: &AtomicU64, calls: &AtomicU64, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        calls.fetch_add(1, Ordering::Relaxed);
        r
    }
}

impl Comm for TimedComm<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn allreduce_sum(&self, buf: &mut [f64]) -> Result<()> {
        self.vector_values
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.timed(&self.vector_ns, &self.vector_calls, || {
            self.inner.allreduce_sum(buf)
        })
    }
    fn allreduce_scalar(&self, x: f64) -> Result<f64> {
        self.timed(&self.scalar_ns, &self.scalar_calls, || {
            self.inner.allreduce_scalar(x)
        })
    }
    fn allreduce_max(&self, x: f64) -> Result<f64> {
        self.timed(&self.scalar_ns, &self.scalar_calls, || {
            self.inner.allreduce_max(x)
        })
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.broadcast_bytes(root, buf)
    }
    fn gather_to_root(&self, local: &[f64]) -> Result<Option<Vec<f64>>> {
        self.inner.gather_to_root(local)
    }
    fn alltoallv(&self, send: &[Vec<f64>]) -> Result<Vec<Vec<f64>>> {
        self.inner.alltoallv(send)
    }
    fn alltoallv_u64(&self, send: &[Vec<u64>]) -> Result<Vec<Vec<u64>>> {
        self.inner.alltoallv_u64(send)
    }
    fn local_size(&self) -> usize {
        self.inner.local_size()
    }
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn abort(&self, code: i32) -> ! {
        self.inner.abort(code)
    }
    /// The wrapped communicator's reader (reads are not timed here: loads are timed whole).
    fn reader(&self) -> &dyn RangeSource {
        self.inner.reader()
    }
}

/// One rank's share of a run, for report.json (`rank_timing`, one entry per rank, rank order).
/// The products and the allreduce are timed alone before the solve (each after a barrier,
/// median of 5), so `compute_s` and `allreduce_s` are what they cost, not what a rank waited
/// for; `wait_s` is the rest of the solve: vector updates and waiting for slower ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RankTiming {
    pub rank: usize,
    /// Rows and nonzeros of the system held by this rank.
    pub rows: usize,
    pub nnz: usize,
    /// The load plan's cost of this rank (bytes one iteration moves, `partition::RowCost`; 0
    /// where rows were split by nonzeros).
    pub cost: f64,
    /// Seconds to read (or receive) this rank's rows.
    pub load_s: f64,
    /// One A x and one A^T y on this rank, milliseconds.
    pub product_ms: f64,
    /// One sum of the n-vector A^T u over ranks, all ranks starting together, milliseconds.
    pub allreduce_ms: f64,
    /// The solve's products: `product_ms` x iterations, seconds.
    pub compute_s: f64,
    /// The solve's vector sums: `allreduce_ms` x iterations, seconds.
    pub allreduce_s: f64,
    /// The rest of the solve: vector updates and waiting for slower ranks, seconds.
    pub wait_s: f64,
    /// Reductions this rank took part in (set-up and solve).
    pub allreduce_calls: u64,
    /// Of the rows, those applied as grid stencils (compact storage).
    pub stencil_rows: usize,
}

impl RankTiming {
    const FIELDS: usize = 12;

    fn to_f64s(self) -> [f64; Self::FIELDS] {
        [
            self.rank as f64,
            self.rows as f64,
            self.nnz as f64,
            self.cost,
            self.load_s,
            self.product_ms,
            self.allreduce_ms,
            self.compute_s,
            self.allreduce_s,
            self.wait_s,
            self.allreduce_calls as f64,
            self.stencil_rows as f64,
        ]
    }

    fn from_f64s(v: &[f64]) -> RankTiming {
        RankTiming {
            rank: v[0] as usize,
            rows: v[1] as usize,
            nnz: v[2] as usize,
            cost: v[3],
            load_s: v[4],
            product_ms: v[5],
            allreduce_ms: v[6],
            compute_s: v[7],
            allreduce_s: v[8],
            wait_s: v[9],
            allreduce_calls: v[10] as u64,
            stencil_rows: v[11] as usize,
        }
    }

    /// Collective: every rank's timing, in rank order, on rank 0 (`None` elsewhere).
    pub fn gather(self, comm: &dyn Comm) -> Result<Option<Vec<RankTiming>>> {
        Ok(comm.gather_to_root(&self.to_f64s())?.map(|all| {
            all.chunks_exact(Self::FIELDS)
                .map(RankTiming::from_f64s)
                .collect()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SerialComm;

    #[test]
    fn counts_reductions_and_round_trips_timing() {
        let c = TimedComm::new(&SerialComm);
        let mut v = vec![1.0; 5];
        c.allreduce_sum(&mut v).unwrap();
        c.allreduce_sum(&mut v).unwrap();
        assert_eq!(c.allreduce_scalar(2.5).unwrap(), 2.5);
        let t = c.totals();
        assert_eq!(
            (t.vector_calls, t.vector_values, t.scalar_calls),
            (2, 10, 1)
        );
        let rt = RankTiming {
            rank: 0,
            rows: 7,
            nnz: 30,
            cost: 1e9,
            load_s: 0.5,
            product_ms: 0.25,
            allreduce_ms: 0.0625,
            compute_s: 1.25,
            allreduce_s: 0.125,
            wait_s: 0.03125,
            allreduce_calls: 9,
            stencil_rows: 3,
        };
        assert_eq!(rt.gather(&c).unwrap(), Some(vec![rt]));
    }
}
