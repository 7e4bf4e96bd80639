//! The split layout's column tiles encoded on the GPU (kernels/encode.cu): the CSR rows are
//! uploaded once (12 bytes a nonzero, against the 20 of the two encoded halves) and cut into
//! segments, sorted into tile order and filled there, at the device's memory speed instead of
//! the host's. The arrays are those of [`Tiled::from_csr_half`], element for element (the GPU
//! tests compare them): the segments by tile (rows ascending within a tile, by a stable radix
//! sort of their tiles), the chunks cut on the host from the tiles' first segments (a few
//! thousand numbers), the column entries of each chunk by a stable sort of (chunk, column) keys.

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use super::backend::CudaBackend;
use super::error::Doing;
use super::tiled::{DevTiled, DevTiledParts, AXF_P};
use super::util::{arg, up, DevValues};
use crate::error::{Error, Result};
use crate::sparse::tiled::{chunks, Tiled, TiledHalf, TiledValues};
use crate::sparse::{Csr, Precision};

/// Keys a radix-sort block handles (kernels/encode.cu RS_TILE), and its threads.
const RS_TILE: u64 = 2048;
const RS_THREADS: u32 = 256;
/// Counts a scan block handles (kernels/encode.cu SC_TILE), and its threads.
const SC_TILE: u64 = 4096;
const SC_THREADS: u32 = 1024;
/// Warps per block of the warp-per-row and warp-per-segment kernels (ENC_WARPS).
const ENC_WARPS: u64 = 8;
/// Threads per block of the thread-per-item kernels.
const THREADS: u32 = 256;

/// CSR rows on the device: the input of the encoder.
pub(crate) struct DevRows {
    nrows: usize,
    ncols: usize,
    nnz: usize,
    ip: CudaSlice<u64>,
    ci: CudaSlice<u32>,
    val: CudaSlice<f64>,
}

impl DevRows {
    pub fn upload(be: &CudaBackend, a: &Csr) -> Result<Self> {
        Ok(DevRows {
            nrows: a.nrows(),
            ncols: a.ncols(),
            nnz: a.nnz(),
            ip: up(be, a.indptr())?,
            ci: up(be, a.indices())?,
            val: up(be, a.data())?,
        })
    }
}

/// Whether the GPU can encode `a`: its counts within the kernels' 32-bit positions and its
/// working memory (the rows, the sort's buffers and both halves' entries: at most 60 bytes a
/// nonzero and 40 a row) within 90 % of `free` bytes.
pub(crate) fn fits(a: &Csr, free: u64) -> bool {
    let (m, nnz) = (a.nrows() as u64, a.nnz() as u64);
    nnz > 0 && nnz < u32::MAX as u64 && m < u32::MAX as u64 && 60 * nnz + 40 * m < free / 10 * 9
}

