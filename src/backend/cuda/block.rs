//! Blocks of k vectors on the GPU and the block products of batched LSQR (kernels/batch.cu):
//! `impl BatchBackend for CudaBackend` and [`CudaBlockOperator`].
//!
//! A block is `rows x k` f64 values on the device, row-major ([`crate::backend::batch`]). The
//! element-wise and reduction kernels run in blocks of a multiple of k threads, so each thread
//! stays on one member's column; per-member coefficients go to the device as one small array
//! per launch. Reductions write one partial sum per block and member, added in block order by a
//! second launch: deterministic, but summed in another order than the CPU's kernels, so a
//! member equals its single solve within rounding (not bitwise, as on the CPU).
//!
//! The operator keeps the matrix in two parts over the same rows: G, the unweighted rows'
//! entries (f64 or f32 values), in column tiles ([`BlockTiles`]: the k values of X or Y an
//! entry multiplies come from shared memory), and R, the weighted rows' entries, in CSR and CSR
//! of R^T (always f64: member j's entry `a w_j` is formed, and rounded to f32 in an f32 batch,
//! as its own solve stores it). Each nonzero is read once for up to [`BT_KB`] members (A X) or
//! [`BT_KBT`] (A^T Y) from HBM; the blocks of the other members' groups read it from L2.

use cudarc::driver::CudaSlice;

use super::backend::{CudaBackend, DeviceVec};
use super::error::Doing;
use super::tiled::{up_padded, values};
use super::util::{arg, check_row_numbers, up, DevValues};
use crate::backend::batch::{check, weighted_rows, BatchBackend, BlockOperator, BlockScale, Side};
use crate::backend::{Backend, Precision, XwStep};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::sparse::tiled::{Tiled, TiledHalf};
use crate::sparse::Csr;
use crate::ui::phases;

/// Members a GPU batch holds at most (threads of one kernel block in the column reductions).
pub const MAX_MEMBERS: usize = 1024;

/// `rows x k` values on the device, row-major: entry (i, j) at `i * k + j`.
pub struct CudaBlock {
    data: DeviceVec,
    rows: usize,
    k: usize,
    /// A scale not yet applied (`block_scale`'s factors): the block's values are then
    /// `pending[j] * data_ij`, formed by each kernel as it reads them (kernels/batch.cu
    /// `scaled`: the same product a pass would have stored), so scaling u and v costs no pass
    /// over them (k = 16 on the 101M-nonzero system: u is 742 MB). A kernel that writes the
    /// whole block clears it; the few that cannot form it apply it first ([`CudaBackend::settle`]).
    pending: Option<Vec<f64>>,
}

impl CudaBlock {
    fn len(&self) -> usize {
        self.rows * self.k
    }
}

fn check_shape(what: &str, x: &CudaBlock, rows: usize, k: usize) -> Result<()> {
    check::shape(what, (x.rows, x.k), rows, k)
}

/// Threads per kernel block for a block of k columns: a multiple of k (thread t works on
/// column t % k), at least 256 where k allows.
fn block_threads(k: usize) -> u32 {
    let k = k.max(1);
    (if k >= 256 { k } else { k * (256 / k) }) as u32
}

impl CudaBackend {
    /// The device copy of a block's pending scale for a launch (None: none).
    fn pending_of(&self, x: &CudaBlock) -> Result<Option<CudaSlice<f64>>> {
        x.pending.as_ref().map(|p| up(self, p)).transpose()
    }

    /// The device address of a pending scale's copy (0: none).
    fn pending_ptr(&self, d: &Option<CudaSlice<f64>>) -> u64 {
        d.as_ref().map_or(0, |d| self.ptr(d))
    }

    /// Apply `x`'s pending scale in a pass of its own (for the kernels that do not form it).
    fn settle(&self, x: &mut CudaBlock) -> Result<()> {
        let Some(p) = x.pending.take() else {
            return Ok(());
        };
        if x.len() == 0 {
            return Ok(());
        }
        let d = up(self, &p)?;
        let n = x.len() as u64;
        let (kk, px, pa) = (x.k as i32, self.ptr(&x.data), self.ptr(&d));
        let mut args = [arg(&n), arg(&kk), arg(&px), arg(&pa)];
        self.block_elementwise(&self.k.block_scale, x.len(), x.k, &mut args)
    }

