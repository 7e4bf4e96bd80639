//! Communication between ranks. Solvers reach other ranks only through this trait (and through
//! [`crate::backend::Backend::allreduce_sum`], which moves device vectors to it), so LSQR and
//! GMRES are written once for one process or many.

mod serial;

pub use serial::SerialComm;

use crate::error::Result;

/// What a solver or loader needs from the ranks of a job.
pub trait Comm: Send + Sync {
    /// This process's rank, 0-based.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Wait for every rank.
    fn barrier(&self) -> Result<()>;
    /// Element-wise sum over ranks, in place, result on every rank.
    fn allreduce_sum(&self, buf: &mut [f64]) -> Result<()>;
    /// Sum of one value over ranks.
    fn allreduce_scalar(&self, x: f64) -> Result<f64> {
        let mut b = [x];
        self.allreduce_sum(&mut b)?;
        Ok(b[0])
    }
    /// Maximum of one value over ranks.
    fn allreduce_max(&self, x: f64) -> Result<f64>;
    /// Replace `buf` on every rank with rank `root`'s bytes (lengths may differ before the call).
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<()>;
    /// Gather each rank's slice (lengths may differ) to rank 0, concatenated in rank order;
    /// `None` on other ranks.
    fn gather_to_root(&self, local: &[f64]) -> Result<Option<Vec<f64>>>;
    /// Personalised all-to-all exchange: `send[r]` goes to rank r; returns what each rank sent
    /// here (`recv[r]` from rank r). Used for halo exchanges of distributed square systems.
    fn alltoallv(&self, send: &[Vec<f64>]) -> Result<Vec<Vec<f64>>>;
    /// The same for indices (set-up of communication patterns).
    fn alltoallv_u64(&self, send: &[Vec<u64>]) -> Result<Vec<Vec<u64>>>;
    /// True on rank 0, the rank that logs and writes output files.
    fn is_root(&self) -> bool {
        self.rank() == 0
    }
}
