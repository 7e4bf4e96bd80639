//! Compressed sparse row storage with u64 row offsets (a matrix may hold more than 2^31
//! nonzeros) and u32 column indices, and its transpose form CSC (= CSR of A^T).

use rayon::prelude::*;

use super::{par, Lanes};
use crate::error::{Result, StructureError};

/// A CSR matrix: row `i` holds `indices[indptr[i]..indptr[i+1]]` with matching `data`.
/// Invariants (checked by [`Csr::try_new`]): column indices strictly increase within a row,
/// are `< ncols`, and every value is finite.
#[derive(Debug, Clone, PartialEq)]
pub struct Csr {
    nrows: usize,
    ncols: usize,
    indptr: Vec<u64>,
    indices: Vec<u32>,
    data: Vec<f64>,
}

impl crate::sparse::par::GiveBack for Csr {
    fn give_back(&mut self) {
        use crate::sparse::par::give_back_pages;
        give_back_pages(&mut self.indptr);
        give_back_pages(&mut self.indices);
        give_back_pages(&mut self.data);
    }
}

/// `a` followed by `f` of each value of `b`, as one new vector: allocated once (zeroed pages,
/// faulted in by the threads that fill them) and filled in parallel pieces.
fn concat_par<T: Copy + Default + Send + Sync>(
    a: &[T],
    b: &[T],
    f: impl Fn(T) -> T + Sync,
) -> Vec<T> {
    const PIECE: usize = 1 << 18;
    let mut v = vec![T::default(); a.len() + b.len()];
    let (va, vb) = v.split_at_mut(a.len());
    va.par_chunks_mut(PIECE)
        .zip(a.par_chunks(PIECE))
        .for_each(|(d, s)| d.copy_from_slice(s));
    vb.par_chunks_mut(PIECE)
        .zip(b.par_chunks(PIECE))
        .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, &s)| *d = f(s)));
    v
}

