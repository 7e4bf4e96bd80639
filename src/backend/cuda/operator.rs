//! A CSR matrix on the GPU, with A^T applied three ways, and the memory plan that picks one.

use std::ffi::c_void;

use cudarc::driver::{CudaFunction, CudaSlice};

use super::backend::{CudaBackend, DeviceVec};
use super::cusparse::CuSparse;
use super::lsqr_loop::{Epilogue, FusedLsqr, LoopSlot};
use super::util::{arg, fused_entries_per_block};
use crate::backend::lsqr::LsqrDevice;
use crate::backend::{Operator, Precision, Scale, TransposeStrategy};
use crate::error::{Error, Result};
use crate::sparse::Csr;

/// Rows with more nonzeros than this get a warp of their own.
const LONG_ROW: u64 = 32;
/// Nonzeros of a multi-row segment at most (= the shared-memory tile of kernels/spmv.cu).
const SEG_NNZ: u64 = 256;
/// Rows of a multi-row segment at most (one per lane).
const SEG_ROWS: usize = 32;
/// Warps per block of the sparse kernels (kernels/spmv.cu: WARPS_PER_BLOCK).
const WARPS_PER_BLOCK: u32 = 8;
/// Device memory left free besides the plan: this much plus 3% of what is free.
const HEADROOM_BYTES: u64 = 256 << 20;

/// Cut rows into warp segments: a long row alone, or up to SEG_ROWS consecutive short rows
/// with at most SEG_NNZ nonzeros together. Returns segment start rows plus the end. A
/// single-row segment is summed by a whole warp (32 strided lane sums, then a shuffle tree);
/// the rows of a multi-row segment are each summed sequentially by one lane.
pub fn segments(indptr: &[u64]) -> Vec<u32> {
    let m = indptr.len().saturating_sub(1);
    let mut seg = vec![0u32];
    let (mut rows, mut nnz) = (0usize, 0u64);
    for r in 0..m {
        let len = indptr[r + 1] - indptr[r];
        if len > LONG_ROW {
            if rows > 0 {
                seg.push(r as u32);
            }
            seg.push(r as u32 + 1);
            (rows, nnz) = (0, 0);
            continue;
        }
        if rows == SEG_ROWS || nnz + len > SEG_NNZ {
            seg.push(r as u32);
            (rows, nnz) = (0, 0);
        }
        rows += 1;
        nnz += len;
    }
    if rows > 0 {
        seg.push(m as u32);
    }
    seg
}

pub(crate) enum DevValues {
    F64(CudaSlice<f64>),
    F32(CudaSlice<f32>),
}

impl DevValues {
    /// The kernel index of the values' precision (f64 = 0, f32 = 1) and their device address.
    pub fn index_and_ptr(&self, be: &CudaBackend) -> (usize, u64) {
        match self {
            DevValues::F64(v) => (0, be.ptr(v)),
            DevValues::F32(v) => (1, be.ptr(v)),
        }
    }
}

/// The kernel index of a sub-warp width (32, 16, 8, 4 -> 0..3; kernels/compact.cu, tiled.cu).
pub(super) fn width_index(s: u32) -> usize {
    match s {
        32 => 0,
        16 => 1,
        8 => 2,
        _ => 3,
    }
}

/// The length check of a product with a `shape` = (rows, columns) matrix: the input has `got.0`
/// entries and must have `want.0`, the output `got.1` and `want.1`.
pub(super) fn check_vectors(
    what: &str,
    got: (usize, usize),
    want: (usize, usize),
    shape: (usize, usize),
) -> Result<()> {
    if got != want {
        return Err(Error::Invalid(format!(
            "cuda {what}: vectors of {} and {} for a {} x {} matrix",
            got.0, got.1, shape.0, shape.1
        )));
    }
    Ok(())
}

