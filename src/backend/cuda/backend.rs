//! The CUDA backend's device, stream and kernels ([`CudaBackend`]), and the launch of a kernel.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    result as dres, sys as dsys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr,
};

use super::device::{probe_checked, DeviceInfo};
use super::error::{CudaError, Doing};
use super::nccl::Nccl;
use super::nvrtc::{check_defines, kernels_for, Kernels};
use super::peer::PeerSwitch;
use crate::backend::Backend;
use crate::comm::Comm;
use crate::error::{Error, Result};

/// At most this many blocks in a reduction (and the size of the partial-sum buffer).
pub(super) const RED_MAX_BLOCKS: usize = 1024;
/// Basis vectors per launch of the batched Gram-Schmidt kernels (MULTI_MAX in vector.cu).
pub(super) const MULTI_MAX: usize = 32;

/// `len` f64 of page-locked host memory mapped into the device's address space.
pub(super) struct MappedScalar {
    _mem: cudarc::driver::PinnedHostSlice<f64>,
    /// Host address (kept as an integer so the backend stays Send + Sync).
    pub(super) host: usize,
    pub(super) device: u64,
}

impl MappedScalar {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        // SAFETY: the memory is written below before any read.
        let mut mem = unsafe {
            ctx.alloc_pinned_with_flags::<f64>(
                len,
                dsys::CU_MEMHOSTALLOC_DEVICEMAP | dsys::CU_MEMHOSTALLOC_PORTABLE,
            )
        }
        .doing("mapped host memory")?;
        let host = mem.as_mut_ptr().doing("mapped host memory")?;
        // SAFETY: `host` points to `len` f64 of page-locked memory owned by `mem`.
        unsafe { std::ptr::write_bytes(host, 0, len) };
        let mut device: dsys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with CU_MEMHOSTALLOC_DEVICEMAP in this context.
        unsafe { dsys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0) }
            .result()
            .doing("mapping host memory")?;
        Ok(MappedScalar {
            _mem: mem,
            host: host as usize,
            device,
        })
    }
}

/// A vector on the device: the CUDA backend's `Backend::Vector`.
pub type DeviceVec = CudaSlice<f64>;

/// Bytes of one page-locked staging buffer of [`CudaBackend::upload_staged`].
pub const STAGE: usize = 8 << 20;

/// Device vectors and fused kernels on one GPU (one stream; no host synchronisation except
/// where a scalar comes back).
pub struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) k: Arc<Kernels>,
    pub(crate) info: DeviceInfo,
    /// Partial sums of a reduction (RED_MAX_BLOCKS), its ticket counter, and its result.
    pub(super) partial: CudaSlice<f64>,
    pub(super) counter: CudaSlice<u32>,
    pub(super) result: CudaSlice<f64>,
    /// Where reductions write their result: a page-locked, device-mapped host word (the kernel
    /// writes it directly; the host reads it after one stream synchronisation, no copy), or
    /// `result` on the device when mapping is unavailable.
    pub(super) mapped: Option<MappedScalar>,
    /// The same for the batched reductions of GMRES: MULTI_MAX partial-sum rows of
    /// RED_MAX_BLOCKS, and MULTI_MAX results (mapped host memory, or `multi_result` on the
    /// device when mapping is unavailable).
    pub(super) multi_partial: CudaSlice<f64>,
    pub(super) multi_result: CudaSlice<f64>,
    pub(super) multi_mapped: Option<MappedScalar>,
    /// Page-locked host staging for the multi-rank vector reduction (host path).
    pub(super) pinned: Mutex<Option<cudarc::driver::PinnedHostSlice<f64>>>,
    /// Two page-locked buffers of [`STAGE`] bytes for large uploads ([`Self::upload_staged`]),
    /// allocated at the first.
    staging: Mutex<Option<[cudarc::driver::PinnedHostSlice<u8>; 2]>>,
    /// NCCL communicator over the job's GPUs (NCCL path), set up by `setup_allreduce`.
    pub(crate) nccl: Nccl,
    /// Whether the sums over the ranks (LSQR's device loop, GMRES's sums and halo) go through
    /// their GPUs' memory (CUDA IPC), set up by `setup_allreduce`.
    pub(crate) peer: PeerSwitch,
    /// The buffers of the vector sums outside the loops where `peer` is on
    /// ([`crate::backend::Backend::allreduce_sum`]), made at the first.
    pub(super) peer_vec: Mutex<Option<super::peer::PeerBuffers>>,
    /// The buffers of the sums of a few scalars kept on the device where `peer` is on
    /// ([`crate::backend::ScalarSlots::allreduce_scalars`]: GMRES's device loop), made at the
    /// first.
    pub(super) peer_sc: Mutex<Option<super::peer::PeerBuffers>>,
    /// One device word that the peer kernels outside LSQR's loop (GMRES's sums and halo) set
    /// where a wait for another rank timed out; read with the scalars ([`Self::peer_fault`]).
    pub(super) peer_fault: Mutex<Option<CudaSlice<u64>>>,
    /// The preprocessor defines the kernels were compiled with.
    defines: Vec<String>,
}

