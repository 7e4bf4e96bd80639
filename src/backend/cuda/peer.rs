//! The sums over the ranks of one node through each other's GPU memory (CUDA IPC): every rank
//! owns one buffer that every other rank maps, and the device LSQR loop's kernels
//! (kernels/lsqr.cu `lsqr_peer_*`) publish, wait for and add the ranks' vectors there in rank
//! order, inside the loop's graph. No NCCL call, no host round trip: one read of the other
//! ranks' vectors over NVLink (or PCIe) per iteration. GMRES's sums of a few scalars and its
//! halo exchange use buffers of the same kind (kernels/peer.cu; src/backend/cuda/vector.rs
//! and square.rs).
//!
//! Set-up is collective over the job's [`Comm`]: the IPC handles travel over it. A rank that
//! cannot export or open a buffer makes every rank fall back (None), so the job takes NCCL or
//! the host path instead; so does a job whose ranks are not all on one node.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream};

use super::error::Doing;
use crate::backend::AllreducePath;
use crate::comm::{on_every_rank, Comm};
use crate::error::{Error, Result};

/// Bytes of the control block ahead of a buffer's values (kernels/lsqr.cu `PEER_CTRL`): word 0
/// counts the exchanges the rank has published, word 1 those it has finished reading.
pub(super) const CTRL: usize = 256;

/// What a sum through peer memory says when another rank never published its part.
pub(super) const PEER_TIMEOUT: &str =
    "another rank's GPU did not publish its part within 120 s (has another rank failed?)";

/// u64 words of an IPC memory handle (64 bytes).
const HANDLE_WORDS: usize = 8;

/// Whether this backend's sums over the ranks (LSQR's device loop, GMRES's sums and halo) go
/// through peer memory, decided once for the job by [`PeerSwitch::setup`] (the same on every
/// rank).
#[derive(Default)]
pub(crate) struct PeerSwitch(AtomicBool);

/// Collective: whether a job's sums try the GPUs' memory first, before NCCL is made:
/// `allreduce = "peer"`, or `auto` where the job's sums run on the GPUs (`device_sums`: LSQR's
/// device loop, or GMRES) on several ranks all on one node. NCCL is then not started at all
/// where the peer sums come up (its start costs 0.5-0.7 s on 2 x H100); LSQR's sums outside its
/// loop go through mapped buffers too (the backend's `allreduce_sum`).
pub fn peer_first(comm: &dyn Comm, path: AllreducePath, device_sums: bool) -> Result<bool> {
    Ok(match path {
        AllreducePath::Peer => comm.size() > 1,
        AllreducePath::Auto if device_sums && comm.size() > 1 => {
            on_every_rank(comm, comm.local_size() == comm.size())?
        }
        _ => false,
    })
}

impl PeerSwitch {
    /// Collective, after [`peer_first`] said yes on every rank (several ranks, all on one
    /// node, a path that allows it): peer sums for this job where every rank can export a
    /// buffer and open every other's (a small buffer is tried). `peer` where that fails is an
    /// error. Returns whether they are on.
    pub fn setup(
        &self,
        stream: &Arc<CudaStream>,
        comm: &dyn Comm,
        path: AllreducePath,
    ) -> Result<bool> {
        let on = PeerBuffers::new(stream, comm, 1)?.is_some_and(|p| p.close(comm).is_ok());
        if path == AllreducePath::Peer && !on {
            return Err(Error::backend(
                "cuda",
                "allreduce = peer, but the ranks' GPUs cannot map each other's memory (the ranks must be processes on one node, with CUDA IPC between their GPUs)",
            ));
        }
        self.0.store(on, Ordering::Relaxed);
        Ok(on)
    }

    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// This rank's buffer, which every other rank of the job has mapped, and theirs mapped here.
pub(crate) struct PeerBuffers {
    ctx: Arc<CudaContext>,
    /// This rank's buffer (cuMemAlloc: memory of the stream-ordered pool cannot be exported
    /// with a plain IPC handle).
    own: sys::CUdeviceptr,
    /// The other ranks' buffers as mapped here (their order; this rank's absent).
    opened: Vec<sys::CUdeviceptr>,
    /// Every rank's buffer address in this process, in rank order (this rank's own included),
    /// on the device for the kernels.
    pub bases: CudaSlice<u64>,
    pub rank: usize,
    pub ranks: usize,
    /// f64 values after the control block.
    pub values: usize,
}

impl PeerBuffers {
    /// Collective: a buffer of [`CTRL`] bytes and `values` f64 (zeroed) on every rank, mapped
    /// by every other rank, on `stream`'s device; None on every rank where one rank could not
    /// make or open one.
    pub fn new(
        stream: &Arc<CudaStream>,
        comm: &dyn Comm,
        values: usize,
    ) -> Result<Option<PeerBuffers>> {
        let ctx = stream.context().clone();
        ctx.bind_to_thread().doing("binding the GPU context")?;
        let bytes = CTRL + values.max(1) * 8;
        let (own, handle) = match export(bytes) {
            Ok(x) => (Some(x.0), Some(x.1)),
            Err(_) => (None, None),
        };
        // Every rank sends [ok, handle words] to every other.
        let mut mine = vec![u64::from(handle.is_some())];
        mine.extend(handle.unwrap_or([0; HANDLE_WORDS]));
        let got = comm.alltoallv_u64(&vec![mine; comm.size()])?;
        let mut bufs = PeerBuffers {
            ctx,
            own: own.unwrap_or(0),
            opened: Vec::new(),
            bases: stream.alloc_zeros::<u64>(1).doing("device memory")?,
            rank: comm.rank(),
            ranks: comm.size(),
            values: values.max(1),
        };
        let mut all = Vec::with_capacity(comm.size());
        let mut ok = own.is_some() && got.iter().all(|g| g.len() == 1 + HANDLE_WORDS && g[0] == 1);
        for (r, g) in got.iter().enumerate() {
            if !ok {
                break;
            }
            if r == comm.rank() {
                all.push(bufs.own);
                continue;
            }
            match open(&g[1..]) {
                Ok(p) => {
                    bufs.opened.push(p);
                    all.push(p);
                }
                Err(_) => ok = false,
            }
        }
        if !on_every_rank(comm, ok)? {
            bufs.close(comm)?;
            return Ok(None);
        }
        bufs.bases = stream.clone_htod(&all).doing("the peers' addresses")?;
        Ok(Some(bufs))
    }

