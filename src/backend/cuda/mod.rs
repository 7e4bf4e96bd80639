//! The CUDA backend (cudarc 0.19, driver API, libraries loaded at run time).
//!
//! - [`probe`] checks that the CUDA driver, NVRTC, cuBLAS and cuSPARSE libraries can be loaded
//!   *before* any context is made (cudarc panics on a missing library), then that a device
//!   exists; it never panics and says why CUDA is not usable.
//! - The kernels live in `kernels/*.cu`, are embedded with `include_str!` and compiled once per
//!   process and device by NVRTC for the device's architecture (`compute_XY` PTX, which the
//!   driver turns into machine code for `sm_XY`); the module is cached.
//! - Vectors are device buffers of f64 ([`CudaSlice<f64>`]); only scalars come back to the host
//!   (one 8-byte copy per reduction). Reductions are single-launch and deterministic.
//! - [`CudaCsrOperator`] (operator.rs) holds the matrix (f64 or f32 values) and applies A^T by an
//!   explicit transposed copy, by f64 atomics, or through cuSPARSE.

mod compact;
mod cusparse;
mod lsqr_loop;
mod operator;
mod patterns;
mod square;
mod tiled;

pub use compact::{CompactGpuOptions, CudaCompactOperator, GpuLayout};
pub use operator::{plan_for, plan_memory, segments, CudaCsrOperator, MemoryPlan};
pub use square::{CudaIluSweeps, CudaSquareOperator};

use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    result as dres, sys as dsys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream,
    DevicePtr,
};

use super::{Backend, XwState, XwStep};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// The kernel sources, compiled together as one NVRTC program.
const KERNEL_SOURCES: [&str; 5] = [
    include_str!("../../../kernels/spmv.cu"),
    include_str!("../../../kernels/vector.cu"),
    include_str!("../../../kernels/compact.cu"),
    include_str!("../../../kernels/tiled.cu"),
    include_str!("../../../kernels/lsqr.cu"),
];

/// Threads per block of the element-wise and reduction kernels.
const THREADS: u32 = 256;
/// Nonzeros (entries) one block of a fused product kernel aims at: 16384, fewer where that
/// would leave fewer than [`FUSED_MIN_BLOCKS`] blocks. One block writes one partial sum, so the
/// cap bounds the partials a step kernel adds on large systems; the floor keeps the GPU busy on
/// small ones (australia's 285k nonzeros made 17 blocks of 64 warp-serial segments each: 0.10 ms
/// per product, against 0.013 ms for the unfused kernel).
pub(crate) fn fused_entries_per_block(total: usize) -> f64 {
    (total as f64 / FUSED_MIN_BLOCKS as f64).clamp(1.0, 16384.0)
}
/// Blocks a fused product aims for at least (8 blocks of 256 threads per SM of a 132-SM GPU).
const FUSED_MIN_BLOCKS: usize = 1024;
/// At most this many blocks in a reduction (and the size of the partial-sum buffer).
const RED_MAX_BLOCKS: usize = 1024;
/// Elements per thread a reduction aims at before adding blocks.
const RED_PER_THREAD: usize = 4;
/// Basis vectors per launch of the batched Gram-Schmidt kernels (MULTI_MAX in vector.cu).
const MULTI_MAX: usize = 32;

pub(crate) fn cuda_err(what: &str) -> impl Fn(dres::DriverError) -> Error + '_ {
    move |e| Error::backend("cuda", format!("{what}: {e:?}"))
}

/// What [`probe`] found: the device a CUDA backend would use.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_bytes: usize,
    pub free_bytes: usize,
    pub multiprocessors: i32,
    pub device_count: i32,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {} of {}: {} (sm_{}{}, {} SMs, {:.1} GiB, {:.1} GiB free)",
            self.ordinal,
            self.device_count,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.multiprocessors,
            self.total_bytes as f64 / (1u64 << 30) as f64,
            self.free_bytes as f64 / (1u64 << 30) as f64
        )
    }
}

/// The CUDA libraries that cannot be loaded here (empty when all are present).
pub fn missing_libraries() -> Vec<&'static str> {
    let mut missing = Vec::new();
    // SAFETY: these functions only try to dlopen the library by its usual names; they do not
    // call into it.
    unsafe {
        if !cudarc::driver::sys::is_culib_present() {
            missing.push("CUDA driver (libcuda)");
        }
        if !cudarc::nvrtc::sys::is_culib_present() {
            missing.push("NVRTC (libnvrtc)");
        }
        if !cudarc::cublas::sys::is_culib_present() {
            missing.push("cuBLAS (libcublas)");
        }
        if !cudarc::cusparse::sys::is_culib_present() {
            missing.push("cuSPARSE (libcusparse)");
        }
    }
    missing
}

/// Whether a usable CUDA device is present: its description, or the reason it is not usable.
/// Never panics. Creates (and keeps) the device's primary context when the libraries load.
pub fn probe() -> std::result::Result<DeviceInfo, String> {
    probe_device(0)
}

/// [`probe`] for one device ordinal.
pub fn probe_device(ordinal: usize) -> std::result::Result<DeviceInfo, String> {
    let missing = missing_libraries();
    if !missing.is_empty() {
        return Err(format!("missing {}", missing.join(", ")));
    }
    let count = CudaContext::device_count().map_err(|e| format!("cuInit/device count: {e:?}"))?;
    if count <= 0 {
        return Err("the CUDA driver reports no device".into());
    }
    if ordinal >= count as usize {
        return Err(format!(
            "device {ordinal} requested but only {count} present"
        ));
    }
    let ctx =
        CudaContext::new(ordinal).map_err(|e| format!("context on device {ordinal}: {e:?}"))?;
    let name = ctx.name().map_err(|e| format!("device name: {e:?}"))?;
    let cc = ctx
        .compute_capability()
        .map_err(|e| format!("compute capability: {e:?}"))?;
    let (free, total) = ctx
        .mem_get_info()
        .map_err(|e| format!("memory info: {e:?}"))?;
    let sms = ctx
        .attribute(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| format!("SM count: {e:?}"))?;
    if cc.0 < 6 {
        return Err(format!(
            "{name} has compute capability {}.{}; f64 atomics need 6.0 or newer",
            cc.0, cc.1
        ));
    }
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability: cc,
        total_bytes: total,
        free_bytes: free,
        multiprocessors: sms,
        device_count: count,
    })
}

