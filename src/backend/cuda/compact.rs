//! Compact storage on the GPU (kernels/compact.cu): stored rows with 16-bit column deltas and
//! their explicit transpose in the same form, grid damping rows as stencils, and the fused
//! products the device-resident LSQR loop (lsqr_loop.rs) runs.

use cudarc::driver::CudaSlice;

use super::backend::{CudaBackend, DeviceVec};
use super::encode;
use super::lsqr_loop::{Epilogue, FusedLsqr, LoopSlot};
use super::operator::MemoryPlan;
use super::stencil::{stencil_parts, DevStencil, StencilArgs};
use super::tiled::DevTiled;
use super::util::{
    arg, check_row_numbers, check_vectors, fused_entries_per_block, up, width_index, DevValues,
};
use crate::backend::lsmr::LsmrDevice;
use crate::backend::lsqr::LsqrDevice;
use crate::backend::storage::{DeviceEncoding, EncodedRows, EncodingKey, ReorderedRows};
use crate::backend::{Operator, Precision, Scale, TransposeStrategy};
use crate::error::{Error, Result};
use crate::grid::StencilOp;
use crate::settings::tuning::{GpuLayout, Tuning};
use crate::sparse::tiled::{Tiled, TiledHalf};
use crate::sparse::{CompactCsr, Csr};
use crate::ui::phases;

/// Warps per block of the compact kernels (kernels/compact.cu CWARPS).
const CWARPS: u32 = 8;

/// Default tile size: 2^9 columns (512 cells, an 8x8x8 brick in Morton order).
const TILE_BITS: u32 = 9;
/// Default tile size of A x in the split layout: 2^12 columns (4096 cells, a 16x16x16 brick).
const AX_TILE_BITS: u32 = 12;

/// The sub-warp width and rows per sub-warp for rows of `mean` entries on average, where the
/// tuning (`compact_s`, `compact_r`: `s`, `r`) does not fix them.
fn launch_shape(mean: f64, entries: usize, s: Option<u32>, r: Option<u32>) -> (u32, u32) {
    let s = s.unwrap_or_else(|| {
        let target = (mean / 4.0).max(1.0);
        let mut s = 4u32;
        while s < 32 && (2 * s) as f64 <= target {
            s *= 2;
        }
        s
    });
    let g = 32 / s;
    let r = r.unwrap_or_else(|| {
        (fused_entries_per_block(entries) / (mean.max(1.0) * (CWARPS * g) as f64))
            .round()
            .clamp(1.0, 64.0) as u32
    });
    (s, r.max(1))
}

/// Compact rows on the device.
pub(crate) struct DevCompact {
    nrows: usize,
    entries: usize,
    ptr: CudaSlice<u64>,
    base: CudaSlice<u32>,
    delta: CudaSlice<u16>,
    values: DevValues,
    s: u32,
    rows_per_sub: u32,
    blocks: u32,
}

impl DevCompact {
    /// Upload `c` with the launch shape of the tuning `o` (validated) or chosen from `c`.
    fn upload(be: &CudaBackend, c: &CompactCsr, o: &Tuning) -> Result<Self> {
        check_row_numbers(c.nrows())?;
        let mean = c.entries() as f64 / c.nrows().max(1) as f64;
        let (s, rows_per_sub) = launch_shape(mean, c.entries(), o.compact_s, o.compact_r);
        let rows_per_block = (CWARPS * (32 / s) * rows_per_sub) as usize;
        let values = DevValues::upload(be, c.values())?;
        Ok(DevCompact {
            nrows: c.nrows(),
            entries: c.entries(),
            ptr: up(be, c.ptr())?,
            base: up(be, c.base())?,
            delta: up(be, c.delta())?,
            values,
            s,
            rows_per_sub,
            blocks: c.nrows().div_ceil(rows_per_block) as u32,
        })
    }