    /// The grid of an element-wise or reduction block kernel over `n` values.
    fn block_grid(&self, n: usize, threads: u32) -> u32 {
        let max = (self.info.multiprocessors.max(1) as usize) * 8;
        n.div_ceil(threads as usize * 4).clamp(1, max) as u32
    }

    /// A column reduction kernel (`f(grid, threads, smem, partials)` launches it), its
    /// partials added per column on the device, and the k sums on the host.
    fn column_sums(
        &self,
        n: usize,
        k: usize,
        out: &mut [f64],
        f: impl FnOnce(u32, u32, u32, u64) -> Result<()>,
    ) -> Result<()> {
        if k == 0 {
            return Ok(());
        }
        let threads = block_threads(k);
        let grid = self.block_grid(n, threads);
        // SAFETY: every partial is written by the reduction kernel (each block writes its k)
        // before the sum reads it.
        let partial = unsafe { self.stream.alloc::<f64>(grid as usize * k) }
            .doing("allocating block partial sums")?;
        // SAFETY: written by block_sum_partials before the copy reads it.
        let sums = unsafe { self.stream.alloc::<f64>(k) }.doing("allocating block sums")?;
        f(grid, threads, threads * 8, self.ptr(&partial))?;
        let (blocks, kk) = (grid as i32, k as i32);
        let (pp, ps) = (self.ptr(&partial), self.ptr(&sums));
        let mut args = [arg(&blocks), arg(&kk), arg(&pp), arg(&ps)];
        self.launch(
            &self.k.block_sum_partials,
            k.div_ceil(128) as u32,
            128,
            &mut args,
        )?;
        self.stream
            .memcpy_dtoh(&sums, out)
            .doing("copying block sums to the host")?;
        self.synchronize()
    }

    /// Launch an element-wise block kernel over `n` values of a k-column block.
    fn block_elementwise(
        &self,
        f: &cudarc::driver::CudaFunction,
        n: usize,
        k: usize,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        if n == 0 || k == 0 {
            return Ok(());
        }
        let threads = block_threads(k);
        self.launch(f, self.block_grid(n, threads), threads, args)
    }
}

impl BatchBackend for CudaBackend {
    type Block = CudaBlock;

