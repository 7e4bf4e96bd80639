//! The kernels of kernels/*.cu, compiled by NVRTC once per process and device and cached.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};

use super::error::{CudaError, Doing};
use crate::error::Result;

/// The kernel sources, compiled together as one NVRTC program.
const KERNEL_SOURCES: [&str; 9] = [
    include_str!("../../../kernels/spmv.cu"),
    include_str!("../../../kernels/vector.cu"),
    include_str!("../../../kernels/compact.cu"),
    include_str!("../../../kernels/tiled.cu"),
    include_str!("../../../kernels/peer.cu"),
    include_str!("../../../kernels/lsqr.cu"),
    include_str!("../../../kernels/lsmr.cu"),
    include_str!("../../../kernels/batch.cu"),
    include_str!("../../../kernels/encode.cu"),
];

/// `Kernels`, the compiled kernels of one device, and their loader: one field per kernel named
/// as the kernel (`single`), and the kernels compiled per precision or width as arrays
/// (`families`: the array type and how the loader by name, `$f`, fills it).
macro_rules! kernels {
    (
        loader: $f:ident;
        single: $($one:ident),* ;
        families: $($(#[$doc:meta])* $many:ident: $t:ty = $load:expr),* $(,)?
    ) => {
        /// The compiled kernels of one device.
        pub(crate) struct Kernels {
            _module: Arc<CudaModule>,
            $(pub $one: CudaFunction,)*
            $($(#[$doc])* pub $many: $t,)*
        }

        impl Kernels {
            /// Every kernel of `module`, by name.
            fn load(module: &Arc<CudaModule>) -> Result<Kernels> {
                let by_name = |name: &str| {
                    module
                        .load_function(name)
                        .doing_with(|| format!("kernel {name}"))
                };
                let $f: &Loader = &by_name;
                Ok(Kernels {
                    _module: module.clone(),
                    $($one: $f(stringify!($one))?,)*
                    $($many: $load,)*
                })
            }
        }
    };
}

kernels! {
    loader: f;
    single: spmv_f64, spmv_f32, scatter_f64, scatter_f32, dot, lsqr_update, axpby, scale, fill,
        pmul, copy_scaled, copy_inv_sqrt, multi_axpy, tri_sweep, gather, scatter_rows, stencil_av,
        tiled_rows, tiled_cols, csr_fused_f64, csr_fused_f32, lsqr_step1, lsqr_step2, lsqr_step3,
        lsqr_update_dev, lsqr_normalize, lsqr_rescaled, lsqr_sum, lsqr_combine, lsqr_peer_usq,
        lsqr_peer_step1, lsqr_peer_piece, lsqr_peer_combine, peer_vec_begin, peer_vec_publish, peer_vec_sum,
        peer_scalars_sum, peer_halo_publish, peer_halo_pull,
        lsmr_step1,
        lsmr_step2, lsmr_step3, lsmr_update, lsmr_normalize, lsmr_rescaled, block_norms,
        block_sum_partials, block_scale, block_axpby, block_update, block_keep, block_column,
        enc_seg_count, enc_seg_fill, enc_seg_len, rs_hist,
        rs_scatter, scan_local, scan_add, bounds_sorted, enc_gather_u32, enc_gather_u64, enc_seg_pos,
        enc_col_keys, perm_entry_rows, perm_col_keys;
    families:
        /// pattern_spmv [f64 = 0, f32 = 1] (kernels/spmv.cu: row patterns)
        pattern_spmv: [CudaFunction; 2] =
            named(f, PRECISIONS.map(|p| format!("pattern_spmv_{p}")))?,
        /// pattern_spmv_halo [f64 = 0, f32 = 1]: the ghost columns from a buffer of their own
        pattern_spmv_halo: [CudaFunction; 2] =
            named(f, PRECISIONS.map(|p| format!("pattern_spmv_halo_{p}")))?,
        /// multi_dot_K of vector.cu for K = 1, 2, 4, 8, 16, 32 (index: ceil(log2 k)).
        multi_dot: [CudaFunction; 6] =
            named(f, [1, 2, 4, 8, 16, 32].map(|k| format!("multi_dot_{k}")))?,
        /// compact[stencil_t][f64 = 0, f32 = 1][sub-warp 32, 16, 8, 4] (kernels/compact.cu)
        compact: [[[CudaFunction; 4]; 2]; 2] = [
            by_precision_and_width(f, |p, w| format!("compact_s{w}_{p}"))?,
            by_precision_and_width(f, |p, w| format!("compact_st_s{w}_{p}"))?,
        ],
        /// tiled_atu [f64 = 0, f32 = 1][sub-warp 32, 16, 8, 4] (kernels/tiled.cu)
        tiled_atu: [[CudaFunction; 4]; 2] =
            by_precision_and_width(f, |p, w| format!("tiled_atu_s{w}_{p}"))?,
        /// tiled_axf [f64 = 0, f32 = 1]: A x's segment sums as one flat stream per chunk
        tiled_axf: [CudaFunction; 2] =
            named(f, PRECISIONS.map(|p| format!("tiled_axf_{p}")))?,
        /// bt_axf [f64 = 0, f32 = 1] (kernels/batch.cu: a batch's A X on column tiles)
        bt_axf: [CudaFunction; 2] = named(f, PRECISIONS.map(|p| format!("bt_axf_{p}")))?,
        /// bt_rows [f64 = 0, f32 = 1] (kernels/batch.cu: its row pass and weighted rows)
        bt_rows: [CudaFunction; 2] = named(f, PRECISIONS.map(|p| format!("bt_rows_{p}")))?,
        /// bt_atu [f64 = 0, f32 = 1] (kernels/batch.cu: a batch's A^T Y on column tiles)
        bt_atu: [CudaFunction; 2] = named(f, PRECISIONS.map(|p| format!("bt_atu_{p}")))?,
        /// bt_cols [f64 = 0, f32 = 1] (kernels/batch.cu: its column pass and weighted rows)
        bt_cols: [CudaFunction; 2] = named(f, PRECISIONS.map(|p| format!("bt_cols_{p}")))?,
        /// enc_fill_rows [f64 = 0, f32 = 1] (kernels/encode.cu: A x's tile entries)
        enc_fill_rows: [CudaFunction; 2] =
            named(f, PRECISIONS.map(|p| format!("enc_fill_rows_{p}")))?,
        /// enc_fill_cols [f64 = 0, f32 = 1] (kernels/encode.cu: A^T y's tile entries)
        enc_fill_cols: [CudaFunction; 2] =
            named(f, PRECISIONS.map(|p| format!("enc_fill_cols_{p}")))?,
}

/// A kernel of the module by its name.
type Loader<'a> = dyn Fn(&str) -> Result<CudaFunction> + 'a;

/// The precisions of the kernels compiled per precision, in their index order.
const PRECISIONS: [&str; 2] = ["f64", "f32"];
/// The sub-warp widths of the kernels compiled per width, in their index order
/// (`util::width_index`).
const WIDTHS: [u32; 4] = [32, 16, 8, 4];

/// The kernels named `names`, in order.
fn named<const N: usize>(f: &Loader, names: [String; N]) -> Result<[CudaFunction; N]> {
    let loaded = names.iter().map(|n| f(n)).collect::<Result<Vec<_>>>()?;
    Ok(loaded
        .try_into()
        .unwrap_or_else(|_| unreachable!("one kernel per name")))
}

/// The kernels `name(precision, width)` by precision, then width.
fn by_precision_and_width(
    f: &Loader,
    name: impl Fn(&str, u32) -> String,
) -> Result<[[CudaFunction; 4]; 2]> {
    let [p64, p32] = PRECISIONS;
    Ok([
        named(f, WIDTHS.map(|w| name(p64, w)))?,
        named(f, WIDTHS.map(|w| name(p32, w)))?,
    ])
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
    // The PTX of these sources and options, kept on disk: a later process loads it instead of
    // compiling (0.08-0.1 s on an H200 host). A file that does not load is compiled again.
    let kept = kept_ptx(&src, &options);
    let module = match kept.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        Some(text) => crate::ui::phases::time("module", || {
            ctx.load_module(cudarc::nvrtc::Ptx::from_src(text))
        })
        .ok(),
        None => None,
    };
    let module = match module {
        Some(m) => m,
        None => {
            let opts = cudarc::nvrtc::CompileOptions {
                options,
                name: Some("seistomo_kernels.cu".into()),
                ..Default::default()
            };
            let ptx = crate::ui::phases::time("nvrtc", || {
                cudarc::nvrtc::compile_ptx_with_opts(src, opts)
            })
            .map_err(CudaError::from)?;
            if let Some(p) = &kept {
                // best effort: a cache that cannot be written is only slower
                let _ = std::fs::create_dir_all(p.parent().unwrap_or(p));
                let text = ptx.to_src();
                let _ = crate::io::write_atomic(p, |w| w.write_all(text.as_bytes()));
            }
            crate::ui::phases::time("module", || ctx.load_module(ptx))
                .doing("loading the kernel module")?
        }
    };
    let k = Arc::new(Kernels::load(&module)?);
    cache.push((ctx.ordinal(), defines.to_vec(), k.clone()));
    Ok(k)
}

/// The file that keeps the PTX of `src` compiled with `options` (None: no cache directory):
/// named by a hash of both and of this seistomo's version, so that another source, option or
/// version never reads it.
fn kept_ptx(src: &str, options: &[String]) -> Option<std::path::PathBuf> {
    let mut h = crate::io::Fnv::default();
    h.update(crate::VERSION.as_bytes());
    h.update(src.as_bytes());
    for o in options {
        h.update(b"\0");
        h.update(o.as_bytes());
    }
    crate::settings::launch::cache_dir()
        .map(|d| d.join("kernels").join(format!("{:016x}.ptx", h.finish())))
}

/// An error unless every item is a preprocessor define ([`crate::settings::tuning::check_define`]).
pub(super) fn check_defines(defines: &[String]) -> Result<()> {
    defines
        .iter()
        .try_for_each(|d| crate::settings::tuning::check_define(d))
}