    /// y = a A x + b y with the epilogue `e`; with `st`, the stencil's transposed terms from
    /// `yd` are added.
    fn launch(
        &self,
        be: &CudaBackend,
        x: u64,
        y: u64,
        e: &Epilogue,
        st: Option<(&StencilArgs, u64)>,
    ) -> Result<()> {
        let (pi, pv) = self.values.index_and_ptr(be);
        let (stt, sargs, yd) = stencil_parts(st);
        let f = &be.k.compact[stt as usize][pi][width_index(self.s)];
        let nrows = self.nrows as u32;
        let (pp, pb, pd) = (be.ptr(&self.ptr), be.ptr(&self.base), be.ptr(&self.delta));
        let lead = [
            arg(&nrows),
            arg(&self.rows_per_sub),
            arg(&pp),
            arg(&pb),
            arg(&pd),
            arg(&pv),
            arg(&x),
            arg(&y),
        ];
        let grid = (self.blocks, CWARPS * 32);
        e.launch(be, f, grid, &lead, &[arg(&sargs), arg(&yd)])
    }
}

/// Device bytes of compact storage: both compact copies, the stencil tables, LSQR's vectors.
fn compact_plan(
    (nrows, ncols): (usize, usize),
    matrix_bytes: u64,
    precision: Precision,
    stencil: Option<&StencilOp>,
    free_bytes: u64,
) -> MemoryPlan {
    let (m, n) = (
        (nrows + stencil.map_or(0, |s| s.nrows())) as u64,
        ncols as u64,
    );
    let matrix_bytes = matrix_bytes + stencil.map_or(0, |s| 8 * s.ncols() as u64);
    MemoryPlan::of(
        TransposeStrategy::Csc,
        precision,
        matrix_bytes,
        (m, n),
        free_bytes,
    )
}

/// [`compact_plan`] of a `shape` = (rows, columns, nonzeros) system, or the error that says
/// why it does not fit.
fn fitting_plan(
    (nrows, ncols, nnz): (usize, usize, usize),
    matrix_bytes: u64,
    precision: Precision,
    stencil: Option<&StencilOp>,
    free_bytes: u64,
) -> Result<MemoryPlan> {
    let plan = compact_plan((nrows, ncols), matrix_bytes, precision, stencil, free_bytes);
    if plan.fits() {
        return Ok(plan);
    }
    Err(Error::backend(
        "cuda",
        format!(
            "the system ({nrows} x {ncols}, {nnz} nonzeros) does not fit on the GPU with compact storage: {plan}; try --storage csr --transpose scatter, or more MPI ranks"
        ),
    ))
}

/// How compact storage is laid out on the device.
enum Layout {
    /// Rows with 16-bit deltas and their transpose in the same form (a gather per nonzero).
    Rows {
        a: Box<DevCompact>,
        at: Box<DevCompact>,
    },
    /// Column tiles (x or y staged in shared memory per tile; src/sparse/tiled.rs).
    Tiles(Box<DevTiled>),
    /// Delta rows for A x, column tiles for A^T y (each product in the layout that measured
    /// fastest for it on the 100.8M-nonzero system, docs/gpu.md).
    Mixed {
        a: Box<DevCompact>,
        t: Box<DevTiled>,
    },
    /// Column tiles for both products, each of its own size (A x: large tiles, few segments
    /// per row; A^T: tiles whose column partials stay few).
    Split {
        ax: Box<DevTiled>,
        at: Box<DevTiled>,
    },
}

/// Nonzeros from which a matrix is bound by its gathers (below: the rows layout).
const SPLIT_MIN_NNZ: usize = 1_000_000;

/// [`choose_layout`]'s rule for a matrix of `nnz` nonzeros in `segs` segments (one per tile of
/// A^T's size a row touches): split from [`SPLIT_MIN_NNZ`] nonzeros and 4 nonzeros a segment.
fn split_by_segments(nnz: usize, segs: u64) -> bool {
    nnz >= SPLIT_MIN_NNZ && nnz as u64 >= 4 * segs
}

/// Whether the tuning lets the GPU encode `rows` (`gpu_encode`, default true) and its working
/// memory fits in the device's free memory now.
fn gpu_may_encode(be: &CudaBackend, rows: &Csr, o: &Tuning) -> Result<bool> {
    Ok(o.gpu_encode != Some(false) && encode::fits(rows, be.mem_info()?.0 as u64))
}