    fn block_zeros(&self, rows: usize, k: usize) -> Result<CudaBlock> {
        if k > MAX_MEMBERS {
            return Err(Error::Invalid(format!(
                "a GPU batch holds at most {MAX_MEMBERS} members (asked for {k})"
            )));
        }
        let len = check::len(rows, k)?;
        Ok(CudaBlock {
            data: self.zeros(len.max(1))?,
            rows,
            k,
            pending: None,
        })
    }
    fn block_shape(&self, x: &CudaBlock) -> (usize, usize) {
        (x.rows, x.k)
    }
    fn block_column(&self, x: &CudaBlock, j: usize) -> Result<Vec<f64>> {
        check::column(j, x.k)?;
        let mut col = self.zeros(x.rows.max(1))?;
        self.column_copy(x, j, &mut col, false)?;
        let mut out = vec![0.0; x.rows.max(1)];
        self.download(&col, &mut out)?;
        out.truncate(x.rows);
        if let Some(p) = &x.pending {
            // (the host's product is the device's: IEEE, not fused)
            out.iter_mut().for_each(|v| *v *= p[j]);
        }
        Ok(out)
    }
    fn block_set_column(&self, x: &mut CudaBlock, j: usize, col: &[f64]) -> Result<()> {
        check::set_column(j, col.len(), (x.rows, x.k))?;
        self.settle(x)?;
        let mut c = up(self, col)?;
        self.column_copy(&*x, j, &mut c, true)
    }
    fn block_keep(&self, x: &mut CudaBlock, keep: &[usize]) -> Result<()> {
        if !check::keep(keep, x.k)? {
            return Ok(());
        }
        let k2 = keep.len();
        let mut out = self.block_zeros(x.rows, k2)?;
        out.pending = x
            .pending
            .as_ref()
            .map(|p| keep.iter().map(|&j| p[j]).collect());
        if k2 > 0 && x.rows > 0 {
            let idx: Vec<i32> = keep.iter().map(|&j| j as i32).collect();
            let d = up(self, &idx)?;
            let n = (x.rows * k2) as u64;
            let (k, k2i) = (x.k as i32, k2 as i32);
            let (ps, pk, pd) = (self.ptr(&x.data), self.ptr(&d), self.ptr(&out.data));
            let mut args = [arg(&n), arg(&k), arg(&k2i), arg(&ps), arg(&pk), arg(&pd)];
            self.block_elementwise(&self.k.block_keep, x.rows * k2, k2, &mut args)?;
        }
        *x = out;
        Ok(())
    }
    fn block_norms_sq(&self, x: &CudaBlock, factor: Option<&[f64]>, out: &mut [f64]) -> Result<()> {
        let k = x.k;
        check::one_per_column("block norms", out.len(), k)?;
        if let Some(f) = factor {
            check::one_per_column("block norms", f.len(), k)?;
        }
        if x.rows == 0 {
            out.iter_mut().for_each(|o| *o = 0.0);
            return Ok(());
        }
        let f = factor.map(|f| up(self, f)).transpose()?;
        let pf = f.as_ref().map_or(0, |f| self.ptr(f));
        let xp = self.pending_of(x)?;
        let pxp = self.pending_ptr(&xp);
        let n = x.len() as u64;
        let (kk, px) = (k as i32, self.ptr(&x.data));
        self.column_sums(x.len(), k, out, |grid, threads, smem, pp| {
            let mut args = [arg(&n), arg(&kk), arg(&px), arg(&pxp), arg(&pf), arg(&pp)];
            self.launch_smem(&self.k.block_norms, grid, threads, smem, &mut args)
        })
    }
    fn block_scale(&self, x: &mut CudaBlock, a: &[f64]) -> Result<()> {
        check::one_per_column("block scale", a.len(), x.k)?;
        // recorded, not applied: the next kernels form a x as they read x (a scale already
        // pending is applied first: (p x) a is not (p a) x)
        self.settle(x)?;
        x.pending = Some(a.to_vec());
        Ok(())
    }
    fn block_axpby(&self, a: f64, x: &CudaBlock, b: &[f64], y: &mut CudaBlock) -> Result<()> {
        check_shape("block axpby", y, x.rows, x.k)?;
        check::one_per_column("block axpby", b.len(), x.k)?;
        if x.len() == 0 {
            return Ok(());
        }
        let d = up(self, b)?;
        let (xp, yp) = (self.pending_of(x)?, self.pending_of(y)?);
        let (pxp, pyp) = (self.pending_ptr(&xp), self.pending_ptr(&yp));
        let n = x.len() as u64;
        let kk = x.k as i32;
        let (px, pb, py) = (self.ptr(&x.data), self.ptr(&d), self.ptr(&y.data));
        let mut args = [
            arg(&n),
            arg(&kk),
            arg(&a),
            arg(&px),
            arg(&pxp),
            arg(&pb),
            arg(&py),
            arg(&pyp),
        ];
        self.block_elementwise(&self.k.block_axpby, x.len(), x.k, &mut args)?;
        y.pending = None;
        Ok(())
    }
    fn block_lsqr_update(
        &self,
        steps: &[XwStep],
        v: &CudaBlock,
        (x, w): (&mut CudaBlock, &mut CudaBlock),
        var: Option<&mut CudaBlock>,
        out: &mut [f64],
    ) -> Result<()> {
        let (rows, k) = (v.rows, v.k);
        check_shape("block update x", x, rows, k)?;
        check_shape("block update w", w, rows, k)?;
        check::one_per_column("block update", steps.len(), k)?;
        check::one_per_column("block update", out.len(), k)?;
        if let Some(vr) = var.as_deref() {
            check_shape("block update var", vr, rows, k)?;
        }
        // (x, w and var are never scaled in LSQR; v's scale is formed as it is read)
        self.settle(x)?;
        self.settle(w)?;
        let mut var = var;
        if let Some(vr) = var.as_deref_mut() {
            self.settle(vr)?;
        }
        if v.len() == 0 {
            out.iter_mut().for_each(|o| *o = 0.0);
            return Ok(());
        }
        let mut c = Vec::with_capacity(3 * k);
        c.extend(steps.iter().map(|s| s.t1));
        c.extend(steps.iter().map(|s| s.t2));
        c.extend(steps.iter().map(|s| s.inv_rho));
        let d = up(self, &c)?;
        let n = v.len() as u64;
        let kk = k as i32;
        let (px, pw, pv) = (self.ptr(&x.data), self.ptr(&w.data), self.ptr(&v.data));
        let pvar = var.map_or(0, |vr| self.ptr(&vr.data));
        let pc = self.ptr(&d);
        let vp = self.pending_of(v)?;
        let pvp = self.pending_ptr(&vp);
        self.column_sums(v.len(), k, out, |grid, threads, smem, pp| {
            let mut args = [
                arg(&n),
                arg(&kk),
                arg(&px),
                arg(&pw),
                arg(&pv),
                arg(&pvp),
                arg(&pvar),
                arg(&pc),
                arg(&pp),
            ];
            self.launch_smem(&self.k.block_update, grid, threads, smem, &mut args)
        })
    }
    fn block_allreduce_sum(&self, comm: &dyn Comm, x: &mut CudaBlock) -> Result<()> {
        self.settle(x)?;
        if x.len() == 0 {
            return Ok(());
        }
        self.allreduce_sum(comm, &mut x.data)
    }
}

