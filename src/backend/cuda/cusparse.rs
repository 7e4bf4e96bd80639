//! cuSPARSE SpMV through `cudarc::cusparse::sys` (the library baseline: the paper's GPU-I).

use std::ffi::c_void;

use cudarc::cusparse::sys as cs;
use cudarc::driver::CudaSlice;

use super::backend::CudaBackend;
use super::csr::DevCsr;
use super::error::{CudaError, Doing};
use super::util::DevValues;
use crate::error::{Error, Result};
use crate::sparse::Csr;

/// The arguments cusparseSpMV and cusparseSpMV_bufferSize share: handle, operation, host
/// scalars alpha and beta (host pointer mode), the matrix and the two vector descriptors.
struct SpMvArgs {
    h: cs::cusparseHandle_t,
    op: cs::cusparseOperation_t,
    alpha: *const c_void,
    mat: cs::cusparseConstSpMatDescr_t,
    x: cs::cusparseConstDnVecDescr_t,
    beta: *const c_void,
    y: cs::cusparseDnVecDescr_t,
}

/// `cs::$f(the SpMvArgs $c, f64 data, the default algorithm, $last)`: cusparseSpMV (last: the
/// work buffer) or cusparseSpMV_bufferSize (last: where the size goes). Unsafe: calls cuSPARSE.
macro_rules! spmv_call {
    ($f:ident, $c:expr, $last:expr) => {{
        let c: &SpMvArgs = $c;
        cs::$f(
            c.h,
            c.op,
            c.alpha,
            c.mat,
            c.x,
            c.beta,
            c.y,
            cs::cudaDataType::CUDA_R_64F,
            cs::cusparseSpMVAlg_t::CUSPARSE_SPMV_ALG_DEFAULT,
            $last,
        )
    }};
}

fn check(what: &str, st: cs::cusparseStatus_t) -> Result<()> {
    st.result().doing_with(|| format!("cuSPARSE {what}"))
}

/// A cuSPARSE handle and CSR descriptor over the operator's device arrays (with 32-bit row
/// offsets of its own), and the SpMV work buffer.
pub(crate) struct CuSparse {
    handle: cs::cusparseHandle_t,
    mat: cs::cusparseSpMatDescr_t,
    _ip32: CudaSlice<i32>,
    buf: CudaSlice<u8>,
    m: usize,
    n: usize,
}

impl CuSparse {
    pub fn new(be: &CudaBackend, a: &Csr, dev: &DevCsr) -> Result<Self> {
        if let Some(why) = super::device::cusparse_missing() {
            return Err(Error::backend("cuda", why));
        }
        let ip32: Vec<i32> = a.indptr().iter().map(|&p| p as i32).collect();
        let ip32 = be.stream.clone_htod(&ip32).doing("uploading row offsets")?;
        let vals = match &dev.values {
            DevValues::F64(v) => be.ptr(v),
            DevValues::F32(_) => {
                return Err(Error::backend("cuda", "cuSPARSE baseline needs f64 values"))
            }
        };
        let mut handle: cs::cusparseHandle_t = std::ptr::null_mut();
        // SAFETY: cusparseCreate writes a new handle into `handle`; the library is present
        // (checked by probe before the backend was made).
        check("create", unsafe { cs::cusparseCreate(&mut handle) })?;
        let mut me = CuSparse {
            handle,
            mat: std::ptr::null_mut(),
            _ip32: ip32,
            buf: be.stream.alloc_zeros::<u8>(1).map_err(CudaError::from)?,
            m: a.nrows(),
            n: a.ncols(),
        };
        // SAFETY: the stream outlives the handle (both owned by the backend / this operator).
        check("set stream", unsafe {
            cs::cusparseSetStream(handle, be.stream.cu_stream() as cs::cudaStream_t)
        })?;
        let (pi, pc) = (be.ptr(&me._ip32), be.ptr(&dev.indices));
        // SAFETY: the arrays are device buffers of the stated sizes and types, kept alive by
        // `me` (row offsets) and by the operator that owns `dev` and this wrapper.
        check("create CSR", unsafe {
            cs::cusparseCreateCsr(
                &mut me.mat,
                me.m as i64,
                me.n as i64,
                dev.nnz as i64,
                pi as *mut c_void,
                pc as *mut c_void,
                vals as *mut c_void,
                cs::cusparseIndexType_t::CUSPARSE_INDEX_32I,
                cs::cusparseIndexType_t::CUSPARSE_INDEX_32I,
                cs::cusparseIndexBase_t::CUSPARSE_INDEX_BASE_ZERO,
                cs::cudaDataType::CUDA_R_64F,
            )
        })?;
        // Work buffer: the larger of the two products' needs.
        use crate::backend::Backend;
        let x = be.zeros(me.n.max(1))?;
        let y = be.zeros(me.m.max(1))?;
        let mut size = 0usize;
        for trans in [false, true] {
            let (xin, yout) = if trans { (&y, &x) } else { (&x, &y) };
            let s = me.with_vectors(be, trans, (1.0, xin), (0.0, yout), |c| {
                let mut s = 0usize;
                // SAFETY: valid handle and descriptors; host scalars live across the call.
                check("SpMV buffer size", unsafe {
                    spmv_call!(cusparseSpMV_bufferSize, c, &mut s)
                })?;
                Ok(s)
            })?;
            size = size.max(s);
        }
        me.buf = be
            .stream
            .alloc_zeros::<u8>(size.max(1))
            .doing_with(|| format!("cuSPARSE buffer of {size} bytes"))?;
        Ok(me)
    }