/// The device layout for `stored` where the tuning (`gpu_layout`) does not fix it: split
/// (tiles of 2^12 columns for A x, of 2^tile_bits for A^T) when the matrix is large enough to
/// be bound by its gathers (>= 1M nonzeros) and its rows have on average at least 4 nonzeros
/// per tile of 2^tile_bits they touch; else rows.
fn choose_layout(stored: &Csr, tile_bits: u32) -> GpuLayout {
    if stored.nnz() < SPLIT_MIN_NNZ {
        return GpuLayout::Rows;
    }
    use rayon::prelude::*;
    // segments counted per row in parallel (an integer sum: the same in any order)
    let (ip, ci) = (stored.indptr(), stored.indices());
    let segs_of = |r: usize| {
        let (a, b) = (ip[r] as usize, ip[r + 1] as usize);
        let mut segs = 0u64;
        for j in a..b {
            if j == a || ci[j] >> tile_bits != ci[j - 1] >> tile_bits {
                segs += 1;
            }
        }
        segs
    };
    let segs: u64 = (0..stored.nrows())
        .into_par_iter()
        .with_min_len(1024)
        .map(segs_of)
        .sum();
    if split_by_segments(stored.nnz(), segs) {
        GpuLayout::Split
    } else {
        GpuLayout::Rows
    }
}

/// What an encoding made ahead must be for a run with values in `precision` and the tuning
/// `o` to use it: None where the tuning asks for a device layout other than split (only split
/// is made ahead).
pub fn encoding_key(precision: Precision, o: &Tuning) -> Option<EncodingKey> {
    match o.gpu_layout {
        None | Some(GpuLayout::Split) => Some(EncodingKey {
            precision,
            tile_bits: o.tile_bits.unwrap_or(TILE_BITS),
            ax_tile_bits: o.ax_tile_bits.unwrap_or(AX_TILE_BITS),
        }),
        Some(_) => None,
    }
}

/// The split layout's tiles of `stored`, encoded as [`CudaCompactOperator::with_options`]
/// would encode them (the same arrays), where it would choose that layout; None where it would
/// choose another (the encoding is then left to the run). CPU work only: `seistomo prepare`
/// makes it without a GPU.
pub fn encode_ahead(stored: &Csr, precision: Precision, o: &Tuning) -> Option<DeviceEncoding> {
    let key = encoding_key(precision, o)?;
    let layout = o
        .gpu_layout
        .unwrap_or_else(|| choose_layout(stored, key.tile_bits));
    if layout != GpuLayout::Split {
        return None;
    }
    let (ax, at) = rayon::join(
        || Tiled::from_csr_half(stored, precision, key.ax_tile_bits, TiledHalf::Rows),
        || Tiled::from_csr_half(stored, precision, key.tile_bits, TiledHalf::Cols),
    );
    Some(DeviceEncoding { key, ax, at })
}

/// What the GPU made of rows on the host ([`split_on_device`]).
enum OnDevice {
    /// The split layout's operator, its rule counted and both halves encoded on the device.
    Made(Box<CudaCompactOperator>),
    /// The layout the rule chose where the device does not make it: rows (by the segments it
    /// counted), or split where its counts exceed the encoder's 32-bit positions (the CPU
    /// encodes).
    Chose(GpuLayout),
    /// Not tried: the tuning asks for another layout or `gpu_encode = false`, the matrix is
    /// small (rows), or the encoder's working memory does not fit.
    Not,
}

/// The split layout of `stored`'s rows made on the GPU from the rows uploaded once (a prepared
/// run's rows; [`CudaCompactOperator::from_reordered`]'s rows still to reorder, which
/// `then` permutes on the device once they are there): where the tuning does not fix the
/// layout, its rule (segments per tile of A^T) counted there instead of [`choose_layout`]'s
/// pass over the rows on the host (0.023 s at 101M nonzeros), then both halves encoded there.
/// Phases `upload` (the CSR rows), `layout` and `gpu_encode`.
fn split_on_device(
    be: &CudaBackend,
    stored: &Csr,
    (stencil, precision, o): (Option<&StencilOp>, Precision, &Tuning),
    then: &mut dyn FnMut(encode::DevRows) -> Result<encode::DevRows>,
) -> Result<OnDevice> {
    let split = matches!(o.gpu_layout, None | Some(GpuLayout::Split));
    // choose_layout's rule: split from SPLIT_MIN_NNZ nonzeros (then by segments, below)
    let large = o.gpu_layout.is_some() || stored.nnz() >= SPLIT_MIN_NNZ;
    if !split || !large || !gpu_may_encode(be, stored, o)? {
        return Ok(OnDevice::Not);
    }
    let free = be.mem_info()?.0 as u64;
    let bits = o.tile_bits.unwrap_or(TILE_BITS);
    let xbits = o.ax_tile_bits.unwrap_or(AX_TILE_BITS);
    let rows = phases::time("upload", || encode::DevRows::upload(be, stored))?;
    let rows = then(rows)?;
    if o.gpu_layout.is_none() {
        let segs = phases::time("layout", || encode::segments(be, &rows, bits))?;
        if !split_by_segments(stored.nnz(), segs) {
            return Ok(OnDevice::Chose(GpuLayout::Rows));
        }
    }
    match encode_split(be, &rows, precision, (xbits, bits))? {
        Some(made) => {
            drop(rows);
            CudaCompactOperator::from_split(be, made, stencil, precision, o, free)
                .map(|op| OnDevice::Made(Box::new(op)))
        }
        None => Ok(OnDevice::Chose(GpuLayout::Split)),
    }
}

