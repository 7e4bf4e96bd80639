//! Whether CUDA is usable here: the libraries, the device and what it offers ([`probe`]).

use cudarc::driver::{result as dres, sys as dsys, CudaContext};

use super::error::CudaError;

/// What [`probe`] found: the device a CUDA backend would use.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_bytes: usize,
    /// Free memory, once a context exists (the probe itself creates none).
    pub free_bytes: Option<usize>,
    pub multiprocessors: i32,
    pub device_count: i32,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {} of {}: {} (sm_{}{}, {} SMs, {:.1} GiB{})",
            self.ordinal,
            self.device_count,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.multiprocessors,
            self.total_bytes as f64 / (1u64 << 30) as f64,
            match self.free_bytes {
                Some(b) => format!(", {:.1} GiB free", b as f64 / (1u64 << 30) as f64),
                None => String::new(),
            }
        )
    }
}

/// The GPU a rank uses: its local rank on the node (`None`: a job of one rank, GPU 0),
/// round-robin where a node has more ranks than GPUs; and the node's GPU count.
pub fn rank_ordinal(local_rank: Option<usize>) -> Result<(usize, usize), CudaError> {
    let count = CudaContext::device_count()
        .map_err(|e| CudaError::during("cuInit/device count", e))?
        .max(1) as usize;
    Ok((local_rank.map_or(0, |l| l % count), count))
}

/// Which physical GPU `ordinal` is, as two words: a hash of this host's name, and the GPU's PCI
/// domain, bus and device. Two ranks have the same words exactly where they share a GPU.
pub fn gpu_identity(ordinal: usize) -> Result<[u64; 2], CudaError> {
    use dsys::CUdevice_attribute as A;
    let dev = dres::device::get(ordinal as i32).map_err(|e| CudaError::during("cuDeviceGet", e))?;
    let attr = |a: A| -> Result<u64, CudaError> {
        // SAFETY: `dev` is a valid device handle; the attribute is a plain integer query.
        unsafe { dres::device::get_attribute(dev, a) }
            .map(|v| v as u32 as u64)
            .map_err(|e| CudaError::during("cuDeviceGetAttribute", e))
    };
    let pci = attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)? << 32
        | attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)? << 16
        | attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
    Ok([host_hash(), pci])
}

/// FNV-1a of this host's name (0 where it cannot be read).
fn host_hash() -> u64 {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `name.len()` bytes into the buffer it is given.
    let ok = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let bytes = if ok { &name[..end] } else { &[][..] };
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The CUDA libraries every GPU run needs that cannot be loaded here (empty when all are
/// present): the driver and NVRTC. cuSPARSE is looked for only where it is used
/// (`transpose = "library"`: `cusparse_missing`); cuBLAS is not used. Opening cuBLAS and
/// cuSPARSE only to close them again took part of the 0.2-0.3 s the probe cost (H200 host,
/// 2026-11-26).
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
    }
    missing
}

/// Why cuSPARSE cannot be used here (None: it can be loaded).
pub fn cusparse_missing() -> Option<String> {
    // SAFETY: as in `missing_libraries`: a dlopen by the usual names, nothing called.
    let present = unsafe { cudarc::cusparse::sys::is_culib_present() };
    (!present).then(|| {
        "cuSPARSE (libcusparse) cannot be loaded: transpose = \"library\" needs it (the other transposes do not)".to_string()
    })
}

/// Whether a usable CUDA device is present: its description, or the reason it is not usable.
/// Never panics. Creates (and keeps) the device's primary context when the libraries load.
pub fn probe() -> std::result::Result<DeviceInfo, String> {
    probe_device(0)
}

/// [`probe`] for one device ordinal.
pub fn probe_device(ordinal: usize) -> std::result::Result<DeviceInfo, String> {
    probe_checked(ordinal).map_err(|e| e.to_string())
}

/// [`probe_device`] with the reason typed.
pub(super) fn probe_checked(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    let unusable = |why: String| Err(CudaError::Unusable(why));
    let missing = missing_libraries();
    if !missing.is_empty() {
        return unusable(format!("missing {}", missing.join(", ")));
    }
    let count =
        CudaContext::device_count().map_err(|e| CudaError::during("cuInit/device count", e))?;
    if count <= 0 {
        return unusable("the CUDA driver reports no device".into());
    }
    if ordinal >= count as usize {
        return unusable(format!(
            "device {ordinal} requested but only {count} present"
        ));
    }
    // Device queries only: a context costs 0.1-0.4 s to create and would be destroyed again
    // before the backend creates its own (measured on an H200, 2026-11-26).
    let dev = dres::device::get(ordinal as i32)
        .map_err(|e| CudaError::during(format!("device {ordinal}"), e))?;
    let name = dres::device::get_name(dev).map_err(|e| CudaError::during("device name", e))?;
    let attr = |a: dsys::CUdevice_attribute, what: &'static str| {
        // SAFETY: cuInit ran (device_count above) and `dev` is a device handle it returned.
        unsafe { dres::device::get_attribute(dev, a) }.map_err(|e| CudaError::during(what, e))
    };
    use dsys::CUdevice_attribute as At;
    let cc = (
        attr(
            At::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            "compute capability",
        )?,
        attr(
            At::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            "compute capability",
        )?,
    );
    let sms = attr(At::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count")?;
    // SAFETY: as above.
    let total =
        unsafe { dres::device::total_mem(dev) }.map_err(|e| CudaError::during("memory size", e))?;
    if cc.0 < 6 {
        return unusable(format!(
            "{name} has compute capability {}.{}; f64 atomics need 6.0 or newer",
            cc.0, cc.1
        ));
    }
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability: cc,
        total_bytes: total,
        free_bytes: None,
        multiprocessors: sms,
        device_count: count,
    })
}