impl CudaBackend {
    /// Column j of `x` into `col` (`to_block`: from `col` into the block; the caller holds the
    /// block mutably then).
    fn column_copy(
        &self,
        x: &CudaBlock,
        j: usize,
        col: &mut DeviceVec,
        to_block: bool,
    ) -> Result<()> {
        if x.rows == 0 {
            return Ok(());
        }
        let rows = x.rows as u64;
        let (kk, jj, tb) = (x.k as i32, j as i32, i32::from(to_block));
        let (pb, pc) = (self.ptr(&x.data), self.ptr(col));
        let mut args = [arg(&rows), arg(&kk), arg(&jj), arg(&tb), arg(&pb), arg(&pc)];
        self.launch_elementwise(&self.k.block_column, x.rows, &mut args)
    }
}

/// The weighted rows R (or their transpose) on the device in CSR: offsets, columns and f64
/// values (member j's entry `a w_j` is formed in the kernels, as its own solve stores it).
struct Part {
    ptr: CudaSlice<u64>,
    cols: CudaSlice<u32>,
    vals: CudaSlice<f64>,
    nnz: usize,
}

impl Part {
    fn upload(be: &CudaBackend, a: &Csr) -> Result<Part> {
        Ok(Part {
            ptr: up(be, a.indptr())?,
            cols: up(be, a.indices())?,
            vals: up(be, a.data())?,
            nnz: a.nnz(),
        })
    }

    /// The device addresses of the offsets, columns and values; zeros for no part.
    fn ptrs(be: &CudaBackend, p: Option<&Part>) -> (u64, u64, u64) {
        p.map_or((0, 0, 0), |p| {
            (be.ptr(&p.ptr), be.ptr(&p.cols), be.ptr(&p.vals))
        })
    }
}

/// Members one block of A X's tile kernel serves at most (kernels/batch.cu BT_KB): a batch of
/// more takes one block per chunk and group of members.
const BT_KB: usize = 16;
/// Members one block of A^T Y's tile kernel serves at most (kernels/batch.cu BT_KBT).
const BT_KBT: usize = 16;
/// Segments a chunk of A^T Y's tiles holds at most: a block stages Y on them for up to
/// [`BT_KBT`] members (64 KiB). A X's chunks hold the single solve's 2048 (its block stages X on
/// the tile, whatever the segments).
const BT_CHUNK_SEGS_AT: usize = 512;
/// The tiles: 2^9 columns, so a block of A X stages at most 512 x [`BT_KB`] values of X
/// (64 KiB).
const BT_TILE_BITS: u32 = 9;
/// The largest shared memory a block of `bt_axf` asks for (bytes).
const BT_SMEM_AX: usize = (1 << BT_TILE_BITS) * BT_KB * 8;
/// The largest a block of `bt_atu` asks for: Y on a chunk's segments (bytes).
const BT_SMEM_AT: usize = BT_CHUNK_SEGS_AT * BT_KBT * 8;

