//! The kernels of kernels/*.cu, compiled by NVRTC once per process and device and cached.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};

use super::error::{CudaError, Doing};
use crate::error::{Error, Result};

/// The kernel sources, compiled together as one NVRTC program.
const KERNEL_SOURCES: [&str; 5] = [
    include_str!("../../../kernels/spmv.cu"),
    include_str!("../../../kernels/vector.cu"),
    include_str!("../../../kernels/compact.cu"),
    include_str!("../../../kernels/tiled.cu"),
    include_str!("../../../kernels/lsqr.cu"),
];

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

/// The compiled kernels by device ordinal and preprocessor defines.
type ModuleCache = Mutex<Vec<(usize, Vec<String>, Arc<Kernels>)>>;

/// Compile (once per process, device and set of `defines`, each `NAME` or `NAME=VALUE`) and
/// load the kernels.
pub(super) fn kernels_for(
    ctx: &Arc<CudaContext>,
    cc: (i32, i32),
    defines: &[String],
) -> Result<Arc<Kernels>> {
    static CACHE: OnceLock<ModuleCache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    let hit = cache
        .iter()
        .find(|(o, d, _)| *o == ctx.ordinal() && d == defines);
    if let Some((_, _, k)) = hit {
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
    // Kernel constants for experiments (tuning nvrtc_defines, e.g. CUNROLL=2, CMINB=8).
    options.extend(defines.iter().map(|d| format!("-D{d}")));
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        name: Some("seistomo_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(CudaError::from)?;
    let module = ctx.load_module(ptx).doing("loading the kernel module")?;
    let f = |name: &str| {
        module
            .load_function(name)
            .doing_with(|| format!("kernel {name}"))
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
    cache.push((ctx.ordinal(), defines.to_vec(), k.clone()));
    Ok(k)
}

/// The kernels' preprocessor defines are each `NAME` or `NAME=VALUE`: NAME a C identifier,
/// VALUE without spaces (one NVRTC option `-DNAME=VALUE` each).
pub(super) fn check_defines(defines: &[String]) -> Result<()> {
    for d in defines {
        let (name, value) = d.split_once('=').unwrap_or((d, ""));
        let ident = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident || value.chars().any(char::is_whitespace) {
            return Err(Error::Invalid(format!(
                "tuning nvrtc_defines: '{d}' is not NAME or NAME=VALUE (a C identifier, a value without spaces)"
            )));
        }
    }
    Ok(())
}
