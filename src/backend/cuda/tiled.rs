//! Column tiles on the GPU (src/sparse/tiled.rs, kernels/tiled.cu): the products of compact
//! storage that gather from shared memory instead of L2.

use cudarc::driver::{CudaFunction, CudaSlice};

use super::backend::CudaBackend;
use super::error::Doing;
use super::lsqr_loop::{Epilogue, PIECE_ALIGN};
use super::stencil::{stencil_parts, StencilArgs};
use super::util::{arg, up, up_if, width_index, DevValues};
use crate::error::{Error, Result};
use crate::sparse::tiled::{Tiled, TiledValues};

const THREADS: u32 = 256;
const ROWS_PER_THREAD: u64 = 4;
/// Columns of one block of the column pass (kernels/tiled.cu TILED_THREADS x
/// TILED_ROWS_PER_THREAD): the pieces of A^T start at multiples of it.
const COLS_ALIGN: usize = THREADS as usize * ROWS_PER_THREAD as usize;
// A^T's pieces start on column-pass blocks and on tiles of any size (tile_bits <= 12).
const _: () = assert!(PIECE_ALIGN % COLS_ALIGN == 0 && PIECE_ALIGN % (1 << 12) == 0);

/// A piece of A^T y's columns ([`DevTiled::atu_piece`]): the chunks of their tiles, and
/// the columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AtuPiece {
    pub chunks: std::ops::Range<u32>,
    pub cols: std::ops::Range<u32>,
}

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
pub(super) fn up_padded<
    T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Default + Copy,
>(
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
pub(super) fn values(be: &CudaBackend, on: bool, v: &TiledValues, pad: bool) -> Result<DevValues> {
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
    /// `tile_chunk` on the host (empty when the column pass is not made): where the pieces
    /// of A^T ([`DevTiled::atu_piece`]) start and end.
    pub tile_chunk_host: Vec<u32>,
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
    /// The first chunk of each tile and the end (tile count + 1 values) on the host; empty
    /// when the column pass was not uploaded.
    tile_chunk_host: Vec<u32>,
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
            tile_chunk_host: if cols {
                t.tile_chunk.clone()
            } else {
                Vec::new()
            },
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
            tile_chunk_host: p.tile_chunk_host,
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
        let all = AtuPiece {
            chunks: 0..self.nchunks,
            cols: 0..self.ncols as u32,
        };
        self.atu_range(be, y, x, e, st, &all)
    }

    /// The chunks and columns of A^T's piece `cols` (boundaries from
    /// [`super::lsqr_loop::column_pieces`]).
    pub fn atu_piece(&self, cols: std::ops::Range<usize>) -> Result<AtuPiece> {
        piece_of(&self.tile_chunk_host, self.tile_bits, self.ncols, cols)
    }

    /// The columns `piece.cols` of x = a A^T y + b x (+ the stencil rows' terms) from the
    /// chunks `piece.chunks` (those of the columns' tiles: [`Self::atu_piece`]), with the
    /// epilogue `e` (its block partials at their places among all the columns').
    pub fn atu_range(
        &self,
        be: &CudaBackend,
        y: u64,
        x: u64,
        e: &Epilogue,
        st: Option<(&StencilArgs, u64)>,
        piece: &AtuPiece,
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
        // the tile's column offsets in shared memory (u32, relative to the chunk's first entry:
        // a chunk holds at most CHUNK_SEGS segments of at most one tile each, < 2^32 entries)
        let smem = 4 * ((1u32 << self.tile_bits) + 1);
        let nq = piece.chunks.len() as u32;
        if nq > 0 {
            let q0 = piece.chunks.start;
            let mut args = [
                arg(&self.tile_bits),
                arg(&q0),
                arg(&seg),
                arg(&row),
                arg(&colptr),
                arg(&lseg),
                arg(&pv),
                arg(&y),
                arg(&pcpart),
                arg(&e.skip),
            ];
            be.launch_smem(f, nq, THREADS, smem, &mut args)?;
        }
        let (has, sargs, yd) = stencil_parts(st);
        let has = i32::from(has);
        let (j0, j1) = (piece.cols.start, piece.cols.end);
        let ptc = be.ptr(&self.tile_chunk);
        let lead = [
            arg(&j0),
            arg(&j1),
            arg(&self.tile_bits),
            arg(&ptc),
            arg(&pcpart),
            arg(&x),
        ];
        let tail = [arg(&sargs), arg(&yd), arg(&has)];
        let first_block = j0 as u64 / COLS_ALIGN as u64;
        let e = Epilogue {
            partial: if e.partial == 0 {
                0
            } else {
                e.partial + 8 * first_block
            },
            ..*e
        };
        let blocks = ((j1 - j0) as u64).div_ceil(COLS_ALIGN as u64) as u32;
        e.launch(be, &be.k.tiled_cols, (blocks.max(1), THREADS), &lead, &tail)
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

/// The chunks of the tiles of columns `cols` (a piece of [`super::lsqr_loop::column_pieces`]) of a matrix of
/// `ncols` columns in tiles of 2^`tile_bits` whose chunks start at `tile_chunk` (one value per
/// tile and the end; empty: the column pass was not uploaded).
fn piece_of(
    tile_chunk: &[u32],
    tile_bits: u32,
    ncols: usize,
    cols: std::ops::Range<usize>,
) -> Result<AtuPiece> {
    let ntiles = tile_chunk.len().saturating_sub(1);
    let tile = |c: usize| {
        if c >= ncols {
            Some(ntiles)
        } else if c % PIECE_ALIGN == 0 {
            Some(c >> tile_bits)
        } else {
            None
        }
    };
    match (tile(cols.start), tile(cols.end), ntiles) {
        (Some(t0), Some(t1), 1..) if t0 <= t1 && t1 <= ntiles && cols.end <= ncols => {
            Ok(AtuPiece {
                chunks: tile_chunk[t0]..tile_chunk[t1],
                cols: cols.start as u32..cols.end as u32,
            })
        }
        _ => Err(Error::backend(
            "cuda",
            format!(
                "A^T's piece of columns {cols:?} does not fall on tiles of {} of the {ncols} columns",
                1usize << tile_bits
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::lsqr_loop::column_pieces;
    use super::*;

    #[test]
    fn a_piece_takes_the_chunks_of_its_tiles() {
        // 20 tiles of 512 columns (the last short); tile i has 1 + i % 3 chunks
        let (bits, ncols) = (9, 19 * 512 + 100);
        let mut tc = vec![0u32];
        for i in 0..20 {
            tc.push(tc[i] + 1 + (i as u32 % 3));
        }
        let pieces = column_pieces(ncols, 2);
        assert_eq!(pieces, vec![0..4096, 4096..ncols]);
        let a = piece_of(&tc, bits, ncols, pieces[0].clone()).unwrap();
        let b = piece_of(&tc, bits, ncols, pieces[1].clone()).unwrap();
        assert_eq!((a.chunks, a.cols), (0..tc[8], 0..4096));
        assert_eq!((b.chunks, b.cols), (tc[8]..tc[20], 4096..ncols as u32));
        // tiles of 4096: the same boundaries
        let tc4k = [0u32, 7, 9, 12];
        let p = piece_of(&tc4k, 12, 3 * 4096 - 5, 4096..3 * 4096 - 5).unwrap();
        assert_eq!(p.chunks, 7..12);
        // off a boundary, or without the column pass: an error
        assert!(piece_of(&tc, bits, ncols, 0..1000).is_err());
        assert!(piece_of(&[], bits, ncols, 0..ncols).is_err());
    }
}