/// Both halves of the split layout encoded from rows on the device (phase `gpu_encode`); None
/// where their counts exceed the encoder's 32-bit positions.
fn encode_split(
    be: &CudaBackend,
    rows: &encode::DevRows,
    precision: Precision,
    (xbits, bits): (u32, u32),
) -> Result<Option<(encode::Encoded, encode::Encoded)>> {
    let made = phases::time("gpu_encode", || {
        let ax = encode::encode(be, rows, precision, xbits, TiledHalf::Rows)?;
        let at = encode::encode(be, rows, precision, bits, TiledHalf::Cols)?;
        be.synchronize()?;
        Ok((ax, at))
    });
    match made {
        // counts beyond the encoder's 32-bit positions: the CPU encodes
        Err(Error::Invalid(_)) => Ok(None),
        made => made.map(Some),
    }
}

/// Where a compact operator's rows come from: CSR rows to encode, or an encoding made ahead.
#[derive(Clone, Copy)]
enum Source<'a> {
    Rows(&'a Csr),
    Ahead(&'a EncodedRows),
}

/// LSQR's operator on one GPU with compact storage: [stored rows; stencil rows].
pub struct CudaCompactOperator {
    layout: Layout,
    stencil: Option<DevStencil>,
    m_stored: usize,
    ncols: usize,
    nnz: usize,
    plan: MemoryPlan,
    device_loop: LoopSlot,
}

impl CudaCompactOperator {
    /// Encode `stored` (values rounded to `precision`) and its transpose, upload both and the
    /// stencil. Fails with the numbers when they do not fit in free device memory.
    pub fn new(
        be: &CudaBackend,
        stored: &Csr,
        stencil: Option<&StencilOp>,
        precision: Precision,
    ) -> Result<Self> {
        Self::with_options(be, stored, stencil, precision, &Tuning::default())
    }

    /// [`CudaCompactOperator::new`] with the tuning `o`: its layout, tile sizes and launch
    /// shapes, and the device LSQR loop's block (checked first: [`Tuning::validate`]). The
    /// kernels' defines must be the backend's ([`CudaBackend::with_defines`] compiles them).
    pub fn with_options(
        be: &CudaBackend,
        stored: &Csr,
        stencil: Option<&StencilOp>,
        precision: Precision,
        o: &Tuning,
    ) -> Result<Self> {
        Self::build(be, Source::Rows(stored), stencil, precision, o)
    }

    /// The operator of rows whose split-layout encoding was made ahead ([`encode_ahead`], kept
    /// in prepared storage): uploaded as it is, nothing encoded. The encoding must be the one
    /// this run would make ([`encoding_key`] of `precision` and `o`), else an error.
    pub fn from_encoded(
        be: &CudaBackend,
        rows: &EncodedRows,
        stencil: Option<&StencilOp>,
        precision: Precision,
        o: &Tuning,
    ) -> Result<Self> {
        if encoding_key(precision, o) != Some(rows.encoding.key) {
            return Err(Error::Invalid(format!(
                "the encoding made ahead ({:?}) is not what this run asks for ({precision} values, tuning {:?} / {:?} / {:?})",
                rows.encoding.key, o.gpu_layout, o.tile_bits, o.ax_tile_bits
            )));
        }
        Self::build(be, Source::Ahead(rows), stencil, precision, o)
    }

    fn build(
        be: &CudaBackend,
        src: Source,
        stencil: Option<&StencilOp>,
        precision: Precision,
        o: &Tuning,
    ) -> Result<Self> {
        o.validate()?;
        be.check_compiled_with(&o.nvrtc_defines)?;
        let bits = o.tile_bits.unwrap_or(TILE_BITS);
        let (nrows, ncols, nnz) = match src {
            Source::Rows(a) => (a.nrows(), a.ncols(), a.nnz()),
            Source::Ahead(e) => (e.nrows, e.ncols, e.nnz),
        };
        let layout_kind = match src {
            Source::Rows(stored) => {
                match split_on_device(be, stored, (stencil, precision, o), &mut Ok)? {
                    OnDevice::Made(op) => return Ok(*op),
                    OnDevice::Chose(layout) => layout,
                    OnDevice::Not => o
                        .gpu_layout
                        .unwrap_or_else(|| phases::time("layout", || choose_layout(stored, bits))),
                }
            }
            Source::Ahead(_) => GpuLayout::Split,
        };
        // The CSR rows, for the layouts never made ahead.
        let csr = || match src {
            Source::Rows(a) => a,
            Source::Ahead(_) => unreachable!("only the split layout is made ahead"),
        };
        let (free, _) = be.mem_info()?;
        // The plan for `bytes` of matrix storage, or why it does not fit.
        let planned =
            |bytes: u64| fitting_plan((nrows, ncols, nnz), bytes, precision, stencil, free as u64);
        let rows =
            |c: CompactCsr| phases::time("upload", || DevCompact::upload(be, &c, o)).map(Box::new);
        let encode = |bits, half| {
            phases::time("encode", || {
                Tiled::from_csr_half(csr(), precision, bits, half)
            })
        };
        let tiles = |t: &Tiled, r, c| {
            phases::time("upload", || DevTiled::upload(be, t, r, c, o.tiled_s_cols)).map(Box::new)
        };
        let (layout, plan) = match layout_kind {
            GpuLayout::Tiles => {
                let t = phases::time("encode", || Tiled::from_csr(csr(), precision, bits));
                let scratch = 8 * (t.nseg() + t.nchunks() * t.tile()) as u64;
                let plan = planned(t.bytes() + scratch)?;
                (Layout::Tiles(tiles(&t, true, true)?), plan)
            }
            GpuLayout::Mixed => {
                let ca = phases::time("encode", || CompactCsr::from_csr(csr(), precision));
                let t = encode(bits, TiledHalf::Cols);
                // the tiles' column half only: entries, column offsets, segment rows
                let tbytes = t.bytes() / 2 + 8 * (t.nchunks() * t.tile()) as u64;
                let plan = planned(ca.bytes() + tbytes)?;
                let a = rows(ca)?;
                let t = tiles(&t, false, true)?;
                (Layout::Mixed { a, t }, plan)
            }
            GpuLayout::Split => {
                let xbits = o.ax_tile_bits.unwrap_or(AX_TILE_BITS);
                let mut made: Option<(Tiled, Tiled)> = None;
                let (tx, t) = match src {
                    Source::Ahead(e) => (&e.encoding.ax, &e.encoding.at),
                    Source::Rows(_) => {
                        let m = made.insert((
                            encode(xbits, TiledHalf::Rows),
                            encode(bits, TiledHalf::Cols),
                        ));
                        (&m.0, &m.1)
                    }
                };
                // A x's row half and segment partials; A^T's column half and column partials
                let xbytes = tx.bytes() / 2 + 8 * tx.nseg() as u64;
                let tbytes = t.bytes() / 2 + 8 * (t.nchunks() * t.tile()) as u64;
                let plan = planned(xbytes + tbytes)?;
                let ax = tiles(tx, true, false)?;
                let at = tiles(t, false, true)?;
                if let Some(made) = made.take() {
                    crate::sparse::par::drop_in_background(made);
                }
                (Layout::Split { ax, at }, plan)
            }
            GpuLayout::Rows => {
                let (ca, cat) = phases::time("encode", || {
                    let stored = csr();
                    let at = stored.transpose();
                    (
                        CompactCsr::from_csr(stored, precision),
                        CompactCsr::from_csr(&at, precision),
                    )
                });
                let plan = planned(ca.bytes() + cat.bytes())?;
                let a = rows(ca)?;
                (Layout::Rows { a, at: rows(cat)? }, plan)
            }
        };
        Self::finish(be, layout, plan, stencil, o, (nrows, ncols, nnz))
    }

    /// The operator of rows still to reorder (`r`: as read, with their ordering): uploaded as
    /// they are, reordered and encoded in the split layout on the GPU, the same operator as
    /// [`Self::with_options`] of the rows reordered on the host. None where the GPU does not
    /// make it (the tuning asks for another layout or `gpu_encode = false`, the rows would get
    /// another layout, the working memory does not fit): the caller reorders on the host.
    /// `uploaded` is called once the rows are on the GPU (and only then): what the host does
    /// next no longer competes with the upload for memory bandwidth.
    pub fn from_reordered(
        be: &CudaBackend,
        r: &ReorderedRows,
        stencil: Option<&StencilOp>,
        precision: Precision,
        o: &Tuning,
        uploaded: &mut dyn FnMut(),
    ) -> Result<Option<Self>> {
        o.validate()?;
        be.check_compiled_with(&o.nvrtc_defines)?;
        let Some(order) = &r.ordering.rows else {
            return Ok(None);
        };
        let mut permute = |rows| {
            uploaded();
            phases::time("gpu_permute", || -> Result<encode::DevRows> {
                let p = encode::permute(be, rows, order, r.ordering.cols.as_deref())?;
                be.synchronize()?;
                Ok(p)
            })
        };
        Ok(
            match split_on_device(be, &r.rows, (stencil, precision, o), &mut permute)? {
                OnDevice::Made(op) => Some(*op),
                OnDevice::Chose(_) | OnDevice::Not => None,
            },
        )
    }

    /// The split layout's operator from both halves encoded on the device; an error with the
    /// numbers where it does not fit in `free` bytes.
    fn from_split(
        be: &CudaBackend,
        (ax, at): (encode::Encoded, encode::Encoded),
        stencil: Option<&StencilOp>,
        precision: Precision,
        o: &Tuning,
        free: u64,
    ) -> Result<Self> {
        let (nrows, ncols, nnz) = ax.shape();
        // as the split layout's plan in build(): each half and its partials
        let xbytes = ax.bytes() / 2 + 8 * ax.nseg() as u64;
        let tbytes = at.bytes() / 2 + 8 * (at.nchunks() * at.tile()) as u64;
        let plan = fitting_plan(ax.shape(), xbytes + tbytes, precision, stencil, free)?;
        let ax = Box::new(ax.into_dev_tiled(be, o.tiled_s_cols)?);
        let at = Box::new(at.into_dev_tiled(be, o.tiled_s_cols)?);
        Self::finish(
            be,
            Layout::Split { ax, at },
            plan,
            stencil,
            o,
            (nrows, ncols, nnz),
        )
    }

    /// The operator of `layout`: the stencil uploaded beside it.
    fn finish(
        be: &CudaBackend,
        layout: Layout,
        plan: MemoryPlan,
        stencil: Option<&StencilOp>,
        o: &Tuning,
        (nrows, ncols, nnz): (usize, usize, usize),
    ) -> Result<Self> {
        let _upload = phases::span("upload");
        let stencil = stencil.map(|s| DevStencil::upload(be, s)).transpose()?;
        be.synchronize()?;
        let device_loop = LoopSlot::default();
        device_loop.set_block(o.lsqr_block)?;
        device_loop.set_pieces(o.atu_pieces)?;
        Ok(CudaCompactOperator {
            m_stored: nrows,
            ncols,
            nnz,
            layout,
            stencil,
            plan,
            device_loop,
        })
    }

    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }
    pub fn precision(&self) -> Precision {
        self.plan.precision
    }
    /// Stored nonzeros (the stencil's not counted).
    pub fn stored_nnz(&self) -> usize {
        self.nnz
    }
    /// Stored entries of A and A^T (fillers included; tiles store every nonzero twice).
    pub fn entries(&self) -> (usize, usize) {
        match &self.layout {
            Layout::Rows { a, at } => (a.entries, at.entries),
            Layout::Tiles(_) => (self.nnz, self.nnz),
            Layout::Mixed { a, .. } => (a.entries, self.nnz),
            Layout::Split { .. } => (self.nnz, self.nnz),
        }
    }
    /// Bytes each product must move besides LSQR's vectors: (A x, A^T y). Rows: entries and
    /// 12 bytes a row. Tiles: entries; per segment its entry offset, slot and partial (written
    /// and read) in A x, its row and staged y value in A^T; per row its segment offset; per
    /// chunk column its entry offset and partial (written and read).
    pub fn pass_bytes(&self) -> (u64, u64) {
        let vb = 2 + self.precision().bytes() as u64;
        match &self.layout {
            Layout::Rows { a, at } => (
                a.entries as u64 * vb + a.nrows as u64 * 12,
                at.entries as u64 * vb + at.nrows as u64 * 12,
            ),
            Layout::Tiles(t) => {
                let (nnz, nseg, cols) = (self.nnz as u64, t.nseg as u64, t.chunk_cols as u64);
                (
                    nnz * vb + nseg * (8 + 4 + 16) + (t.nrows as u64 + 1) * 8,
                    nnz * vb + nseg * (4 + 8) + cols * (8 + 16),
                )
            }
            Layout::Mixed { a, t } => {
                let (nnz, nseg, cols) = (self.nnz as u64, t.nseg as u64, t.chunk_cols as u64);
                (
                    a.entries as u64 * vb + a.nrows as u64 * 12,
                    nnz * vb + nseg * (4 + 8) + cols * (8 + 16),
                )
            }
            Layout::Split { ax, at } => {
                let nnz = self.nnz as u64;
                let (xseg, nseg, cols) = (ax.nseg as u64, at.nseg as u64, at.chunk_cols as u64);
                (
                    nnz * vb + xseg * (8 + 4 + 16) + (ax.nrows as u64 + 1) * 8,
                    nnz * vb + nseg * (4 + 8) + cols * (8 + 16),
                )
            }
        }
    }

    /// The device layout and its launch shape, in words.
    pub fn layout(&self) -> String {
        match &self.layout {
            Layout::Rows { a, at } => format!(
                "rows (sub-warp {} x {} rows, transpose {} x {})",
                a.s, a.rows_per_sub, at.s, at.rows_per_sub
            ),
            Layout::Tiles(t) => format!(
                "tiles of {} columns (A x flat, sub-warps of {} per column for A^T)",
                t.tile(),
                t.s_cols
            ),
            Layout::Mixed { a, t } => format!(
                "mixed: rows for A x (sub-warp {} x {} rows), tiles of {} columns for A^T ({} per column)",
                a.s,
                a.rows_per_sub,
                t.tile(),
                t.s_cols
            ),
            Layout::Split { ax, at } => format!(
                "split: tiles of {} columns for A x (flat), of {} for A^T ({} per column)",
                ax.tile(),
                at.tile(),
                at.s_cols
            ),
        }
    }
    /// Use the device-resident LSQR loop (off by default: `[backend] lsqr_loop`).
    pub fn set_device_loop(&self, on: bool) {
        self.device_loop.set(on);
    }
    /// Iterations per replay of the device loop's graph (tuning `lsqr_block`, 1..=256; None:
    /// the default, 32).
    pub fn set_lsqr_block(&self, block: Option<usize>) -> Result<()> {
        self.device_loop.set_block(block)
    }

    fn check(&self, what: &str, got: (usize, usize), want: (usize, usize)) -> Result<()> {
        check_vectors(what, got, want, (self.rows(), self.ncols))
    }

    fn rows(&self) -> usize {
        self.m_stored + self.stencil.as_ref().map_or(0, |s| s.nrows as usize)
    }

    /// y = a A x + b y over all rows; partials of y^2: stored rows' blocks, then the stencil's.
    fn av_launch(&self, be: &CudaBackend, x: u64, y: u64, e: &Epilogue) -> Result<u32> {
        let mut np = match &self.layout {
            Layout::Rows { a: ra, .. } | Layout::Mixed { a: ra, .. } => {
                ra.launch(be, x, y, e, None)?;
                ra.blocks
            }
            Layout::Tiles(t) | Layout::Split { ax: t, .. } => {
                t.av(be, x, y, e)?;
                t.row_blocks()
            }
        };
        if let Some(st) = &self.stencil {
            let yd = y + 8 * self.m_stored as u64;
            let partial = if e.partial == 0 {
                0
            } else {
                e.partial + 8 * np as u64
            };
            st.av(be, x, yd, &Epilogue { partial, ..*e })?;
            np += st.blocks(st.nrows);
        }
        Ok(np)
    }

    /// x = a A^T y + b x; partials of x^2.
    fn atu_launch(&self, be: &CudaBackend, y: u64, x: u64, e: &Epilogue) -> Result<u32> {
        let st = self
            .stencil
            .as_ref()
            .map(|s| (&s.args, y + 8 * self.m_stored as u64));
        match &self.layout {
            Layout::Rows { at, .. } => {
                at.launch(be, y, x, e, st)?;
                Ok(at.blocks)
            }
            Layout::Tiles(t) | Layout::Mixed { t, .. } | Layout::Split { at: t, .. } => {
                t.atu(be, y, x, e, st)?;
                Ok(t.col_blocks())
            }
        }
    }
}

