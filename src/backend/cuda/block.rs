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
//! entries (f64 or f32 values), and R, the weighted rows' entries (always f64: member j's entry
//! `a w_j` is formed, and rounded to f32 in an f32 batch, as its own solve stores it). A X takes
//! G from column tiles ([`BlockTiles`]: the k values of X an entry multiplies come from shared
//! memory) and R from CSR; A^T Y takes both from CSR of their transposes, one warp summing a
//! row for every member at once. Each nonzero is read once for all k (at most [`BT_KB`]
//! members a block in A X's tiles).

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

/// Members a GPU batch holds at most (threads of one kernel block in the column reductions).
pub const MAX_MEMBERS: usize = 1024;

/// `rows x k` values on the device, row-major: entry (i, j) at `i * k + j`.
pub struct CudaBlock {
    data: DeviceVec,
    rows: usize,
    k: usize,
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
        Ok(out)
    }
    fn block_set_column(&self, x: &mut CudaBlock, j: usize, col: &[f64]) -> Result<()> {
        check::set_column(j, col.len(), (x.rows, x.k))?;
        let mut c = up(self, col)?;
        self.column_copy(&*x, j, &mut c, true)
    }
    fn block_keep(&self, x: &mut CudaBlock, keep: &[usize]) -> Result<()> {
        if !check::keep(keep, x.k)? {
            return Ok(());
        }
        let k2 = keep.len();
        let out = self.block_zeros(x.rows, k2)?;
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
        let n = x.len() as u64;
        let (kk, px) = (k as i32, self.ptr(&x.data));
        self.column_sums(x.len(), k, out, |grid, threads, smem, pp| {
            let mut args = [arg(&n), arg(&kk), arg(&px), arg(&pf), arg(&pp)];
            self.launch_smem(&self.k.block_norms, grid, threads, smem, &mut args)
        })
    }
    fn block_scale(&self, x: &mut CudaBlock, a: &[f64]) -> Result<()> {
        check::one_per_column("block scale", a.len(), x.k)?;
        if x.len() == 0 {
            return Ok(());
        }
        let d = up(self, a)?;
        let n = x.len() as u64;
        let (kk, px, pa) = (x.k as i32, self.ptr(&x.data), self.ptr(&d));
        let mut args = [arg(&n), arg(&kk), arg(&px), arg(&pa)];
        self.block_elementwise(&self.k.block_scale, x.len(), x.k, &mut args)
    }
    fn block_axpby(&self, a: f64, x: &CudaBlock, b: &[f64], y: &mut CudaBlock) -> Result<()> {
        check_shape("block axpby", y, x.rows, x.k)?;
        check::one_per_column("block axpby", b.len(), x.k)?;
        if x.len() == 0 {
            return Ok(());
        }
        let d = up(self, b)?;
        let n = x.len() as u64;
        let kk = x.k as i32;
        let (px, pb, py) = (self.ptr(&x.data), self.ptr(&d), self.ptr(&y.data));
        let mut args = [arg(&n), arg(&kk), arg(&a), arg(&px), arg(&pb), arg(&py)];
        self.block_elementwise(&self.k.block_axpby, x.len(), x.k, &mut args)
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
        self.column_sums(v.len(), k, out, |grid, threads, smem, pp| {
            let mut args = [
                arg(&n),
                arg(&kk),
                arg(&px),
                arg(&pw),
                arg(&pv),
                arg(&pvar),
                arg(&pc),
                arg(&pp),
            ];
            self.launch_smem(&self.k.block_update, grid, threads, smem, &mut args)
        })
    }
    fn block_allreduce_sum(&self, comm: &dyn Comm, x: &mut CudaBlock) -> Result<()> {
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

/// One part of a block operator's matrix on the device: CSR offsets, columns and values.
struct Part {
    ptr: CudaSlice<u64>,
    cols: CudaSlice<u32>,
    vals: DevValues,
    nnz: usize,
}

impl Part {
    fn upload(be: &CudaBackend, a: &Csr, precision: Precision) -> Result<Part> {
        let vals = DevValues::of(be, a.data(), precision)?;
        Ok(Part {
            ptr: up(be, a.indptr())?,
            cols: up(be, a.indices())?,
            vals,
            nnz: a.nnz(),
        })
    }
}

/// Rows of at most this many entries are summed by a group of lanes each (kernels/batch.cu
/// `spmm_short`), longer ones by a warp each.
const SHORT_ROW: u64 = 16;

/// One side of the operator (A or A^T): G's part, and R's (None: no weighted rows), and its
/// rows split into long and short ones (None: all long, in order).
struct Sided {
    nrows: usize,
    ncols: usize,
    g: Part,
    r: Option<Part>,
    rows: Option<RowLists>,
}

/// The long and the short rows of a side, in the matrix's order.
struct RowLists {
    long: CudaSlice<u32>,
    nlong: usize,
    short: CudaSlice<u32>,
    nshort: usize,
}

impl Sided {
    /// `g` and `r` (same rows) on the device, the rows sorted into long and short.
    fn new(be: &CudaBackend, g: &Csr, r: Option<&Csr>, precision: Precision) -> Result<Sided> {
        let len = |i: usize| {
            let (gp, rp) = (g.indptr(), r.map(|r| r.indptr()));
            gp[i + 1] - gp[i] + rp.map_or(0, |p| p[i + 1] - p[i])
        };
        let (mut long, mut short) = (Vec::new(), Vec::new());
        for i in 0..g.nrows() {
            if len(i) > SHORT_ROW {
                long.push(i as u32);
            } else {
                short.push(i as u32);
            }
        }
        let rows = if short.is_empty() {
            None
        } else {
            Some(RowLists {
                long: up(be, &long)?,
                nlong: long.len(),
                short: up(be, &short)?,
                nshort: short.len(),
            })
        };
        Ok(Sided {
            nrows: g.nrows(),
            ncols: g.ncols(),
            g: Part::upload(be, g, precision)?,
            r: r.map(|r| Part::upload(be, r, Precision::F64)).transpose()?,
            rows,
        })
    }
}

/// Members one block of A X's tile kernel serves at most (kernels/batch.cu BT_KB): a batch of
/// more takes one block per chunk and group of members.
const BT_KB: usize = 16;
/// A X's tiles: 2^9 columns, so a block stages at most 512 x [`BT_KB`] values of X (64 KiB).
const BT_TILE_BITS: u32 = 9;
/// The largest shared memory a block of `bt_axf` asks for (bytes).
const BT_SMEM: usize = (1 << BT_TILE_BITS) * BT_KB * 8;

/// G, the unweighted rows, in column tiles of 2^[`BT_TILE_BITS`] columns: the row entries of
/// [`Tiled`] (A x's half) on the device, for the block product A X (kernels/batch.cu `bt_axf`,
/// `bt_rows`).
struct BlockTiles {
    nrows: usize,
    ncols: usize,
    nseg: usize,
    nchunks: usize,
    chunk_tile: CudaSlice<u32>,
    chunk_seg: CudaSlice<u32>,
    seg_ent: CudaSlice<u64>,
    row_seg: CudaSlice<u64>,
    seg_pos: CudaSlice<u32>,
    lcol: CudaSlice<u16>,
    vals: DevValues,
    /// The segment sums of the last product (nseg x k values; grown where a product has more
    /// members): kept, as a new allocation every product costs more than the product where the
    /// memory pool hands the memory back at each synchronisation.
    partial: std::sync::Mutex<Option<CudaSlice<f64>>>,
}

impl BlockTiles {
    fn upload(be: &CudaBackend, g: &Csr, precision: Precision) -> Result<BlockTiles> {
        let t = Tiled::from_csr_half(g, precision, BT_TILE_BITS, TiledHalf::Rows);
        // bt_axf stages up to BT_SMEM bytes: more than the default 48 KiB of a block.
        for f in &be.k.bt_axf {
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                BT_SMEM as i32,
            )
            .doing("allowing the batch's tile kernel its shared memory")?;
        }
        Ok(BlockTiles {
            nrows: t.nrows,
            ncols: t.ncols,
            nseg: t.nseg(),
            nchunks: t.nchunks(),
            chunk_tile: up(be, &t.chunk_tile)?,
            chunk_seg: up(be, &t.chunk_seg)?,
            seg_ent: up(be, &t.seg_ent)?,
            row_seg: up(be, &t.row_seg)?,
            seg_pos: up(be, &t.seg_pos)?,
            // the entries padded as the flat kernel's 16-byte loads read them
            lcol: up_padded(be, true, &t.a_lcol, true)?,
            vals: values(be, true, &t.a_val, true)?,
            partial: std::sync::Mutex::new(None),
        })
    }

    /// Y_j = alpha (G + w_j R) X_j + beta_j Y_j: G's segment sums per tile chunk, then per
    /// row their sum in tile order and R's entries (`r`: the weighted rows, None: none).
    fn product(
        &self,
        be: &CudaBackend,
        r: Option<&Part>,
        BlockScale { w, alpha, beta }: BlockScale,
        x: &CudaBlock,
        y: &mut CudaBlock,
    ) -> Result<()> {
        let k = x.k;
        check_shape("block product x", x, self.ncols, k)?;
        check_shape("block product y", y, self.nrows, k)?;
        if beta.len() != k || (r.is_some() && w.len() != k) {
            return Err(Error::Invalid(format!(
                "block product: {} betas and {} weights for {k} members",
                beta.len(),
                w.len()
            )));
        }
        if k == 0 || self.nrows == 0 {
            return Ok(());
        }
        let kk = k as i32;
        let (vi, pv) = self.vals.index_and_ptr(be);
        let (px, py) = (be.ptr(&x.data), be.ptr(&y.data));
        let mut scratch = self
            .partial
            .lock()
            .map_err(|_| Error::backend("cuda", "the batch's segment sums were poisoned"))?;
        let len = (self.nseg * k).max(1);
        if scratch.as_ref().is_none_or(|p| p.len() < len) {
            *scratch = None;
            // SAFETY: bt_axf writes every segment's k sums before bt_rows reads them.
            *scratch = Some(
                unsafe { be.stream.alloc::<f64>(len) }
                    .doing("allocating the batch's segment sums")?,
            );
        }
        let pp = scratch.as_ref().map_or(0, |p| be.ptr(p));
        if self.nseg > 0 {
            let bits = BT_TILE_BITS;
            let ncols = self.ncols as u64;
            let (pt, ps) = (be.ptr(&self.chunk_tile), be.ptr(&self.chunk_seg));
            let (pe, pl) = (be.ptr(&self.seg_ent), be.ptr(&self.lcol));
            let mut args = [
                arg(&kk),
                arg(&bits),
                arg(&ncols),
                arg(&pt),
                arg(&ps),
                arg(&pe),
                arg(&pl),
                arg(&pv),
                arg(&px),
                arg(&pp),
            ];
            let groups = k.div_ceil(BT_KB);
            let grid = u32::try_from(self.nchunks * groups).map_err(|_| {
                Error::Invalid(format!(
                    "a GPU batch of {k} members on {} tile chunks needs too many blocks",
                    self.nchunks
                ))
            })?;
            let smem = ((1usize << bits) * k.min(BT_KB) * 8) as u32;
            be.launch_smem(&be.k.bt_axf[vi], grid, 256, smem, &mut args)?;
        }
        let db = up(be, beta)?;
        let dw = match r {
            Some(_) => Some(up(be, w)?),
            None => None,
        };
        let (prp, prc, prv) = match r {
            Some(r) => (be.ptr(&r.ptr), be.ptr(&r.cols), r.vals.index_and_ptr(be).1),
            None => (0, 0, 0),
        };
        let pw = dw.as_ref().map_or(0, |d| be.ptr(d));
        let pb = be.ptr(&db);
        let nrows = self.nrows as u32;
        let (prs, psp) = (be.ptr(&self.row_seg), be.ptr(&self.seg_pos));
        let mut args = [
            arg(&nrows),
            arg(&kk),
            arg(&prs),
            arg(&psp),
            arg(&pp),
            arg(&prp),
            arg(&prc),
            arg(&prv),
            arg(&px),
            arg(&py),
            arg(&alpha),
            arg(&pb),
            arg(&pw),
        ];
        // a group of min(k, 32) lanes a row
        let rows_per_block = 8 * (32 / k.min(32));
        let needed = self.nrows.div_ceil(rows_per_block).max(1);
        let grid = (be.info.multiprocessors.max(1) as usize * 16).min(needed) as u32;
        be.launch(&be.k.bt_rows[vi], grid, 256, &mut args)
    }
}

