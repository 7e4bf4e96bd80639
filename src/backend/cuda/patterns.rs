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

/// The columns a row-pattern product reads.
pub(crate) enum Cols<'a> {
    /// Every column.
    All(&'a DeviceVec),
    /// The rows' own columns only (the first nrows): for rows that read no other column.
    Own(&'a DeviceVec),
    /// The own columns, and the others (a rank's ghosts, in column order) from a buffer of
    /// their own.
    Halo(&'a DeviceVec, &'a DeviceVec),
}

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
        self.spmv_rows(be, s, Cols::All(x), 0..self.nrows, normalized, d, y)
    }

    /// [`Self::spmv`] for the rows `rows` only (their entries of y, d and v), reading the
    /// columns `cols` ([`Cols`]; Own only for rows that read no column beyond nrows: the
    /// kernel would read past x).
    #[allow(clippy::too_many_arguments)]
    pub fn spmv_rows(
        &self,
        be: &CudaBackend,
        s: Scale,
        cols: Cols,
        rows: std::ops::Range<usize>,
        normalized: Option<(u64, &mut DeviceVec)>,
        d: Option<&DeviceVec>,
        y: &mut DeviceVec,
    ) -> Result<()> {
        let (m, ncols) = (self.nrows, self.ncols);
        let check = |what: &str, got, want| check_vectors(what, got, want, (m, ncols));
        if rows.start > rows.end || rows.end > m {
            return Err(crate::error::Error::Invalid(format!(
                "row-pattern product: rows {rows:?} of {m}"
            )));
        }
        let (x, ghosts) = match cols {
            Cols::All(x) => {
                check("row-pattern product", (x.len(), y.len()), (ncols, m))?;
                (x, None)
            }
            Cols::Own(x) => {
                check("row-pattern product", (x.len(), y.len()), (m, m))?;
                (x, None)
            }
            Cols::Halo(x, g) => {
                check("row-pattern product", (x.len(), y.len()), (m, m))?;
                let need = ncols - m;
                check(
                    "row-pattern ghosts",
                    (g.len().min(need), y.len()),
                    (need, m),
                )?;
                (x, Some(g))
            }
        };
        if let Some(d) = d {
            check("row-pattern row scale", (d.len(), y.len()), (m, m))?;
        }
        let (pn, pvout) = match normalized {
            Some((nsq, v)) => {
                check("row-pattern normalised vector", (v.len(), y.len()), (m, m))?;
                (nsq, be.ptr(v))
            }
            None => (0, 0),
        };
        if rows.is_empty() {
            return Ok(());
        }
        let (alpha, beta) = (s.alpha, s.beta);
        let (pi, pv) = self.values.index_and_ptr(be);
        let (r0, r1, nown) = (rows.start as u32, rows.end as u32, m as u32);
        let (slices, row_pat) = (be.ptr(&self.slice_ptr), be.ptr(&self.row_pat));
        let (start, off) = (be.ptr(&self.pat_start), be.ptr(&self.pat_off));
        let gx = ghosts.map_or(0, |g| be.ptr(g));
        let ptrs = [slices, row_pat, start, off, pv, be.ptr(x), gx, be.ptr(y)];
        let pd = d.map_or(0u64, |d| be.ptr(d));
        let mut args = vec![arg(&r0), arg(&r1), arg(&nown)];
        args.extend(ptrs.iter().map(arg));
        args.extend([arg(&alpha), arg(&beta), arg(&pd), arg(&pn), arg(&pvout)]);
        let k = if ghosts.is_some() {
            &be.k.pattern_spmv_halo[pi]
        } else {
            &be.k.pattern_spmv[pi]
        };
        be.launch(k, (r1 - r0).div_ceil(THREADS), THREADS, &mut args)
    }
}