/// Threads a block of the batch's second passes (`bt_rows`, `bt_cols`).
const BT_THREADS: u32 = 256;
/// Threads a block of the tile kernels (`bt_axf`, `bt_atu`) serving more than 8 members: their
/// shared memory (more than 32 KiB a block) lets only three blocks share an SM, so a block is
/// twice the size (kernels/batch.cu BT_TILE_THREADS, the most); 8 members or fewer take
/// [`BT_THREADS`]. 101M-nonzero system, f32, k = 16 (H100): A X 3.73 -> 3.63 ms, A^T Y 4.29 ->
/// 3.02; k = 1 and 8 were as fast or faster with 256.
const BT_TILE_THREADS: u32 = 512;

/// Threads a block of the tile kernels for a group of `kb` members.
fn tile_threads(kb: usize) -> u32 {
    if kb > 8 {
        BT_TILE_THREADS
    } else {
        BT_THREADS
    }
}

/// G, the unweighted rows, in column tiles of 2^[`BT_TILE_BITS`] columns ([`Tiled`]: the row
/// entries in chunks of up to 2048 segments, the column entries in chunks of up to
/// [`BT_CHUNK_SEGS_AT`]) on the device, for the block products (kernels/batch.cu `bt_axf` and
/// `bt_rows` for A X, `bt_atu` and `bt_cols` for A^T Y).
struct BlockTiles {
    nrows: usize,
    ncols: usize,
    nnz: usize,
    nseg: usize,
    /// A X's chunks: their count, tiles and first segments.
    nchunks: usize,
    chunk_tile: CudaSlice<u32>,
    chunk_seg: CudaSlice<u32>,
    /// A^T Y's chunks: their count, first segments, each tile's first chunk, and the row of
    /// each segment.
    nchunks_t: usize,
    chunk_seg_t: CudaSlice<u32>,
    tile_chunk: CudaSlice<u32>,
    seg_row: CudaSlice<u32>,
    seg_ent: CudaSlice<u64>,
    row_seg: CudaSlice<u64>,
    seg_pos: CudaSlice<u32>,
    lcol: CudaSlice<u16>,
    vals: DevValues,
    colptr: CudaSlice<u64>,
    lseg: CudaSlice<u16>,
    cvals: DevValues,
    /// The segment sums of A X (nseg x k values) and the chunk column sums of A^T Y
    /// (nchunks x tile x k), grown where a product has more members: kept, as a new
    /// allocation every product cost more than the product (the memory pool hands memory
    /// back at each synchronisation).
    scratch: std::sync::Mutex<[Option<CudaSlice<f64>>; 2]>,
}

/// Blocks of a grid-stride kernel that gives `items` a group of min(k, 32) lanes each.
fn group_grid(be: &CudaBackend, items: usize, k: usize) -> u32 {
    let per_block = (BT_THREADS as usize / 32) * (32 / k.clamp(1, 32));
    let needed = items.div_ceil(per_block).max(1);
    (be.info.multiprocessors.max(1) as usize * 16).min(needed) as u32
}

impl BlockTiles {
    fn upload(be: &CudaBackend, g: &Csr, precision: Precision) -> Result<BlockTiles> {
        let (t, c) = phases::time("tiles", || {
            rayon::join(
                || Tiled::from_csr_half(g, precision, BT_TILE_BITS, TiledHalf::Rows),
                || {
                    let half = TiledHalf::Cols;
                    Tiled::from_csr_chunked(g, precision, BT_TILE_BITS, half, BT_CHUNK_SEGS_AT)
                },
            )
        });
        let _s = phases::span("upload");
        // The tile kernels stage more than the default 48 KiB a block.
        for (fs, bytes) in [(&be.k.bt_axf, BT_SMEM_AX), (&be.k.bt_atu, BT_SMEM_AT)] {
            for f in fs {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
                .doing("allowing the batch's tile kernels their shared memory")?;
            }
        }
        let tiles = BlockTiles {
            nrows: t.nrows,
            ncols: t.ncols,
            nnz: t.nnz,
            nseg: t.nseg(),
            nchunks: t.nchunks(),
            chunk_tile: up(be, &t.chunk_tile)?,
            chunk_seg: up(be, &t.chunk_seg)?,
            nchunks_t: c.nchunks(),
            chunk_seg_t: up(be, &c.chunk_seg)?,
            tile_chunk: up(be, &c.tile_chunk)?,
            seg_row: up(be, &c.seg_row)?,
            seg_ent: up(be, &t.seg_ent)?,
            row_seg: up(be, &t.row_seg)?,
            seg_pos: up(be, &t.seg_pos)?,
            // the row entries padded as the flat kernel's 16-byte loads read them
            lcol: up_padded(be, true, &t.a_lcol, true)?,
            vals: values(be, true, &t.a_val, true)?,
            colptr: up(be, &c.b_colptr)?,
            lseg: up(be, &c.b_lseg)?,
            cvals: values(be, true, &c.b_val, false)?,
            scratch: std::sync::Mutex::new([None, None]),
        };
        // the host's tiles (both halves: gigabytes) dropped on a thread of their own
        crate::sparse::par::drop_in_background((t, c));
        Ok(tiles)
    }

