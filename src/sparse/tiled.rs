//! Column tiles: the GPU's layout of compact storage (src/backend/cuda/compact.rs).
//!
//! On a GPU a sparse product is bound by its gathers: every nonzero fetches a 32-byte sector of
//! x from L2 for one 8-byte value, whatever the matrix storage costs (measured on an H100: CSR
//! f64, CSR f32 and 16-bit deltas all run A x at ~185 G gathers/s, the L2's sector rate). Once
//! the columns are numbered along a space-filling curve (src/grid/reorder.rs), a block of 2^k
//! consecutive columns is a compact brick of cells, and a ray crosses only a dozen of them. So:
//!
//! - the columns are cut into **tiles** of `1 << tile_bits` columns;
//! - every row is cut into **segments**, one per tile it touches;
//! - segments are grouped by tile (rows in order within a tile) and tiles into **chunks** of at
//!   most [`CHUNK_SEGS`] segments.
//!
//! A x: a GPU block stages its chunk's tile of x in shared memory (one coalesced load); each
//! segment sums its entries against shared memory (no L2 gather) into a partial; a second pass
//! adds the partials of each row in tile order. A^T y: a block stages y of its chunk's segments
//! in shared memory (one gather per segment instead of one per nonzero) and sums the tile's
//! columns from it (entries in column order within the chunk); a second pass adds the chunks of
//! each column. Every sum has a fixed order. Entries hold a 16-bit column (or segment) index
//! local to the tile (or chunk) and an f32 or f64 value: 6 or 10 bytes, for any matrix (no
//! escapes: a local index always fits).

use rayon::prelude::*;

use crate::sparse::{par, Csr, Precision};

/// Segments per chunk at most (the shared-memory stage of y in A^T: 2048 f64 = 16 KiB).
pub const CHUNK_SEGS: usize = 2048;
/// Bit of an `a_lcol` entry set on the last entry of each segment (the GPU's flat A x kernel
/// finds segment ends from it); [`LCOL_MASK`] keeps the column within the tile.
pub const LCOL_END: u16 = 0x8000;
pub const LCOL_MASK: u16 = 0x7fff;

/// Values of a tiled matrix.
#[derive(Debug, Clone, PartialEq)]
pub enum TiledValues {
    F64(Vec<f64>),
    F32(Vec<f32>),
}

impl TiledValues {
    fn get(&self, k: usize) -> f64 {
        match self {
            Self::F64(v) => v[k],
            Self::F32(v) => v[k] as f64,
        }
    }
}

/// Which halves of a [`Tiled`] matrix to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TiledHalf {
    Both,
    /// The row entries only (A x).
    Rows,
    /// The column entries only (A^T y).
    Cols,
}

/// A matrix in column tiles (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Tiled {
    pub nrows: usize,
    pub ncols: usize,
    pub nnz: usize,
    pub tile_bits: u32,
    /// Tile of each chunk.
    pub chunk_tile: Vec<u32>,
    /// First segment (in tile order) of each chunk; nchunks + 1 entries.
    pub chunk_seg: Vec<u32>,
    /// First chunk of each tile; ntiles + 1 entries.
    pub tile_chunk: Vec<u32>,
    /// Row of each segment (tile order).
    pub seg_row: Vec<u32>,
    /// Position of each segment (tile order) in row order.
    pub seg_slot: Vec<u32>,
    /// The inverse: the tile-order position of each segment in row order (the GPU's A x writes
    /// its segment sums in tile order and adds them per row through it).
    pub seg_pos: Vec<u32>,
    /// First entry of each segment (tile order) in the row-entry arrays; nseg + 1 entries.
    pub seg_ent: Vec<u64>,
    /// First segment of each row in row order; nrows + 1 entries.
    pub row_seg: Vec<u64>,
    /// Row entries (segment by segment, in tile order): column within the tile (with
    /// [`LCOL_END`] set on each segment's last entry), value.
    pub a_lcol: Vec<u16>,
    pub a_val: TiledValues,
    /// Column entries: for chunk q and column c of its tile, entries
    /// `b_colptr[q * T + c]..b_colptr[q * T + c + 1]` (a chunk's entries sit where its row
    /// entries do); each holds the segment index within the chunk and the value.
    pub b_colptr: Vec<u64>,
    pub b_lseg: Vec<u16>,
    pub b_val: TiledValues,
}