/// CSR arrays on the device plus the warp segments.
pub(crate) struct DevCsr {
    pub nrows: usize,
    pub ncols: usize,
    pub nnz: usize,
    pub indptr: CudaSlice<u64>,
    pub indices: CudaSlice<u32>,
    pub values: DevValues,
    pub seg: CudaSlice<u32>,
    pub nseg: u32,
}

/// Upload a host slice (a one-element dummy for an empty one: no zero-byte allocations).
pub(super) fn up<T: cudarc::driver::DeviceRepr + Default + Copy>(
    be: &CudaBackend,
    v: &[T],
) -> Result<CudaSlice<T>> {
    let dummy = [T::default()];
    let src = if v.is_empty() { &dummy[..] } else { v };
    be.stream.clone_htod(src).map_err(|e| {
        Error::backend(
            "cuda",
            format!("uploading {} bytes: {e:?}", std::mem::size_of_val(src)),
        )
    })
}

/// [`up`] of `v` when `on`, else of the one-element dummy (a part of a layout not used).
pub(super) fn up_if<T: cudarc::driver::DeviceRepr + Default + Copy>(
    be: &CudaBackend,
    on: bool,
    v: &[T],
) -> Result<CudaSlice<T>> {
    up(be, if on { v } else { &[] })
}

impl DevCsr {
    fn upload(be: &CudaBackend, a: &Csr, precision: Precision) -> Result<Self> {
        if a.nrows() >= u32::MAX as usize {
            return Err(Error::Invalid(format!(
                "cuda: {} rows on one rank do not fit 32-bit row numbers; use more ranks",
                a.nrows()
            )));
        }
        let seg = segments(a.indptr());
        let nseg = (seg.len() - 1) as u32;
        let values = match precision {
            Precision::F64 => DevValues::F64(up(be, a.data())?),
            Precision::F32 => {
                let v: Vec<f32> = a.data().iter().map(|&x| x as f32).collect();
                DevValues::F32(up(be, &v)?)
            }
        };
        Ok(DevCsr {
            nrows: a.nrows(),
            ncols: a.ncols(),
            nnz: a.nnz(),
            indptr: up(be, a.indptr())?,
            indices: up(be, a.indices())?,
            values,
            seg: up(be, &seg)?,
            nseg,
        })
    }

    /// Launch the CSR kernel for the values' precision (`kernels` = [f64, f32]) on `grid` blocks
    /// of warp segments: its arguments are nseg, `lead`, the device addresses of the row
    /// segments, row offsets, columns and values, then `tail`.
    fn launch_segments(
        &self,
        be: &CudaBackend,
        kernels: [&CudaFunction; 2],
        grid: u32,
        lead: &[*mut c_void],
        tail: &[*mut c_void],
    ) -> Result<()> {
        let (pi, pv) = self.values.index_and_ptr(be);
        let nseg = self.nseg;
        let ptrs = [
            be.ptr(&self.seg),
            be.ptr(&self.indptr),
            be.ptr(&self.indices),
            pv,
        ];
        let ptr_args: Vec<*mut c_void> = ptrs.iter().map(arg).collect();
        let mut args = [&[arg(&nseg)][..], lead, &ptr_args, tail].concat();
        be.launch(kernels[pi], grid, WARPS_PER_BLOCK * 32, &mut args)
    }

    /// [`Self::launch_segments`] with a warp per segment and no `lead` (kernels/spmv.cu).
    fn launch_per_segment(
        &self,
        be: &CudaBackend,
        kernels: [&CudaFunction; 2],
        tail: &[*mut c_void],
    ) -> Result<()> {
        let grid = self.nseg.div_ceil(WARPS_PER_BLOCK);
        self.launch_segments(be, kernels, grid, &[], tail)
    }

    /// y = alpha A x + beta y
    pub fn spmv(
        &self,
        be: &CudaBackend,
        alpha: f64,
        x: &CudaSlice<f64>,
        beta: f64,
        y: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.spmv_scaled(be, alpha, x, beta, None, y)
    }

