//! Row patterns on the GPU ([`RowPatterns`], src/sparse/patterns.rs): the product of a square
//! system's rows for GMRES with fewer bytes than CSR (kernels/spmv.cu pattern_spmv).

use cudarc::driver::CudaSlice;

use super::backend::CudaBackend;
use super::util::{arg, check_vectors, up, DevValues};
use crate::error::Result;
use crate::sparse::patterns::RowPatterns;
use crate::sparse::CompactValues;

/// Threads per block of pattern_spmv (a thread per row).
const THREADS: u32 = 256;

/// A [`RowPatterns`] matrix on the device.
pub(crate) struct DevPatterns {
    pub nrows: usize,
    pub ncols: usize,
    slice_ptr: CudaSlice<u64>,
    row_pat: CudaSlice<u16>,
    pat_start: CudaSlice<u32>,
    pat_off: CudaSlice<i32>,
    values: DevValues,
    describe: String,
}

impl DevPatterns {
    pub fn upload(be: &CudaBackend, p: &RowPatterns) -> Result<Self> {
        let values = match &p.values {
            CompactValues::F64(v) => DevValues::F64(up(be, v)?),
            CompactValues::F32(v) => DevValues::F32(up(be, v)?),
        };
        Ok(DevPatterns {
            nrows: p.nrows,
            ncols: p.ncols,
            slice_ptr: up(be, &p.slice_ptr)?,
            row_pat: up(be, &p.row_pat)?,
            pat_start: up(be, &p.pat_start)?,
            pat_off: up(be, &p.pat_off)?,
            values,
            describe: p.describe(),
        })
    }

    /// What is stored, in one line.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// y = d .* (alpha A x + beta y) (beta == 0: y is not read; without `d` no scaling).
    pub fn spmv_scaled(
        &self,
        be: &CudaBackend,
        alpha: f64,
        x: &CudaSlice<f64>,
        beta: f64,
        d: Option<&CudaSlice<f64>>,
        y: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.launch(be, (alpha, beta), x, d, y, None)
    }

    /// y = d .* (A v) with v = x / sqrt(max(*nsq, 0)) (x's first nrows entries: the rows' own
    /// columns) written to `v` by the same launch: `nsq` is the device address of the squared
    /// norm.
    pub fn spmv_normalized(
        &self,
        be: &CudaBackend,
        nsq: u64,
        x: &CudaSlice<f64>,
        v: &mut CudaSlice<f64>,
        d: Option<&CudaSlice<f64>>,
        y: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let shape = (self.nrows, self.ncols);
        check_vectors(
            "row-pattern normalised vector",
            (v.len(), y.len()),
            (self.nrows, self.nrows),
            shape,
        )?;
        self.launch(be, (1.0, 0.0), x, d, y, Some((nsq, be.ptr(v))))
    }

    fn launch(
        &self,
        be: &CudaBackend,
        (alpha, beta): (f64, f64),
        x: &CudaSlice<f64>,
        d: Option<&CudaSlice<f64>>,
        y: &mut CudaSlice<f64>,
        norm: Option<(u64, u64)>,
    ) -> Result<()> {
        let shape = (self.nrows, self.ncols);
        check_vectors(
            "row-pattern product",
            (x.len(), y.len()),
            (self.ncols, self.nrows),
            shape,
        )?;
        if let Some(d) = d {
            check_vectors(
                "row-pattern row scale",
                (d.len(), y.len()),
                (self.nrows, self.nrows),
                shape,
            )?;
        }
        let (pi, pv) = self.values.index_and_ptr(be);
        let m = self.nrows as u32;
        let ptrs = [
            be.ptr(&self.slice_ptr),
            be.ptr(&self.row_pat),
            be.ptr(&self.pat_start),
            be.ptr(&self.pat_off),
            pv,
            be.ptr(x),
            be.ptr(y),
        ];
        let pd = d.map_or(0u64, |d| be.ptr(d));
        let (pn, pvout) = norm.unwrap_or((0, 0));
        let mut args = vec![arg(&m)];
        args.extend(ptrs.iter().map(arg));
        args.extend([arg(&alpha), arg(&beta), arg(&pd), arg(&pn), arg(&pvout)]);
        be.launch(
            &be.k.pattern_spmv[pi],
            m.div_ceil(THREADS),
            THREADS,
            &mut args,
        )
    }
}