impl par::GiveBack for Tiled {
    fn give_back(&mut self) {
        use par::give_back_pages as g;
        for v in [
            &mut self.chunk_tile,
            &mut self.chunk_seg,
            &mut self.tile_chunk,
            &mut self.seg_row,
            &mut self.seg_slot,
            &mut self.seg_pos,
        ] {
            g(v);
        }
        for v in [&mut self.seg_ent, &mut self.row_seg, &mut self.b_colptr] {
            g(v);
        }
        g(&mut self.a_lcol);
        g(&mut self.b_lseg);
        for v in [&mut self.a_val, &mut self.b_val] {
            match v {
                TiledValues::F64(v) => g(v),
                TiledValues::F32(v) => g(v),
            }
        }
    }
}

impl Tiled {
    pub fn tile(&self) -> usize {
        1 << self.tile_bits
    }
    pub fn ntiles(&self) -> usize {
        self.tile_chunk.len() - 1
    }
    pub fn nchunks(&self) -> usize {
        self.chunk_tile.len()
    }
    pub fn nseg(&self) -> usize {
        self.seg_row.len()
    }
    pub fn precision(&self) -> Precision {
        match self.a_val {
            TiledValues::F64(_) => Precision::F64,
            TiledValues::F32(_) => Precision::F32,
        }
    }

    /// Device bytes: both entry copies, the per-segment, per-row and per-chunk tables.
    pub fn bytes(&self) -> u64 {
        Self::bytes_for(
            (self.nrows, self.nnz),
            (self.nseg(), self.nchunks()),
            self.tile(),
            self.precision(),
        )
    }

    /// [`Self::bytes`] of a matrix of `nrows` rows and `nnz` nonzeros in `nseg` segments and
    /// `nchunks` chunks of tiles of `tile` columns.
    pub fn bytes_for(
        (nrows, nnz): (usize, usize),
        (nseg, nchunks): (usize, usize),
        tile: usize,
        precision: Precision,
    ) -> u64 {
        let vb = precision.bytes() as u64 + 2;
        2 * nnz as u64 * vb
            + nseg as u64 * (4 + 4 + 8)
            + (nrows as u64 + 1) * 8
            + (nchunks * tile + 1) as u64 * 8
            + nchunks as u64 * 8
    }