    /// y = d .* (alpha A x + beta y): with `d` the rows of the result scaled in the product's
    /// epilogue (a diagonal preconditioner without a pass of its own).
    pub fn spmv_scaled(
        &self,
        be: &CudaBackend,
        alpha: f64,
        x: &CudaSlice<f64>,
        beta: f64,
        d: Option<&CudaSlice<f64>>,
        y: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let (px, py) = (be.ptr(x), be.ptr(y));
        let pd = d.map_or(0u64, |d| be.ptr(d));
        let tail = [arg(&px), arg(&py), arg(&alpha), arg(&beta), arg(&pd)];
        self.launch_per_segment(be, [&be.k.spmv_f64, &be.k.spmv_f32], &tail)
    }

    /// Segments per warp of the fused kernel (a block covers about
    /// [`fused_entries_per_block`] nonzeros).
    fn segs_per_warp(&self) -> u32 {
        let per_seg = self.nnz as f64 / self.nseg.max(1) as f64;
        (fused_entries_per_block(self.nnz) / (8.0 * per_seg.max(1.0)))
            .round()
            .clamp(1.0, 64.0) as u32
    }

    /// Blocks (= partial sums) of the fused kernel.
    pub(crate) fn fused_blocks(&self) -> u32 {
        self.nseg.div_ceil(8 * self.segs_per_warp())
    }

    /// y = a A x + b y with the fused epilogue `e` (kernels/compact.cu csr_fused); returns the
    /// number of block partials.
    pub(crate) fn fused(&self, be: &CudaBackend, x: u64, y: u64, e: &Epilogue) -> Result<u32> {
        let (spw, blocks) = (self.segs_per_warp(), self.fused_blocks());
        self.launch_segments(
            be,
            [&be.k.csr_fused_f64, &be.k.csr_fused_f32],
            blocks,
            &[arg(&spw)],
            &[&[arg(&x), arg(&y)][..], &e.args()].concat(),
        )?;
        Ok(blocks)
    }

    /// x += alpha A^T y by atomics.
    pub fn scatter(
        &self,
        be: &CudaBackend,
        alpha: f64,
        y: &CudaSlice<f64>,
        x: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let (py, px) = (be.ptr(y), be.ptr(x));
        let tail = [arg(&py), arg(&px), arg(&alpha)];
        self.launch_per_segment(be, [&be.k.scatter_f64, &be.k.scatter_f32], &tail)
    }
}

/// Bytes a plan needs on the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPlan {
    pub strategy: TransposeStrategy,
    pub precision: Precision,
    /// Matrix storage (A, and A^T or the library's copies).
    pub matrix_bytes: u64,
    /// LSQR's vectors (u, b, a reduction scratch of m; v, w, x, var, x0, scratch of n).
    pub vector_bytes: u64,
    /// Free device memory when planned.
    pub free_bytes: u64,
    /// What must stay free besides.
    pub headroom_bytes: u64,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.matrix_bytes + self.vector_bytes
    }
    pub fn fits(&self) -> bool {
        self.total() + self.headroom_bytes <= self.free_bytes
    }
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = |b: u64| b as f64 / 1e9;
        write!(
            f,
            "{} transpose, {} values: matrix {:.2} GB + vectors {:.2} GB = {:.2} GB of {:.2} GB free ({:.2} GB kept free)",
            self.strategy,
            self.precision,
            g(self.matrix_bytes),
            g(self.vector_bytes),
            g(self.total()),
            g(self.free_bytes),
            g(self.headroom_bytes)
        )
    }
}

/// Bytes of one CSR copy on the device: values, column indices, u64 row offsets and (at most)
/// one u32 segment start per row.
fn csr_bytes(rows: u64, nnz: u64, precision: Precision) -> u64 {
    nnz * (4 + precision.bytes() as u64) + (rows + 1) * (8 + 4)
}