impl Operator<CudaBackend> for CudaCompactOperator {
    fn nrows(&self) -> usize {
        self.rows()
    }
    fn ncols(&self) -> usize {
        self.ncols
    }
    fn apply(&self, be: &CudaBackend, s: Scale, x: &DeviceVec, y: &mut DeviceVec) -> Result<()> {
        self.check("apply", (x.len(), y.len()), (self.ncols, self.rows()))?;
        let e = Epilogue::plain(s.alpha, s.beta);
        self.av_launch(be, be.ptr(x), be.ptr(y), &e).map(|_| ())
    }
    fn apply_t(&self, be: &CudaBackend, s: Scale, y: &DeviceVec, x: &mut DeviceVec) -> Result<()> {
        self.check("apply_t", (y.len(), x.len()), (self.rows(), self.ncols))?;
        let e = Epilogue::plain(s.alpha, s.beta);
        self.atu_launch(be, be.ptr(y), be.ptr(x), &e).map(|_| ())
    }
    fn lsqr_device(&self) -> Option<&dyn LsqrDevice<CudaBackend>> {
        if self.device_loop.is_on() {
            Some(self)
        } else {
            None
        }
    }
    fn lsmr_device(&self) -> Option<&dyn LsmrDevice<CudaBackend>> {
        if self.device_loop.is_on() {
            Some(self)
        } else {
            None
        }
    }
}