    /// Check that the tables fit each other and the shape (what a GPU kernel indexes with):
    /// lengths, offsets ascending from 0 to their ends, rows, tiles and segment numbers in
    /// range. For a matrix read back from a file (made by [`Self::from_csr_half`] there).
    pub fn check(&self) -> Result<(), String> {
        if !(1..=15).contains(&self.tile_bits) {
            return Err(format!("tile_bits {}", self.tile_bits));
        }
        let ntiles = self.ncols.div_ceil(self.tile()).max(1);
        let (nseg, nchunks) = (self.seg_row.len(), self.chunk_tile.len());
        let offsets = |what: &str, v: &[u64], len: usize, end: u64| -> Result<(), String> {
            let ok = v.len() == len
                && v.first() == Some(&0)
                && v.last() == Some(&end)
                && v.par_windows(2).all(|w| w[0] <= w[1]);
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{what}: not {len} ascending offsets from 0 to {end}"
                ))
            }
        };
        let wide = |v: &[u32]| v.iter().map(|&x| x as u64).collect::<Vec<u64>>();
        offsets(
            "chunk_seg",
            &wide(&self.chunk_seg),
            nchunks + 1,
            nseg as u64,
        )?;
        offsets(
            "tile_chunk",
            &wide(&self.tile_chunk),
            ntiles + 1,
            nchunks as u64,
        )?;
        offsets("row_seg", &self.row_seg, self.nrows + 1, nseg as u64)?;
        offsets("seg_ent", &self.seg_ent, nseg + 1, self.nnz as u64)?;
        let below = |what: &str, v: &[u32], len: usize, lim: usize| -> Result<(), String> {
            if v.len() == len && v.par_iter().all(|&x| (x as usize) < lim) {
                Ok(())
            } else {
                Err(format!("{what}: not {len} numbers below {lim}"))
            }
        };
        below("chunk_tile", &self.chunk_tile, nchunks, ntiles)?;
        below("seg_row", &self.seg_row, nseg, self.nrows)?;
        below("seg_slot", &self.seg_slot, nseg, nseg)?;
        below("seg_pos", &self.seg_pos, nseg, nseg)?;
        if (self.chunk_seg.windows(2)).any(|w| (w[1] - w[0]) as usize > CHUNK_SEGS) {
            return Err(format!("a chunk of more than {CHUNK_SEGS} segments"));
        }
        let len = |v: &TiledValues| match v {
            TiledValues::F64(v) => v.len(),
            TiledValues::F32(v) => v.len(),
        };
        let rows = !self.a_lcol.is_empty() || len(&self.a_val) > 0;
        if rows && (self.a_lcol.len() != self.nnz || len(&self.a_val) != self.nnz) {
            return Err(format!("row entries: not {} of each", self.nnz));
        }
        let cols = !self.b_lseg.is_empty() || len(&self.b_val) > 0 || !self.b_colptr.is_empty();
        if cols {
            let n = nchunks * self.tile() + 1;
            offsets("b_colptr", &self.b_colptr, n, self.nnz as u64)?;
            if self.b_lseg.len() != self.nnz || len(&self.b_val) != self.nnz {
                return Err(format!("column entries: not {} of each", self.nnz));
            }
            if !self.b_lseg.par_iter().all(|&x| (x as usize) < CHUNK_SEGS) {
                return Err(format!("a column entry's segment beyond {CHUNK_SEGS}"));
            }
        }
        Ok(())
    }

    /// Cut `a` into tiles of `1 << tile_bits` columns (both halves).
    pub fn from_csr(a: &Csr, precision: Precision, tile_bits: u32) -> Tiled {
        Self::from_csr_half(a, precision, tile_bits, TiledHalf::Both)
    }

    /// [`Self::from_csr`] building only `half`: the row entries (A x) or the column entries
    /// (A^T y, sorted per chunk straight from `a`'s rows). The other half's arrays are left
    /// empty: [`Self::matvec`] needs the rows, [`Self::matvec_t`] the columns. Every step runs
    /// by blocks of rows, segments or chunks in parallel, each into its own places: the same
    /// arrays as the sequential loops.
    pub fn from_csr_half(a: &Csr, precision: Precision, tile_bits: u32, half: TiledHalf) -> Tiled {
        Self::from_csr_chunked(a, precision, tile_bits, half, CHUNK_SEGS)
    }

    /// [`Self::from_csr_half`] with chunks of at most `chunk_segs` segments (1..=[`CHUNK_SEGS`]):
    /// fewer segments a chunk for a GPU block that stages several values a segment (the
    /// batch's A^T Y, src/backend/cuda/block.rs).
    pub fn from_csr_chunked(
        a: &Csr,
        precision: Precision,
        tile_bits: u32,
        half: TiledHalf,
        chunk_segs: usize,
    ) -> Tiled {
        assert!((1..=15).contains(&tile_bits), "tile_bits in 1..=15");
        assert!(
            (1..=CHUNK_SEGS).contains(&chunk_segs),
            "chunk_segs in 1..={CHUNK_SEGS}"
        );
        let (m, n) = (a.nrows(), a.ncols());
        let ntiles = n.div_ceil(1 << tile_bits).max(1);
        let row_seg = row_segments(a, tile_bits);
        let nseg = *row_seg.last().unwrap() as usize;
        assert!(
            nseg < u32::MAX as usize,
            "too many segments for 32-bit indices"
        );
        let segs = Segments::in_tile_order(a, tile_bits, ntiles, &row_seg);
        let (chunk_tile, chunk_seg, tile_chunk) = chunks(&segs.tile_seg, nseg, chunk_segs);
        // Row entries in tile order.
        let lens: Vec<u64> = segs.csr.par_iter().map(|&(_, len)| len as u64).collect();
        let seg_ent = par::offsets(&lens);
        drop(lens);
        let nnz = a.nnz();
        let at = Entries {
            a,
            tile_bits,
            chunk_seg: &chunk_seg,
            seg_ent: &seg_ent,
            seg_csr: &segs.csr,
        };
        let rows = half != TiledHalf::Cols;
        let cols = half != TiledHalf::Rows;
        let (a_lcol, a_val, b_colptr, b_lseg, b_val) = match precision {
            Precision::F64 => {
                let (l, v) = if rows {
                    at.rows(|x| x)
                } else {
                    Default::default()
                };
                let (p, s, w) = if cols {
                    at.columns(|x| x)
                } else {
                    Default::default()
                };
                (l, TiledValues::F64(v), p, s, TiledValues::F64(w))
            }
            Precision::F32 => {
                let (l, v) = if rows {
                    at.rows(|x| x as f32)
                } else {
                    Default::default()
                };
                let (p, s, w) = if cols {
                    at.columns(|x| x as f32)
                } else {
                    Default::default()
                };
                (l, TiledValues::F32(v), p, s, TiledValues::F32(w))
            }
        };
        let mut seg_pos = vec![0u32; nseg];
        {
            let pos = par::Scatter::new(&mut seg_pos);
            segs.slot
                .par_iter()
                .enumerate()
                .with_min_len(4096)
                .for_each(|(s, &k)| {
                    // SAFETY: `slot` is a permutation of the segments: each place once.
                    unsafe { pos.put(k as usize, s as u32) }
                });
        }
        Tiled {
            nrows: m,
            ncols: n,
            nnz,
            tile_bits,
            chunk_tile,
            chunk_seg,
            tile_chunk,
            seg_row: segs.row,
            seg_slot: segs.slot,
            seg_pos,
            seg_ent,
            row_seg,
            a_lcol,
            a_val,
            b_colptr,
            b_lseg,
            b_val,
        }
    }

    /// y = A x in the GPU's order (segment partials from the row entries, added per row in
    /// tile order): the reference of the GPU kernels.
    pub fn matvec(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.ncols);
        let tsz = self.tile();
        let mut partial = vec![0.0; self.nseg()];
        for q in 0..self.nchunks() {
            let t = self.chunk_tile[q] as usize;
            for s in self.chunk_seg[q] as usize..self.chunk_seg[q + 1] as usize {
                let mut sum = 0.0;
                for k in self.seg_ent[s] as usize..self.seg_ent[s + 1] as usize {
                    sum += self.a_val.get(k) * x[t * tsz + (self.a_lcol[k] & LCOL_MASK) as usize];
                }
                partial[self.seg_slot[s] as usize] = sum;
            }
        }
        (0..self.nrows)
            .map(|r| {
                partial[self.row_seg[r] as usize..self.row_seg[r + 1] as usize]
                    .iter()
                    .sum()
            })
            .collect()
    }

    /// x = A^T y from the column entries (chunk sums per column, added in chunk order).
    pub fn matvec_t(&self, y: &[f64]) -> Vec<f64> {
        assert_eq!(y.len(), self.nrows);
        let tsz = self.tile();
        let mut x = vec![0.0; self.ncols];
        for q in 0..self.nchunks() {
            let t = self.chunk_tile[q] as usize;
            let s0 = self.chunk_seg[q] as usize;
            for c in 0..tsz {
                let j = t * tsz + c;
                let (e0, e1) = (
                    self.b_colptr[q * tsz + c] as usize,
                    self.b_colptr[q * tsz + c + 1] as usize,
                );
                let mut sum = 0.0;
                for k in e0..e1 {
                    sum +=
                        self.b_val.get(k) * y[self.seg_row[s0 + self.b_lseg[k] as usize] as usize];
                }
                if j < self.ncols {
                    x[j] += sum;
                }
            }
        }
        x
    }
}