    /// This rank's buffer's address (its values start [`CTRL`] bytes later).
    pub fn own_base(&self) -> u64 {
        self.own
    }

    /// Collective: unmap the other ranks' buffers, wait until every rank has, then free this
    /// rank's (never while another rank still maps it).
    pub fn close(mut self, comm: &dyn Comm) -> Result<()> {
        self.unmap();
        comm.barrier()?;
        Ok(())
    }

    fn unmap(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for p in self.opened.drain(..) {
            // SAFETY: `p` was opened by cuIpcOpenMemHandle in this context and is closed once
            // (drained); no kernel of this rank runs on it any more (the loop's stream was
            // synchronised at the end of its last replay).
            let _ = unsafe { sys::cuIpcCloseMemHandle(p) };
        }
    }
}

impl Drop for PeerBuffers {
    fn drop(&mut self) {
        self.unmap();
        if self.own != 0 {
            // SAFETY: `own` came from cuMemAlloc in this context and is freed once. The other
            // ranks no longer read it: [`PeerBuffers::close`] waits for them, and a loop's
            // buffers are dropped with its operator, after the solve's last collective (the
            // result's gather), which every rank reaches after its last replay has finished.
            let _ = unsafe { result::free_sync(self.own) };
            self.own = 0;
        }
    }
}

/// A zeroed buffer of `bytes` and its IPC handle as u64 words; the context must be current.
fn export(bytes: usize) -> std::result::Result<(sys::CUdeviceptr, [u64; HANDLE_WORDS]), ()> {
    // SAFETY: plain allocation in the current context; freed by PeerBuffers' drop (or below).
    let own = unsafe { result::malloc_sync(bytes) }.map_err(|_| ())?;
    let mut handle = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
    // SAFETY: `own` is a live allocation of `bytes`; the handle is written by the driver on
    // success; the memset finishes before the handle leaves this rank (synchronous on the
    // null stream for device memory, and the synchronize below).
    let done = unsafe {
        result::memset_d8_sync(own, 0, bytes)
            .and_then(|_| result::ctx::synchronize())
            .and_then(|_| sys::cuIpcGetMemHandle(handle.as_mut_ptr(), own).result())
    };
    if done.is_err() {
        // SAFETY: allocated above, not shared with anyone.
        let _ = unsafe { result::free_sync(own) };
        return Err(());
    }
    // SAFETY: written by cuIpcGetMemHandle.
    let handle = unsafe { handle.assume_init() };
    let mut words = [0u64; HANDLE_WORDS];
    for (i, w) in words.iter_mut().enumerate() {
        let b: [u8; 8] = std::array::from_fn(|j| handle.reserved[i * 8 + j] as u8);
        *w = u64::from_le_bytes(b);
    }
    Ok((own, words))
}

/// Another rank's buffer mapped here from its handle words; the context must be current.
fn open(words: &[u64]) -> std::result::Result<sys::CUdeviceptr, ()> {
    if words.len() != HANDLE_WORDS {
        return Err(());
    }
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    for (i, w) in words.iter().enumerate() {
        for (j, b) in w.to_le_bytes().into_iter().enumerate() {
            handle.reserved[i * 8 + j] = b as std::ffi::c_char;
        }
    }
    let mut p: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: `handle` is another process of this node's export (the ranks were checked to be
    // on one node; the driver refuses a handle of this process); `p` is written on success.
    unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, handle, flags) }
        .result()
        .map_err(|_| ())?;
    Ok(p)
}
