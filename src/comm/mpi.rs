//! The MPI communicator (rsmpi). One [`MpiComm`] per process: it owns the rsmpi `Universe`, so
//! MPI is initialised when it is created and finalised when it is dropped (keep it alive for the
//! whole run; [`super::init`] hands it out boxed).
//!
//! MPI is initialised with `MPI_THREAD_SERIALIZED` and every call goes through one mutex, so the
//! communicator may be shared between threads (`Comm: Send + Sync`) without two threads ever
//! being inside MPI at once. Its MPI-IO reads ([`MpiIo`], handed to loaders by
//! [`Comm::reader`]) take the same mutex. Message counts are C ints: one collective moves at most 2^31 - 1
//! values per rank (an error says so, never a silent truncation).

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::{Count, Threading};

use super::Comm;
use crate::error::{Error, Result};
use crate::io::mpiio::MpiFile;
use crate::io::rowio::{RangeSink, RangeSource};

/// A job of `size` MPI ranks (MPI_COMM_WORLD).
pub struct MpiComm {
    /// Finalises MPI on drop.
    _universe: Universe,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    library: String,
    /// Serialises MPI calls and holds the send copy for in-place reductions (grown once to the
    /// largest vector reduced, so the solver's per-iteration reduction does not allocate).
    /// Shared with `io`.
    scratch: Arc<MpiLock>,
    /// This rank's MPI-IO reads.
    io: MpiIo,
}

/// The lock every MPI call of a process is made under (MPI_THREAD_SERIALIZED), with the
/// communicator's scratch buffer.
type MpiLock = Mutex<Vec<f64>>;

fn lock(m: &MpiLock) -> MutexGuard<'_, Vec<f64>> {
    // A poisoned lock only means another thread panicked while holding it; the Vec inside is
    // still a valid scratch buffer.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn count(n: usize, what: &str) -> Result<Count> {
    Count::try_from(n).map_err(|_| {
        Error::Comm(format!(
            "{what}: {n} values exceed what one MPI call can move (2^31 - 1)"
        ))
    })
}

fn displacements(counts: &[Count]) -> Result<Vec<Count>> {
    let mut d = Vec::with_capacity(counts.len());
    let mut acc: usize = 0;
    for &c in counts {
        d.push(count(acc, "displacement")?);
        acc += c as usize;
    }
    Ok(d)
}

impl MpiComm {
    /// One scalar reduced over all ranks with `op`.
    fn reduce_scalar(&self, x: f64, op: SystemOperation) -> f64 {
        let _g = self.lock();
        let mut y = 0.0f64;
        self.world().all_reduce_into(&x, &mut y, op);
        y
    }