    /// Run `f` with the arguments of y = alpha op(A) x + beta y: dense-vector descriptors for x
    /// (input) and y (output), op(A) = A^T when `trans`.
    fn with_vectors<T>(
        &self,
        be: &CudaBackend,
        trans: bool,
        (alpha, x): (f64, &CudaSlice<f64>),
        (beta, y): (f64, &CudaSlice<f64>),
        f: impl FnOnce(&SpMvArgs) -> Result<T>,
    ) -> Result<T> {
        let (mut vx, mut vy): (cs::cusparseDnVecDescr_t, cs::cusparseDnVecDescr_t) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: descriptors over device buffers of the stated lengths, destroyed below.
        check("create vector", unsafe {
            cs::cusparseCreateDnVec(
                &mut vx,
                x.len() as i64,
                be.ptr(x) as *mut c_void,
                cs::cudaDataType::CUDA_R_64F,
            )
        })?;
        // SAFETY: as above.
        let st = unsafe {
            cs::cusparseCreateDnVec(
                &mut vy,
                y.len() as i64,
                be.ptr(y) as *mut c_void,
                cs::cudaDataType::CUDA_R_64F,
            )
        };
        if let Err(e) = check("create vector", st) {
            // SAFETY: vx was created above.
            unsafe { cs::cusparseDestroyDnVec(vx) };
            return Err(e);
        }
        let op = if trans {
            cs::cusparseOperation_t::CUSPARSE_OPERATION_TRANSPOSE
        } else {
            cs::cusparseOperation_t::CUSPARSE_OPERATION_NON_TRANSPOSE
        };
        let r = f(&SpMvArgs {
            h: self.handle,
            op,
            alpha: &alpha as *const f64 as *const c_void,
            mat: self.mat,
            x: vx,
            beta: &beta as *const f64 as *const c_void,
            y: vy,
        });
        // SAFETY: created above, not used after this.
        unsafe {
            cs::cusparseDestroyDnVec(vx);
            cs::cusparseDestroyDnVec(vy);
        }
        r
    }

    /// y = alpha op(A) x + beta y
    pub fn spmv(
        &self,
        be: &CudaBackend,
        trans: bool,
        alpha: f64,
        x: &CudaSlice<f64>,
        beta: f64,
        y: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let buf = be.ptr(&self.buf);
        be.ctx.bind_to_thread().map_err(CudaError::from)?;
        self.with_vectors(be, trans, (alpha, x), (beta, y), |c| {
            // SAFETY: valid handle, descriptors and work buffer of the size cuSPARSE asked for;
            // host scalars live across the call (host pointer mode).
            check("SpMV", unsafe {
                spmv_call!(cusparseSpMV, c, buf as *mut c_void)
            })
        })
    }
}

impl Drop for CuSparse {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once here; errors cannot be reported from drop.
        unsafe {
            if !self.mat.is_null() {
                cs::cusparseDestroySpMat(self.mat);
            }
            cs::cusparseDestroy(self.handle);
        }
    }
}