/// The compiled kernels of one device.
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    pub spmv_f64: CudaFunction,
    pub spmv_f32: CudaFunction,
    pub scatter_f64: CudaFunction,
    pub scatter_f32: CudaFunction,
    /// pattern_spmv [f64 = 0, f32 = 1] (kernels/spmv.cu: row patterns)
    pub pattern_spmv: [CudaFunction; 2],
    pub dot: CudaFunction,
    pub lsqr_update: CudaFunction,
    pub axpby: CudaFunction,
    pub scale: CudaFunction,
    pub fill: CudaFunction,
    pub pmul: CudaFunction,
    /// multi_dot_K of vector.cu for K = 1, 2, 4, 8, 16, 32 (index: ceil(log2 k)).
    pub multi_dot: [CudaFunction; 6],
    pub copy_scaled: CudaFunction,
    pub copy_inv_sqrt: CudaFunction,
    pub multi_axpy: CudaFunction,
    pub tri_sweep: CudaFunction,
    pub gather: CudaFunction,
    pub scatter_rows: CudaFunction,
    /// compact[stencil_t][f64 = 0, f32 = 1][sub-warp 32, 16, 8, 4] (kernels/compact.cu)
    pub compact: [[[CudaFunction; 4]; 2]; 2],
    pub stencil_av: CudaFunction,
    /// tiled_atu [f64 = 0, f32 = 1][sub-warp 32, 16, 8, 4] (kernels/tiled.cu)
    pub tiled_atu: [[CudaFunction; 4]; 2],
    /// tiled_axf [f64 = 0, f32 = 1]: A x's segment sums as one flat stream per chunk
    pub tiled_axf: [CudaFunction; 2],
    pub tiled_rows: CudaFunction,
    pub tiled_cols: CudaFunction,
    pub csr_fused_f64: CudaFunction,
    pub csr_fused_f32: CudaFunction,
    pub lsqr_step1: CudaFunction,
    pub lsqr_step2: CudaFunction,
    pub lsqr_step3: CudaFunction,
    pub lsqr_update_dev: CudaFunction,
    pub lsqr_normalize: CudaFunction,
    pub lsqr_rescaled: CudaFunction,
}

type ModuleCache = Mutex<Vec<(usize, Arc<Kernels>)>>;

/// Compile (once per process and device) and load the kernels.
fn kernels_for(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Arc<Kernels>> {
    static CACHE: OnceLock<ModuleCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, k)) = cache.iter().find(|(o, _)| *o == ctx.ordinal()) {
        return Ok(k.clone());
    }
    let src = KERNEL_SOURCES.join("\n");
    let mut options = vec![
        format!("--gpu-architecture=compute_{}{}", cc.0, cc.1),
        "--std=c++17".into(),
        // No fused multiply-add contraction: element-wise kernels then round exactly as
        // the CPU backend does (bitwise-equal vector updates; sums differ only in order).
        "--fmad=false".into(),
    ];
    // Kernel tuning constants for experiments: SEISTOMO_NVRTC_DEFINES="CUNROLL=2,CMINB=8".
    if let Ok(d) = std::env::var("SEISTOMO_NVRTC_DEFINES") {
        options.extend(
            d.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(|t| format!("-D{t}")),
        );
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        name: Some("seistomo_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| {
        let detail = match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => format!("{other:?}"),
        };
        Error::backend(
            "cuda",
            format!("NVRTC could not compile kernels/*.cu: {detail}"),
        )
    })?;
    let module = ctx
        .load_module(ptx)
        .map_err(cuda_err("loading the kernel module"))?;
    let f = |name: &str| {
        module
            .load_function(name)
            .map_err(|e| Error::backend("cuda", format!("kernel {name}: {e:?}")))
    };
    let k = Arc::new(Kernels {
        spmv_f64: f("spmv_f64")?,
        spmv_f32: f("spmv_f32")?,
        scatter_f64: f("scatter_f64")?,
        scatter_f32: f("scatter_f32")?,
        pattern_spmv: [f("pattern_spmv_f64")?, f("pattern_spmv_f32")?],
        dot: f("dot")?,
        lsqr_update: f("lsqr_update")?,
        axpby: f("axpby")?,
        scale: f("scale")?,
        fill: f("fill")?,
        pmul: f("pmul")?,
        multi_dot: [
            f("multi_dot_1")?,
            f("multi_dot_2")?,
            f("multi_dot_4")?,
            f("multi_dot_8")?,
            f("multi_dot_16")?,
            f("multi_dot_32")?,
        ],
        copy_scaled: f("copy_scaled")?,
        copy_inv_sqrt: f("copy_inv_sqrt")?,
        multi_axpy: f("multi_axpy")?,
        tri_sweep: f("tri_sweep")?,
        gather: f("gather")?,
        scatter_rows: f("scatter_rows")?,
        compact: {
            let g = |st: &str, p: &str, w: u32| f(&format!("compact_{st}s{w}_{p}"));
            let row = |st: &str, p: &str| -> Result<[CudaFunction; 4]> {
                Ok([g(st, p, 32)?, g(st, p, 16)?, g(st, p, 8)?, g(st, p, 4)?])
            };
            [
                [row("", "f64")?, row("", "f32")?],
                [row("st_", "f64")?, row("st_", "f32")?],
            ]
        },
        stencil_av: f("stencil_av")?,
        tiled_atu: {
            let g = |p: &str, w: u32| f(&format!("tiled_atu_s{w}_{p}"));
            [
                [g("f64", 32)?, g("f64", 16)?, g("f64", 8)?, g("f64", 4)?],
                [g("f32", 32)?, g("f32", 16)?, g("f32", 8)?, g("f32", 4)?],
            ]
        },
        tiled_axf: [f("tiled_axf_f64")?, f("tiled_axf_f32")?],
        tiled_rows: f("tiled_rows")?,
        tiled_cols: f("tiled_cols")?,
        csr_fused_f64: f("csr_fused_f64")?,
        csr_fused_f32: f("csr_fused_f32")?,
        lsqr_step1: f("lsqr_step1")?,
        lsqr_step2: f("lsqr_step2")?,
        lsqr_step3: f("lsqr_step3")?,
        lsqr_update_dev: f("lsqr_update_dev")?,
        lsqr_normalize: f("lsqr_normalize")?,
        lsqr_rescaled: f("lsqr_rescaled")?,
        _module: module.clone(),
    });
    cache.push((ctx.ordinal(), k.clone()));
    Ok(k)
}