/// Does entry `j` of a row starting at `s` open a segment (the first entry, or a new tile)?
fn opens_segment(ci: &[u32], s: usize, j: usize, tile_bits: u32) -> bool {
    j == s || ci[j] >> tile_bits != ci[j - 1] >> tile_bits
}

/// The first segment of each row in row order (one segment per tile a row touches); nrows + 1
/// entries.
fn row_segments(a: &Csr, tile_bits: u32) -> Vec<u64> {
    let (ip, ci) = (a.indptr(), a.indices());
    let per_row: Vec<u64> = (0..a.nrows())
        .into_par_iter()
        .map(|r| {
            let (s, e) = (ip[r] as usize, ip[r + 1] as usize);
            let mut k = 0u64;
            for j in s..e {
                if opens_segment(ci, s, j, tile_bits) {
                    k += 1;
                }
            }
            k
        })
        .collect();
    par::offsets(&per_row)
}

/// The segments in tile order: grouped by tile, rows ascending within a tile.
struct Segments {
    /// First segment of each tile; ntiles + 1 entries.
    tile_seg: Vec<u64>,
    /// Row of each segment.
    row: Vec<u32>,
    /// Position of each segment in row order.
    slot: Vec<u32>,
    /// (CSR start, length) of each segment.
    csr: Vec<(u64, u32)>,
}

