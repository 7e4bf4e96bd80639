//! Communication between ranks. Solvers reach other ranks only through this trait (and through
//! [`crate::backend::Backend::allreduce_sum`], which moves device vectors to it), so LSQR and
//! GMRES are written once for one process or many.

mod agree;
pub mod distribute;
pub mod halo;
#[cfg(feature = "mpi")]
mod mpi;
mod serial;
mod thread;
mod timed;

#[cfg(feature = "mpi")]
pub use self::mpi::MpiComm;
pub use agree::{agree, agree_on, Broadcast};
pub use distribute::{distribute_system, partition_square_on};
pub use serial::SerialComm;
pub use thread::ThreadComm;
pub use timed::{RankTiming, TimedComm};

use crate::error::Result;
use crate::io::rowio::{LocalReads, RangeSource};

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
    /// This rank's index among the ranks on its node (GPU backends bind to GPU = local rank).
    fn local_rank(&self) -> usize {
        local_rank()
    }
    /// Ranks on this rank's node (the launcher's count where the communicator has none).
    fn local_size(&self) -> usize {
        local_size()
    }
    /// One line for logs and reports: which communicator, how many ranks.
    fn describe(&self) -> String {
        format!("{} rank(s)", self.size())
    }
    /// End the whole job now with exit code `code` (MPI_Abort under MPI). For errors that only
    /// this rank has seen while the others may be waiting in a collective.
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
    /// How this rank reads byte ranges of files (what loaders hand to
    /// [`crate::io::rowio::RangeReader`]): MPI-IO under MPI ([`MpiComm`]), positioned std
    /// reads ([`LocalReads`]) otherwise.
    fn reader(&self) -> &dyn RangeSource {
        &LocalReads
    }
}

/// Collective: whether `holds` is true on every rank.
pub fn on_every_rank(comm: &dyn Comm, holds: bool) -> Result<bool> {
    Ok(comm.allreduce_max(f64::from(u8::from(!holds)))? == 0.0)
}

/// Collective: whether `holds` is true on at least one rank.
pub fn on_any_rank(comm: &dyn Comm, holds: bool) -> Result<bool> {
    Ok(comm.allreduce_max(f64::from(u8::from(holds)))? > 0.0)
}

/// True when this process was started by an MPI launcher (mpirun, mpiexec, srun).
pub fn launched_by_mpi() -> bool {
    crate::settings::launch::launched_by_mpi()
}

/// This process's rank among the ranks on its node, from the launcher's environment
/// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID, PMI_LOCAL_RANK); 0 when not
/// launched by MPI. The GPU backend binds rank -> GPU (local rank modulo the GPU count) with it.
/// [`MpiComm`] computes the same from a shared-memory split of the world instead.
pub fn local_rank() -> usize {
    crate::settings::launch::local_rank()
}

/// Ranks on this node according to the launcher (1 when not launched by MPI).
pub fn local_size() -> usize {
    crate::settings::launch::local_size()
}

/// CPU threads a rank should use when none were asked for: the cores divided among the ranks of
/// this node (so that `mpirun --bind-to none -np 4` on 16 cores gives 4 threads per rank rather
/// than 64 threads fighting for 16 cores). `None` when there is one rank per node, or when
/// RAYON_NUM_THREADS decides.
pub fn default_threads_per_rank() -> Option<usize> {
    let per_node = local_size();
    if per_node <= 1 || crate::settings::launch::rayon_threads_set() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some((cores / per_node).max(1))
}

/// The communicator for this process: MPI when the `mpi` feature is on and the process was
/// started by an MPI launcher, else [`SerialComm`]. SEISTOMO_MPI=1 forces MPI (singleton
/// init), SEISTOMO_MPI=0 forces one process. Keep the box alive until the program ends:
/// dropping it finalises MPI.
pub fn init() -> Result<Box<dyn Comm>> {
    let want = crate::settings::launch::mpi_override()?.unwrap_or_else(launched_by_mpi);
    if !want {
        return Ok(Box::new(SerialComm));
    }
    #[cfg(feature = "mpi")]
    {
        Ok(Box::new(MpiComm::init()?))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let world = crate::settings::launch::world_size();
        if launched_by_mpi() && world.is_none_or(|n| n > 1) {
            Err(crate::error::Error::Comm(
                "started by an MPI launcher but this build has no MPI support (built without \
                 the `mpi` feature); rebuild with default features or run without mpirun"
                    .into(),
            ))
        } else {
            Ok(Box::new(SerialComm))
        }
    }
}