/// A kernel argument: the address of a value that lives until the launch returns.
pub(crate) fn arg<T>(v: &T) -> *mut c_void {
    v as *const T as *mut c_void
}

/// `len` f64 of page-locked host memory mapped into the device's address space.
struct MappedScalar {
    _mem: cudarc::driver::PinnedHostSlice<f64>,
    /// Host address (kept as an integer so the backend stays Send + Sync).
    host: usize,
    device: u64,
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
        .map_err(cuda_err("mapped host memory"))?;
        let host = mem.as_mut_ptr().map_err(cuda_err("mapped host memory"))?;
        // SAFETY: `host` points to `len` f64 of page-locked memory owned by `mem`.
        unsafe { std::ptr::write_bytes(host, 0, len) };
        let mut device: dsys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with CU_MEMHOSTALLOC_DEVICEMAP in this context.
        let r = unsafe { dsys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            return Err(Error::backend(
                "cuda",
                format!("mapping host memory: {r:?}"),
            ));
        }
        Ok(MappedScalar {
            _mem: mem,
            host: host as usize,
            device,
        })
    }
}

/// Where the coefficients of a batched Gram-Schmidt launch come from: by value from the host,
/// or from device memory (GMRES's device-resident Arnoldi cycle).
#[derive(Clone, Copy)]
enum Coeffs<'a> {
    Host(&'a [f64]),
    Device(u64),
}

impl<'a> Coeffs<'a> {
    /// The kernel's two coefficient arguments: the by-value ones (empty: zeros) and the device
    /// address (0: use the by-value ones).
    fn args(self) -> (&'a [f64], u64) {
        match self {
            Coeffs::Host(c) => (c, 0),
            Coeffs::Device(p) => (&[], p),
        }
    }
}

/// A vector on the device: the CUDA backend's `Backend::Vector`.
pub type DeviceVec = CudaSlice<f64>;

/// Device vectors and fused kernels on one GPU (one stream; no host synchronisation except
/// where a scalar comes back).
pub struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) k: Arc<Kernels>,
    pub(crate) info: DeviceInfo,
    /// Partial sums of a reduction (RED_MAX_BLOCKS), its ticket counter, and its result.
    partial: CudaSlice<f64>,
    counter: CudaSlice<u32>,
    result: CudaSlice<f64>,
    /// Where reductions write their result: a page-locked, device-mapped host word (the kernel
    /// writes it directly; the host reads it after one stream synchronisation, no copy), or
    /// `result` on the device when mapping is unavailable.
    mapped: Option<MappedScalar>,
    /// The same for the batched reductions of GMRES: MULTI_MAX partial-sum rows of
    /// RED_MAX_BLOCKS, and MULTI_MAX results (mapped host memory, or `multi_result` on the
    /// device when mapping is unavailable).
    multi_partial: CudaSlice<f64>,
    multi_result: CudaSlice<f64>,
    multi_mapped: Option<MappedScalar>,
    /// Page-locked host staging for the multi-rank vector reduction (host path).
    pinned: Mutex<Option<cudarc::driver::PinnedHostSlice<f64>>>,
    /// NCCL communicator over the job's GPUs (NCCL path), set up by `setup_allreduce`.
    nccl: Mutex<Option<NcclComm>>,
}

/// An NCCL communicator that can live in the backend.
struct NcclComm(cudarc::nccl::safe::Comm);
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; the backend keeps it behind a Mutex, so only one thread uses it at a time.
unsafe impl Send for NcclComm {}