impl Segments {
    fn in_tile_order(a: &Csr, tile_bits: u32, ntiles: usize, row_seg: &[u64]) -> Segments {
        let (ip, ci) = (a.indptr(), a.indices());
        let t_of = |c: u32| c >> tile_bits;
        let nseg = *row_seg.last().unwrap() as usize;
        // A stable counting sort of the segments by tile, by blocks of rows: each block counts
        // its segments per tile, then puts them at its places (par::block_starts), rows
        // ascending within a tile as in one sequential pass.
        let parts = par::blocks_for(a.nnz() + a.nrows(), 1).min((nseg / (2 * ntiles)).max(1));
        let bounds = par::row_blocks(row_seg, parts);
        let mut cursor = vec![0u64; parts * ntiles];
        cursor
            .par_chunks_mut(ntiles)
            .enumerate()
            .for_each(|(b, count)| {
                for r in bounds[b]..bounds[b + 1] {
                    let (s, e) = (ip[r] as usize, ip[r + 1] as usize);
                    for j in s..e {
                        if opens_segment(ci, s, j, tile_bits) {
                            count[t_of(ci[j]) as usize] += 1;
                        }
                    }
                }
            });
        let tile_seg = par::block_starts(&mut cursor, ntiles);
        let mut row = vec![0u32; nseg];
        let mut slot = vec![0u32; nseg];
        let mut csr = vec![(0u64, 0u32); nseg];
        {
            let (prow, pslot, pcsr) = (
                par::Scatter::new(&mut row),
                par::Scatter::new(&mut slot),
                par::Scatter::new(&mut csr),
            );
            cursor
                .par_chunks_mut(ntiles)
                .enumerate()
                .for_each(|(b, cursor)| {
                    for r in bounds[b]..bounds[b + 1] {
                        let (s, e) = (ip[r] as usize, ip[r + 1] as usize);
                        let mut k = row_seg[r];
                        let mut j = s;
                        while j < e {
                            let t = t_of(ci[j]);
                            let mut j1 = j + 1;
                            while j1 < e && t_of(ci[j1]) == t {
                                j1 += 1;
                            }
                            let pos = cursor[t as usize] as usize;
                            cursor[t as usize] += 1;
                            // SAFETY: block b owns places cursor[t].. of every tile t, up to the
                            // next block's (block_starts), and takes each once.
                            unsafe {
                                prow.put(pos, r as u32);
                                pslot.put(pos, k as u32);
                                pcsr.put(pos, (j as u64, (j1 - j) as u32));
                            }
                            k += 1;
                            j = j1;
                        }
                    }
                });
        }
        Segments {
            tile_seg,
            row,
            slot,
            csr,
        }
    }
}

/// Chunks: each tile's segments (`tile_seg`: the first of each tile) in runs of at most
/// `chunk_segs` (at most [`CHUNK_SEGS`]). Returns the tile and first segment of each chunk (with
/// `nseg` after the last) and the first chunk of each tile (with the chunk count after the last).
pub(crate) fn chunks(
    tile_seg: &[u64],
    nseg: usize,
    chunk_segs: usize,
) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let ntiles = tile_seg.len() - 1;
    let mut chunk_tile = Vec::new();
    let mut chunk_seg = Vec::new();
    let mut tile_chunk = Vec::with_capacity(ntiles + 1);
    for t in 0..ntiles {
        tile_chunk.push(chunk_tile.len() as u32);
        let (s0, s1) = (tile_seg[t] as usize, tile_seg[t + 1] as usize);
        let mut s = s0;
        loop {
            chunk_tile.push(t as u32);
            chunk_seg.push(s as u32);
            s = (s + chunk_segs).min(s1);
            if s >= s1 {
                break;
            }
        }
    }
    tile_chunk.push(chunk_tile.len() as u32);
    chunk_seg.push(nseg as u32);
    (chunk_tile, chunk_seg, tile_chunk)
}