impl CudaBackend {
    /// A backend on device `ordinal`: checks the libraries and the device first (an error, not
    /// a panic, when CUDA is not usable), then compiles or reuses the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_defines(ordinal, &[])
    }

    /// Run `first` on another thread (a run's choice of backend, whose driver start is most
    /// of its wait), then create the context of the GPU it names and compile its kernels (with
    /// `defines`) there, while the caller reads its system: the backend made later for the
    /// same device and defines finds both done (the context is the device's primary one, the
    /// kernels are cached). `then` runs after, on the same thread with the context made (an
    /// NCCL communicator made ahead, [`super::EarlyNccl`]). Nothing is made where `first`
    /// names no GPU; errors are left for that backend to meet and report.
    pub fn prestart_after(
        first: impl FnOnce() -> Option<usize> + Send + 'static,
        defines: Vec<String>,
        then: impl FnOnce(&Arc<CudaContext>) + Send + 'static,
    ) -> Prestart {
        Prestart(Some(std::thread::spawn(move || {
            let ordinal = first()?;
            let info = probe_checked(ordinal).ok()?;
            let ctx = CudaContext::new(ordinal).ok()?;
            check_defines(&defines).ok()?;
            kernels_for(&ctx, info.compute_capability, &defines).ok()?;
            then(&ctx);
            Some(ctx)
        })))
    }

    /// [`CudaBackend::new`] with the kernels compiled with preprocessor `defines` (tuning
    /// `nvrtc_defines`: each `NAME` or `NAME=VALUE`, checked first); the compiled module is
    /// cached per device and set of defines.
    pub fn with_defines(ordinal: usize, defines: &[String]) -> Result<Self> {
        check_defines(defines)?;
        let mut info = probe_checked(ordinal).map_err(|why| CudaError::NoDevice(Box::new(why)))?;
        let ctx = CudaContext::new(ordinal).doing("creating the context")?;
        info.free_bytes = Some(ctx.mem_get_info().doing("memory info")?.0);
        // SAFETY: this backend uses a single stream for every buffer and kernel, so cudarc's
        // per-buffer event tracking (cross-stream synchronisation) is not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().doing("creating a stream")?;
        let k = kernels_for(&ctx, info.compute_capability, defines)?;
        let partial = stream
            .alloc_zeros::<f64>(RED_MAX_BLOCKS)
            .doing("allocating reduction buffers")?;
        let counter = stream
            .alloc_zeros::<u32>(1)
            .doing("allocating reduction buffers")?;
        let result = stream
            .alloc_zeros::<f64>(1)
            .doing("allocating reduction buffers")?;
        let mapped = MappedScalar::new(&ctx, 1).ok();
        let multi_partial = stream
            .alloc_zeros::<f64>(MULTI_MAX * RED_MAX_BLOCKS)
            .doing("allocating reduction buffers")?;
        let multi_result = stream
            .alloc_zeros::<f64>(MULTI_MAX)
            .doing("allocating reduction buffers")?;
        let multi_mapped = MappedScalar::new(&ctx, MULTI_MAX).ok();
        Ok(CudaBackend {
            ctx,
            stream,
            k,
            info,
            partial,
            counter,
            result,
            mapped,
            multi_partial,
            multi_result,
            multi_mapped,
            pinned: Mutex::new(None),
            staging: Mutex::new(None),
            nccl: Nccl::default(),
            peer: PeerSwitch::default(),
            peer_vec: Mutex::new(None),
            peer_sc: Mutex::new(None),
            peer_fault: Mutex::new(None),
            defines: defines.to_vec(),
        })
    }

    /// Upload `v` through two page-locked staging buffers: the host copies one piece into a
    /// buffer (on the thread pool) while the GPU pulls the previous one, instead of the
    /// driver's copy from pageable memory (measured 5 GB/s on an H200 host, 2026-11-26). The
    /// upload is complete when this returns. Large arrays take this path through `up`.
    pub fn upload_staged<T: cudarc::driver::DeviceRepr + Copy>(
        &self,
        v: &[T],
    ) -> Result<CudaSlice<T>> {
        use rayon::prelude::*;
        // SAFETY: the allocation is written by the copies below before any kernel reads it.
        let d = unsafe { self.stream.alloc::<T>(v.len().max(1)) }
            .doing("allocating device memory for an upload")?;
        // SAFETY: DeviceRepr types are plain data (no padding the copy could expose matters:
        // bytes go to the device as they are); the length is the slice's size in bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v))
        };
        let mut guard = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            // SAFETY: the buffers are written before each copy reads them; flags 0: ordinary
            // page-locked memory.
            let a = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(STAGE, 0) };
            let b = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(STAGE, 0) };
            *guard = Some([
                a.doing("allocating page-locked staging")?,
                b.doing("allocating page-locked staging")?,
            ]);
        }
        let bufs = guard.as_mut().expect("allocated above");
        let base = self.ptr(&d);
        let mut done: [Option<cudarc::driver::CudaEvent>; 2] = [None, None];
        for (k, piece) in bytes.chunks(STAGE).enumerate() {
            let slot = k % 2;
            if let Some(e) = done[slot].take() {
                e.synchronize().doing("waiting for a staged copy")?;
            }
            let host = bufs[slot].as_mut_ptr().doing("page-locked staging")?;
            // SAFETY: the buffer holds STAGE >= piece.len() bytes and no copy reads it now (its
            // last one was waited for above).
            let host = unsafe { std::slice::from_raw_parts_mut(host, piece.len()) };
            host.par_chunks_mut(1 << 20)
                .zip(piece.par_chunks(1 << 20))
                .for_each(|(h, p)| h.copy_from_slice(p));
            // SAFETY: the destination range lies inside `d` (k * STAGE + piece.len() <= its
            // size in bytes); the source stays untouched until the event recorded after it.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    base + (k * STAGE) as u64,
                    host,
                    self.stream.cu_stream(),
                )
            }
            .doing("staged upload")?;
            done[slot] = Some(
                self.stream
                    .record_event(None)
                    .doing("recording a staged copy")?,
            );
        }
        self.synchronize()?;
        Ok(d)
    }

    /// The backend of this rank of a job: one GPU per rank, GPU = local rank on the node
    /// (device 0 alone); says which GPU each rank took when there are several ranks.
    pub fn for_rank(comm: &dyn Comm) -> Result<Self> {
        Self::for_rank_with_defines(comm, &[])
    }

    /// [`CudaBackend::for_rank`] with the kernels compiled with `defines`
    /// ([`CudaBackend::with_defines`]).
    pub fn for_rank_with_defines(comm: &dyn Comm, defines: &[String]) -> Result<Self> {
        let (ordinal, count) = Self::ordinal_for(comm)?;
        let be = CudaBackend::with_defines(ordinal, defines)?;
        if comm.size() > 1 {
            let shared = if comm.local_rank() >= count {
                format!(", shared: {count} GPU(s) for more ranks on this node")
            } else {
                String::new()
            };
            eprintln!(
                "rank {}: GPU {ordinal} ({}){shared}",
                comm.rank(),
                be.describe()
            );
        }
        Ok(be)
    }

    /// The GPU this rank of `comm` uses: its local rank on the node, round-robin where a node
    /// has more ranks than GPUs (device 0 alone); and the node's GPU count.
    pub fn ordinal_for(comm: &dyn Comm) -> Result<(usize, usize)> {
        Self::ordinal_of((comm.size() > 1).then(|| comm.local_rank()))
    }

    /// [`Self::ordinal_for`] from the rank's place on its node (`None`: a job of one rank).
    pub fn ordinal_of(local_rank: Option<usize>) -> Result<(usize, usize)> {
        Ok(super::device::rank_ordinal(local_rank)?)
    }

    /// Choose and set up how a job of several ranks sums vectors (collective: every rank calls
    /// it). `device_sums`: the job's sums over the ranks run on the GPUs (LSQR's device loop,
    /// GMRES), which then go through the other GPUs' memory where they are on one node
    /// ([`super::peer_first`]; LSQR's sums outside its loop too, the others through the host);
    /// else NCCL, which needs libnccl on every rank (LD_LIBRARY_PATH; the unique id travels over
    /// `comm`), else the host. Returns the path in words.
    pub fn setup_allreduce(
        &self,
        comm: &dyn Comm,
        path: crate::backend::AllreducePath,
        max_ctas: Option<u32>,
        device_sums: bool,
    ) -> Result<String> {
        if super::peer_first(comm, path, device_sums)?
            && self.peer.setup(&self.stream, comm, path)?
        {
            return Ok("peer (sums through the other GPUs' memory, CUDA IPC)".into());
        }
        self.nccl.setup(&self.stream, comm, path, max_ctas)
    }

    /// Whether the device loops of several ranks can sum over them on the GPUs, inside the
    /// loop (peer memory or NCCL: [`Self::setup_allreduce`]), rather than through the host.
    pub fn sums_on_device(&self) -> bool {
        self.peer.is_on() || self.nccl.ready()
    }

    /// `x` (a vector or a piece of one) summed over the ranks in place by NCCL, GPU to GPU,
    /// on `stream` (also inside a graph capture: the device LSQR loop of several ranks); an
    /// error where NCCL is not set up.
    pub(crate) fn nccl_sum_on<R: cudarc::driver::DevicePtrMut<f64>>(
        &self,
        stream: &cudarc::driver::CudaStream,
        x: &mut R,
    ) -> Result<()> {
        if self.nccl.all_reduce_on(Some(stream), x)? {
            Ok(())
        } else {
            Err(Error::backend(
                "cuda",
                "a sum over the ranks on the device needs NCCL, which is not set up",
            ))
        }
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// The preprocessor defines the kernels were compiled with (tuning `nvrtc_defines`).
    pub fn defines(&self) -> &[String] {
        &self.defines
    }

    /// An error when a tuning's `defines` are given but are not the ones this backend's
    /// kernels were compiled with (they reach the kernels only through
    /// [`CudaBackend::with_defines`]).
    pub(crate) fn check_compiled_with(&self, defines: &[String]) -> Result<()> {
        if defines.is_empty() || defines == self.defines {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "tuning nvrtc_defines = {defines:?}, but this backend's kernels were compiled with {:?} (make the backend with CudaBackend::with_defines)",
            self.defines
        )))
    }

    /// Free and total device memory now, in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().doing("memory info")
    }

    /// Wait for all queued work (for timing).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().doing("synchronize")
    }

    /// The stream every kernel of this backend runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Device address of a buffer (event tracking is off, so nothing is recorded).
    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    /// Launch `f` on this backend's stream.
    pub(crate) fn launch(
        &self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.launch_smem(f, grid, block, 0, args)
    }

    /// Launch `f` with `smem` bytes of dynamic shared memory (0 for the kernels without).
    pub(crate) fn launch_smem(
        &self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        smem: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.launch_on(&self.stream, f, (grid, block, smem), args)
    }

    /// Launch `f` on `stream` (this backend's or one forked from it) with `(grid, block,
    /// smem)`: blocks, threads a block, bytes of dynamic shared memory.
    pub(crate) fn launch_on(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        (grid, block, smem): (u32, u32, u32),
        args: &mut [*mut c_void],
    ) -> Result<()> {
        if grid == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().doing("binding the context")?;
        // SAFETY: every kernel of kernels/*.cu is launched through a typed wrapper of
        // backend/cuda (vector.rs, csr.rs, compact.rs, tiled.rs, ...) that passes exactly the
        // kernel's parameters, in order, as pointers to values of the matching types that
        // outlive this call; buffer lengths are checked by the wrapper before the launch.
        // Kernels with `extern __shared__` arrays use at most `smem` bytes, which the caller
        // sizes.
        unsafe {
            dres::launch_kernel(
                f.cu_function(),
                (grid, 1, 1),
                (block, 1, 1),
                smem,
                stream.cu_stream(),
                args,
            )
        }
        .doing("kernel launch")
    }
}