    /// Initialise MPI (once per process) and describe MPI_COMM_WORLD.
    pub fn init() -> Result<MpiComm> {
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| Error::Comm("MPI was already initialised in this process".into()))?;
        if provided < Threading::Serialized {
            // Dropping the universe finalises MPI again.
            return Err(Error::Comm(format!(
                "the MPI library provides thread support {provided:?}; seistomo needs Serialized"
            )));
        }
        let world = universe.world();
        let node = world.split_shared(world.rank());
        let library = mpi::environment::library_version()
            .unwrap_or_else(|_| "unknown MPI library".into())
            .split([',', '\n'])
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let scratch = Arc::new(Mutex::new(Vec::new()));
        Ok(MpiComm {
            rank: world.rank() as usize,
            size: world.size() as usize,
            local_rank: node.rank() as usize,
            local_size: node.size() as usize,
            library,
            io: MpiIo {
                lock: scratch.clone(),
            },
            scratch,
            _universe: universe,
        })
    }

    /// Ranks on this node (from a shared-memory split of the world).
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// The MPI library's version line.
    pub fn library(&self) -> &str {
        &self.library
    }

    fn lock(&self) -> MutexGuard<'_, Vec<f64>> {
        lock(&self.scratch)
    }

    fn world(&self) -> SimpleCommunicator {
        SimpleCommunicator::world()
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn barrier(&self) -> Result<()> {
        let _g = self.lock();
        self.world().barrier();
        Ok(())
    }
    fn allreduce_sum(&self, buf: &mut [f64]) -> Result<()> {
        count(buf.len(), "allreduce")?;
        let mut send = self.lock();
        send.clear();
        send.extend_from_slice(buf);
        self.world()
            .all_reduce_into(&send[..], buf, SystemOperation::sum());
        Ok(())
    }
    fn allreduce_scalar(&self, x: f64) -> Result<f64> {
        Ok(self.reduce_scalar(x, SystemOperation::sum()))
    }
    fn allreduce_max(&self, x: f64) -> Result<f64> {
        Ok(self.reduce_scalar(x, SystemOperation::max()))
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<()> {
        if root >= self.size {
            return Err(Error::Comm(format!(
                "broadcast from rank {root} of {} ranks",
                self.size
            )));
        }
        let _g = self.lock();
        let world = self.world();
        let p = world.process_at_rank(root as i32);
        let mut len = buf.len() as u64;
        p.broadcast_into(&mut len);
        let len =
            usize::try_from(len).map_err(|_| Error::Comm(format!("broadcast of {len} bytes")))?;
        buf.resize(len, 0);
        // MPI counts are i32: large buffers (a big dataset's metadata) go in 1 GiB pieces.
        for piece in buf.chunks_mut(1 << 30) {
            count(piece.len(), "broadcast")?;
            p.broadcast_into(piece);
        }
        Ok(())
    }
    fn gather_to_root(&self, local: &[f64]) -> Result<Option<Vec<f64>>> {
        let n = count(local.len(), "gather")?;
        let _g = self.lock();
        let world = self.world();
        let root = world.process_at_rank(0);
        if self.rank == 0 {
            let mut counts = vec![0 as Count; self.size];
            root.gather_into_root(&n, &mut counts[..]);
            let total: usize = counts.iter().map(|&c| c as usize).sum();
            let displs = displacements(&counts)?;
            let mut out = vec![0.0f64; total];
            {
                let mut part = PartitionMut::new(&mut out[..], &counts[..], &displs[..]);
                root.gather_varcount_into_root(local, &mut part);
            }
            Ok(Some(out))
        } else {
            root.gather_into(&n);
            root.gather_varcount_into(local);
            Ok(None)
        }
    }
    fn alltoallv(&self, send: &[Vec<f64>]) -> Result<Vec<Vec<f64>>> {
        self.alltoallv_impl(send)
    }
    fn alltoallv_u64(&self, send: &[Vec<u64>]) -> Result<Vec<Vec<u64>>> {
        self.alltoallv_impl(send)
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_size(&self) -> usize {
        self.local_size
    }
    fn describe(&self) -> String {
        format!(
            "mpi: {} ranks ({} on this node), {}",
            self.size, self.local_size, self.library
        )
    }
    fn abort(&self, code: i32) -> ! {
        self.world().abort(code)
    }
    fn reader(&self) -> &dyn RangeSource {
        &self.io
    }
}

impl MpiComm {
    fn alltoallv_impl<T: Equivalence + Copy + Default>(
        &self,
        send: &[Vec<T>],
    ) -> Result<Vec<Vec<T>>> {
        if send.len() != self.size {
            return Err(Error::Comm(format!(
                "alltoallv with {} send buffers on {} ranks",
                send.len(),
                self.size
            )));
        }
        let send_counts = send
            .iter()
            .map(|s| count(s.len(), "alltoallv"))
            .collect::<Result<Vec<Count>>>()?;
        let send_displs = displacements(&send_counts)?;
        let flat: Vec<T> = send.iter().flatten().copied().collect();
        let _g = self.lock();
        let world = self.world();
        let mut recv_counts = vec![0 as Count; self.size];
        world.all_to_all_into(&send_counts[..], &mut recv_counts[..]);
        let recv_displs = displacements(&recv_counts)?;
        let total: usize = recv_counts.iter().map(|&c| c as usize).sum();
        let mut recv = vec![T::default(); total];
        {
            let sp = Partition::new(&flat[..], &send_counts[..], &send_displs[..]);
            let mut rp = PartitionMut::new(&mut recv[..], &recv_counts[..], &recv_displs[..]);
            world.all_to_all_varcount_into(&sp, &mut rp);
        }
        Ok(recv_counts
            .iter()
            .zip(&recv_displs)
            .map(|(&c, &d)| recv[d as usize..d as usize + c as usize].to_vec())
            .collect())
    }
}

/// MPI-IO reads of this rank (the communicator's [`Comm::reader`]): each call is made under the
/// communicator's lock, so that no two threads are ever inside MPI at once.
pub struct MpiIo {
    lock: Arc<MpiLock>,
}

impl RangeSource for MpiIo {
    fn read_at(&self, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
        let _g = lock(&self.lock);
        crate::io::mpiio::read_at(path, offset, len)
    }
    fn read_at_all(&self, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
        let _g = lock(&self.lock);
        MpiFile::open_world(path)?.read_at_all(offset, len)
    }
    fn read_ranges(&self, path: &Path, ranges: &[(u64, usize)], f: RangeSink) -> Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        // The lock is held for each MPI call only (open, each read, close), not while `f`
        // works on the bytes, so other threads' reads interleave with this one's decoding.
        let file = {
            let _g = lock(&self.lock);
            LockedFile {
                file: Some(MpiFile::open_self(path)?),
                lock: &self.lock,
            }
        };
        // One buffer for all ranges (fresh pages for every range would cost a page fault each).
        let mut buf = vec![0u8; ranges.iter().map(|r| r.1).max().unwrap_or(0)];
        for (i, &(off, len)) in ranges.iter().enumerate() {
            {
                let _g = lock(&self.lock);
                let fh = file.file.as_ref().expect("open until drop");
                fh.read_into(off, &mut buf[..len])?;
            }
            f(i, &buf[..len])?;
        }
        Ok(())
    }
}

/// An MPI file that is closed with the communicator's lock held (also on early returns), so
/// that no two threads are ever inside MPI at once (MPI_THREAD_SERIALIZED).
struct LockedFile<'a> {
    file: Option<MpiFile>,
    lock: &'a MpiLock,
}

impl Drop for LockedFile<'_> {
    fn drop(&mut self) {
        let _g = lock(self.lock);
        drop(self.file.take());
    }
}