/// The entries of each chunk (its segments' entries, `seg_ent` their first): their count.
fn chunk_entries<'a>(chunk_seg: &'a [u32], seg_ent: &'a [u64]) -> impl Iterator<Item = usize> + 'a {
    chunk_seg
        .windows(2)
        .map(|w| (seg_ent[w[1] as usize] - seg_ent[w[0] as usize]) as usize)
}

/// What the entry arrays are filled from: `a`'s rows cut into segments (`seg_csr`: each
/// segment's CSR start and length, in tile order; `seg_ent` their first entries), the
/// segments in chunks (`chunk_seg`).
struct Entries<'a> {
    a: &'a Csr,
    tile_bits: u32,
    chunk_seg: &'a [u32],
    seg_ent: &'a [u64],
    seg_csr: &'a [(u64, u32)],
}

impl Entries<'_> {
    /// The row entries in tile order, segment by segment: the column within the tile (with
    /// [`LCOL_END`] on each segment's last entry) and the value (`conv`erted), filled per chunk
    /// in parallel (chunks own disjoint entry ranges).
    fn rows<V: Copy + Default + Send>(&self, conv: impl Fn(f64) -> V + Sync) -> (Vec<u16>, Vec<V>) {
        let (ci, va, nnz) = (self.a.indices(), self.a.data(), self.a.nnz());
        let mask = (1u32 << self.tile_bits) - 1;
        let mut a_lcol = vec![0u16; nnz];
        let mut vals = vec![V::default(); nnz];
        let lcols = par::split_parts(&mut a_lcol, chunk_entries(self.chunk_seg, self.seg_ent));
        let values = par::split_parts(&mut vals, chunk_entries(self.chunk_seg, self.seg_ent));
        lcols
            .into_par_iter()
            .zip(values)
            .enumerate()
            .for_each(|(q, (l, v))| {
                let (s0, s1) = (self.chunk_seg[q] as usize, self.chunk_seg[q + 1] as usize);
                let mut k = 0;
                for &(st, len) in &self.seg_csr[s0..s1] {
                    for j in st as usize..st as usize + len as usize {
                        l[k] = (ci[j] & mask) as u16;
                        v[k] = conv(va[j]);
                        k += 1;
                    }
                    l[k - 1] |= LCOL_END;
                }
            });
        (a_lcol, vals)
    }

    /// The column entries: within each chunk, its segments' entries sorted by local column
    /// (stable: segment order within a column). Returns the column offsets (chunks x tile
    /// columns + 1), the segment within the chunk and the value (`conv`erted).
    fn columns<V: Copy + Default + Send>(
        &self,
        conv: impl Fn(f64) -> V + Sync,
    ) -> (Vec<u64>, Vec<u16>, Vec<V>) {
        let (ci, va, nnz) = (self.a.indices(), self.a.data(), self.a.nnz());
        let (chunk_seg, seg_ent) = (self.chunk_seg, self.seg_ent);
        let tsz = 1usize << self.tile_bits;
        let mask = (tsz - 1) as u32;
        let nchunks = chunk_seg.len() - 1;
        let mut b_colptr = vec![0u64; nchunks * tsz + 1];
        let mut b_lseg = vec![0u16; nnz];
        let mut b_vals = vec![V::default(); nnz];
        let colptrs = par::split_parts(&mut b_colptr[..nchunks * tsz], (0..nchunks).map(|_| tsz));
        let lsegs = par::split_parts(&mut b_lseg, chunk_entries(chunk_seg, seg_ent));
        let values = par::split_parts(&mut b_vals, chunk_entries(chunk_seg, seg_ent));
        colptrs
            .into_par_iter()
            .zip(lsegs)
            .zip(values)
            .enumerate()
            .for_each(|(q, ((cp, ls), bv))| {
                let (s0, s1) = (chunk_seg[q] as usize, chunk_seg[q + 1] as usize);
                let e0 = seg_ent[s0];
                let mut count = vec![0u64; tsz + 1];
                for &(st, len) in &self.seg_csr[s0..s1] {
                    for &c in &ci[st as usize..st as usize + len as usize] {
                        count[(c & mask) as usize + 1] += 1;
                    }
                }
                for c in 0..tsz {
                    count[c + 1] += count[c];
                }
                for c in 0..tsz {
                    cp[c] = e0 + count[c];
                }
                for (s, &(st, len)) in self.seg_csr[s0..s1].iter().enumerate() {
                    for j in st as usize..st as usize + len as usize {
                        let c = (ci[j] & mask) as usize;
                        let pos = count[c] as usize;
                        count[c] += 1;
                        ls[pos] = s as u16;
                        bv[pos] = conv(va[j]);
                    }
                }
            });
        b_colptr[nchunks * tsz] = nnz as u64;
        (b_colptr, b_lseg, b_vals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_accepts_what_is_made_and_names_what_is_damaged() {
        let a = crate::testproblems::awkward_csr(3000, 5000, 6);
        for half in [TiledHalf::Both, TiledHalf::Rows, TiledHalf::Cols] {
            let t = Tiled::from_csr_half(&a, Precision::F32, 9, half);
            assert_eq!(t.check(), Ok(()), "{half:?}");
        }
        let good = Tiled::from_csr(&a, Precision::F64, 9);
        type Damage = Box<dyn Fn(&mut Tiled)>;
        let damaged: Vec<(&str, Damage)> = vec![
            ("tile_bits", Box::new(|t| t.tile_bits = 0)),
            (
                "chunk_seg",
                Box::new(|t| *t.chunk_seg.last_mut().unwrap() += 1),
            ),
            (
                "tile_chunk",
                Box::new(|t| t.tile_chunk.pop().map(drop).unwrap()),
            ),
            ("row_seg", Box::new(|t| t.row_seg[1] = t.row_seg[2] + 1)),
            ("seg_ent", Box::new(|t| *t.seg_ent.last_mut().unwrap() -= 1)),
            ("chunk_tile", Box::new(|t| t.chunk_tile[0] = u32::MAX)),
            ("seg_row", Box::new(|t| t.seg_row[0] = t.nrows as u32)),
            ("seg_pos", Box::new(|t| t.seg_pos.truncate(1))),
            ("row entries", Box::new(|t| t.a_lcol.truncate(1))),
            ("b_colptr", Box::new(|t| t.b_colptr[1] = u64::MAX)),
            ("column entries", Box::new(|t| t.b_lseg.push(0))),
            (
                "segment beyond",
                Box::new(|t| t.b_lseg[0] = CHUNK_SEGS as u16),
            ),
        ];
        for (what, damage) in damaged {
            let mut t = good.clone();
            damage(&mut t);
            let e = t.check().expect_err(what);
            assert!(e.contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn a_half_is_that_half_of_the_whole() {
        let a = crate::testproblems::awkward_csr(3000, 5000, 5);
        for p in [Precision::F64, Precision::F32] {
            let both = Tiled::from_csr(&a, p, 9);
            let rows = Tiled::from_csr_half(&a, p, 9, TiledHalf::Rows);
            let cols = Tiled::from_csr_half(&a, p, 9, TiledHalf::Cols);
            assert_eq!(
                (rows.a_lcol.clone(), rows.a_val.clone()),
                (both.a_lcol.clone(), both.a_val.clone())
            );
            assert!(rows.b_colptr.is_empty() && rows.b_lseg.is_empty());
            assert_eq!(
                (&cols.b_colptr, &cols.b_lseg, &cols.b_val),
                (&both.b_colptr, &both.b_lseg, &both.b_val)
            );
            assert!(cols.a_lcol.is_empty());
            for t in [&rows, &cols] {
                assert_eq!(t.seg_row, both.seg_row);
                assert_eq!(t.seg_pos, both.seg_pos);
                assert_eq!(t.chunk_seg, both.chunk_seg);
                assert_eq!(t.bytes(), both.bytes());
                assert_eq!(t.precision(), p);
            }
        }
    }

    #[test]
    fn tiled_products_equal_csr_on_awkward_shapes() {
        for &(m, n, seed, bits) in &[
            (2000usize, 700usize, 1u64, 6u32),
            (300, 200_000, 2, 9),
            (50_000, 64, 3, 4),
            (7, 3, 4, 1),
            (3000, 5000, 5, 9),
        ] {
            let a = crate::testproblems::awkward_csr(m, n, seed);
            let x: Vec<f64> = (0..n).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
            let y: Vec<f64> = (0..m)
                .map(|i| ((i * 13) % 17) as f64 * 0.25 - 2.0)
                .collect();
            let t = Tiled::from_csr(&a, Precision::F64, bits);
            assert_eq!(t.nnz, a.nnz());
            for s in 0..t.nseg() {
                let (e0, e1) = (t.seg_ent[s] as usize, t.seg_ent[s + 1] as usize);
                for k in e0..e1 {
                    assert_eq!(t.a_lcol[k] & LCOL_END != 0, k + 1 == e1, "end bit of {k}");
                }
                assert_eq!(t.seg_pos[t.seg_slot[s] as usize] as usize, s);
            }
            assert!(t
                .chunk_seg
                .windows(2)
                .all(|w| w[1] - w[0] <= CHUNK_SEGS as u32));
            let ax = a.matvec(&x);
            for (p, q) in t.matvec(&x).iter().zip(&ax) {
                assert!(
                    (p - q).abs() <= 1e-12 * (1.0 + q.abs()),
                    "{m}x{n}: {p} vs {q}"
                );
            }
            let aty = a.transpose().matvec(&y);
            for (p, q) in t.matvec_t(&y).iter().zip(&aty) {
                assert!(
                    (p - q).abs() <= 1e-12 * (1.0 + q.abs()),
                    "{m}x{n} T: {p} vs {q}"
                );
            }
        }
    }

    #[test]
    fn a_tile_hit_by_many_rows_is_cut_into_chunks() {
        // 5000 rows all in column 3: one tile, three chunks
        let m = 5000;
        let r: Vec<u64> = (0..m as u64).collect();
        let c = vec![3u64; m];
        let v: Vec<f64> = (0..m).map(|i| 1.0 + i as f64).collect();
        let a = Csr::from_triplets(m, 10, &r, &c, &v).unwrap();
        let t = Tiled::from_csr(&a, Precision::F32, 3);
        assert_eq!(t.nchunks(), 3 + 1); // tile 0: 3 chunks; tile 1 (columns 8, 9): 1 empty
        let y = vec![1.0; m];
        let want: f64 = v.iter().map(|&x| x as f32 as f64).sum();
        assert_eq!(t.matvec_t(&y)[3], want);
        // chunks of 512 segments: ten in tile 0, and the same column sum (in chunk order)
        let t = Tiled::from_csr_chunked(&a, Precision::F32, 3, TiledHalf::Cols, 512);
        assert_eq!(t.nchunks(), 10 + 1);
        assert_eq!(t.check(), Ok(()));
        assert_eq!(t.matvec_t(&y)[3], want);
    }

    #[test]
    fn smaller_chunks_give_the_same_products() {
        let a = crate::testproblems::awkward_csr(3000, 5000, 6);
        let y: Vec<f64> = (0..3000)
            .map(|i| ((i * 13) % 17) as f64 * 0.25 - 2.0)
            .collect();
        let whole = Tiled::from_csr(&a, Precision::F64, 9);
        for segs in [1, 7, 512] {
            let t = Tiled::from_csr_chunked(&a, Precision::F64, 9, TiledHalf::Both, segs);
            assert_eq!(t.check(), Ok(()), "chunks of {segs}");
            assert!(t.nchunks() > whole.nchunks() || segs == 512);
            assert!(t
                .chunk_seg
                .windows(2)
                .all(|w| (w[1] - w[0]) as usize <= segs));
            let x = vec![1.0; 5000];
            assert_eq!(t.matvec(&x), whole.matvec(&x));
            let (p, q) = (t.matvec_t(&y), whole.matvec_t(&y));
            for (p, q) in p.iter().zip(&q) {
                assert!(
                    (p - q).abs() <= 1e-12 * (1.0 + q.abs()),
                    "chunks of {segs}: {p} vs {q}"
                );
            }
        }
    }
}