/// The memory a strategy needs for an m x n matrix with nnz nonzeros.
pub fn plan_for(
    m: usize,
    n: usize,
    nnz: usize,
    strategy: TransposeStrategy,
    precision: Precision,
    free_bytes: u64,
) -> MemoryPlan {
    let (m, n, nnz) = (m as u64, n as u64, nnz as u64);
    let a = csr_bytes(m, nnz, precision);
    let matrix_bytes = match strategy {
        TransposeStrategy::Csc | TransposeStrategy::Auto => a + csr_bytes(n, nnz, precision),
        TransposeStrategy::Scatter => a,
        // 32-bit row offsets for cuSPARSE and its work buffer (about one vector).
        TransposeStrategy::Library => a + (m + 1) * 4 + m.max(n) * 8,
    };
    MemoryPlan {
        strategy,
        precision,
        matrix_bytes,
        vector_bytes: (3 * m + 6 * n) * 8,
        free_bytes,
        headroom_bytes: HEADROOM_BYTES + free_bytes / 33,
    }
}

/// Choose a transpose strategy that fits in `free_bytes` (Auto: the explicit copy when it fits,
/// else atomics), or explain with numbers why nothing fits.
pub fn plan_memory(
    m: usize,
    n: usize,
    nnz: usize,
    requested: TransposeStrategy,
    precision: Precision,
    free_bytes: u64,
) -> Result<MemoryPlan> {
    let candidates: &[TransposeStrategy] = match requested {
        TransposeStrategy::Auto => &[TransposeStrategy::Csc, TransposeStrategy::Scatter],
        TransposeStrategy::Csc => &[TransposeStrategy::Csc],
        TransposeStrategy::Scatter => &[TransposeStrategy::Scatter],
        TransposeStrategy::Library => &[TransposeStrategy::Library],
    };
    for &s in candidates {
        let p = plan_for(m, n, nnz, s, precision, free_bytes);
        if p.fits() {
            return Ok(p);
        }
    }
    let tried: Vec<String> = candidates
        .iter()
        .map(|&s| plan_for(m, n, nnz, s, precision, free_bytes).to_string())
        .collect();
    let mut hints = Vec::new();
    if requested != TransposeStrategy::Scatter && requested != TransposeStrategy::Auto {
        hints.push("--transpose scatter (no second copy of the matrix)".to_string());
    }
    if precision == Precision::F64 {
        let p32 = plan_for(
            m,
            n,
            nnz,
            TransposeStrategy::Scatter,
            Precision::F32,
            free_bytes,
        );
        hints.push(format!(
            "--precision f32 (scatter with f32 values needs {:.2} GB)",
            p32.total() as f64 / 1e9
        ));
    }
    hints.push("more MPI ranks (each holds only its rows)".into());
    Err(Error::backend(
        "cuda",
        format!(
            "the system ({m} x {n}, {nnz} nonzeros) does not fit on the GPU: {}; try {}",
            tried.join("; "),
            hints.join(", or ")
        ),
    ))
}

enum Transpose {
    Csc(DevCsr),
    Scatter,
    Library(CuSparse),
}

/// A CSR matrix on one GPU; A^T by an explicit transposed copy (GPU-III), f64 atomics from the
/// CSR rows (GPU-IV), or cuSPARSE (the library baseline, used for A x too).
pub struct CudaCsrOperator {
    a: DevCsr,
    t: Transpose,
    plan: MemoryPlan,
    device_loop: LoopSlot,
}