impl Csr {
    /// Validating constructor: the arrays must describe a well-formed CSR matrix with sorted,
    /// unique column indices and finite values.
    pub fn try_new(
        nrows: usize,
        ncols: usize,
        indptr: Vec<u64>,
        indices: Vec<u32>,
        data: Vec<f64>,
    ) -> Result<Self, StructureError> {
        if ncols > u32::MAX as usize + 1 {
            return Err(StructureError::TooManyColumns { ncols });
        }
        if indptr.len() != nrows + 1 {
            return Err(StructureError::OffsetsLength {
                got: indptr.len(),
                expected: nrows + 1,
            });
        }
        if indptr[0] != 0 {
            return Err(StructureError::OffsetsStart(indptr[0]));
        }
        if indices.len() != data.len() {
            return Err(StructureError::LengthMismatch {
                indices: indices.len(),
                values: data.len(),
            });
        }
        for (row, w) in indptr.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(StructureError::OffsetsDecrease { row });
            }
        }
        let last = indptr[nrows];
        if last != indices.len() as u64 {
            return Err(StructureError::OffsetsEnd {
                last,
                nnz: indices.len(),
            });
        }
        // Rows checked in parallel blocks; the first bad row (in row order) is the error.
        let check_row = |row: usize| -> Result<(), StructureError> {
            let (s, e) = (indptr[row] as usize, indptr[row + 1] as usize);
            let mut prev: Option<u32> = None;
            for k in s..e {
                let col = indices[k];
                if col as usize >= ncols {
                    return Err(StructureError::ColumnOutOfRange {
                        row,
                        col: col as u64,
                        ncols,
                    });
                }
                if prev.is_some_and(|p| col <= p) {
                    return Err(StructureError::Unsorted { row, col });
                }
                if !data[k].is_finite() {
                    return Err(StructureError::NonFinite {
                        row,
                        col,
                        value: data[k],
                    });
                }
                prev = Some(col);
            }
            Ok(())
        };
        let block = 4096;
        let first_bad = (0..nrows.div_ceil(block))
            .into_par_iter()
            .find_map_first(|b| {
                (b * block..((b + 1) * block).min(nrows)).find_map(|row| check_row(row).err())
            });
        if let Some(e) = first_bad {
            return Err(e);
        }
        Ok(Csr {
            nrows,
            ncols,
            indptr,
            indices,
            data,
        })
    }

    /// [`Self::try_new`]'s checks on a matrix built another way (tests: the builder kept the
    /// invariants).
    #[cfg(test)]
    pub fn check(&self) -> Result<(), StructureError> {
        Csr::try_new(
            self.nrows,
            self.ncols,
            self.indptr.clone(),
            self.indices.clone(),
            self.data.clone(),
        )
        .map(|_| ())
    }

    /// Build from (row, col, value) triplets in any order; duplicates are summed. Indices are
    /// checked against the shape; values must be finite.
    pub fn from_triplets(
        nrows: usize,
        ncols: usize,
        rows: &[u64],
        cols: &[u64],
        vals: &[f64],
    ) -> Result<Self, StructureError> {
        if rows.len() != cols.len() || rows.len() != vals.len() {
            return Err(StructureError::LengthMismatch {
                indices: rows.len(),
                values: vals.len(),
            });
        }
        if ncols > u32::MAX as usize + 1 {
            return Err(StructureError::TooManyColumns { ncols });
        }
        let mut counts = vec![0u64; nrows + 1];
        for (k, (&r, &c)) in rows.iter().zip(cols).enumerate() {
            if r as usize >= nrows {
                return Err(StructureError::Shape(format!(
                    "entry {k}: row {r} out of range (nrows = {nrows})"
                )));
            }
            if c as usize >= ncols {
                return Err(StructureError::ColumnOutOfRange {
                    row: r as usize,
                    col: c,
                    ncols,
                });
            }
            if !vals[k].is_finite() {
                return Err(StructureError::NonFinite {
                    row: r as usize,
                    col: c as u32,
                    value: vals[k],
                });
            }
            counts[r as usize + 1] += 1;
        }
        for i in 0..nrows {
            counts[i + 1] += counts[i];
        }
        let mut next = counts.clone();
        let mut idx = vec![0u32; rows.len()];
        let mut val = vec![0f64; rows.len()];
        for k in 0..rows.len() {
            let r = rows[k] as usize;
            let p = next[r] as usize;
            idx[p] = cols[k] as u32;
            val[p] = vals[k];
            next[r] += 1;
        }
        // Sort each row by column and sum duplicates, compacting in place.
        let mut indptr = vec![0u64; nrows + 1];
        let mut out = 0usize;
        let mut perm: Vec<usize> = Vec::new();
        for r in 0..nrows {
            let (s, e) = (counts[r] as usize, counts[r + 1] as usize);
            perm.clear();
            perm.extend(s..e);
            perm.sort_by_key(|&p| idx[p]);
            let row_start = out;
            let (ri, rv): (Vec<u32>, Vec<f64>) = perm.iter().map(|&p| (idx[p], val[p])).unzip();
            for (c, v) in ri.into_iter().zip(rv) {
                if out > row_start && idx[out - 1] == c {
                    val[out - 1] += v;
                } else {
                    idx[out] = c;
                    val[out] = v;
                    out += 1;
                }
            }
            indptr[r + 1] = out as u64;
        }
        idx.truncate(out);
        val.truncate(out);
        Ok(Csr {
            nrows,
            ncols,
            indptr,
            indices: idx,
            data: val,
        })
    }

    /// [`Self::from_triplets`] of `parts` one after another (rows < `nrows` <= 2^32, columns <
    /// `ncols`, values finite: checked by the caller, a file reader), built in parallel:
    /// entries sorted by row and then column (row-major files) are placed as they are, entries
    /// sorted by column and then row (column-major files) through a transpose, anything else
    /// by a counting sort by blocks of rows; duplicates are summed in the order they come, as
    /// `from_triplets` sums them. The same matrix bit for bit.
    pub fn from_triplet_parts(nrows: usize, ncols: usize, parts: Vec<TripletPart>) -> Csr {
        assert!(nrows <= u32::MAX as usize + 1 && ncols <= u32::MAX as usize + 1);
        let key_rc = |p: &TripletPart, k: usize| ((p.rows[k] as u64) << 32) | p.cols[k] as u64;
        let key_cr = |p: &TripletPart, k: usize| ((p.cols[k] as u64) << 32) | p.rows[k] as u64;
        if TripletPart::increasing(&parts, key_rc) {
            return Self::from_sorted_parts(nrows, ncols, &parts, |p| &p.rows, |p| &p.cols);
        }
        if TripletPart::increasing(&parts, key_cr) {
            let t = Self::from_sorted_parts(ncols, nrows, &parts, |p| &p.cols, |p| &p.rows);
            drop(parts);
            return t.transpose();
        }
        Self::from_parts_sorted_by_blocks(nrows, ncols, parts)
    }

    /// The matrix of `parts` whose entries are, one part after another, sorted by (`major`,
    /// `minor`) with no repeats: `major` indices are the rows.
    fn from_sorted_parts(
        nrows: usize,
        ncols: usize,
        parts: &[TripletPart],
        major: impl Fn(&TripletPart) -> &[u32] + Sync,
        minor: impl Fn(&TripletPart) -> &[u32] + Sync,
    ) -> Csr {
        let lens: Vec<u64> = parts.iter().map(|p| p.len() as u64).collect();
        let starts = par::offsets(&lens);
        let nnz = starts[parts.len()] as usize;
        // Each part fills the row offsets from after the last row of the part before it up to
        // its own last row; the rows after the last entry end at nnz.
        let mut owned = Vec::with_capacity(parts.len());
        let mut next_row = 0usize;
        for p in parts {
            match major(p).last() {
                Some(&last) => {
                    owned.push(last as usize + 1 - next_row);
                    next_row = last as usize + 1;
                }
                None => owned.push(0),
            }
        }
        let mut indptr = vec![0u64; nrows + 1];
        indptr[next_row..].fill(nnz as u64);
        let first_rows = {
            let mut f = Vec::with_capacity(parts.len());
            let mut r = 0;
            for &o in &owned {
                f.push(r);
                r += o;
            }
            f
        };
        par::split_parts(&mut indptr[..next_row], owned.iter().copied())
            .into_par_iter()
            .enumerate()
            .for_each(|(q, out)| {
                let rows = major(&parts[q]);
                let mut k = 0;
                for (i, o) in out.iter_mut().enumerate() {
                    let r = (first_rows[q] + i) as u32;
                    while rows[k] < r {
                        k += 1;
                    }
                    *o = starts[q] + k as u64;
                }
            });
        let mut indices = vec![0u32; nnz];
        let mut data = vec![0f64; nnz];
        let is = par::split_parts(&mut indices, lens.iter().map(|&l| l as usize));
        let vs = par::split_parts(&mut data, lens.iter().map(|&l| l as usize));
        is.into_par_iter()
            .zip(vs)
            .zip(parts)
            .for_each(|((i, v), p)| {
                i.copy_from_slice(minor(p));
                v.copy_from_slice(&p.vals);
            });
        Csr::from_trusted(nrows, ncols, indptr, indices, data)
    }

    /// [`Self::from_triplet_parts`] for entries in any order: a stable counting sort of the
    /// entries into ranges of rows (each part, in parallel, puts its entries at its places of
    /// each range), then per range, in parallel, a stable counting sort by row, each row's
    /// entries sorted by column (stable) and repeats summed in order.
    fn from_parts_sorted_by_blocks(nrows: usize, ncols: usize, parts: Vec<TripletPart>) -> Csr {
        let nnz: usize = parts.iter().map(|p| p.len()).sum();
        if nrows == 0 || nnz == 0 {
            return Csr::zeros(nrows, ncols);
        }
        let width = nrows.div_ceil(par::blocks_for(nnz, 4)).max(1);
        let nranges = nrows.div_ceil(width);
        let mut next = vec![0u64; parts.len() * nranges];
        next.par_chunks_mut(nranges)
            .zip(&parts)
            .for_each(|(count, p)| {
                for &r in &p.rows {
                    count[r as usize / width] += 1;
                }
            });
        let range_start = par::block_starts(&mut next, nranges);
        let mut br = vec![0u32; nnz];
        let mut bc = vec![0u32; nnz];
        let mut bv = vec![0f64; nnz];
        {
            let (pr, pc, pv) = (
                par::Scatter::new(&mut br),
                par::Scatter::new(&mut bc),
                par::Scatter::new(&mut bv),
            );
            next.par_chunks_mut(nranges)
                .zip(&parts)
                .for_each(|(next, p)| {
                    for k in 0..p.len() {
                        let g = p.rows[k] as usize / width;
                        let at = next[g] as usize;
                        next[g] += 1;
                        // SAFETY: part q owns places next[g].. of every range g, up to the next
                        // part's (block_starts), and takes each once.
                        unsafe {
                            pr.put(at, p.rows[k]);
                            pc.put(at, p.cols[k]);
                            pv.put(at, p.vals[k]);
                        }
                    }
                });
        }
        drop(parts);
        let range_len = |g: usize| (range_start[g + 1] - range_start[g]) as usize;
        let mut lens = vec![0u64; nrows];
        let kept: Vec<usize> = par::split_parts(&mut bc, (0..nranges).map(range_len))
            .into_par_iter()
            .zip(par::split_parts(&mut bv, (0..nranges).map(range_len)))
            .zip(lens.par_chunks_mut(width))
            .enumerate()
            .map(|(g, ((cols, vals), lens))| {
                let r0 = g * width;
                let rows = &br[range_start[g] as usize..range_start[g + 1] as usize];
                // by row, stable
                let mut at = vec![0usize; lens.len() + 1];
                for &r in rows {
                    at[r as usize - r0 + 1] += 1;
                }
                for i in 0..lens.len() {
                    at[i + 1] += at[i];
                }
                let (mut tc, mut tv) = (vec![0u32; rows.len()], vec![0f64; rows.len()]);
                {
                    let mut next = at.clone();
                    for k in 0..rows.len() {
                        let i = rows[k] as usize - r0;
                        tc[next[i]] = cols[k];
                        tv[next[i]] = vals[k];
                        next[i] += 1;
                    }
                }
                // each row by column (stable: (column, place) keys), repeats summed in order
                let mut out = 0usize;
                let mut keys: Vec<u64> = Vec::new();
                for (i, len) in lens.iter_mut().enumerate() {
                    let (s, e) = (at[i], at[i + 1]);
                    keys.clear();
                    keys.extend((s..e).map(|k| ((tc[k] as u64) << 32) | (k - s) as u64));
                    keys.sort_unstable();
                    let row_start = out;
                    for &key in &keys {
                        let (c, v) = ((key >> 32) as u32, tv[s + (key as u32) as usize]);
                        if out > row_start && cols[out - 1] == c {
                            vals[out - 1] += v;
                        } else {
                            cols[out] = c;
                            vals[out] = v;
                            out += 1;
                        }
                    }
                    *len = (out - row_start) as u64;
                }
                out
            })
            .collect();
        drop(br);
        let indptr = par::offsets(&lens);
        let total = indptr[nrows] as usize;
        let mut indices = vec![0u32; total];
        let mut data = vec![0f64; total];
        let is = par::split_parts(&mut indices, kept.iter().copied());
        let vs = par::split_parts(&mut data, kept.iter().copied());
        is.into_par_iter()
            .zip(vs)
            .enumerate()
            .for_each(|(g, (i, v))| {
                let s = range_start[g] as usize;
                i.copy_from_slice(&bc[s..s + i.len()]);
                v.copy_from_slice(&bv[s..s + v.len()]);
            });
        Csr::from_trusted(nrows, ncols, indptr, indices, data)
    }

    /// An empty matrix of the given shape.
    pub fn zeros(nrows: usize, ncols: usize) -> Self {
        Csr {
            nrows,
            ncols,
            indptr: vec![0; nrows + 1],
            indices: Vec::new(),
            data: Vec::new(),
        }
    }

    /// Skip validation: for arrays produced by code that already guarantees the invariants
    /// (a checked load, a transpose, a stack of valid matrices).
    pub(crate) fn from_trusted(
        nrows: usize,
        ncols: usize,
        indptr: Vec<u64>,
        indices: Vec<u32>,
        data: Vec<f64>,
    ) -> Self {
        debug_assert_eq!(indptr.len(), nrows + 1);
        debug_assert_eq!(indices.len(), data.len());
        Csr {
            nrows,
            ncols,
            indptr,
            indices,
            data,
        }
    }

    pub fn nrows(&self) -> usize {
        self.nrows
    }
    pub fn ncols(&self) -> usize {
        self.ncols
    }
    pub fn shape(&self) -> (usize, usize) {
        (self.nrows, self.ncols)
    }
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }
    pub fn indptr(&self) -> &[u64] {
        &self.indptr
    }
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }
    pub fn data(&self) -> &[f64] {
        &self.data
    }
    /// Values may be changed freely (they stay finite if the caller keeps them so).
    pub fn data_mut(&mut self) -> &mut [f64] {
        &mut self.data
    }
    /// Column indices and values of row `i`.
    pub fn row(&self, i: usize) -> (&[u32], &[f64]) {
        let (s, e) = (self.indptr[i] as usize, self.indptr[i + 1] as usize);
        (&self.indices[s..e], &self.data[s..e])
    }
    /// Rows `..at` and rows `at..` as two matrices of the same columns.
    pub fn split_at_row(self, at: usize) -> (Csr, Csr) {
        assert!(at <= self.nrows, "split at row {at} of {}", self.nrows);
        let Csr {
            nrows,
            ncols,
            mut indptr,
            mut indices,
            mut data,
        } = self;
        let cut = indptr[at];
        let tail_ptr: Vec<u64> = indptr[at..].iter().map(|&p| p - cut).collect();
        let tail_idx = indices.split_off(cut as usize);
        let tail_val = data.split_off(cut as usize);
        indptr.truncate(at + 1);
        (
            Csr::from_trusted(at, ncols, indptr, indices, data),
            Csr::from_trusted(nrows - at, ncols, tail_ptr, tail_idx, tail_val),
        )
    }
    pub fn into_parts(self) -> (usize, usize, Vec<u64>, Vec<u32>, Vec<f64>) {
        (self.nrows, self.ncols, self.indptr, self.indices, self.data)
    }

    /// The transpose, as a new CSR matrix (counting sort by column: rows stay sorted). Blocks of
    /// rows count and place their entries in parallel ([`par::block_starts`]): the same matrix
    /// as the sequential counting sort.
    pub fn transpose(&self) -> Csr {
        let (n, nnz) = (self.ncols, self.nnz());
        // the per-block counters (8 bytes per block and column) stay below 4 bytes per entry
        let parts = par::blocks_for(nnz + self.nrows, 1).min((nnz / (2 * n.max(1))).max(1));
        if parts <= 1 {
            return self.transpose_sequential();
        }
        let (ip, ci, va) = (&self.indptr, &self.indices, &self.data);
        let bounds = par::row_blocks(ip, parts);
        let mut next = vec![0u64; parts * n];
        next.par_chunks_mut(n).enumerate().for_each(|(b, count)| {
            let (s, e) = (ip[bounds[b]] as usize, ip[bounds[b + 1]] as usize);
            for &c in &ci[s..e] {
                count[c as usize] += 1;
            }
        });
        let indptr = par::block_starts(&mut next, n);
        let mut idx = vec![0u32; nnz];
        let mut val = vec![0f64; nnz];
        let (pi, pv) = (par::Scatter::new(&mut idx), par::Scatter::new(&mut val));
        next.par_chunks_mut(n).enumerate().for_each(|(b, next)| {
            for r in bounds[b]..bounds[b + 1] {
                let (s, e) = (ip[r] as usize, ip[r + 1] as usize);
                for (&c, &v) in ci[s..e].iter().zip(&va[s..e]) {
                    let p = next[c as usize] as usize;
                    next[c as usize] += 1;
                    // SAFETY: block b owns places next[c].. of every column c, up to the next
                    // block's (block_starts), and takes each once.
                    unsafe {
                        pi.put(p, r as u32);
                        pv.put(p, v);
                    }
                }
            }
        });
        Csr {
            nrows: self.ncols,
            ncols: self.nrows,
            indptr,
            indices: idx,
            data: val,
        }
    }

    /// [`Self::transpose`] on the calling thread.
    fn transpose_sequential(&self) -> Csr {
        let mut counts = vec![0u64; self.ncols + 1];
        for &c in &self.indices {
            counts[c as usize + 1] += 1;
        }
        for j in 0..self.ncols {
            counts[j + 1] += counts[j];
        }
        let mut next = counts.clone();
        let mut idx = vec![0u32; self.nnz()];
        let mut val = vec![0f64; self.nnz()];
        for r in 0..self.nrows {
            let (cols, vals) = self.row(r);
            for (&c, &v) in cols.iter().zip(vals) {
                let p = next[c as usize] as usize;
                idx[p] = r as u32;
                val[p] = v;
                next[c as usize] += 1;
            }
        }
        Csr {
            nrows: self.ncols,
            ncols: self.nrows,
            indptr: counts,
            indices: idx,
            data: val,
        }
    }

    /// Stack `self` on top of `scale * other` (same column count): the system [A; λR].
    pub fn vstack_scaled(&self, other: &Csr, scale: f64) -> Result<Csr, StructureError> {
        if other.ncols != self.ncols {
            return Err(StructureError::Shape(format!(
                "cannot stack a matrix with {} columns under one with {}",
                other.ncols, self.ncols
            )));
        }
        // Each array made once at its final size and filled in parallel (a stacked kernel is
        // gigabytes: a clone then an extend copied it twice, on one thread).
        let base = self.nnz() as u64;
        let indptr = concat_par(&self.indptr, &other.indptr[1..], |p| p + base);
        let indices = concat_par(&self.indices, &other.indices, |c| c);
        let data = concat_par(&self.data, &other.data, |v| v * scale);
        Ok(Csr::from_trusted(
            self.nrows + other.nrows,
            self.ncols,
            indptr,
            indices,
            data,
        ))
    }

    /// The matrix with column j renamed `new_of_old[j]` (a permutation of 0..ncols); each row's
    /// entries are re-sorted by their new column.
    pub fn permute_columns(&self, new_of_old: &[u32]) -> Csr {
        assert_eq!(new_of_old.len(), self.ncols);
        self.gather(None, Some(new_of_old))
    }

    /// Rows with indices `rows` (in that order) as a new matrix.
    pub fn select_rows(&self, rows: &[usize]) -> Csr {
        self.gather(Some(rows), None)
    }

    /// The matrix with its rows in the order `rows` (new row i is old row `rows[i]`) and column
    /// j renamed `cols[j]` (a permutation of 0..ncols; each row re-sorted by its new columns):
    /// one new copy when the rows move, none when only the columns do (renamed in place).
    pub fn permuted(mut self, rows: Option<&[usize]>, cols: Option<&[u32]>) -> Csr {
        if let Some(p) = cols {
            assert_eq!(p.len(), self.ncols);
        }
        match (rows, cols) {
            (Some(_), _) => self.gather(rows, cols),
            (None, None) => self,
            (None, Some(p)) => {
                let parts = par::blocks_for(self.nnz() + self.nrows, 4);
                let bounds = par::row_blocks(&self.indptr, parts);
                let ip = &self.indptr;
                let is = par::split_rows(&mut self.indices, ip, &bounds);
                let vs = par::split_rows(&mut self.data, ip, &bounds);
                is.into_par_iter()
                    .zip(vs)
                    .enumerate()
                    .for_each(|(b, (ci, va))| {
                        let (mut keys, mut vals) = (Vec::new(), Vec::new());
                        let base = ip[bounds[b]];
                        for r in bounds[b]..bounds[b + 1] {
                            let (s, e) = ((ip[r] - base) as usize, (ip[r + 1] - base) as usize);
                            vals.clear();
                            vals.extend_from_slice(&va[s..e]);
                            rename_sort(&mut keys, &ci[s..e], p);
                            write_sorted(&keys, &vals, &mut ci[s..e], &mut va[s..e]);
                        }
                    });
                self
            }
        }
    }

    /// [`Self::permuted`] as a new matrix beside this one.
    pub fn permuted_copy(&self, rows: Option<&[usize]>, cols: Option<&[u32]>) -> Csr {
        self.gather(rows, cols)
    }

    /// Rows `rows` (all, in order, when none) with columns renamed by `cols` (when given) as a
    /// new matrix, filled by blocks of rows in parallel.
    fn gather(&self, rows: Option<&[usize]>, cols: Option<&[u32]>) -> Csr {
        let ip = &self.indptr;
        let m = rows.map_or(self.nrows, |r| r.len());
        let old = |i: usize| rows.map_or(i, |r| r[i]);
        let indptr = match rows {
            None => ip.clone(),
            Some(r) => {
                let len = |&o: &usize| ip[o + 1] - ip[o];
                let lens: Vec<u64> = if r.len() < par::SEQUENTIAL_BELOW {
                    r.iter().map(len).collect()
                } else {
                    r.par_iter().map(len).collect()
                };
                par::offsets(&lens)
            }
        };
        let total = indptr[m] as usize;
        let mut indices = vec![0u32; total];
        let mut data = vec![0f64; total];
        let parts = par::blocks_for(total + m, 4);
        let bounds = par::row_blocks(&indptr, parts);
        let is = par::split_rows(&mut indices, &indptr, &bounds);
        let vs = par::split_rows(&mut data, &indptr, &bounds);
        is.into_par_iter()
            .zip(vs)
            .enumerate()
            .for_each(|(b, (oi, ov))| {
                let mut keys = Vec::new();
                let mut at = 0;
                let end = bounds[b + 1];
                for i in bounds[b]..end {
                    if rows.is_some() {
                        // rows come from anywhere: fetch a row's start a few rows ahead
                        if i + 2 * AHEAD < end {
                            par::prefetch(ip.as_ptr().wrapping_add(old(i + 2 * AHEAD)));
                        }
                        if i + AHEAD < end {
                            let s = ip[old(i + AHEAD)] as usize;
                            par::prefetch(self.indices.as_ptr().wrapping_add(s));
                            par::prefetch(self.data.as_ptr().wrapping_add(s));
                            par::prefetch(self.data.as_ptr().wrapping_add(s + 8));
                        }
                    }
                    let (c, v) = self.row(old(i));
                    let (oc, ow) = (&mut oi[at..at + c.len()], &mut ov[at..at + c.len()]);
                    match cols {
                        None => {
                            oc.copy_from_slice(c);
                            ow.copy_from_slice(v);
                        }
                        Some(p) => {
                            rename_sort(&mut keys, c, p);
                            write_sorted(&keys, v, oc, ow);
                        }
                    }
                    at += c.len();
                }
            });
        Csr::from_trusted(m, self.ncols, indptr, indices, data)
    }

    /// Rows `0..nrows` only (a prefix of the rows: the arrays are cut in place, nothing copied).
    pub fn truncate_rows(&mut self, nrows: usize) {
        assert!(nrows <= self.nrows);
        let end = self.indptr[nrows] as usize;
        self.indptr.truncate(nrows + 1);
        self.indices.truncate(end);
        self.data.truncate(end);
        self.indptr.shrink_to_fit();
        self.indices.shrink_to_fit();
        self.data.shrink_to_fit();
        self.nrows = nrows;
    }

    /// Rows `rows` of this matrix, borrowed.
    pub fn row_range(&self, rows: std::ops::Range<usize>) -> CsrView<'_> {
        assert!(rows.start <= rows.end && rows.end <= self.nrows);
        CsrView { a: self, rows }
    }

    /// Multiply column j by `scale[j]` (right diagonal scaling A D).
    pub fn scale_columns(&mut self, scale: &[f64]) {
        assert_eq!(scale.len(), self.ncols);
        for (v, &c) in self.data.iter_mut().zip(&self.indices) {
            *v *= scale[c as usize];
        }
    }

    /// Euclidean norm of every column.
    pub fn column_norms(&self) -> Vec<f64> {
        let mut s = vec![0.0; self.ncols];
        for (&v, &c) in self.data.iter().zip(&self.indices) {
            s[c as usize] += v * v;
        }
        s.iter_mut().for_each(|x| *x = x.sqrt());
        s
    }

    /// Row i of A x.
    fn row_dot(&self, i: usize, x: &[f64]) -> f64 {
        let (c, v) = self.row(i);
        Lanes::of(c.len(), |k| v[k] * x[c[k] as usize]).sum()
    }

    /// y = A x computed serially (reference implementation for tests and small work).
    pub fn matvec(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.ncols);
        (0..self.nrows).map(|i| self.row_dot(i, x)).collect()
    }

    /// [`Self::matvec`] with the rows in parallel: each row's sum the same, bit for bit.
    pub fn par_matvec(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.ncols);
        (0..self.nrows)
            .into_par_iter()
            .with_min_len(1024)
            .map(|i| self.row_dot(i, x))
            .collect()
    }

    /// [`Self::par_matvec`] of each of `xs`, one pass over the matrix for all (a row's entries
    /// read once, then its sum for each x): each vector the same, bit for bit.
    pub fn par_matvec_many(&self, xs: &[&[f64]]) -> Vec<Vec<f64>> {
        let k = xs.len();
        if k <= 1 {
            return xs.iter().map(|x| self.par_matvec(x)).collect();
        }
        for x in xs {
            assert_eq!(x.len(), self.ncols);
        }
        // row i's k sums at i * k.., then one vector a member
        let mut rows = vec![0.0; self.nrows * k];
        rows.par_chunks_mut(k)
            .with_min_len(1024)
            .enumerate()
            .for_each(|(i, out)| {
                for (o, x) in out.iter_mut().zip(xs) {
                    *o = self.row_dot(i, x);
                }
            });
        (0..k)
            .into_par_iter()
            .map(|j| rows.iter().skip(j).step_by(k).copied().collect())
            .collect()
    }

    /// The diagonal (zero where absent).
    pub fn diagonal(&self) -> Vec<f64> {
        let n = self.nrows.min(self.ncols);
        (0..n)
            .map(|i| {
                let (c, v) = self.row(i);
                c.binary_search(&(i as u32)).map(|k| v[k]).unwrap_or(0.0)
            })
            .collect()
    }
}