/// Bits that hold every number up to `max`.
fn bits_for(max: u64) -> u32 {
    64 - max.leading_zeros()
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(be: &CudaBackend, n: usize) -> Result<CudaSlice<T>> {
    be.stream
        .alloc_zeros::<T>(n.max(1))
        .doing("allocating the encoder's arrays")
}

fn grid(n: u64, per_block: u64) -> u32 {
    n.div_ceil(per_block) as u32
}

/// Exclusive scan of `n` u32 counts into n + 1 u64 offsets; returns them and the total.
fn scan(be: &CudaBackend, input: &CudaSlice<u32>, n: u64) -> Result<(CudaSlice<u64>, u64)> {
    let out = zeros::<u64>(be, n as usize + 1)?;
    let nb = grid(n, SC_TILE).max(1);
    let bsum = zeros::<u64>(be, nb as usize)?;
    let (pi, po, pb) = (be.ptr(input), be.ptr(&out), be.ptr(&bsum));
    be.launch(
        &be.k.scan_local,
        nb,
        SC_THREADS,
        &mut [arg(&n), arg(&pi), arg(&po), arg(&pb)],
    )?;
    let mut sums = be
        .stream
        .clone_dtoh(&bsum)
        .doing("copying block sums to the host")?;
    be.synchronize()?;
    let mut total = 0u64;
    for s in sums.iter_mut() {
        let v = *s;
        *s = total;
        total += v;
    }
    let boff = up(be, &sums)?;
    let pboff = be.ptr(&boff);
    be.launch(
        &be.k.scan_add,
        grid(n + 1, THREADS as u64),
        THREADS,
        &mut [arg(&n), arg(&po), arg(&pboff), arg(&total)],
    )?;
    Ok((out, total))
}

/// A stable sort of `n` keys below `2^key_bits`: the sorted keys and the position each came
/// from. 8 bits a pass (at least one pass).
fn radix_sort(
    be: &CudaBackend,
    keys: CudaSlice<u32>,
    n: u64,
    key_bits: u32,
) -> Result<(CudaSlice<u32>, CudaSlice<u32>)> {
    radix_sort_with(be, keys, None, n, key_bits)
}

/// [`radix_sort`] carrying `payload` (None: each key's position) with the keys.
fn radix_sort_with(
    be: &CudaBackend,
    keys: CudaSlice<u32>,
    payload: Option<CudaSlice<u32>>,
    n: u64,
    key_bits: u32,
) -> Result<(CudaSlice<u32>, CudaSlice<u32>)> {
    let nb = grid(n, RS_TILE).max(1);
    let counts = zeros::<u32>(be, 256 * nb as usize)?;
    let given = payload.is_some();
    let mut k_in = keys;
    let mut k_out = zeros::<u32>(be, n as usize)?;
    let mut v_in = match payload {
        Some(p) => p,
        None => zeros::<u32>(be, n as usize)?,
    };
    let mut v_out = zeros::<u32>(be, n as usize)?;
    let passes = key_bits.div_ceil(8).max(1);
    for pass in 0..passes {
        let shift = 8 * pass;
        let (pk, pc) = (be.ptr(&k_in), be.ptr(&counts));
        be.launch(
            &be.k.rs_hist,
            nb,
            RS_THREADS,
            &mut [arg(&n), arg(&pk), arg(&shift), arg(&nb), arg(&pc)],
        )?;
        let (offs, _) = scan(be, &counts, 256 * nb as u64)?;
        // without a payload given, the first pass's is each key's position (a null `vin`)
        let pv = if pass == 0 && !given {
            0u64
        } else {
            be.ptr(&v_in)
        };
        let (pko, pvo, po) = (be.ptr(&k_out), be.ptr(&v_out), be.ptr(&offs));
        be.launch(
            &be.k.rs_scatter,
            nb,
            RS_THREADS,
            &mut [
                arg(&n),
                arg(&pk),
                arg(&pv),
                arg(&pko),
                arg(&pvo),
                arg(&shift),
                arg(&nb),
                arg(&po),
            ],
        )?;
        std::mem::swap(&mut k_in, &mut k_out);
        std::mem::swap(&mut v_in, &mut v_out);
    }
    Ok((k_in, v_in))
}

/// `out[b]` = the first position of a key >= b in the ascending `keys` (n of them, each below
/// `nbins`), for b = 0..=nbins.
fn bounds(be: &CudaBackend, keys: &CudaSlice<u32>, n: u64, nbins: u64) -> Result<CudaSlice<u64>> {
    let out = zeros::<u64>(be, nbins as usize + 1)?;
    let (pk, po) = (be.ptr(keys), be.ptr(&out));
    be.launch(
        &be.k.bounds_sorted,
        grid(n + 1, THREADS as u64),
        THREADS,
        &mut [arg(&n), arg(&pk), arg(&nbins), arg(&po)],
    )?;
    Ok(out)
}

/// `src[idx[i]]` for the `n` indices.
fn gather_u32(
    be: &CudaBackend,
    src: &CudaSlice<u32>,
    idx: &CudaSlice<u32>,
    n: u64,
) -> Result<CudaSlice<u32>> {
    let dst = zeros::<u32>(be, n as usize)?;
    let (ps, pi, pd) = (be.ptr(src), be.ptr(idx), be.ptr(&dst));
    be.launch(
        &be.k.enc_gather_u32,
        grid(n, THREADS as u64),
        THREADS,
        &mut [arg(&n), arg(&ps), arg(&pi), arg(&pd)],
    )?;
    Ok(dst)
}

/// The rows `a` in a new order on the device: new row i is old row `rows[i]` (a permutation),
/// old column j becomes `cols[j]` (None: unchanged), each row's columns ascending. The same
/// matrix as [`Csr::permuted`] on the host (src/grid/reorder.rs `Ordering::apply`): a stable
/// radix sort of the entries by new column, then by new row.
pub(crate) fn permute(
    be: &CudaBackend,
    a: DevRows,
    rows: &[usize],
    cols: Option<&[u32]>,
) -> Result<DevRows> {
    let (m, n, nnz) = (a.nrows, a.ncols, a.nnz as u64);
    if rows.len() != m || cols.is_some_and(|c| c.len() != n) {
        return Err(Error::Invalid(format!(
            "cuda: an ordering of {} rows and {:?} columns for a {m} x {n} matrix",
            rows.len(),
            cols.map(<[u32]>::len)
        )));
    }
    let mut new_row = vec![0u32; m];
    for (new, &old) in rows.iter().enumerate() {
        new_row[old] = new as u32;
    }
    let new_row = up(be, &new_row)?;
    let m32 = m as u32;
    let (pip, pci, pnr) = (be.ptr(&a.ip), be.ptr(&a.ci), be.ptr(&new_row));
    // each entry's new row
    let row_key = zeros::<u32>(be, nnz as usize)?;
    let prk = be.ptr(&row_key);
    be.launch(
        &be.k.perm_entry_rows,
        grid(m as u64, ENC_WARPS),
        32 * ENC_WARPS as u32,
        &mut [arg(&m32), arg(&pip), arg(&pnr), arg(&prk)],
    )?;
    drop(new_row);
    // the entries in new-column order (stable), then in new-row order (stable): the rows in
    // their new order, columns ascending
    let (col_key, by_col) = match cols {
        Some(c) => {
            let new_col = up(be, c)?;
            let col_key = zeros::<u32>(be, nnz as usize)?;
            let (pnc, pck) = (be.ptr(&new_col), be.ptr(&col_key));
            be.launch(
                &be.k.perm_col_keys,
                grid(nnz, THREADS as u64),
                THREADS,
                &mut [arg(&nnz), arg(&pci), arg(&pnc), arg(&pck)],
            )?;
            drop(new_col);
            let (_, order) = radix_sort(be, col_key.clone(), nnz, bits_for(n.max(1) as u64 - 1))?;
            (col_key, Some(order))
        }
        None => (a.ci, None),
    };
    let row_key = match &by_col {
        Some(order) => {
            let in_column_order = gather_u32(be, &row_key, order, nnz)?;
            drop(row_key);
            in_column_order
        }
        None => row_key,
    };
    let (row_sorted, order) =
        radix_sort_with(be, row_key, by_col, nnz, bits_for(m.max(1) as u64 - 1))?;
    let ip = bounds(be, &row_sorted, nnz, m as u64)?;
    drop(row_sorted);
    let ci = gather_u32(be, &col_key, &order, nnz)?;
    drop(col_key);
    let val = zeros::<f64>(be, nnz as usize)?;
    let (pv, po, pval) = (be.ptr(&a.val), be.ptr(&order), be.ptr(&val));
    // the values moved as 8-byte words
    be.launch(
        &be.k.enc_gather_u64,
        grid(nnz, THREADS as u64),
        THREADS,
        &mut [arg(&nnz), arg(&pv), arg(&po), arg(&pval)],
    )?;
    Ok(DevRows {
        nrows: m,
        ncols: n,
        nnz: a.nnz,
        ip,
        ci,
        val,
    })
}

/// Segments of the rows `a` in tiles of `1 << tile_bits` columns (one per tile a row touches).
pub(crate) fn segments(be: &CudaBackend, a: &DevRows, tile_bits: u32) -> Result<u64> {
    let m = a.nrows as u64;
    let m32 = a.nrows as u32;
    let count = zeros::<u32>(be, a.nrows)?;
    let (pip, pci, pc) = (be.ptr(&a.ip), be.ptr(&a.ci), be.ptr(&count));
    be.launch(
        &be.k.enc_seg_count,
        grid(m, ENC_WARPS),
        32 * ENC_WARPS as u32,
        &mut [arg(&m32), arg(&pip), arg(&pci), arg(&tile_bits), arg(&pc)],
    )?;
    Ok(scan(be, &count, m)?.1)
}

/// Values of `precision` on the device, `n` zeros.
fn zero_values(be: &CudaBackend, precision: Precision, n: usize) -> Result<DevValues> {
    Ok(match precision {
        Precision::F64 => DevValues::F64(zeros(be, n)?),
        Precision::F32 => DevValues::F32(zeros(be, n)?),
    })
}

/// One half of a matrix in tiles, made on the device: every table of [`Tiled`] (the chunk
/// tables on the host, where they were cut), the other half's arrays absent.
pub(crate) struct Encoded {
    nrows: usize,
    ncols: usize,
    nnz: usize,
    nseg: usize,
    tile_bits: u32,
    precision: Precision,
    chunk_tile: Vec<u32>,
    chunk_seg: Vec<u32>,
    tile_chunk: Vec<u32>,
    seg_row: CudaSlice<u32>,
    seg_slot: CudaSlice<u32>,
    seg_pos: CudaSlice<u32>,
    seg_ent: CudaSlice<u64>,
    row_seg: CudaSlice<u64>,
    rows: Option<(CudaSlice<u16>, DevValues)>,
    cols: Option<(CudaSlice<u64>, CudaSlice<u16>, DevValues)>,
}

/// Encode `half` of the rows `a` (on the device) in tiles of `1 << tile_bits` columns, values
/// in `precision`: [`Tiled::from_csr_half`] on the GPU. The caller checks [`fits`].
pub(crate) fn encode(
    be: &CudaBackend,
    a: &DevRows,
    precision: Precision,
    tile_bits: u32,
    half: TiledHalf,
) -> Result<Encoded> {
    if !(1..=15).contains(&tile_bits) {
        return Err(Error::Invalid(format!("tile_bits {tile_bits}: not 1..=15")));
    }
    let (m, nnz) = (a.nrows as u64, a.nnz as u64);
    let ntiles = a.ncols.div_ceil(1 << tile_bits).max(1) as u64;
    let (pip, pci, pval) = (be.ptr(&a.ip), be.ptr(&a.ci), be.ptr(&a.val));
    let m32 = a.nrows as u32;
    // segments per row, their offsets
    let count = zeros::<u32>(be, a.nrows)?;
    let pcount = be.ptr(&count);
    let warps = grid(m, ENC_WARPS);
    let block = 32 * ENC_WARPS as u32;
    be.launch(
        &be.k.enc_seg_count,
        warps,
        block,
        &mut [
            arg(&m32),
            arg(&pip),
            arg(&pci),
            arg(&tile_bits),
            arg(&pcount),
        ],
    )?;
    let (row_seg, nseg) = scan(be, &count, m)?;
    drop(count);
    if nseg == 0 || nseg >= u32::MAX as u64 {
        return Err(Error::Invalid(format!(
            "cuda: {nseg} tile segments cannot be encoded on the GPU"
        )));
    }
    // each segment's tile, row and first entry in row order, and its length
    let tile = zeros::<u32>(be, nseg as usize)?;
    let row = zeros::<u32>(be, nseg as usize)?;
    let start = zeros::<u64>(be, nseg as usize)?;
    let len = zeros::<u32>(be, nseg as usize)?;
    let (prs, pt, pr, pst, pl) = (
        be.ptr(&row_seg),
        be.ptr(&tile),
        be.ptr(&row),
        be.ptr(&start),
        be.ptr(&len),
    );
    be.launch(
        &be.k.enc_seg_fill,
        warps,
        block,
        &mut [
            arg(&m32),
            arg(&pip),
            arg(&pci),
            arg(&tile_bits),
            arg(&prs),
            arg(&pt),
            arg(&pr),
            arg(&pst),
        ],
    )?;
    be.launch(
        &be.k.enc_seg_len,
        grid(nseg, THREADS as u64),
        THREADS,
        &mut [
            arg(&nseg),
            arg(&pip),
            arg(&prs),
            arg(&pr),
            arg(&pst),
            arg(&pl),
        ],
    )?;
    // the segments in tile order (stable: rows ascending within a tile); slot = row-order place
    let (tile_sorted, seg_slot) = radix_sort(be, tile, nseg, bits_for(ntiles - 1))?;
    let tile_seg = bounds(be, &tile_sorted, nseg, ntiles)?;
    let tile_seg_host = be
        .stream
        .clone_dtoh(&tile_seg)
        .doing("copying tile offsets to the host")?;
    be.synchronize()?;
    let (chunk_tile, chunk_seg, tile_chunk) = chunks(
        &tile_seg_host,
        nseg as usize,
        crate::sparse::tiled::CHUNK_SEGS,
    );
    let seg_row = gather_u32(be, &row, &seg_slot, nseg)?;
    let len_t = gather_u32(be, &len, &seg_slot, nseg)?;
    drop((row, len));
    let start_t = zeros::<u64>(be, nseg as usize)?;
    let seg_pos = zeros::<u32>(be, nseg as usize)?;
    let (pslot, pst_t, ppos) = (be.ptr(&seg_slot), be.ptr(&start_t), be.ptr(&seg_pos));
    be.launch(
        &be.k.enc_gather_u64,
        grid(nseg, THREADS as u64),
        THREADS,
        &mut [arg(&nseg), arg(&pst), arg(&pslot), arg(&pst_t)],
    )?;
    be.launch(
        &be.k.enc_seg_pos,
        grid(nseg, THREADS as u64),
        THREADS,
        &mut [arg(&nseg), arg(&pslot), arg(&ppos)],
    )?;
    drop(start);
    let (seg_ent, total) = scan(be, &len_t, nseg)?;
    drop(len_t);
    if total != nnz {
        return Err(Error::backend(
            "cuda",
            format!("the GPU's tile encoding counted {total} entries of {nnz}"),
        ));
    }
    let pent = be.ptr(&seg_ent);
    let pi = match precision {
        Precision::F64 => 0,
        Precision::F32 => 1,
    };
    let seg_warps = grid(nseg, ENC_WARPS);
    let rows = if half != TiledHalf::Cols {
        // padded with zeros to a multiple of AXF_P (the flat A x kernel's vector loads)
        let padded = (nnz as usize).next_multiple_of(AXF_P);
        let lcol = zeros::<u16>(be, padded)?;
        let vals = zero_values(be, precision, padded)?;
        let (plc, (_, pv)) = (be.ptr(&lcol), vals.index_and_ptr(be));
        be.launch(
            &be.k.enc_fill_rows[pi],
            seg_warps,
            block,
            &mut [
                arg(&nseg),
                arg(&pst_t),
                arg(&pent),
                arg(&pci),
                arg(&pval),
                arg(&tile_bits),
                arg(&plc),
                arg(&pv),
            ],
        )?;
        Some((lcol, vals))
    } else {
        None
    };
    let cols = if half != TiledHalf::Rows {
        let nchunks = chunk_tile.len() as u64;
        let nbins = nchunks << tile_bits;
        if nbins >= u32::MAX as u64 {
            return Err(Error::Invalid(format!(
                "cuda: {nchunks} chunks of 2^{tile_bits} columns cannot be encoded on the GPU"
            )));
        }
        let tile_chunk_d = up(be, &tile_chunk)?;
        let keys = zeros::<u32>(be, nnz as usize)?;
        let lseg_t = zeros::<u16>(be, nnz as usize)?;
        let ent = zeros::<u32>(be, nnz as usize)?;
        let (pts, ptseg, ptc) = (
            be.ptr(&tile_sorted),
            be.ptr(&tile_seg),
            be.ptr(&tile_chunk_d),
        );
        let (pk, pls, pe) = (be.ptr(&keys), be.ptr(&lseg_t), be.ptr(&ent));
        be.launch(
            &be.k.enc_col_keys,
            seg_warps,
            block,
            &mut [
                arg(&nseg),
                arg(&pts),
                arg(&ptseg),
                arg(&ptc),
                arg(&pst_t),
                arg(&pent),
                arg(&pci),
                arg(&tile_bits),
                arg(&pk),
                arg(&pls),
                arg(&pe),
            ],
        )?;
        let (keys_sorted, order) = radix_sort(be, keys, nnz, bits_for(nbins - 1))?;
        let colptr = bounds(be, &keys_sorted, nnz, nbins)?;
        drop(keys_sorted);
        let lseg = zeros::<u16>(be, nnz as usize)?;
        let vals = zero_values(be, precision, nnz as usize)?;
        let (po, pl, (_, pv)) = (be.ptr(&order), be.ptr(&lseg), vals.index_and_ptr(be));
        be.launch(
            &be.k.enc_fill_cols[pi],
            grid(nnz, THREADS as u64),
            THREADS,
            &mut [
                arg(&nnz),
                arg(&po),
                arg(&pls),
                arg(&pe),
                arg(&pval),
                arg(&pl),
                arg(&pv),
            ],
        )?;
        Some((colptr, lseg, vals))
    } else {
        None
    };
    Ok(Encoded {
        nrows: a.nrows,
        ncols: a.ncols,
        nnz: a.nnz,
        nseg: nseg as usize,
        tile_bits,
        precision,
        chunk_tile,
        chunk_seg,
        tile_chunk,
        seg_row,
        seg_slot,
        seg_pos,
        seg_ent,
        row_seg,
        rows,
        cols,
    })
}

impl Encoded {
    /// Rows, columns and nonzeros of the matrix.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.nrows, self.ncols, self.nnz)
    }
    pub fn tile(&self) -> usize {
        1 << self.tile_bits
    }
    pub fn nseg(&self) -> usize {
        self.nseg
    }
    pub fn nchunks(&self) -> usize {
        self.chunk_tile.len()
    }

    /// Device bytes of the tables the products keep (as [`Tiled::bytes`] counts them).
    pub fn bytes(&self) -> u64 {
        Tiled::bytes_for(
            (self.nrows, self.nnz),
            (self.nseg, self.nchunks()),
            1 << self.tile_bits,
            self.precision,
        )
    }

    /// The products' matrix ([`DevTiled`]), the tables no product reads dropped.
    pub fn into_dev_tiled(self, be: &CudaBackend, s_cols: Option<u32>) -> Result<DevTiled> {
        let dummy16 = || up::<u16>(be, &[]);
        let dummy_vals = || zero_values(be, self.precision, 1);
        let (rows, (a_lcol, a_val)) = match self.rows {
            Some(r) => (true, r),
            None => (false, (dummy16()?, dummy_vals()?)),
        };
        let (cols, (b_colptr, b_lseg, b_val)) = match self.cols {
            Some(c) => (true, c),
            None => (false, (up::<u64>(be, &[])?, dummy16()?, dummy_vals()?)),
        };
        let parts = DevTiledParts {
            nrows: self.nrows,
            ncols: self.ncols,
            nnz: self.nnz,
            nseg: self.nseg,
            nchunks: self.chunk_tile.len(),
            tile_bits: self.tile_bits,
            chunk_tile: up(be, &self.chunk_tile)?,
            chunk_seg: up(be, &self.chunk_seg)?,
            tile_chunk: up(be, if cols { &self.tile_chunk[..] } else { &[] })?,
            tile_chunk_host: if cols { self.tile_chunk } else { Vec::new() },
            seg_row: if cols { self.seg_row } else { up(be, &[])? },
            seg_pos: if rows { self.seg_pos } else { up(be, &[])? },
            seg_ent: if rows { self.seg_ent } else { up(be, &[])? },
            row_seg: if rows { self.row_seg } else { up(be, &[])? },
            a_lcol,
            a_val,
            b_colptr,
            b_lseg,
            b_val,
            rows,
            cols,
        };
        DevTiled::assemble(be, parts, s_cols)
    }

    /// Every table copied to the host: the [`Tiled`] that [`Tiled::from_csr_half`] makes.
    pub fn download(&self, be: &CudaBackend) -> Result<Tiled> {
        fn get<T: DeviceRepr + Default + Clone>(
            be: &CudaBackend,
            d: &CudaSlice<T>,
            n: usize,
        ) -> Result<Vec<T>> {
            let mut v = be
                .stream
                .clone_dtoh(d)
                .doing("copying an encoded table to the host")?;
            v.truncate(n);
            Ok(v)
        }
        let values = |d: &DevValues, n: usize| -> Result<TiledValues> {
            Ok(match d {
                DevValues::F64(v) => TiledValues::F64(get(be, v, n)?),
                DevValues::F32(v) => TiledValues::F32(get(be, v, n)?),
            })
        };
        let empty = || match self.precision {
            Precision::F64 => TiledValues::F64(Vec::new()),
            Precision::F32 => TiledValues::F32(Vec::new()),
        };
        let (nnz, nseg) = (self.nnz, self.nseg);
        let (a_lcol, a_val) = match &self.rows {
            Some((l, v)) => (get(be, l, nnz)?, values(v, nnz)?),
            None => (Vec::new(), empty()),
        };
        let (b_colptr, b_lseg, b_val) = match &self.cols {
            Some((p, l, v)) => (
                get(be, p, (self.nchunks() << self.tile_bits) + 1)?,
                get(be, l, nnz)?,
                values(v, nnz)?,
            ),
            None => (Vec::new(), Vec::new(), empty()),
        };
        let t = Tiled {
            nrows: self.nrows,
            ncols: self.ncols,
            nnz,
            tile_bits: self.tile_bits,
            chunk_tile: self.chunk_tile.clone(),
            chunk_seg: self.chunk_seg.clone(),
            tile_chunk: self.tile_chunk.clone(),
            seg_row: get(be, &self.seg_row, nseg)?,
            seg_slot: get(be, &self.seg_slot, nseg)?,
            seg_pos: get(be, &self.seg_pos, nseg)?,
            seg_ent: get(be, &self.seg_ent, nseg + 1)?,
            row_seg: get(be, &self.row_seg, self.nrows + 1)?,
            a_lcol,
            a_val,
            b_colptr,
            b_lseg,
            b_val,
        };
        be.synchronize()?;
        Ok(t)
    }
}