/// The context [`head_start`] is making or made (taken by [`end_head_start`]).
static HEAD: Mutex<Option<std::thread::JoinHandle<Option<Arc<CudaContext>>>>> = Mutex::new(None);

/// Start CUDA and make the primary context of GPU `local_rank % GPUs` on a thread of its own,
/// for a rank that a launcher started, before MPI's own start: the backend made later for that
/// GPU finds the context there. With two ranks reading their rows on one 2 x H100 machine the
/// context came up 0.49-0.71 s after MPI's start, and NCCL's start waits for it. Nothing where
/// the CUDA libraries are missing; errors are left for the backend to meet and report.
pub fn head_start(local_rank: usize) {
    if !super::missing_libraries().is_empty() {
        return;
    }
    let made = std::thread::spawn(move || {
        let (ordinal, _) = CudaBackend::ordinal_of(Some(local_rank)).ok()?;
        CudaContext::new(ordinal).ok()
    });
    *HEAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(made);
}

/// Let go of [`head_start`]'s hold on its context, on a thread of its own (a backend on that
/// GPU holds its own; a run on the CPU or on another GPU releases it).
pub fn end_head_start() {
    if let Some(made) = HEAD.lock().unwrap_or_else(|e| e.into_inner()).take() {
        std::thread::spawn(move || drop(made.join()));
    }
}

/// A GPU context and kernels being made on another thread ([`CudaBackend::prestart_after`]); dropping
/// it waits for that thread and releases its hold on the context (a backend made meanwhile
/// holds its own).
pub struct Prestart(Option<std::thread::JoinHandle<Option<Arc<CudaContext>>>>);

impl Prestart {
    /// Nothing started.
    pub fn none() -> Prestart {
        Prestart(None)
    }

    /// Let the thread run on its own: dropping this value no longer waits for it.
    pub fn detach(&mut self) {
        drop(self.0.take());
    }
}

impl Drop for Prestart {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}
