//! A CSR matrix on the GPU, with A^T applied three ways, and the memory plan that picks one.

use super::backend::{CudaBackend, DeviceVec};
use super::csr::DevCsr;
use super::cusparse::CuSparse;
use super::lsqr_loop::{Epilogue, FusedLsqr, LoopSlot};
use super::util::check_vectors;
use crate::backend::lsmr::LsmrDevice;
use crate::backend::lsqr::LsqrDevice;
use crate::backend::storage::DeviceCsr;
use crate::backend::{Operator, Precision, Scale, TransposeStrategy};
use crate::error::{Error, Result};
use crate::settings::tuning::Tuning;
use crate::sparse::Csr;

/// Device memory left free besides the plan: this much plus 3% of what is free.
const HEADROOM_BYTES: u64 = 256 << 20;

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
    /// The plan of `matrix_bytes` for an m x n system (`shape`): LSQR's vectors besides, and
    /// 256 MiB plus 3% of what is free kept free.
    pub(super) fn of(
        strategy: TransposeStrategy,
        precision: Precision,
        matrix_bytes: u64,
        (m, n): (u64, u64),
        free_bytes: u64,
    ) -> Self {
        MemoryPlan {
            strategy,
            precision,
            matrix_bytes,
            vector_bytes: (3 * m + 6 * n) * 8,
            free_bytes,
            headroom_bytes: HEADROOM_BYTES + free_bytes / 33,
        }
    }
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
    MemoryPlan::of(strategy, precision, matrix_bytes, (m, n), free_bytes)
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

    /// [`CudaCsrOperator::new`] with the tuning `t` (checked first): the CSR operator takes
    /// the device LSQR loop's block (`lsqr_block`) from it; the compact layout knobs do not
    /// apply to CSR.
    pub fn with_tuning(
        be: &CudaBackend,
        a: &Csr,
        strategy: TransposeStrategy,
        precision: Precision,
        t: &Tuning,
    ) -> Result<Self> {
        t.validate()?;
        be.check_compiled_with(&t.nvrtc_defines)?;
        let op = Self::new(be, a, strategy, precision)?;
        op.set_lsqr_block(t.lsqr_block)?;
        Ok(op)
    }

    /// The operator of a CSR matrix `a` that lies on the GPU already, with `at` its transpose
    /// as a CSR matrix on the GPU too (another library's arrays: CuPy's `A` and `A.T.tocsr()`),
    /// copied device to device into the backend's storage ([`DeviceCsr`]): the explicit
    /// transpose (`csc`), so the device LSQR loop runs on it, with the values' precision.
    /// Equal, array for array, to [`CudaCsrOperator::new`] with `csc` on the same matrix
    /// uploaded from the host, when `at` holds each column's entries by ascending row.
    pub fn from_device(
        be: &CudaBackend,
        a: &DeviceCsr,
        at: &DeviceCsr,
        tuning: &Tuning,
    ) -> Result<Self> {
        tuning.validate()?;
        if (at.nrows(), at.ncols(), at.nnz()) != (a.ncols(), a.nrows(), a.nnz())
            || at.precision() != a.precision()
        {
            return Err(Error::Invalid(format!(
                "the transpose on the GPU ({} x {}, {} nonzeros, {}) is not that of the {} x {} matrix ({} nonzeros, {})",
                at.nrows(),
                at.ncols(),
                at.nnz(),
                at.precision(),
                a.nrows(),
                a.ncols(),
                a.nnz(),
                a.precision()
            )));
        }
        let precision = a.precision();
        let (free, _total) = be.mem_info()?;
        let plan = plan_memory(
            a.nrows(),
            a.ncols(),
            a.nnz(),
            TransposeStrategy::Csc,
            precision,
            free as u64,
        )?;
        let dev = DevCsr::from_device(be, a)?;
        let t = Transpose::Csc(DevCsr::from_device(be, at)?);
        be.synchronize()?;
        let op = CudaCsrOperator {
            a: dev,
            t,
            plan,
            device_loop: LoopSlot::default(),
        };
        op.set_lsqr_block(tuning.lsqr_block)?;
        Ok(op)
    }

    pub fn strategy(&self) -> TransposeStrategy {
        self.plan.strategy
    }
    /// Use the device-resident LSQR loop (off by default: `[backend] lsqr_loop`; only the
    /// explicit transpose has one, the host loop runs otherwise).
    pub fn set_device_loop(&self, on: bool) {
        self.device_loop.set(on);
    }
    /// Iterations per replay of the device loop's graph (tuning `lsqr_block`, 1..=256; None:
    /// the default, 32).
    pub fn set_lsqr_block(&self, block: Option<usize>) -> Result<()> {
        self.device_loop.set_block(block)
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

impl CudaCsrOperator {
    /// y = d .* (A x) with d applied in the product's epilogue (GMRES's left Jacobi: one pass
    /// over the vectors fewer than a separate scale); None where the product cannot (through
    /// cuSPARSE, which has no row-scale epilogue).
    pub(crate) fn apply_row_scaled(
        &self,
        be: &CudaBackend,
        x: &DeviceVec,
        d: &DeviceVec,
        y: &mut DeviceVec,
    ) -> Option<Result<()>> {
        if matches!(self.t, Transpose::Library(_)) {
            return None;
        }
        Some((|| {
            self.check("apply", (x.len(), y.len()), (self.a.ncols, self.a.nrows))?;
            let n = self.a.nrows;
            self.check("row scale", (d.len(), y.len()), (n, n))?;
            self.a.spmv(be, Scale::SET, x, Some(d), y)
        })())
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
            _ => self.a.spmv(be, s, x, None, y),
        }
    }
    fn apply_t(&self, be: &CudaBackend, s: Scale, y: &DeviceVec, x: &mut DeviceVec) -> Result<()> {
        self.check("apply_t", (y.len(), x.len()), (self.a.nrows, self.a.ncols))?;
        match &self.t {
            Transpose::Csc(t) => t.spmv(be, s, y, None, x),
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
    fn lsmr_device(&self) -> Option<&dyn LsmrDevice<CudaBackend>> {
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