    /// Scratch `which` (0: segment sums, 1: chunk column sums) of at least `len` values, its
    /// device address.
    fn scratch(&self, be: &CudaBackend, which: usize, len: usize) -> Result<u64> {
        let mut s = self
            .scratch
            .lock()
            .map_err(|_| Error::backend("cuda", "the batch's scratch was poisoned"))?;
        let slot = &mut s[which];
        if slot.as_ref().is_none_or(|p| p.len() < len) {
            *slot = None;
            // SAFETY: the tile kernels write every value a product reads from it before the
            // second pass reads it.
            *slot = Some(
                unsafe { be.stream.alloc::<f64>(len.max(1)) }
                    .doing("allocating the batch's tile sums")?,
            );
        }
        Ok(slot.as_ref().map_or(0, |p| be.ptr(p)))
    }

    /// Launch a tile kernel: a block per chunk and group of at most `kb` members
    /// ([`Self::chunk_grid`]), [`tile_threads`] threads a block, `smem` bytes of shared memory.
    fn launch_tiles(
        be: &CudaBackend,
        f: &cudarc::driver::CudaFunction,
        (nchunks, k, kb): (usize, usize, usize),
        smem: usize,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        let grid = Self::chunk_grid(nchunks, k, kb)?;
        be.launch_smem(f, grid, tile_threads(k.min(kb)), smem as u32, args)
    }

    /// The grid of a tile kernel: a block per chunk (of `nchunks`) and group of `kb` members.
    fn chunk_grid(nchunks: usize, k: usize, kb: usize) -> Result<u32> {
        u32::try_from(nchunks * k.div_ceil(kb)).map_err(|_| {
            Error::Invalid(format!(
                "a GPU batch of {k} members on {nchunks} tile chunks needs too many blocks"
            ))
        })
    }