impl CudaBackend {
    /// Choose and set up how a job of several ranks sums vectors (collective: every rank calls
    /// it). NCCL needs libnccl on every rank (LD_LIBRARY_PATH); the unique id travels over
    /// `comm`. Returns the path in words.
    pub fn setup_allreduce(
        &self,
        comm: &dyn Comm,
        path: crate::backend::AllreducePath,
    ) -> Result<String> {
        use crate::backend::AllreducePath;
        if comm.size() <= 1 {
            return Ok("none (one rank)".into());
        }
        // SAFETY: only tries to dlopen libnccl; no NCCL call is made unless it loads.
        let here = path != AllreducePath::Host && unsafe { cudarc::nccl::sys::is_culib_present() };
        let everywhere = comm.allreduce_max(if here { 0.0 } else { 1.0 })? == 0.0;
        if !everywhere {
            if path == AllreducePath::Nccl {
                return Err(Error::backend(
                    "cuda",
                    "allreduce = nccl, but libnccl cannot be loaded on every rank (set LD_LIBRARY_PATH, or use allreduce = \"host\")",
                ));
            }
            return Ok("host (page-locked buffer + MPI_Allreduce)".into());
        }
        let mut id_bytes = Vec::new();
        let mut local_err = None;
        if comm.rank() == 0 {
            match cudarc::nccl::safe::Id::new() {
                Ok(id) => id_bytes = id.internal().iter().map(|&c| c as u8).collect(),
                Err(e) => local_err = Some(format!("ncclGetUniqueId: {e:?}")),
            }
        }
        comm.broadcast_bytes(0, &mut id_bytes)?;
        if id_bytes.len() != 128 {
            return Err(Error::backend(
                "cuda",
                local_err.unwrap_or_else(|| "rank 0 could not create an NCCL id".into()),
            ));
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(&id_bytes) {
            *d = *s as std::ffi::c_char;
        }
        let id = cudarc::nccl::safe::Id::uninit(internal);
        let c =
            cudarc::nccl::safe::Comm::from_rank(self.stream.clone(), comm.rank(), comm.size(), id)
                .map_err(|e| Error::backend("cuda", format!("ncclCommInitRank: {e:?}")))?;
        *self.nccl.lock().unwrap_or_else(|e| e.into_inner()) = Some(NcclComm(c));
        Ok("nccl (GPU to GPU)".into())
    }
}

impl CudaBackend {
    /// A backend on device `ordinal`: checks the libraries and the device first (an error, not
    /// a panic, when CUDA is not usable), then compiles or reuses the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        let info = probe_device(ordinal)
            .map_err(|why| Error::backend("cuda", format!("no usable CUDA GPU: {why}")))?;
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating the context"))?;
        // SAFETY: this backend uses a single stream for every buffer and kernel, so cudarc's
        // per-buffer event tracking (cross-stream synchronisation) is not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(cuda_err("creating a stream"))?;
        let k = kernels_for(&ctx, info.compute_capability)?;
        let partial = stream
            .alloc_zeros::<f64>(RED_MAX_BLOCKS)
            .map_err(cuda_err("allocating reduction buffers"))?;
        let counter = stream
            .alloc_zeros::<u32>(1)
            .map_err(cuda_err("allocating reduction buffers"))?;
        let result = stream
            .alloc_zeros::<f64>(1)
            .map_err(cuda_err("allocating reduction buffers"))?;
        let mapped = MappedScalar::new(&ctx, 1).ok();
        let multi_partial = stream
            .alloc_zeros::<f64>(MULTI_MAX * RED_MAX_BLOCKS)
            .map_err(cuda_err("allocating reduction buffers"))?;
        let multi_result = stream
            .alloc_zeros::<f64>(MULTI_MAX)
            .map_err(cuda_err("allocating reduction buffers"))?;
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
            nccl: Mutex::new(None),
        })
    }

    /// The backend of this rank of a job: one GPU per rank, GPU = local rank on the node
    /// (device 0 alone); says which GPU each rank took when there are several ranks.
    pub fn for_rank(comm: &dyn Comm) -> Result<Self> {
        let count = CudaContext::device_count()
            .map_err(|e| Error::backend("cuda", format!("cuInit/device count: {e:?}")))?
            .max(1) as usize;
        // More ranks on a node than GPUs: ranks share them round-robin (said once per rank).
        let ordinal = if comm.size() > 1 {
            comm.local_rank() % count
        } else {
            0
        };
        let be = CudaBackend::new(ordinal)?;
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

    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// Free and total device memory now, in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(cuda_err("memory info"))
    }

    /// Wait for all queued work (for timing).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err("synchronize"))
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
        if grid == 0 {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the context"))?;
        // SAFETY: every kernel of kernels/*.cu is launched through a typed wrapper in this module
        // or operator.rs that passes exactly the kernel's parameters, in order, as pointers to
        // values of the matching types that outlive this call; buffer lengths are checked by
        // the wrapper before the launch. Kernels with `extern __shared__` arrays use at most
        // `smem` bytes, which the caller sizes.
        unsafe {
            dres::launch_kernel(
                f.cu_function(),
                (grid, 1, 1),
                (block, 1, 1),
                smem,
                self.stream.cu_stream(),
                args,
            )
        }
        .map_err(cuda_err("kernel launch"))
    }

    fn elementwise_grid(&self, n: usize) -> u32 {
        let max = (self.info.multiprocessors.max(1) as usize) * 16;
        n.div_ceil(THREADS as usize).clamp(1, max) as u32
    }

    /// Launch a grid-stride element-wise kernel over `n` entries (THREADS per block).
    pub(crate) fn launch_elementwise(
        &self,
        f: &CudaFunction,
        n: usize,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.launch(f, self.elementwise_grid(n), THREADS, args)
    }

    /// Launch a single-launch reduction over `n` entries (kernels/vector.cu): `args`, then the
    /// partial-sum buffer, the ticket counter and where the result goes; returns the result.
    fn reduce(&self, f: &CudaFunction, n: usize, args: &[*mut c_void]) -> Result<f64> {
        self.reduce_to(f, n, args, self.result_ptr())?;
        self.read_result()
    }

    /// [`Self::reduce`] without waiting: the result goes to device address `pr`.
    fn reduce_to(&self, f: &CudaFunction, n: usize, args: &[*mut c_void], pr: u64) -> Result<()> {
        let (pp, pc) = (self.ptr(&self.partial), self.ptr(&self.counter));
        let mut all = [args, &[arg(&pp), arg(&pc), arg(&pr)]].concat();
        self.launch(f, Self::reduction_grid(n), THREADS, &mut all)
    }

    fn reduction_grid(n: usize) -> u32 {
        n.div_ceil(THREADS as usize * RED_PER_THREAD)
            .clamp(1, RED_MAX_BLOCKS) as u32
    }

    /// Where a reduction kernel writes its result.
    fn result_ptr(&self) -> u64 {
        match &self.mapped {
            Some(m) => m.device,
            None => self.ptr(&self.result),
        }
    }

    /// The reduction result on the host (waits for the stream).
    fn read_result(&self) -> Result<f64> {
        if let Some(m) = &self.mapped {
            self.synchronize()?;
            // SAFETY: `m.host` is the live page-locked word the finished kernel wrote.
            return Ok(unsafe { std::ptr::read_volatile(m.host as *const f64) });
        }
        let mut h = [0.0f64];
        self.stream
            .memcpy_dtoh(&self.result, &mut h)
            .map_err(cuda_err("copying a scalar to the host"))?;
        self.synchronize()?;
        Ok(h[0])
    }

    /// One launch of the batched Gram-Schmidt reduction (`mode` as in vector.cu's multi_dot)
    /// over at most MULTI_MAX basis vectors of length `n`, with w at device address `pw`
    /// (written only in modes 1 and 2); the results land in `out`.
    fn multi_launch(
        &self,
        basis: &[CudaSlice<f64>],
        coeffs: Option<&[f64]>,
        mode: i32,
        pw: u64,
        n: usize,
        out: &mut [f64],
    ) -> Result<()> {
        let nout = if mode == 2 { 1 } else { basis.len() };
        let pr = match &self.multi_mapped {
            Some(m) => m.device,
            None => self.ptr(&self.multi_result),
        };
        self.multi_launch_to(basis, Coeffs::Host(coeffs.unwrap_or(&[])), mode, pw, n, pr)?;
        if let Some(m) = &self.multi_mapped {
            self.synchronize()?;
            for (j, o) in out[..nout].iter_mut().enumerate() {
                // SAFETY: `m.host` holds MULTI_MAX page-locked f64 that the finished kernel
                // wrote; j < nout <= MULTI_MAX.
                *o = unsafe { std::ptr::read_volatile((m.host as *const f64).add(j)) };
            }
        } else {
            self.stream
                .memcpy_dtoh(&self.multi_result.slice(..nout), &mut out[..nout])
                .map_err(cuda_err("copying results to the host"))?;
            self.synchronize()?;
        }
        Ok(())
    }

    /// [`Self::multi_launch`] without waiting: the coefficients by value or from device
    /// memory, the results written to device address `pr`.
    fn multi_launch_to(
        &self,
        basis: &[CudaSlice<f64>],
        coeffs: Coeffs<'_>,
        mode: i32,
        pw: u64,
        n: usize,
        pr: u64,
    ) -> Result<()> {
        let k = basis.len();
        debug_assert!(k <= MULTI_MAX && k > 0);
        let (host, cdev) = coeffs.args();
        let (ptrs, c) = self.multi_args("multi_dot", basis, host, n)?;
        let (k32, n64) = (k as i32, n as u64);
        let (pp, pc) = (self.ptr(&self.multi_partial), self.ptr(&self.counter));
        self.launch(
            // the kernel with the fewest slots that hold k vectors
            &self.k.multi_dot[k.next_power_of_two().trailing_zeros() as usize],
            Self::reduction_grid(n),
            THREADS,
            &mut [
                arg(&ptrs),
                arg(&k32),
                arg(&c),
                arg(&cdev),
                arg(&mode),
                arg(&pw),
                arg(&n64),
                arg(&pp),
                arg(&pc),
                arg(&pr),
            ],
        )
    }

    /// The by-value kernel arguments of at most MULTI_MAX basis vectors of length `n`: their
    /// device addresses and (zero-padded) coefficients.
    fn multi_args(
        &self,
        what: &str,
        basis: &[CudaSlice<f64>],
        coeffs: &[f64],
        n: usize,
    ) -> Result<([u64; MULTI_MAX], [f64; MULTI_MAX])> {
        let mut ptrs = [0u64; MULTI_MAX];
        for (p, b) in ptrs.iter_mut().zip(basis) {
            self.check_len(what, b.len(), n)?;
            *p = self.ptr(b);
        }
        let mut c = [0f64; MULTI_MAX];
        let m = coeffs.len().min(MULTI_MAX);
        c[..m].copy_from_slice(&coeffs[..m]);
        Ok((ptrs, c))
    }

    /// w -= sum_j coeffs[j] basis[j] in launches of at most MULTI_MAX vectors (in j order).
    fn multi_axpy_chunks(
        &self,
        coeffs: &[f64],
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
    ) -> Result<()> {
        for (bs, cs) in basis.chunks(MULTI_MAX).zip(coeffs.chunks(MULTI_MAX)) {
            let k = bs.len().min(cs.len());
            self.multi_axpy_launch(&bs[..k], Coeffs::Host(cs), w)?;
        }
        Ok(())
    }

    /// [`Self::multi_axpy_chunks`] with the coefficients in device memory at `pc`.
    fn multi_axpy_chunks_dev(
        &self,
        pc: u64,
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
    ) -> Result<()> {
        for (i, bs) in basis.chunks(MULTI_MAX).enumerate() {
            let at = pc + (8 * i * MULTI_MAX) as u64;
            self.multi_axpy_launch(bs, Coeffs::Device(at), w)?;
        }
        Ok(())
    }

    /// One multi_axpy launch over at most MULTI_MAX vectors.
    fn multi_axpy_launch(
        &self,
        bs: &[CudaSlice<f64>],
        coeffs: Coeffs<'_>,
        w: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let n = w.len();
        let (host, cdev) = coeffs.args();
        let (ptrs, c) = self.multi_args("multi_axpy", bs, host, n)?;
        let (k32, n64, pw) = (bs.len() as i32, n as u64, self.ptr(w));
        self.launch_elementwise(
            &self.k.multi_axpy,
            n,
            &mut [
                arg(&ptrs),
                arg(&k32),
                arg(&c),
                arg(&cdev),
                arg(&pw),
                arg(&n64),
            ],
        )
    }

    /// Device address of `sc[at]`, checked against its length (`len` entries from there).
    fn scalar_ptr(&self, what: &str, sc: &CudaSlice<f64>, at: usize, len: usize) -> Result<u64> {
        if at + len > sc.len() {
            return Err(Error::Invalid(format!(
                "cuda {what}: scalars {at}..{} of a buffer of {}",
                at + len,
                sc.len()
            )));
        }
        Ok(self.ptr(sc) + 8 * at as u64)
    }

    /// The point-to-point exchange of a halo GPU to GPU when NCCL is set up
    /// ([`CudaBackend::setup_allreduce`]): `send` holds the values for each rank in rank order
    /// (`send_counts`), `recv` receives from each rank in rank order (`recv_counts`). Returns
    /// false (nothing done) when there is no NCCL communicator.
    /// Whether NCCL is set up for this backend's communicator (halo and reductions GPU to GPU).
    pub(crate) fn nccl_ready(&self) -> bool {
        self.nccl
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    pub(crate) fn nccl_exchange(
        &self,
        send: Option<&CudaSlice<f64>>,
        send_counts: &[usize],
        recv: &mut CudaSlice<f64>,
        recv_offset: usize,
        recv_counts: &[usize],
    ) -> Result<bool> {
        let guard = self.nccl.lock().unwrap_or_else(|e| e.into_inner());
        let Some(nc) = guard.as_ref() else {
            return Ok(false);
        };
        let err = |what: &str, e: cudarc::nccl::result::NcclError| {
            Error::backend("cuda", format!("NCCL {what} in the halo exchange: {e:?}"))
        };
        cudarc::nccl::result::group_start().map_err(|e| err("ncclGroupStart", e))?;
        // Every send and receive is queued before ncclGroupEnd launches them together; the
        // group must be closed whatever happens, so errors are collected first.
        let mut failed = None;
        if let Some(send) = send {
            let mut off = 0;
            for (r, &c) in send_counts.iter().enumerate() {
                if c > 0 && failed.is_none() {
                    if let Err(e) = nc.0.send(&send.slice(off..off + c), r as i32) {
                        failed = Some(err("ncclSend", e));
                    }
                }
                off += c;
            }
        }
        let mut off = recv_offset;
        for (r, &c) in recv_counts.iter().enumerate() {
            if c > 0 && failed.is_none() {
                if let Err(e) = nc.0.recv(&mut recv.slice_mut(off..off + c), r as i32) {
                    failed = Some(err("ncclRecv", e));
                }
            }
            off += c;
        }
        let end = cudarc::nccl::result::group_end().map_err(|e| err("ncclGroupEnd", e));
        match failed {
            Some(e) => Err(e),
            None => end.map(|_| true),
        }
    }

    /// out[k] = x[idx[k]] on the device.
    pub(crate) fn gather(
        &self,
        idx: &CudaSlice<u32>,
        x: &CudaSlice<f64>,
        out: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.check_len("gather", idx.len(), out.len())?;
        let (n, pi, px, po) = (idx.len() as u64, self.ptr(idx), self.ptr(x), self.ptr(out));
        self.launch_elementwise(
            &self.k.gather,
            idx.len(),
            &mut [arg(&n), arg(&pi), arg(&px), arg(&po)],
        )
    }

    /// y[idx[k]] = s.alpha t[k] + s.beta y[idx[k]] on the device (a split product's rows put
    /// back; t holds the plain row sums).
    pub(crate) fn scatter_rows(
        &self,
        idx: &CudaSlice<u32>,
        t: &CudaSlice<f64>,
        y: &mut CudaSlice<f64>,
        s: crate::backend::Scale,
    ) -> Result<()> {
        self.check_len("scatter_rows", idx.len(), t.len())?;
        let (n, pi, pt, py) = (idx.len() as u64, self.ptr(idx), self.ptr(t), self.ptr(y));
        let (a, b) = (s.alpha, s.beta);
        self.launch_elementwise(
            &self.k.scatter_rows,
            idx.len(),
            &mut [arg(&n), arg(&pi), arg(&pt), arg(&py), arg(&a), arg(&b)],
        )
    }

    fn check_len(&self, what: &str, got: usize, want: usize) -> Result<()> {
        if got != want {
            return Err(Error::Invalid(format!(
                "cuda {what}: vector lengths differ ({got} vs {want})"
            )));
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Vector = DeviceVec;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn describe(&self) -> String {
        format!("cuda {}", self.info)
    }
    fn zeros(&self, n: usize) -> Result<CudaSlice<f64>> {
        self.stream
            .alloc_zeros::<f64>(n)
            .map_err(|e| Error::backend("cuda", format!("allocating {n} f64 on the device: {e:?}")))
    }
    fn upload(&self, x: &[f64]) -> Result<CudaSlice<f64>> {
        self.stream
            .clone_htod(x)
            .map_err(cuda_err("copying a vector to the device"))
    }
    fn download(&self, x: &CudaSlice<f64>, out: &mut [f64]) -> Result<()> {
        self.check_len("download", out.len(), x.len())?;
        self.stream
            .memcpy_dtoh(x, out)
            .map_err(cuda_err("copying a vector to the host"))?;
        self.synchronize()
    }
    fn len(&self, x: &CudaSlice<f64>) -> usize {
        x.len()
    }
    fn copy(&self, src: &CudaSlice<f64>, dst: &mut CudaSlice<f64>) -> Result<()> {
        self.check_len("copy", src.len(), dst.len())?;
        self.stream
            .memcpy_dtod(src, dst)
            .map_err(cuda_err("device copy"))
    }
    fn fill(&self, x: &mut CudaSlice<f64>, value: f64) -> Result<()> {
        let (n, px) = (x.len() as u64, self.ptr(x));
        self.launch_elementwise(&self.k.fill, x.len(), &mut [arg(&n), arg(&value), arg(&px)])
    }
    fn scale(&self, x: &mut CudaSlice<f64>, a: f64) -> Result<()> {
        let (n, px) = (x.len() as u64, self.ptr(x));
        self.launch_elementwise(&self.k.scale, x.len(), &mut [arg(&n), arg(&a), arg(&px)])
    }
    fn copy_scaled(&self, a: f64, x: &CudaSlice<f64>, y: &mut CudaSlice<f64>) -> Result<()> {
        self.check_len("copy_scaled", x.len(), y.len())?;
        let (n, px, py) = (x.len() as u64, self.ptr(x), self.ptr(y));
        self.launch_elementwise(
            &self.k.copy_scaled,
            x.len(),
            &mut [arg(&n), arg(&a), arg(&px), arg(&py)],
        )
    }
    fn axpby(&self, a: f64, x: &CudaSlice<f64>, b: f64, y: &mut CudaSlice<f64>) -> Result<()> {
        self.check_len("axpby", x.len(), y.len())?;
        let (n, px, py) = (x.len() as u64, self.ptr(x), self.ptr(y));
        self.launch_elementwise(
            &self.k.axpby,
            x.len(),
            &mut [arg(&n), arg(&a), arg(&px), arg(&b), arg(&py)],
        )
    }
    fn pointwise_mul(
        &self,
        x: &CudaSlice<f64>,
        y: &CudaSlice<f64>,
        z: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.check_len("pointwise_mul", x.len(), y.len())?;
        self.check_len("pointwise_mul", x.len(), z.len())?;
        let (n, px, py, pz) = (x.len() as u64, self.ptr(x), self.ptr(y), self.ptr(z));
        self.launch_elementwise(
            &self.k.pmul,
            x.len(),
            &mut [arg(&n), arg(&px), arg(&py), arg(&pz)],
        )
    }
    fn dot(&self, x: &CudaSlice<f64>, y: &CudaSlice<f64>) -> Result<f64> {
        self.check_len("dot", x.len(), y.len())?;
        let (n, px, py) = (x.len() as u64, self.ptr(x), self.ptr(y));
        self.reduce(&self.k.dot, x.len(), &[arg(&px), arg(&py), arg(&n)])
    }
    fn norm_sq(&self, x: &CudaSlice<f64>) -> Result<f64> {
        self.dot(x, x)
    }
    fn lsqr_update(&self, k: XwStep, v: &DeviceVec, s: XwState<DeviceVec>) -> Result<f64> {
        let (XwStep { t1, t2, inv_rho }, XwState { x, w, var }) = (k, s);
        let n = x.len();
        self.check_len("lsqr_update", w.len(), n)?;
        self.check_len("lsqr_update", v.len(), n)?;
        let pvar = match var {
            Some(var) => {
                self.check_len("lsqr_update", var.len(), n)?;
                self.ptr(var)
            }
            None => 0u64,
        };
        let (px, pw, pv, n64) = (self.ptr(x), self.ptr(w), self.ptr(v), n as u64);
        self.reduce(
            &self.k.lsqr_update,
            n,
            &[
                arg(&px),
                arg(&pw),
                arg(&pv),
                arg(&t1),
                arg(&t2),
                arg(&inv_rho),
                arg(&pvar),
                arg(&n64),
            ],
        )
    }
    fn multi_dot(
        &self,
        basis: &[CudaSlice<f64>],
        w: &CudaSlice<f64>,
        out: &mut [f64],
    ) -> Result<()> {
        self.check_len("multi_dot", out.len(), basis.len())?;
        // Mode 0 only reads w.
        let (pw, n) = (self.ptr(w), w.len());
        for (bs, o) in basis.chunks(MULTI_MAX).zip(out.chunks_mut(MULTI_MAX)) {
            self.multi_launch(bs, None, 0, pw, n, o)?;
        }
        Ok(())
    }
    fn multi_axpy(
        &self,
        coeffs: &[f64],
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.check_len("multi_axpy", coeffs.len(), basis.len())?;
        self.multi_axpy_chunks(coeffs, basis, w)
    }
    fn multi_axpy_dot(
        &self,
        coeffs: &[f64],
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
        out: &mut [f64],
    ) -> Result<()> {
        self.check_len("multi_axpy_dot", coeffs.len(), basis.len())?;
        self.check_len("multi_axpy_dot", out.len(), basis.len())?;
        if basis.is_empty() {
            return Ok(());
        }
        if basis.len() > MULTI_MAX {
            self.multi_axpy_chunks(coeffs, basis, w)?;
            return self.multi_dot(basis, w, out);
        }
        let (pw, n) = (self.ptr(w), w.len());
        self.multi_launch(basis, Some(coeffs), 1, pw, n, out)
    }
    fn multi_axpy_norm_sq(
        &self,
        coeffs: &[f64],
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
    ) -> Result<f64> {
        self.check_len("multi_axpy_norm_sq", coeffs.len(), basis.len())?;
        if basis.is_empty() || basis.len() > MULTI_MAX {
            self.multi_axpy_chunks(coeffs, basis, w)?;
            return self.norm_sq(w);
        }
        let mut out = [0f64; 1];
        let (pw, n) = (self.ptr(w), w.len());
        self.multi_launch(basis, Some(coeffs), 2, pw, n, &mut out)?;
        Ok(out[0])
    }
    fn multi_dot_to(
        &self,
        basis: &[CudaSlice<f64>],
        w: &CudaSlice<f64>,
        sc: &mut CudaSlice<f64>,
        at: usize,
    ) -> Result<()> {
        let pr = self.scalar_ptr("multi_dot_to", sc, at, basis.len())?;
        let (pw, n) = (self.ptr(w), w.len());
        for (i, bs) in basis.chunks(MULTI_MAX).enumerate() {
            let at_i = pr + (8 * i * MULTI_MAX) as u64;
            self.multi_launch_to(bs, Coeffs::Host(&[]), 0, pw, n, at_i)?;
        }
        Ok(())
    }
    fn multi_axpy_dot_to(
        &self,
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
        sc: &mut CudaSlice<f64>,
        coef_at: usize,
        out_at: usize,
    ) -> Result<()> {
        let k = basis.len();
        let pc = self.scalar_ptr("multi_axpy_dot_to", sc, coef_at, k)?;
        let pr = self.scalar_ptr("multi_axpy_dot_to", sc, out_at, k)?;
        if k == 0 {
            return Ok(());
        }
        if k > MULTI_MAX {
            // as multi_axpy_dot: the update in chunks, then the inner products
            self.multi_axpy_chunks_dev(pc, basis, w)?;
            return self.multi_dot_to(basis, w, sc, out_at);
        }
        let (pw, n) = (self.ptr(w), w.len());
        self.multi_launch_to(basis, Coeffs::Device(pc), 1, pw, n, pr)
    }
    fn multi_axpy_norm_sq_to(
        &self,
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
        sc: &mut CudaSlice<f64>,
        coef_at: usize,
        out_at: usize,
    ) -> Result<()> {
        let k = basis.len();
        let pc = self.scalar_ptr("multi_axpy_norm_sq_to", sc, coef_at, k)?;
        let pr = self.scalar_ptr("multi_axpy_norm_sq_to", sc, out_at, 1)?;
        let (pw, n) = (self.ptr(w), w.len());
        if k == 0 || k > MULTI_MAX {
            // as multi_axpy_norm_sq: the update in chunks, then the dot kernel's norm
            self.multi_axpy_chunks_dev(pc, basis, w)?;
            let n64 = n as u64;
            return self.reduce_to(&self.k.dot, n, &[arg(&pw), arg(&pw), arg(&n64)], pr);
        }
        self.multi_launch_to(basis, Coeffs::Device(pc), 2, pw, n, pr)
    }
    fn copy_inv_sqrt(
        &self,
        sc: &CudaSlice<f64>,
        at: usize,
        x: &CudaSlice<f64>,
        y: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.check_len("copy_inv_sqrt", x.len(), y.len())?;
        let ps = self.scalar_ptr("copy_inv_sqrt", sc, at, 1)?;
        let (n, px, py) = (x.len() as u64, self.ptr(x), self.ptr(y));
        self.launch_elementwise(
            &self.k.copy_inv_sqrt,
            x.len(),
            &mut [arg(&n), arg(&ps), arg(&px), arg(&py)],
        )
    }
    fn allreduce_scalars(
        &self,
        comm: &dyn Comm,
        sc: &mut CudaSlice<f64>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        self.scalar_ptr("allreduce_scalars", sc, at, len)?;
        if comm.size() <= 1 || len == 0 {
            return Ok(());
        }
        if let Some(nc) = self.nccl.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            // on the stream, GPU to GPU: the cycle goes on without the host
            nc.0.all_reduce_in_place(
                &mut sc.slice_mut(at..at + len),
                &cudarc::nccl::safe::ReduceOp::Sum,
            )
            .map_err(|e| Error::backend("cuda", format!("ncclAllReduce: {e:?}")))?;
            return Ok(());
        }
        let mut h = vec![0.0; len];
        self.read_scalars(sc, at, &mut h)?;
        comm.allreduce_sum(&mut h)?;
        self.write_scalars(sc, at, &h)
    }
    fn read_scalars(&self, sc: &CudaSlice<f64>, at: usize, out: &mut [f64]) -> Result<()> {
        self.scalar_ptr("read_scalars", sc, at, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_dtoh(&sc.slice(at..at + out.len()), out)
            .map_err(cuda_err("copying scalars to the host"))?;
        self.synchronize()
    }
    fn write_scalars(&self, sc: &mut CudaSlice<f64>, at: usize, vals: &[f64]) -> Result<()> {
        self.scalar_ptr("write_scalars", sc, at, vals.len())?;
        if vals.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_htod(vals, &mut sc.slice_mut(at..at + vals.len()))
            .map_err(cuda_err("copying scalars to the device"))?;
        // the host slice may go away when this returns
        self.synchronize()
    }
    fn defers_scalars(&self) -> bool {
        true
    }
    fn allreduce_sum(&self, comm: &dyn Comm, x: &mut CudaSlice<f64>) -> Result<()> {
        if comm.size() <= 1 {
            return Ok(());
        }
        if let Some(n) = self.nccl.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            n.0.all_reduce_in_place(x, &cudarc::nccl::safe::ReduceOp::Sum)
                .map_err(|e| Error::backend("cuda", format!("ncclAllReduce: {e:?}")))?;
            return Ok(());
        }
        let mut guard = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_none_or(|p| p.len() != x.len()) {
            // SAFETY: the buffer is fully overwritten by the device-to-host copy below before
            // it is read; flags 0 = ordinary (not write-combined) page-locked memory, which the
            // host reads fast.
            let p = unsafe { self.ctx.alloc_pinned_with_flags::<f64>(x.len(), 0) }
                .map_err(cuda_err("allocating page-locked host memory"))?;
            *guard = Some(p);
        }
        let p = guard.as_mut().expect("allocated above");
        self.stream
            .memcpy_dtoh(x, p)
            .map_err(cuda_err("copying a vector to the host"))?;
        // Event tracking is off in this backend, so the pinned slice does not wait for the
        // copy by itself: synchronise the stream before the host reads it.
        self.synchronize()?;
        let h = p.as_mut_slice().map_err(cuda_err("waiting for the copy"))?;
        comm.allreduce_sum(h)?;
        self.stream
            .memcpy_htod(p, x)
            .map_err(cuda_err("copying a vector to the device"))?;
        self.synchronize()
    }
}