/// Entries of a part of a file for [`Csr::from_triplet_parts`]: 0-based rows and columns and
/// their values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TripletPart {
    pub rows: Vec<u32>,
    pub cols: Vec<u32>,
    pub vals: Vec<f64>,
}

impl TripletPart {
    pub fn len(&self) -> usize {
        self.vals.len()
    }
    pub fn is_empty(&self) -> bool {
        self.vals.is_empty()
    }

    /// Whether `key` strictly increases over the entries of all `parts`, one after another.
    fn increasing(parts: &[TripletPart], key: impl Fn(&TripletPart, usize) -> u64 + Sync) -> bool {
        let within = parts
            .par_iter()
            .all(|p| (1..p.len()).all(|k| key(p, k - 1) < key(p, k)));
        let ends: Vec<(u64, u64)> = parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| (key(p, 0), key(p, p.len() - 1)))
            .collect();
        within && ends.windows(2).all(|w| w[0].1 < w[1].0)
    }
}

/// Rows of a CSR matrix, borrowed ([`Csr::row_range`]; a whole matrix converts into one).
#[derive(Debug, Clone)]
pub struct CsrView<'a> {
    a: &'a Csr,
    rows: std::ops::Range<usize>,
}

impl<'a> CsrView<'a> {
    pub fn nrows(&self) -> usize {
        self.rows.len()
    }
    pub fn ncols(&self) -> usize {
        self.a.ncols
    }
    /// Column indices and values of row `i` of the view (row `rows.start + i` of the matrix).
    pub fn row(&self, i: usize) -> (&'a [u32], &'a [f64]) {
        assert!(i < self.rows.len());
        self.a.row(self.rows.start + i)
    }
}