    /// `out_j = alpha (G + w_j R) in_j + beta_j out_j` (`Side::A`; `r`: R's rows in CSR) or
    /// `alpha (G + w_j R)^T in_j + beta_j out_j` (`Side::At`; `r`: R^T's rows): G's sums per
    /// tile chunk, then per row (column) their sum in tile (chunk) order and R's entries.
    fn product(
        &self,
        be: &CudaBackend,
        side: Side,
        r: Option<&Part>,
        BlockScale { w, alpha, beta }: BlockScale,
        input: &CudaBlock,
        out: &mut CudaBlock,
    ) -> Result<()> {
        let k = input.k;
        let (ni, no) = match side {
            Side::A => (self.ncols, self.nrows),
            Side::At => (self.nrows, self.ncols),
        };
        check_shape("block product input", input, ni, k)?;
        check_shape("block product output", out, no, k)?;
        if beta.len() != k || (r.is_some() && w.len() != k) {
            return Err(Error::Invalid(format!(
                "block product: {} betas and {} weights for {k} members",
                beta.len(),
                w.len()
            )));
        }
        if k == 0 || no == 0 {
            return Ok(());
        }
        let kk = k as i32;
        let bits = BT_TILE_BITS;
        let (pin, pout) = (be.ptr(&input.data), be.ptr(&out.data));
        // the blocks' pending scales, formed as the kernels read the values
        let (ip, op) = (be.pending_of(input)?, be.pending_of(out)?);
        let (pip, pop) = (be.pending_ptr(&ip), be.pending_ptr(&op));
        let tile = 1usize << bits;
        // the first pass: G's sums per segment (A) or per chunk and column (A^T)
        let (vi, sums) = match side {
            Side::A => {
                let (vi, pv) = self.vals.index_and_ptr(be);
                let sums = self.scratch(be, 0, self.nseg * k)?;
                if self.nseg > 0 {
                    let ncols = self.ncols as u64;
                    let (pt, pcs) = (be.ptr(&self.chunk_tile), be.ptr(&self.chunk_seg));
                    let (pe, pl) = (be.ptr(&self.seg_ent), be.ptr(&self.lcol));
                    let mut args = [
                        arg(&kk),
                        arg(&bits),
                        arg(&ncols),
                        arg(&pt),
                        arg(&pcs),
                        arg(&pe),
                        arg(&pl),
                        arg(&pv),
                        arg(&pin),
                        arg(&pip),
                        arg(&sums),
                    ];
                    let smem = tile * k.min(BT_KB) * 8;
                    let f = &be.k.bt_axf[vi];
                    Self::launch_tiles(be, f, (self.nchunks, k, BT_KB), smem, &mut args)?;
                }
                (vi, sums)
            }
            Side::At => {
                let (vi, pv) = self.cvals.index_and_ptr(be);
                let sums = self.scratch(be, 1, self.nchunks_t * tile * k)?;
                if self.nchunks_t > 0 {
                    let (pcs, psr) = (be.ptr(&self.chunk_seg_t), be.ptr(&self.seg_row));
                    let (pc, pl) = (be.ptr(&self.colptr), be.ptr(&self.lseg));
                    let mut args = [
                        arg(&kk),
                        arg(&bits),
                        arg(&pcs),
                        arg(&psr),
                        arg(&pc),
                        arg(&pl),
                        arg(&pv),
                        arg(&pin),
                        arg(&pip),
                        arg(&sums),
                    ];
                    let smem = BT_CHUNK_SEGS_AT * k.min(BT_KBT) * 8;
                    let f = &be.k.bt_atu[vi];
                    Self::launch_tiles(be, f, (self.nchunks_t, k, BT_KBT), smem, &mut args)?;
                }
                (vi, sums)
            }
        };
        // the second pass: each output row's sums, R's entries and the epilogue
        let db = up(be, beta)?;
        let dw = match r {
            Some(_) => Some(up(be, w)?),
            None => None,
        };
        let (prp, prc, prv) = Part::ptrs(be, r);
        let pw = dw.as_ref().map_or(0, |d| be.ptr(d));
        let pb = be.ptr(&db);
        let nout = no as u32;
        let grid = group_grid(be, no, k);
        // (the second pass's own tables: the rows' segments or the tiles' chunks)
        let (prs, psp) = (be.ptr(&self.row_seg), be.ptr(&self.seg_pos));
        let ptc = be.ptr(&self.tile_chunk);
        let (f, t0, t1) = match side {
            Side::A => (&be.k.bt_rows[vi], arg(&prs), arg(&psp)),
            Side::At => (&be.k.bt_cols[vi], arg(&bits), arg(&ptc)),
        };
        let mut args = [
            arg(&nout),
            arg(&kk),
            t0,
            t1,
            arg(&sums),
            arg(&prp),
            arg(&prc),
            arg(&prv),
            arg(&pin),
            arg(&pip),
            arg(&pout),
            arg(&pop),
            arg(&alpha),
            arg(&pb),
            arg(&pw),
        ];
        be.launch(f, grid, BT_THREADS, &mut args)?;
        out.pending = None;
        Ok(())
    }
}

/// A CSR matrix applied to blocks on the GPU, rows flagged as weighted taking member j's
/// weight (module documentation).
pub struct CudaBlockOperator {
    /// G (the unweighted rows) in column tiles.
    tiles: BlockTiles,
    /// R (the weighted rows) and R^T in CSR; None: no weighted rows.
    r: Option<(Part, Part)>,
    precision: Precision,
    /// The rows as given (a handed-over member's own matrix, [`BlockOperator::member_matrix`]).
    host: Csr,
    row_class: Option<Vec<u8>>,
}

