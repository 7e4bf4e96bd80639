//! Column tiles on the GPU (src/sparse/tiled.rs, kernels/tiled.cu): the products of compact
//! storage that gather from shared memory instead of L2.

use cudarc::driver::{CudaFunction, CudaSlice};

use super::backend::CudaBackend;
use super::error::Doing;
use super::lsqr_loop::Epilogue;
use super::stencil::{stencil_parts, StencilArgs};
use super::util::{arg, up, up_if, width_index, DevValues};
use crate::error::{Error, Result};
use crate::sparse::tiled::{Tiled, TiledValues};

const THREADS: u32 = 256;
const ROWS_PER_THREAD: u64 = 4;

fn width_for(mean: f64) -> u32 {
    let mut s = 4u32;
    while s < 32 && (2 * s) as f64 <= mean / 2.0 {
        s *= 2;
    }
    s
}

/// Entries per lane and round of the flat A x kernel (kernels/tiled.cu AXF_P): the row entries
/// are uploaded padded to a multiple of it.
pub(super) const AXF_P: usize = 8;
/// Rows per thread of the row pass (kernels/tiled.cu TILED_ROWPASS_RPT).
const ROWPASS_RPT: u64 = 2;

/// `v` on the device when `on`, else a one-element dummy; with `pad`, padded with zeros to a
/// multiple of [`AXF_P`] (the row entries the flat A x kernel reads in vector loads): copied
/// into the front of a zeroed device array of the padded length (no padded copy on the host).
fn up_padded<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Default + Copy>(
    be: &CudaBackend,
    on: bool,
    v: &[T],
    pad: bool,
) -> Result<CudaSlice<T>> {
    if !on || !pad || v.len() % AXF_P == 0 {
        return up_if(be, on, v);
    }
    let mut d = be
        .stream
        .alloc_zeros::<T>(v.len().next_multiple_of(AXF_P))
        .doing("allocating padded tile entries")?;
    be.stream
        .memcpy_htod(v, &mut d)
        .doing_with(|| format!("uploading {} bytes", std::mem::size_of_val(v)))?;
    Ok(d)
}

/// The values `v` as [`up_padded`] (a dummy of their precision when not `on`).
fn values(be: &CudaBackend, on: bool, v: &TiledValues, pad: bool) -> Result<DevValues> {
    Ok(match v {
        TiledValues::F64(v) => DevValues::F64(up_padded(be, on, v, pad)?),
        TiledValues::F32(v) => DevValues::F32(up_padded(be, on, v, pad)?),
    })
}

/// The tables of a tiled matrix made on the device ([`DevTiled::assemble`]): the arrays of
/// [`Tiled`] that the products read, with the row entries (`a_lcol`, `a_val`) padded to a
/// multiple of [`AXF_P`].
pub(super) struct DevTiledParts {
    pub nrows: usize,
    pub ncols: usize,
    pub nnz: usize,
    pub nseg: usize,
    pub nchunks: usize,
    pub tile_bits: u32,
    pub chunk_tile: CudaSlice<u32>,
    pub chunk_seg: CudaSlice<u32>,
    pub tile_chunk: CudaSlice<u32>,
    pub seg_row: CudaSlice<u32>,
    pub seg_pos: CudaSlice<u32>,
    pub seg_ent: CudaSlice<u64>,
    pub row_seg: CudaSlice<u64>,
    pub a_lcol: CudaSlice<u16>,
    pub a_val: DevValues,
    pub b_colptr: CudaSlice<u64>,
    pub b_lseg: CudaSlice<u16>,
    pub b_val: DevValues,
    pub rows: bool,
    pub cols: bool,
}

/// A tiled matrix on the device, with its scratch (segment partials, chunk column sums).
pub(crate) struct DevTiled {
    pub nrows: usize,
    pub ncols: usize,
    pub nseg: usize,
    /// Columns over all chunks (nchunks x tile).
    pub chunk_cols: usize,
    tile_bits: u32,
    nchunks: u32,
    chunk_tile: CudaSlice<u32>,
    chunk_seg: CudaSlice<u32>,
    tile_chunk: CudaSlice<u32>,
    seg_row: CudaSlice<u32>,
    seg_pos: CudaSlice<u32>,
    seg_ent: CudaSlice<u64>,
    row_seg: CudaSlice<u64>,
    a_lcol: CudaSlice<u16>,
    a_val: DevValues,
    b_colptr: CudaSlice<u64>,
    b_lseg: CudaSlice<u16>,
    b_val: DevValues,
    seg_partial: CudaSlice<f64>,
    cpart: CudaSlice<f64>,
    /// Whether the row pass (A x) and the column pass (A^T) were uploaded.
    rows: bool,
    cols: bool,
    /// Sub-warp width of the column pass.
    pub s_cols: u32,
}