impl CudaCsrOperator {
    /// Plan memory (see [`plan_memory`]), then upload. Values are rounded to f32 when asked;
    /// A and A^T then share the same rounded values (LSQR solves the nearby problem exactly).
    pub fn new(
        be: &CudaBackend,
        a: &Csr,
        strategy: TransposeStrategy,
        precision: Precision,
    ) -> Result<Self> {
        let (free, _total) = be.mem_info()?;
        let plan = plan_memory(
            a.nrows(),
            a.ncols(),
            a.nnz(),
            strategy,
            precision,
            free as u64,
        )?;
        if plan.strategy == TransposeStrategy::Library {
            if precision != Precision::F64 {
                return Err(Error::backend(
                    "cuda",
                    "the cuSPARSE (library) strategy needs f64 values (cuSPARSE has no f32-matrix x f64-vector product); use --precision f64 or another transpose",
                ));
            }
            if a.nnz() >= i32::MAX as usize || a.nrows() >= i32::MAX as usize {
                return Err(Error::backend(
                    "cuda",
                    "the cuSPARSE (library) strategy needs fewer than 2^31 nonzeros and rows here; use csc or scatter",
                ));
            }
        }
        let dev = DevCsr::upload(be, a, precision)?;
        let t = match plan.strategy {
            TransposeStrategy::Csc | TransposeStrategy::Auto => {
                let at = a.transpose();
                Transpose::Csc(DevCsr::upload(be, &at, precision)?)
            }
            TransposeStrategy::Scatter => Transpose::Scatter,
            TransposeStrategy::Library => Transpose::Library(CuSparse::new(be, a, &dev)?),
        };
        be.synchronize()?;
        Ok(CudaCsrOperator {
            a: dev,
            t,
            plan,
            device_loop: LoopSlot::default(),
        })
    }

    pub fn strategy(&self) -> TransposeStrategy {
        self.plan.strategy
    }
    /// Use the device-resident LSQR loop (off by default: `[backend] lsqr_loop`; only the
    /// explicit transpose has one, the host loop runs otherwise).
    pub fn set_device_loop(&self, on: bool) {
        self.device_loop.set(on);
    }
    pub fn precision(&self) -> Precision {
        self.plan.precision
    }
    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }
    pub fn nnz(&self) -> usize {
        self.a.nnz
    }
    /// Number of warp segments of A and (with the explicit copy) of A^T.
    pub fn segments(&self) -> (u32, Option<u32>) {
        (
            self.a.nseg,
            match &self.t {
                Transpose::Csc(t) => Some(t.nseg),
                _ => None,
            },
        )
    }

    fn check(&self, what: &str, got: (usize, usize), want: (usize, usize)) -> Result<()> {
        check_vectors(what, got, want, (self.a.nrows, self.a.ncols))
    }
}

impl Operator<CudaBackend> for CudaCsrOperator {
    fn nrows(&self) -> usize {
        self.a.nrows
    }
    fn ncols(&self) -> usize {
        self.a.ncols
    }
    fn apply(&self, be: &CudaBackend, s: Scale, x: &DeviceVec, y: &mut DeviceVec) -> Result<()> {
        self.check("apply", (x.len(), y.len()), (self.a.ncols, self.a.nrows))?;
        match &self.t {
            Transpose::Library(cs) => cs.spmv(be, false, s.alpha, x, s.beta, y),
            _ => self.a.spmv(be, s.alpha, x, s.beta, y),
        }
    }
    fn apply_scaled_rows(
        &self,
        be: &CudaBackend,
        x: &DeviceVec,
        d: Option<&DeviceVec>,
        t: &mut DeviceVec,
        y: &mut DeviceVec,
    ) -> Result<()> {
        let (Some(d), false) = (d, matches!(self.t, Transpose::Library(_))) else {
            // cuSPARSE has no row-scale epilogue
            return crate::backend::scaled_rows_by_pass(self, be, x, d, t, y);
        };
        self.check("apply", (x.len(), y.len()), (self.a.ncols, self.a.nrows))?;
        self.check(
            "row scale",
            (d.len(), y.len()),
            (self.a.nrows, self.a.nrows),
        )?;
        self.a.spmv_scaled(be, 1.0, x, 0.0, Some(d), y)
    }
    fn apply_t(&self, be: &CudaBackend, s: Scale, y: &DeviceVec, x: &mut DeviceVec) -> Result<()> {
        self.check("apply_t", (y.len(), x.len()), (self.a.nrows, self.a.ncols))?;
        match &self.t {
            Transpose::Csc(t) => t.spmv(be, s.alpha, y, s.beta, x),
            Transpose::Library(cs) => cs.spmv(be, true, s.alpha, y, s.beta, x),
            Transpose::Scatter => {
                if s.beta == 0.0 {
                    use crate::backend::Backend;
                    be.fill(x, 0.0)?;
                } else if s.beta != 1.0 {
                    use crate::backend::Backend;
                    be.scale(x, s.beta)?;
                }
                self.a.scatter(be, s.alpha, y, x)
            }
        }
    }
    fn lsqr_device(&self) -> Option<&dyn LsqrDevice<CudaBackend>> {
        let on = self.device_loop.is_on();
        match &self.t {
            Transpose::Csc(_) if on => Some(self),
            _ => None,
        }
    }
}