impl<'a> From<&'a Csr> for CsrView<'a> {
    fn from(a: &'a Csr) -> Self {
        a.row_range(0..a.nrows)
    }
}

/// Rows ahead of a gather in a permuted order whose starts are prefetched.
const AHEAD: usize = 16;

/// `keys` := the entries of a row with columns `c` renamed by `p`, as (new column << 32 | place
/// in the row), sorted (the new columns of a row are distinct, so any sort gives this order).
#[inline]
fn rename_sort(keys: &mut Vec<u64>, c: &[u32], p: &[u32]) {
    keys.clear();
    let mut sorted = true;
    let mut prev = 0u64;
    for (k, &j) in c.iter().enumerate() {
        let key = ((p[j as usize] as u64) << 32) | k as u64;
        sorted &= k == 0 || key > prev;
        prev = key;
        keys.push(key);
    }
    if !sorted {
        keys.sort_unstable();
    }
}

/// The row of `keys` ([`rename_sort`]) written out: new columns to `oc`, the values `v` of
/// the places to `ov`.
#[inline]
fn write_sorted(keys: &[u64], v: &[f64], oc: &mut [u32], ov: &mut [f64]) {
    for ((o, w), &key) in oc.iter_mut().zip(ov.iter_mut()).zip(keys) {
        *o = (key >> 32) as u32;
        *w = v[key as u32 as usize];
    }
}