impl FusedLsqr for CudaCompactOperator {
    fn fused_rows(&self) -> usize {
        self.rows()
    }
    fn fused_cols(&self) -> usize {
        self.ncols
    }
    fn max_partials(&self) -> usize {
        let st = self
            .stencil
            .as_ref()
            .map_or(0, |s| s.blocks(s.nrows) as usize);
        match &self.layout {
            Layout::Rows { a, at } => (a.blocks as usize + st).max(at.blocks as usize + st),
            Layout::Tiles(t) => (t.row_blocks() as usize + st).max(t.col_blocks() as usize),
            Layout::Mixed { a, t } => (a.blocks as usize + st).max(t.col_blocks() as usize),
            Layout::Split { ax, at } => {
                (ax.row_blocks() as usize + st).max(at.col_blocks() as usize)
            }
        }
    }
    fn av_fused(&self, be: &CudaBackend, v: u64, u: u64, e: &Epilogue) -> Result<u32> {
        self.av_launch(be, v, u, e)
    }
    fn atu_fused(&self, be: &CudaBackend, u: u64, v: u64, e: &Epilogue) -> Result<u32> {
        self.atu_launch(be, u, v, e)
    }
    /// The column tiles' A^T piece by piece ([`DevTiled::atu_piece`]); the delta rows'
    /// (layout `rows`) whole before the first piece is handed on.
    fn atu_in_pieces(
        &self,
        be: &CudaBackend,
        (u, v): (u64, u64),
        e: &Epilogue,
        pieces: &[std::ops::Range<usize>],
        done: &mut dyn FnMut(std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        let t = match &self.layout {
            Layout::Tiles(t) | Layout::Mixed { t, .. } | Layout::Split { at: t, .. } => t,
            Layout::Rows { .. } => {
                self.atu_launch(be, u, v, e)?;
                return pieces.iter().try_for_each(|p| done(p.clone()));
            }
        };
        let st = self
            .stencil
            .as_ref()
            .map(|s| (&s.args, u + 8 * self.m_stored as u64));
        for cols in pieces {
            t.atu_range(be, u, v, e, st, &t.atu_piece(cols.clone())?)?;
            done(cols.clone())?;
        }
        Ok(())
    }
    fn loop_slot(&self) -> &LoopSlot {
        &self.device_loop
    }
}