impl FusedLsqr for CudaCsrOperator {
    fn fused_rows(&self) -> usize {
        self.a.nrows
    }
    fn fused_cols(&self) -> usize {
        self.a.ncols
    }
    fn max_partials(&self) -> usize {
        match &self.t {
            Transpose::Csc(t) => self.a.fused_blocks().max(t.fused_blocks()) as usize,
            _ => self.a.fused_blocks() as usize,
        }
    }
    fn av_fused(&self, be: &CudaBackend, v: u64, u: u64, e: &Epilogue) -> Result<u32> {
        self.a.fused(be, v, u, e)
    }
    fn atu_fused(&self, be: &CudaBackend, u: u64, v: u64, e: &Epilogue) -> Result<u32> {
        match &self.t {
            Transpose::Csc(t) => t.fused(be, u, v, e),
            _ => Err(Error::backend(
                "cuda",
                "the device LSQR loop needs the explicit transpose",
            )),
        }
    }
    fn loop_slot(&self) -> &LoopSlot {
        &self.device_loop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_rows_and_respect_limits() {
        let lens = [0u64, 1, 2, 300, 5, 5, 40, 0, 0, 3, 33, 1];
        let mut ip = vec![0u64];
        for l in lens {
            ip.push(ip.last().unwrap() + l);
        }
        let mut many = vec![0u64];
        for i in 0..1000u64 {
            many.push(many.last().unwrap() + (i % 3));
        }
        for ip in [ip, many, vec![0u64]] {
            let s = segments(&ip);
            assert_eq!(s[0], 0);
            assert_eq!(*s.last().unwrap() as usize, ip.len() - 1);
            for w in s.windows(2) {
                let (r0, r1) = (w[0] as usize, w[1] as usize);
                assert!(r1 > r0);
                let nnz = ip[r1] - ip[r0];
                if r1 - r0 > 1 {
                    assert!(r1 - r0 <= SEG_ROWS && nnz <= SEG_NNZ, "{r0}..{r1}");
                }
            }
        }
    }

    #[test]
    fn memory_plan_picks_csc_then_scatter_then_explains() {
        let (m, n, nnz) = (5_810_000, 1_310_720, 100_800_000);
        let free = 80e9 as u64;
        let p = plan_memory(m, n, nnz, TransposeStrategy::Auto, Precision::F64, free).unwrap();
        assert_eq!(p.strategy, TransposeStrategy::Csc);
        let csc = plan_for(m, n, nnz, TransposeStrategy::Csc, Precision::F64, free).total();
        let sc = plan_for(m, n, nnz, TransposeStrategy::Scatter, Precision::F64, free).total();
        let p = plan_memory(
            m,
            n,
            nnz,
            TransposeStrategy::Auto,
            Precision::F64,
            (csc + sc) / 2,
        )
        .unwrap();
        assert_eq!(p.strategy, TransposeStrategy::Scatter);
        let e = plan_memory(m, n, nnz, TransposeStrategy::Auto, Precision::F64, sc / 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not fit") && e.contains("f32"), "{e}");
        let f32 = plan_for(m, n, nnz, TransposeStrategy::Csc, Precision::F32, free).matrix_bytes;
        let f64b = plan_for(m, n, nnz, TransposeStrategy::Csc, Precision::F64, free).matrix_bytes;
        assert!(f32 < f64b);
    }
}
