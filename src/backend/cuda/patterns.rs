//! Row patterns on the GPU ([`RowPatterns`], src/sparse/patterns.rs): the product of a square
//! system's rows for GMRES with fewer bytes than CSR (kernels/spmv.cu pattern_spmv).

use cudarc::driver::CudaSlice;

use super::backend::{CudaBackend, DeviceVec};
use super::util::{arg, check_vectors, up, DevValues};
use crate::backend::Scale;
use crate::error::Result;
use crate::sparse::patterns::RowPatterns;

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
        let values = DevValues::upload(be, &p.values)?;
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

    /// y = d .* (s.alpha A x + s.beta y) (s.beta == 0: y is not read; without `d` no
    /// scaling). With `normalized` = (nsq, v), A's input is v = x / sqrt(max(*nsq, 0)) (x's
    /// first nrows entries: the rows' own columns), written to `v` by the same launch: `nsq` is
    /// the device address of the squared norm (GMRES's normalised product, with
    /// [`Scale::SET`]).
    pub fn spmv(
        &self,
        be: &CudaBackend,
        s: Scale,
        x: &DeviceVec,
        normalized: Option<(u64, &mut DeviceVec)>,
        d: Option<&DeviceVec>,
        y: &mut DeviceVec,
    ) -> Result<()> {
        let (rows, cols) = (self.nrows, self.ncols);
        let check = |what: &str, got, want| check_vectors(what, got, want, (rows, cols));
        check("row-pattern product", (x.len(), y.len()), (cols, rows))?;
        if let Some(d) = d {
            check("row-pattern row scale", (d.len(), y.len()), (rows, rows))?;
        }
        let (pn, pvout) = match normalized {
            Some((nsq, v)) => {
                check(
                    "row-pattern normalised vector",
                    (v.len(), y.len()),
                    (rows, rows),
                )?;
                (nsq, be.ptr(v))
            }
            None => (0, 0),
        };
        let (alpha, beta) = (s.alpha, s.beta);
        let (pi, pv) = self.values.index_and_ptr(be);
        let m = self.nrows as u32;
        let (slices, row_pat) = (be.ptr(&self.slice_ptr), be.ptr(&self.row_pat));
        let (start, off) = (be.ptr(&self.pat_start), be.ptr(&self.pat_off));
        let ptrs = [slices, row_pat, start, off, pv, be.ptr(x), be.ptr(y)];
        let pd = d.map_or(0u64, |d| be.ptr(d));
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
