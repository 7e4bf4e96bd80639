//! CSR arrays on the GPU ([`DevCsr`]): the rows cut into warp segments ([`segments`]) and the
//! CSR kernels of kernels/spmv.cu and kernels/compact.cu (csr_fused) over them.

use std::ffi::c_void;

use cudarc::driver::{CudaFunction, CudaSlice};

use super::backend::{CudaBackend, DeviceVec};
use super::error::Doing;
use super::lsqr_loop::Epilogue;
use super::util::{arg, check_row_numbers, fused_entries_per_block, up, DevValues};
use crate::backend::storage::DeviceCsr;
use crate::backend::{Precision, Scale};
use crate::error::Result;
use crate::sparse::Csr;

/// Rows with more nonzeros than this get a warp of their own.
const LONG_ROW: u64 = 32;
/// Nonzeros of a multi-row segment at most (= the shared-memory tile of kernels/spmv.cu).
const SEG_NNZ: u64 = 256;
/// Rows of a multi-row segment at most (one per lane).
const SEG_ROWS: usize = 32;
/// Warps per block of the sparse kernels (kernels/spmv.cu: WARPS_PER_BLOCK).
const WARPS_PER_BLOCK: u32 = 8;

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

impl DevCsr {
    pub(super) fn upload(be: &CudaBackend, a: &Csr, precision: Precision) -> Result<Self> {
        check_row_numbers(a.nrows())?;
        let seg = segments(a.indptr());
        let nseg = (seg.len() - 1) as u32;
        let values = DevValues::of(be, a.data(), precision)?;
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

    /// Copy a CSR matrix that lies on the GPU already (`d`, another library's arrays) into the
    /// backend's storage, device to device: the columns (32-bit, the same bits as u32) and
    /// values as they are, the row offsets widened to u64. The offsets are read on the host
    /// (nrows + 1 integers: they cut the rows into warp segments) and checked there; the
    /// entries never leave the GPU.
    pub(super) fn from_device(be: &CudaBackend, d: &DeviceCsr) -> Result<Self> {
        use cudarc::driver::sys as dsys;
        check_row_numbers(d.nrows())?;
        let (m, nnz) = (d.nrows(), d.nnz());
        let (ip_addr, width) = d.indptr();
        let mut raw = vec![0u8; (m + 1) * width];
        be.synchronize()?;
        // SAFETY: `raw` is a live host buffer of exactly the copied size; DeviceCsr's contract
        // (its unsafe constructor) makes `ip_addr` a readable device buffer of m + 1 offsets
        // of `width` bytes in this device's primary context.
        unsafe {
            dsys::cuMemcpyDtoH_v2(raw.as_mut_ptr().cast(), ip_addr, raw.len())
                .result()
                .doing("reading the row offsets of a matrix on the GPU")?;
        }
        let indptr: Vec<i64> = if width == 4 {
            raw.chunks_exact(4)
                .map(|c| i32::from_ne_bytes(c.try_into().expect("4 bytes")) as i64)
                .collect()
        } else {
            raw.chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes")))
                .collect()
        };
        drop(raw);
        let bad_row = indptr.windows(2).position(|w| w[1] < w[0]);
        if indptr[0] != 0 || indptr[m] != nnz as i64 || bad_row.is_some() {
            return Err(crate::error::Error::Invalid(format!(
                "the matrix on the GPU has bad row offsets: {}",
                match bad_row {
                    Some(r) => format!("row {r} ends before it starts"),
                    None => format!(
                        "they run from {} to {}, not 0 to its {nnz} nonzeros",
                        indptr[0], indptr[m]
                    ),
                }
            )));
        }
        let indptr: Vec<u64> = indptr.into_iter().map(|v| v as u64).collect();
        let seg = segments(&indptr);
        let nseg = (seg.len() - 1) as u32;
        // SAFETY: each allocation is written whole by the device copy below before any kernel
        // reads it (the copies run on the same stream, first).
        let indices =
            unsafe { be.stream.alloc::<u32>(nnz.max(1)) }.doing("device memory for the columns")?;
        let values = match d.precision() {
            // SAFETY: as above.
            Precision::F64 => DevValues::F64(
                unsafe { be.stream.alloc::<f64>(nnz.max(1)) }
                    .doing("device memory for the values")?,
            ),
            // SAFETY: as above.
            Precision::F32 => DevValues::F32(
                unsafe { be.stream.alloc::<f32>(nnz.max(1)) }
                    .doing("device memory for the values")?,
            ),
        };
        let (_, pv) = values.index_and_ptr(be);
        let cs = be.stream.cu_stream();
        if nnz > 0 {
            // SAFETY: the destinations are the allocations above (at least nnz elements); the
            // sources are DeviceCsr's nnz columns (4 bytes) and values (its precision's
            // bytes), readable by its contract; both lie in this context.
            unsafe {
                dsys::cuMemcpyDtoDAsync_v2(be.ptr(&indices), d.indices(), nnz * 4, cs)
                    .result()
                    .doing("copying the columns of a matrix on the GPU")?;
                dsys::cuMemcpyDtoDAsync_v2(pv, d.values(), nnz * d.precision().bytes(), cs)
                    .result()
                    .doing("copying the values of a matrix on the GPU")?;
            }
        }
        Ok(DevCsr {
            nrows: m,
            ncols: d.ncols(),
            nnz,
            indptr: up(be, &indptr)?,
            indices,
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

    /// y = s.alpha A x + s.beta y; with `d`, y = d .* (s.alpha A x + s.beta y): the rows of the
    /// result scaled in the product's epilogue (a diagonal preconditioner without a pass of its
    /// own).
    pub fn spmv(
        &self,
        be: &CudaBackend,
        s: Scale,
        x: &DeviceVec,
        d: Option<&DeviceVec>,
        y: &mut DeviceVec,
    ) -> Result<()> {
        let (px, py) = (be.ptr(x), be.ptr(y));
        let pd = d.map_or(0u64, |d| be.ptr(d));
        let tail = [arg(&px), arg(&py), arg(&s.alpha), arg(&s.beta), arg(&pd)];
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
}