impl DevTiled {
    /// Upload `t`: the row pass (A x) when `rows`, the column pass (A^T) when `cols`; a pass
    /// not uploaded must not be called (the mixed layout takes A x from delta rows, the split
    /// layout each product from tiles of its own size). The column pass's sub-warp width is
    /// `s_cols` (tuning `tiled_s_cols`, validated) or chosen from the mean column length.
    pub fn upload(
        be: &CudaBackend,
        t: &Tiled,
        rows: bool,
        cols: bool,
        s_cols: Option<u32>,
    ) -> Result<Self> {
        if t.nrows >= u32::MAX as usize || t.ncols >= u32::MAX as usize {
            return Err(Error::Invalid(
                "cuda: tiles need fewer than 2^32 rows and columns on a rank".into(),
            ));
        }
        let mean_col = t.nnz as f64 / (t.nchunks() * t.tile()).max(1) as f64;
        let s_cols = s_cols.unwrap_or_else(|| width_for(mean_col));
        let stream = &be.stream;
        let zeros = |n: usize| {
            stream
                .alloc_zeros::<f64>(n.max(1))
                .doing("allocating tile scratch")
        };
        Ok(DevTiled {
            nrows: t.nrows,
            ncols: t.ncols,
            nseg: t.nseg(),
            chunk_cols: t.nchunks() * t.tile(),
            tile_bits: t.tile_bits,
            nchunks: t.nchunks() as u32,
            chunk_tile: up(be, &t.chunk_tile)?,
            chunk_seg: up(be, &t.chunk_seg)?,
            seg_row: up_if(be, cols, &t.seg_row)?,
            // The row pass's arrays (one-element dummies when it is not uploaded).
            seg_pos: up_if(be, rows, &t.seg_pos)?,
            seg_ent: up_if(be, rows, &t.seg_ent)?,
            row_seg: up_if(be, rows, &t.row_seg)?,
            a_lcol: up_padded(be, rows, &t.a_lcol, true)?,
            a_val: values(be, rows, &t.a_val, true)?,
            // The column pass's.
            b_colptr: up_if(be, cols, &t.b_colptr)?,
            b_lseg: up_if(be, cols, &t.b_lseg)?,
            b_val: values(be, cols, &t.b_val, false)?,
            tile_chunk: up_if(be, cols, &t.tile_chunk)?,
            seg_partial: zeros(if rows { t.nseg() } else { 1 })?,
            cpart: zeros(if cols { t.nchunks() * t.tile() } else { 1 })?,
            rows,
            cols,
            s_cols,
        })
    }

    /// A tiled matrix from tables already on the device (kernels/encode.cu made them:
    /// src/backend/cuda/encode.rs), with its scratch; the halves as [`Self::upload`]'s `rows`
    /// and `cols` (a half not made holds one-element dummies).
    pub(super) fn assemble(
        be: &CudaBackend,
        p: DevTiledParts,
        s_cols: Option<u32>,
    ) -> Result<Self> {
        let tile = 1usize << p.tile_bits;
        let mean_col = p.nnz as f64 / (p.nchunks * tile).max(1) as f64;
        let zeros = |n: usize| {
            be.stream
                .alloc_zeros::<f64>(n.max(1))
                .doing("allocating tile scratch")
        };
        Ok(DevTiled {
            nrows: p.nrows,
            ncols: p.ncols,
            nseg: p.nseg,
            chunk_cols: p.nchunks * tile,
            tile_bits: p.tile_bits,
            nchunks: p.nchunks as u32,
            seg_partial: zeros(if p.rows { p.nseg } else { 1 })?,
            cpart: zeros(if p.cols { p.nchunks * tile } else { 1 })?,
            chunk_tile: p.chunk_tile,
            chunk_seg: p.chunk_seg,
            tile_chunk: p.tile_chunk,
            seg_row: p.seg_row,
            seg_pos: p.seg_pos,
            seg_ent: p.seg_ent,
            row_seg: p.row_seg,
            a_lcol: p.a_lcol,
            a_val: p.a_val,
            b_colptr: p.b_colptr,
            b_lseg: p.b_lseg,
            b_val: p.b_val,
            rows: p.rows,
            cols: p.cols,
            s_cols: s_cols.unwrap_or_else(|| width_for(mean_col)),
        })
    }