/// `a`'s rows where `keep(row)` holds, the others empty (same shape); the rows copied in
/// parallel blocks (one after another it took 1.6 s for the 92M entries of the 600k-ray
/// dataset's rays).
fn rows_where(a: &Csr, keep: impl Fn(usize) -> bool + Sync) -> Csr {
    use crate::sparse::par;
    use rayon::prelude::*;
    let (m, ip) = (a.nrows(), a.indptr());
    let lens: Vec<u64> = (0..m)
        .into_par_iter()
        .with_min_len(4096)
        .map(|r| if keep(r) { ip[r + 1] - ip[r] } else { 0 })
        .collect();
    let ptr = par::offsets(&lens);
    drop(lens);
    let nnz = ptr[m] as usize;
    let (mut cols, mut vals) = (vec![0u32; nnz], vec![0.0f64; nnz]);
    let bounds = par::row_blocks(&ptr, par::blocks_for(nnz + m, 4));
    par::split_rows(&mut cols, &ptr, &bounds)
        .into_par_iter()
        .zip(par::split_rows(&mut vals, &ptr, &bounds))
        .zip(bounds.par_windows(2))
        .for_each(|((cs, vs), w)| {
            let mut at = 0;
            for r in (w[0]..w[1]).filter(|&r| keep(r)) {
                let (c, v) = a.row(r);
                cs[at..at + c.len()].copy_from_slice(c);
                vs[at..at + c.len()].copy_from_slice(v);
                at += c.len();
            }
        });
    Csr::from_trusted(m, a.ncols(), ptr, cols, vals)
}

impl CudaBlockOperator {
    /// `a` on the device with the rows where `weighted[r]` is true weighted per member (None:
    /// no weighted rows), its unweighted values stored in `precision`.
    pub fn new(
        be: &CudaBackend,
        a: Csr,
        weighted: Option<Vec<bool>>,
        precision: Precision,
    ) -> Result<Self> {
        check_row_numbers(a.nrows())?;
        check_row_numbers(a.ncols())?;
        if let Some(w) = &weighted {
            if w.len() != a.nrows() {
                return Err(Error::Invalid(format!(
                    "{} row weights flags for {} rows",
                    w.len(),
                    a.nrows()
                )));
            }
        }
        let weighted = weighted.filter(|w| w.iter().any(|&b| b));
        let (tiles, r) = match &weighted {
            None => (BlockTiles::upload(be, &a, precision)?, None),
            Some(w) => {
                let r = phases::time("split rows", || rows_where(&a, |r| w[r]));
                let rt = phases::time("transpose", || r.transpose());
                let parts = (Part::upload(be, &r)?, Part::upload(be, &rt)?);
                drop((r, rt));
                let g = phases::time("split rows", || rows_where(&a, |r| !w[r]));
                let tiles = BlockTiles::upload(be, &g, precision)?;
                // (a gigabyte at 92M kernel nonzeros: its pages go back on a thread of their own)
                crate::sparse::par::drop_in_background(g);
                (tiles, Some(parts))
            }
        };
        let row_class = weighted.map(|w| w.iter().map(|&b| u8::from(b)).collect());
        be.synchronize()?;
        Ok(CudaBlockOperator {
            tiles,
            r,
            precision,
            host: a,
            row_class,
        })
    }

    /// What the batch stores, in words (report.json's `storage`).
    fn stored(&self) -> String {
        let p = match self.precision {
            Precision::F64 => "f64",
            Precision::F32 => "f32",
        };
        let tile = 1usize << BT_TILE_BITS;
        let nnz = self.tiles.nnz + self.r.as_ref().map_or(0, |(r, _)| r.nnz);
        match &self.r {
            Some((r, _)) => format!(
                "block tiles of {tile} columns ({p} values; {} weighted entries f64 in CSR; {nnz} nonzeros)",
                r.nnz
            ),
            None => format!("block tiles of {tile} columns ({p} values; {nnz} nonzeros)"),
        }
    }
}

impl BlockOperator<CudaBackend> for CudaBlockOperator {
    fn nrows(&self) -> usize {
        self.host.nrows()
    }
    fn ncols(&self) -> usize {
        self.host.ncols()
    }
    fn has_weighted_rows(&self) -> bool {
        self.row_class.is_some()
    }
    fn describe(&self) -> String {
        self.stored()
    }
    fn member_matrix(&self, w: f64) -> Csr {
        weighted_rows(&self.host, self.row_class.as_deref(), w)
    }
    fn apply_block(
        &self,
        be: &CudaBackend,
        side: Side,
        s: BlockScale,
        input: &CudaBlock,
        out: &mut CudaBlock,
    ) -> Result<()> {
        let r = self.r.as_ref().map(|(r, rt)| match side {
            Side::A => r,
            Side::At => rt,
        });
        self.tiles.product(be, side, r, s, input, out)
    }
}