/// A CSR matrix applied to blocks on the GPU, rows flagged as weighted taking member j's
/// weight (module documentation).
pub struct CudaBlockOperator {
    /// A X: G in column tiles, R (the weighted rows) in CSR.
    ax: BlockTiles,
    r: Option<Part>,
    at: Sided,
    precision: Precision,
    /// The rows as given (a handed-over member's own matrix, [`BlockOperator::member_matrix`]).
    host: Csr,
    row_class: Option<Vec<u8>>,
}

/// `a`'s rows where `keep(row)` holds, the others empty (same shape).
fn rows_where(a: &Csr, keep: impl Fn(usize) -> bool) -> Csr {
    let mut ptr = Vec::with_capacity(a.nrows() + 1);
    ptr.push(0u64);
    let (mut cols, mut vals) = (Vec::new(), Vec::new());
    for r in 0..a.nrows() {
        if keep(r) {
            let (c, v) = a.row(r);
            cols.extend_from_slice(c);
            vals.extend_from_slice(v);
        }
        ptr.push(cols.len() as u64);
    }
    Csr::from_trusted(a.nrows(), a.ncols(), ptr, cols, vals)
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
        let (ax, r, at_side) = match &weighted {
            None => (
                BlockTiles::upload(be, &a, precision)?,
                None,
                Sided::new(be, &a.transpose(), None, precision)?,
            ),
            Some(w) => {
                let g = rows_where(&a, |r| !w[r]);
                let r = rows_where(&a, |r| w[r]);
                let (gt, rt) = (g.transpose(), r.transpose());
                (
                    BlockTiles::upload(be, &g, precision)?,
                    Some(Part::upload(be, &r, Precision::F64)?),
                    Sided::new(be, &gt, Some(&rt), precision)?,
                )
            }
        };
        let row_class = weighted.map(|w| w.iter().map(|&b| u8::from(b)).collect());
        be.synchronize()?;
        Ok(CudaBlockOperator {
            ax,
            r,
            at: at_side,
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
        let nnz = self.at.g.nnz + self.at.r.as_ref().map_or(0, |r| r.nnz);
        let tiles = 1usize << BT_TILE_BITS;
        match &self.r {
            Some(r) => format!(
                "block tiles of {tiles} columns + block CSR transpose ({p} values; {} weighted entries f64 in CSR; {nnz} nonzeros)",
                r.nnz
            ),
            None => format!("block tiles of {tiles} columns + block CSR transpose ({p} values; {nnz} nonzeros)"),
        }
    }

    fn product(
        &self,
        be: &CudaBackend,
        side: &Sided,
        BlockScale { w, alpha, beta }: BlockScale,
        x: &CudaBlock,
        y: &mut CudaBlock,
    ) -> Result<()> {
        let k = x.k;
        check_shape("block product x", x, side.ncols, k)?;
        check_shape("block product y", y, side.nrows, k)?;
        if beta.len() != k || (side.r.is_some() && w.len() != k) {
            return Err(Error::Invalid(format!(
                "block product: {} betas and {} weights for {k} members",
                beta.len(),
                w.len()
            )));
        }
        if k == 0 || side.nrows == 0 {
            return Ok(());
        }
        let db = up(be, beta)?;
        let dw = match &side.r {
            Some(_) => Some(up(be, w)?),
            None => None,
        };
        let (vi, pgv) = side.g.vals.index_and_ptr(be);
        let (pgp, pgc) = (be.ptr(&side.g.ptr), be.ptr(&side.g.cols));
        let (prp, prc, prv) = match &side.r {
            Some(r) => (be.ptr(&r.ptr), be.ptr(&r.cols), r.vals.index_and_ptr(be).1),
            None => (0, 0, 0),
        };
        let pw = dw.as_ref().map_or(0, |d| be.ptr(d));
        let (px, py, pb) = (be.ptr(&x.data), be.ptr(&y.data), be.ptr(&db));
        let f = if vi == 0 {
            &be.k.block_spmm_f64
        } else {
            &be.k.block_spmm_f32
        };
        let kk = k as i32;
        // lanes a short row takes: one per member, a power of two (k > 16: a warp)
        let gw_short = if k <= 16 {
            k.next_power_of_two() as i32
        } else {
            32
        };
        const THREADS: u32 = 256;
        let grid = (be.info.multiprocessors.max(1) as u32) * 16;
        let run = |nlist: usize, list: u64, gw: i32| -> Result<()> {
            if nlist == 0 {
                return Ok(());
            }
            let n = nlist as u32;
            let mut args = [
                arg(&n),
                arg(&list),
                arg(&kk),
                arg(&gw),
                arg(&pgp),
                arg(&pgc),
                arg(&pgv),
                arg(&prp),
                arg(&prc),
                arg(&prv),
                arg(&px),
                arg(&py),
                arg(&alpha),
                arg(&pb),
                arg(&pw),
            ];
            // blocks that give every row a warp (a lane group) at most
            let needed = nlist.div_ceil(THREADS as usize / gw as usize).max(1);
            be.launch(f, grid.min(needed as u32), THREADS, &mut args)
        };
        match &side.rows {
            None => run(side.nrows, 0, 32),
            Some(l) => {
                run(l.nlong, be.ptr(&l.long), 32)?;
                run(l.nshort, be.ptr(&l.short), gw_short)
            }
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
        match side {
            Side::A => self.ax.product(be, self.r.as_ref(), s, input, out),
            Side::At => self.product(be, &self.at, s, input, out),
        }
    }
}
