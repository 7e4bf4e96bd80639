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

/// The CUDA libraries every GPU run needs that cannot be loaded here (empty when all are
/// present): the driver and NVRTC. cuSPARSE is looked for only where it is used
/// (`transpose = "library"`: [`cusparse_missing`]); cuBLAS is not used. Opening cuBLAS and
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