    pub fn tile(&self) -> usize {
        1 << self.tile_bits
    }

    /// Blocks (= norm partials) of the row pass.
    pub fn row_blocks(&self) -> u32 {
        (self.nrows as u64).div_ceil(THREADS as u64 * ROWPASS_RPT) as u32
    }
    /// Blocks (= norm partials) of the column pass.
    pub fn col_blocks(&self) -> u32 {
        (self.ncols as u64).div_ceil(THREADS as u64 * ROWS_PER_THREAD) as u32
    }

    /// y = a A x + b y with the epilogue `e`.
    pub fn av(&self, be: &CudaBackend, x: u64, y: u64, e: &Epilogue) -> Result<()> {
        if !self.rows {
            return Err(Error::backend(
                "cuda",
                "tiles uploaded for A^T only were asked for A x",
            ));
        }
        let (pi, pv) = self.a_val.index_and_ptr(be);
        let psp = be.ptr(&self.seg_partial);
        let (tile, seg) = (be.ptr(&self.chunk_tile), be.ptr(&self.chunk_seg));
        let (ent, lcol) = (be.ptr(&self.seg_ent), be.ptr(&self.a_lcol));
        let words = [self.ncols as u64, tile, seg, ent, lcol, pv, x, psp];
        // x of the chunk's tile in shared memory
        let smem = 8u32 << self.tile_bits;
        self.launch_chunks(be, &be.k.tiled_axf[pi], smem, &words, &e.skip)?;
        let nrows = self.nrows as u32;
        let (prs, psq) = (be.ptr(&self.row_seg), be.ptr(&self.seg_pos));
        let lead = [arg(&nrows), arg(&prs), arg(&psq), arg(&psp), arg(&y)];
        e.launch(
            be,
            &be.k.tiled_rows,
            (self.row_blocks(), THREADS),
            &lead,
            &[],
        )
    }

    /// x = a A^T y + b x (+ the stencil rows' terms from `st`) with the epilogue `e`.
    pub fn atu(
        &self,
        be: &CudaBackend,
        y: u64,
        x: u64,
        e: &Epilogue,
        st: Option<(&StencilArgs, u64)>,
    ) -> Result<()> {
        if !self.cols {
            return Err(Error::backend(
                "cuda",
                "tiles uploaded for A x only were asked for A^T y",
            ));
        }
        let (pi, pv) = self.b_val.index_and_ptr(be);
        let f = &be.k.tiled_atu[pi][width_index(self.s_cols)];
        let pcpart = be.ptr(&self.cpart);
        let (seg, row) = (be.ptr(&self.chunk_seg), be.ptr(&self.seg_row));
        let (colptr, lseg) = (be.ptr(&self.b_colptr), be.ptr(&self.b_lseg));
        let words = [seg, row, colptr, lseg, pv, y, pcpart];
        // the tile's column offsets in shared memory (u32, relative to the chunk's first entry:
        // a chunk holds at most CHUNK_SEGS segments of at most one tile each, < 2^32 entries)
        let smem = 4 * ((1u32 << self.tile_bits) + 1);
        self.launch_chunks(be, f, smem, &words, &e.skip)?;
        let (has, sargs, yd) = stencil_parts(st);
        let has = i32::from(has);
        let ncols = self.ncols as u32;
        let ptc = be.ptr(&self.tile_chunk);
        let lead = [
            arg(&ncols),
            arg(&self.tile_bits),
            arg(&ptc),
            arg(&pcpart),
            arg(&x),
        ];
        let tail = [arg(&sargs), arg(&yd), arg(&has)];
        e.launch(
            be,
            &be.k.tiled_cols,
            (self.col_blocks(), THREADS),
            &lead,
            &tail,
        )
    }

    /// Launch the chunk kernel `f` (a block per chunk, `smem` bytes of shared memory): its
    /// arguments are the tile bits, `words` (at most 8 sizes and device addresses), then the
    /// epilogue's skip flag.
    fn launch_chunks(
        &self,
        be: &CudaBackend,
        f: &CudaFunction,
        smem: u32,
        words: &[u64],
        skip: &u64,
    ) -> Result<()> {
        assert!(words.len() <= 8, "a chunk kernel takes at most 8 words");
        let mut args = [std::ptr::null_mut(); 10];
        args[0] = arg(&self.tile_bits);
        for (a, w) in args[1..].iter_mut().zip(words) {
            *a = arg(w);
        }
        args[words.len() + 1] = arg(skip);
        be.launch_smem(f, self.nchunks, THREADS, smem, &mut args[..words.len() + 2])
    }
}
