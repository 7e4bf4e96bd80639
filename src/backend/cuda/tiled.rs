//! Column tiles on the GPU (src/sparse/tiled.rs, kernels/tiled.cu): the products of compact
//! storage that gather from shared memory instead of L2.

use cudarc::driver::CudaSlice;

use super::compact::{stencil_parts, StencilArgs};
use super::lsqr_loop::Epilogue;
use super::operator::{up, up_if, width_index, DevValues};
use super::{arg, CudaBackend};
use crate::error::{Error, Result};
use crate::sparse::tiled::{Tiled, TiledValues};

const THREADS: u32 = 256;
const ROWS_PER_THREAD: u64 = 16;

fn width_for(mean: f64) -> u32 {
    let mut s = 4u32;
    while s < 32 && (2 * s) as f64 <= mean / 2.0 {
        s *= 2;
    }
    s
}

/// The values `v` on the device when `on`, else a one-element dummy of their precision.
fn values(be: &CudaBackend, on: bool, v: &TiledValues) -> Result<DevValues> {
    Ok(match v {
        TiledValues::F64(v) => DevValues::F64(up_if(be, on, v)?),
        TiledValues::F32(v) => DevValues::F32(up_if(be, on, v)?),
    })
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
    seg_slot: CudaSlice<u32>,
    seg_ent: CudaSlice<u64>,
    row_seg: CudaSlice<u64>,
    a_lcol: CudaSlice<u16>,
    a_val: DevValues,
    b_colptr: CudaSlice<u64>,
    b_lseg: CudaSlice<u16>,
    b_val: DevValues,
    seg_partial: CudaSlice<f64>,
    cpart: CudaSlice<f64>,
    /// Whether the row pass (A x) was uploaded.
    rows: bool,
    /// Sub-warp widths of the row (segment) and column passes.
    pub s_rows: u32,
    pub s_cols: u32,
}

impl DevTiled {
    /// Upload `t`; with `rows` false only the column pass (A^T) is uploaded and [`Self::av`]
    /// must not be called (the mixed layout takes A x from delta rows).
    pub fn upload(be: &CudaBackend, t: &Tiled, rows: bool) -> Result<Self> {
        if t.nrows >= u32::MAX as usize || t.ncols >= u32::MAX as usize {
            return Err(Error::Invalid(
                "cuda: tiles need fewer than 2^32 rows and columns on a rank".into(),
            ));
        }
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
        let mean_seg = t.nnz as f64 / t.nseg().max(1) as f64;
        let mean_col = t.nnz as f64 / (t.nchunks() * t.tile()).max(1) as f64;
        let s_rows = env("SEISTOMO_TILED_S_ROWS")
            .filter(|s| [4, 8, 16, 32].contains(s))
            .unwrap_or_else(|| width_for(mean_seg));
        let s_cols = env("SEISTOMO_TILED_S_COLS")
            .filter(|s| [4, 8, 16, 32].contains(s))
            .unwrap_or_else(|| width_for(mean_col));
        let stream = &be.stream;
        let zeros = |n: usize| {
            stream
                .alloc_zeros::<f64>(n.max(1))
                .map_err(|e| Error::backend("cuda", format!("allocating tile scratch: {e:?}")))
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
            tile_chunk: up(be, &t.tile_chunk)?,
            seg_row: up(be, &t.seg_row)?,
            // The row pass's arrays (one-element dummies when it is not uploaded).
            seg_slot: up_if(be, rows, &t.seg_slot)?,
            seg_ent: up_if(be, rows, &t.seg_ent)?,
            row_seg: up_if(be, rows, &t.row_seg)?,
            a_lcol: up_if(be, rows, &t.a_lcol)?,
            a_val: values(be, rows, &t.a_val)?,
            b_colptr: up(be, &t.b_colptr)?,
            b_lseg: up(be, &t.b_lseg)?,
            b_val: values(be, true, &t.b_val)?,
            seg_partial: zeros(if rows { t.nseg() } else { 1 })?,
            cpart: zeros(t.nchunks() * t.tile())?,
            rows,
            s_rows,
            s_cols,
        })
    }

    pub fn tile(&self) -> usize {
        1 << self.tile_bits
    }

    /// Blocks (= norm partials) of the row pass.
    pub fn row_blocks(&self) -> u32 {
        (self.nrows as u64).div_ceil(THREADS as u64 * ROWS_PER_THREAD) as u32
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
        let f = &be.k.tiled_ax[pi][width_index(self.s_rows)];
        let ncols = self.ncols as u64;
        let (pct, pcs, pse, pss, plc, psp) = (
            be.ptr(&self.chunk_tile),
            be.ptr(&self.chunk_seg),
            be.ptr(&self.seg_ent),
            be.ptr(&self.seg_slot),
            be.ptr(&self.a_lcol),
            be.ptr(&self.seg_partial),
        );
        be.launch_smem(
            f,
            self.nchunks,
            THREADS,
            (8u32) << self.tile_bits,
            &mut [
                arg(&self.tile_bits),
                arg(&ncols),
                arg(&pct),
                arg(&pcs),
                arg(&pse),
                arg(&pss),
                arg(&plc),
                arg(&pv),
                arg(&x),
                arg(&psp),
                arg(&e.skip),
            ],
        )?;
        let nrows = self.nrows as u32;
        let prs = be.ptr(&self.row_seg);
        let lead = [arg(&nrows), arg(&prs), arg(&psp), arg(&y)];
        be.launch(
            &be.k.tiled_rows,
            self.row_blocks(),
            THREADS,
            &mut [&lead[..], &e.args()].concat(),
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
        let (pi, pv) = self.b_val.index_and_ptr(be);
        let f = &be.k.tiled_atu[pi][width_index(self.s_cols)];
        let (pcs, psr, pcp, pls, pcpart) = (
            be.ptr(&self.chunk_seg),
            be.ptr(&self.seg_row),
            be.ptr(&self.b_colptr),
            be.ptr(&self.b_lseg),
            be.ptr(&self.cpart),
        );
        // the tile's column offsets in shared memory (u32, relative to the chunk's first entry:
        // a chunk holds at most CHUNK_SEGS segments of at most one tile each, < 2^32 entries)
        be.launch_smem(
            f,
            self.nchunks,
            THREADS,
            4 * ((1u32 << self.tile_bits) + 1),
            &mut [
                arg(&self.tile_bits),
                arg(&pcs),
                arg(&psr),
                arg(&pcp),
                arg(&pls),
                arg(&pv),
                arg(&y),
                arg(&pcpart),
                arg(&e.skip),
            ],
        )?;
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
        be.launch(
            &be.k.tiled_cols,
            self.col_blocks(),
            THREADS,
            &mut [&lead[..], &e.args(), &tail].concat(),
        )
    }
}