/// Compressed sparse column storage of A, held as the CSR of A^T.
#[derive(Debug, Clone, PartialEq)]
pub struct Csc {
    t: Csr,
}

#[allow(clippy::misnamed_getters)] // the fields of A^T, read as A's
impl Csc {
    /// CSC copy of a CSR matrix.
    pub fn from_csr(a: &Csr) -> Self {
        Csc { t: a.transpose() }
    }
    /// Rows of A.
    pub fn nrows(&self) -> usize {
        self.t.ncols
    }
    /// Columns of A.
    pub fn ncols(&self) -> usize {
        self.t.nrows
    }
    pub fn nnz(&self) -> usize {
        self.t.nnz()
    }
    /// A^T in CSR form: row j of it is column j of A.
    pub fn transpose_csr(&self) -> &Csr {
        &self.t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Csr {
        // [1 0 2]
        // [0 0 0]
        // [3 4 0]
        Csr::try_new(
            3,
            3,
            vec![0, 2, 2, 4],
            vec![0, 2, 0, 1],
            vec![1., 2., 3., 4.],
        )
        .unwrap()
    }

    #[test]
    fn try_new_rejects_bad_structure() {
        use StructureError::*;
        assert!(matches!(
            Csr::try_new(2, 2, vec![0, 1], vec![0], vec![1.]),
            Err(OffsetsLength { .. })
        ));
        assert!(matches!(
            Csr::try_new(1, 2, vec![1, 1], vec![0], vec![1.]),
            Err(OffsetsStart(1))
        ));
        assert!(matches!(
            Csr::try_new(2, 2, vec![0, 2, 1], vec![0, 1], vec![1., 2.]),
            Err(OffsetsDecrease { row: 1 })
        ));
        assert!(matches!(
            Csr::try_new(1, 2, vec![0, 2], vec![0, 1], vec![1.]),
            Err(LengthMismatch { .. })
        ));
        assert!(matches!(
            Csr::try_new(1, 2, vec![0, 1], vec![0, 1], vec![1., 2.]),
            Err(OffsetsEnd { .. })
        ));
        assert!(matches!(
            Csr::try_new(1, 2, vec![0, 1], vec![2], vec![1.]),
            Err(ColumnOutOfRange { row: 0, col: 2, .. })
        ));
        assert!(matches!(
            Csr::try_new(1, 3, vec![0, 2], vec![2, 1], vec![1., 2.]),
            Err(Unsorted { row: 0, col: 1 })
        ));
        assert!(matches!(
            Csr::try_new(1, 3, vec![0, 2], vec![1, 1], vec![1., 2.]),
            Err(Unsorted { .. })
        ));
        assert!(matches!(
            Csr::try_new(1, 3, vec![0, 1], vec![1], vec![f64::NAN]),
            Err(NonFinite { .. })
        ));
    }

    #[test]
    fn triplets_sort_and_sum_duplicates() {
        let a = Csr::from_triplets(
            3,
            3,
            &[2, 0, 2, 0, 2],
            &[1, 2, 0, 0, 1],
            &[2., 2., 3., 1., 2.],
        )
        .unwrap();
        assert_eq!(a, small());
        assert!(Csr::from_triplets(2, 2, &[2], &[0], &[1.]).is_err());
        assert!(Csr::from_triplets(2, 2, &[0], &[2], &[1.]).is_err());
    }

    #[test]
    fn par_matvec_many_equals_par_matvec_bit_for_bit() {
        let mut rng = 7u64;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let (m, n) = (3000, 400);
        let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..m {
            for e in 0..(i % 37) {
                r.push(i as u64);
                c.push(((i * 7 + e * 13) % n) as u64);
                v.push(next());
            }
        }
        let a = Csr::from_triplets(m, n, &r, &c, &v).unwrap();
        let xs: Vec<Vec<f64>> = (0..5).map(|_| (0..n).map(|_| next()).collect()).collect();
        let refs: Vec<&[f64]> = xs.iter().map(|x| x.as_slice()).collect();
        let many = a.par_matvec_many(&refs);
        assert_eq!(many.len(), 5);
        for (x, y) in xs.iter().zip(&many) {
            let want: Vec<u64> = a.matvec(x).iter().map(|v| v.to_bits()).collect();
            let got: Vec<u64> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want);
        }
        assert_eq!(a.par_matvec_many(&refs[..1])[0], a.matvec(&xs[0]));
        assert!(a.par_matvec_many(&[]).is_empty());
    }

    #[test]
    fn transpose_and_stack() {
        let a = small();
        let t = a.transpose();
        assert_eq!(t.shape(), (3, 3));
        assert_eq!(t.matvec(&[1., 2., 3.]), vec![1. + 9., 12., 2.]);
        assert_eq!(t.transpose(), a);
        let s = a.vstack_scaled(&a, 2.0).unwrap();
        assert_eq!(s.nrows(), 6);
        assert_eq!(s.matvec(&[1., 1., 1.]), vec![3., 0., 7., 6., 0., 14.]);
        assert_eq!(Csc::from_csr(&a).transpose_csr(), &t);
        assert_eq!(a.diagonal(), vec![1., 0., 0.]);
        assert_eq!(a.select_rows(&[2, 0]).matvec(&[1., 1., 1.]), vec![7., 3.]);
    }
}