/// [`Csr::permuted`] of `a` (new row i = old row `rows[i]`, old column j -> `cols[j]`) made on
/// the GPU (`permute`) and copied back (for the GPU tests).
pub fn permute_on_gpu(
    be: &CudaBackend,
    a: &Csr,
    rows: &[usize],
    cols: Option<&[u32]>,
) -> Result<Csr> {
    let d = permute(be, DevRows::upload(be, a)?, rows, cols)?;
    let ip = be.stream.clone_dtoh(&d.ip).doing("copying rows")?;
    let mut ci = be.stream.clone_dtoh(&d.ci).doing("copying columns")?;
    let mut val = be.stream.clone_dtoh(&d.val).doing("copying values")?;
    be.synchronize()?;
    ci.truncate(d.nnz);
    val.truncate(d.nnz);
    Csr::try_new(d.nrows, d.ncols, ip, ci, val).map_err(|e| Error::Invalid(e.to_string()))
}

/// [`Tiled::from_csr_half`] of `a` made on the GPU and copied back (for the GPU tests, which
/// compare it with the CPU's).
pub fn encode_on_gpu(
    be: &CudaBackend,
    a: &Csr,
    precision: Precision,
    tile_bits: u32,
    half: TiledHalf,
) -> Result<Tiled> {
    let rows = DevRows::upload(be, a)?;
    encode(be, &rows, precision, tile_bits, half)?.download(be)
}
