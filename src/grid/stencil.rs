//! Damping rows generated from a regular grid, applied as stencils instead of stored rows.
//!
//! The regularisation of a tomography system (norm damping λ I, first differences
//! `w (m[c+e] - m[c])`, second differences `w (m[c-e] - 2 m[c] + m[c+e])`, per axis) is most of
//! its rows (4.6 of the 5.8 million rows of the 100M-nonzero benchmark system) but carries no
//! information a stored row needs: a few weights and the grid size. [`Stencil`] holds exactly
//! that; [`StencilOp`] computes its products in A x and A^T y without reading a row offset, a
//! column index or a value.
//!
//! **Row order** is the one `grid::regularisation` writes (the canonical order): the norm rows
//! (one per cell), then for each axis x, y, z with a weight the first-difference rows, then for
//! each axis the second-difference rows; within a block, cells in grid order (x fastest) where
//! the stencil fits. [`Stencil::detect_suffix`] recognises such rows at the end of a stored
//! matrix, so datasets and configs that generate their regularisation get the stencil without
//! asking, and anything else stays stored.
//!
//! **Sums** are taken in the order a CSR product of the same rows takes them (entries in
//! increasing column order, the transposed rows in increasing row order), so the stencil's
//! products equal the stored rows' products bit for bit, also after the columns were renumbered
//! (Morton order, src/grid/reorder.rs: `new_of_old`).

use rayon::prelude::*;

use crate::sparse::{Csr, CsrView, Lanes};

/// A block of stencil rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BlockKind {
    /// `norm * m[c]` for every cell.
    Norm,
    /// `w (m[c+e] - m[c])` along an axis (0 = x, 1 = y, 2 = z), 2 nonzeros.
    First(usize),
    /// `w (m[c-e] - 2 m[c] + m[c+e])` along an axis, 3 nonzeros.
    Second(usize),
}

/// One block of rows: which stencil, its weight, where its rows start, and the box of cells
/// its rows enumerate (`lo` is the first cell coordinate, `dims` the extent; row index within
/// the block = `x + dims[0] (y + dims[1] z)` of the cell's coordinates minus `lo`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Block {
    pub kind: BlockKind,
    pub weight: f64,
    pub row0: usize,
    pub nrows: usize,
    pub lo: [usize; 3],
    pub dims: [usize; 3],
}

/// Regularisation generated from an nx x ny x nz grid of cells (cell c = i + nx (j + ny k)).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Stencil {
    pub n: [usize; 3],
    /// Norm damping weight (0: no norm rows).
    pub norm: f64,
    /// First-difference weight per axis (0: none).
    pub first: [f64; 3],
    /// Second-difference weight per axis (0: none).
    pub second: [f64; 3],
}

impl Stencil {
    pub fn ncells(&self) -> usize {
        self.n[0] * self.n[1] * self.n[2]
    }

    /// The blocks of rows, in the canonical order.
    pub fn blocks(&self) -> Vec<Block> {
        let mut out = Vec::new();
        let mut row0 = 0;
        let mut push = |kind, weight, lo: [usize; 3], dims: [usize; 3]| {
            let nrows = dims[0] * dims[1] * dims[2];
            out.push(Block {
                kind,
                weight,
                row0,
                nrows,
                lo,
                dims,
            });
            row0 += nrows;
        };
        if self.norm != 0.0 {
            push(BlockKind::Norm, self.norm, [0; 3], self.n);
        }
        for a in 0..3 {
            if self.first[a] != 0.0 && self.n[a] >= 2 {
                let mut d = self.n;
                d[a] -= 1;
                push(BlockKind::First(a), self.first[a], [0; 3], d);
            }
        }
        for a in 0..3 {
            if self.second[a] != 0.0 && self.n[a] >= 3 {
                let mut d = self.n;
                d[a] -= 2;
                let mut lo = [0; 3];
                lo[a] = 1;
                push(BlockKind::Second(a), self.second[a], lo, d);
            }
        }
        out
    }

    pub fn nrows(&self) -> usize {
        self.blocks().iter().map(|b| b.nrows).sum()
    }

    /// Where the blocks would end if `rows` rows on grid `n` were whole stencil blocks in the
    /// canonical order: the ends of the one choice of blocks whose rows add up to `rows` (None
    /// when no choice does, or two choices cut in different places). A load plan cuts damping
    /// rows there so that every rank's rows are a stencil of their own.
    pub fn block_cuts(n: [usize; 3], rows: u64) -> Option<Vec<u64>> {
        let all = Stencil {
            n,
            norm: 1.0,
            first: [1.0; 3],
            second: [1.0; 3],
        }
        .blocks();
        let mut found: Option<Vec<u64>> = None;
        for mask in 1u32..(1 << all.len()) {
            let mut cuts = Vec::new();
            let mut end = 0u64;
            for (i, b) in all.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    end += b.nrows as u64;
                    cuts.push(end);
                }
            }
            if end != rows {
                continue;
            }
            match &found {
                Some(f) if *f != cuts => return None,
                _ => found = Some(cuts),
            }
        }
        found
    }

    pub fn nnz(&self) -> usize {
        self.blocks()
            .iter()
            .map(|b| {
                b.nrows
                    * match b.kind {
                        BlockKind::Norm => 1,
                        BlockKind::First(_) => 2,
                        BlockKind::Second(_) => 3,
                    }
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.nrows() == 0
    }

    /// The rows as a stored matrix (canonical order, original cell numbering).
    pub fn to_csr(&self) -> Csr {
        let nr = self.nrows();
        let mut indptr = Vec::with_capacity(nr + 1);
        let mut indices = Vec::with_capacity(self.nnz());
        let mut data = Vec::with_capacity(self.nnz());
        indptr.push(0u64);
        for b in self.blocks() {
            for r in 0..b.nrows {
                let c = block_cell(&b, self.n, r);
                let (cols, vals) = row_entries(&b, self.n, c);
                for (&cc, &v) in cols.iter().zip(&vals).take(entries_of(b.kind)) {
                    indices.push(cc as u32);
                    data.push(v);
                }
                indptr.push(indices.len() as u64);
            }
        }
        Csr::from_trusted(nr, self.ncells(), indptr, indices, data)
    }

    /// Find stencil rows at the end of `d` (rows of one grid with `n` cells, columns in grid
    /// order): the longest suffix whose rows are exactly the canonical rows of some
    /// [`Stencil`] (every block's weight is read from its first row, then every row of every
    /// block is checked, value for value). Returns the first row of the suffix and the stencil.
    /// `d` may be some rows of a matrix ([`Csr::row_range`]: nothing copied).
    pub fn detect_suffix<'a>(d: impl Into<CsrView<'a>>, n: [usize; 3]) -> Option<(usize, Stencil)> {
        let d: CsrView = d.into();
        let ncells = n[0] * n[1] * n[2];
        if d.ncols() != ncells || d.nrows() == 0 || ncells == 0 {
            return None;
        }
        // Candidate blocks in canonical order with their row counts.
        let all = Stencil {
            n,
            norm: 1.0,
            first: [1.0; 3],
            second: [1.0; 3],
        }
        .blocks();
        let mut best: Option<(usize, Stencil)> = None;
        for mask in 1u32..(1 << all.len()) {
            let chosen: Vec<&Block> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, b)| b)
                .collect();
            let total: usize = chosen.iter().map(|b| b.nrows).sum();
            if total > d.nrows() || best.as_ref().is_some_and(|(s, _)| d.nrows() - s >= total) {
                continue;
            }
            let start = d.nrows() - total;
            // Weights from the first row of each block.
            let mut st = Stencil {
                n,
                norm: 0.0,
                first: [0.0; 3],
                second: [0.0; 3],
            };
            let mut row = start;
            let mut ok = true;
            for b in &chosen {
                let (cols, vals) = d.row(row);
                let w = match (b.kind, vals.len()) {
                    (BlockKind::Norm, 1) => vals[0],
                    (BlockKind::First(_), 2) => vals[1],
                    (BlockKind::Second(_), 3) => vals[0],
                    _ => f64::NAN,
                };
                if w == 0.0 || !w.is_finite() || cols.is_empty() {
                    ok = false;
                    break;
                }
                match b.kind {
                    BlockKind::Norm => st.norm = w,
                    BlockKind::First(a) => st.first[a] = w,
                    BlockKind::Second(a) => st.second[a] = w,
                }
                row += b.nrows;
            }
            if !ok || st.blocks().len() != chosen.len() {
                continue;
            }
            if st.rows_match(&d, start) {
                best = Some((start, st));
            }
        }
        best
    }

    /// Whether rows `start..` of `d` are exactly this stencil's rows.
    fn rows_match(&self, d: &CsrView, start: usize) -> bool {
        self.blocks().iter().all(|b| {
            (0..b.nrows).into_par_iter().all(|r| {
                let c = block_cell(b, self.n, r);
                let (cols, vals) = row_entries(b, self.n, c);
                let k = entries_of(b.kind);
                let (dc, dv) = d.row(start + b.row0 + r);
                dc.len() == k
                    && dc.iter().zip(&cols[..k]).all(|(&p, &q)| p as usize == q)
                    && dv.iter().zip(&vals[..k]).all(|(p, q)| p == q)
            })
        })
    }
}

fn entries_of(kind: BlockKind) -> usize {
    match kind {
        BlockKind::Norm => 1,
        BlockKind::First(_) => 2,
        BlockKind::Second(_) => 3,
    }
}

const STRIDE: fn([usize; 3], usize) -> usize = |n, a| match a {
    0 => 1,
    1 => n[0],
    _ => n[0] * n[1],
};

/// The cell (original numbering) of row `r` of block `b`.
#[inline]
fn block_cell(b: &Block, n: [usize; 3], r: usize) -> usize {
    let i = r % b.dims[0] + b.lo[0];
    let j = (r / b.dims[0]) % b.dims[1] + b.lo[1];
    let k = r / (b.dims[0] * b.dims[1]) + b.lo[2];
    i + n[0] * (j + n[1] * k)
}

/// Columns (original numbering, increasing) and values of the row of block `b` at cell `c`;
/// only the first `entries_of(b.kind)` are meaningful.
#[inline]
fn row_entries(b: &Block, n: [usize; 3], c: usize) -> ([usize; 3], [f64; 3]) {
    let w = b.weight;
    match b.kind {
        BlockKind::Norm => ([c, 0, 0], [w, 0.0, 0.0]),
        BlockKind::First(a) => ([c, c + STRIDE(n, a), 0], [-w, w, 0.0]),
        BlockKind::Second(a) => {
            let s = STRIDE(n, a);
            ([c - s, c, c + s], [w, -2.0 * w, w])
        }
    }
}

/// Row index within block `b` of the row at cell `c`, if the block has one there.
#[inline]
fn block_row(b: &Block, n: [usize; 3], c: usize) -> Option<usize> {
    block_row_at(b, cell_ijk(n, c))
}

/// The grid position (i, j, k) of cell `c` (original numbering).
#[inline]
fn cell_ijk(n: [usize; 3], c: usize) -> [usize; 3] {
    [c % n[0], (c / n[0]) % n[1], c / (n[0] * n[1])]
}

/// Row index within block `b` of the row at the cell at grid position `ijk`, if the block has
/// one there.
#[inline]
fn block_row_at(b: &Block, ijk: [usize; 3]) -> Option<usize> {
    let mut r = 0;
    let mut mul = 1;
    for (a, &i) in ijk.iter().enumerate() {
        let v = i.checked_sub(b.lo[a])?;
        if v >= b.dims[a] {
            return None;
        }
        r += v * mul;
        mul *= b.dims[a];
    }
    Some(r)
}

/// A [`Stencil`] applied to vectors whose cells may be renumbered (`new_of_old[c]` = position
/// of cell c in x; None = grid order).
#[derive(Debug, Clone)]
pub struct StencilOp {
    stencil: Stencil,
    blocks: Vec<Block>,
    nrows: usize,
    new_of_old: Option<Vec<u32>>,
    old_of_new: Option<Vec<u32>>,
}

impl StencilOp {
    pub fn new(stencil: Stencil, new_of_old: Option<Vec<u32>>) -> StencilOp {
        let old_of_new = new_of_old.as_ref().map(|p| {
            let mut inv = vec![0u32; p.len()];
            for (old, &new) in p.iter().enumerate() {
                inv[new as usize] = old as u32;
            }
            inv
        });
        let blocks = stencil.blocks();
        StencilOp {
            nrows: blocks.iter().map(|b| b.nrows).sum(),
            blocks,
            stencil,
            new_of_old,
            old_of_new,
        }
    }

    pub fn stencil(&self) -> &Stencil {
        &self.stencil
    }
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }
    pub fn nrows(&self) -> usize {
        self.nrows
    }
    pub fn ncols(&self) -> usize {
        self.stencil.ncells()
    }
    pub fn new_of_old(&self) -> Option<&[u32]> {
        self.new_of_old.as_deref()
    }
    pub fn old_of_new(&self) -> Option<&[u32]> {
        self.old_of_new.as_deref()
    }

    #[inline]
    fn new_index(&self, c: usize) -> usize {
        match &self.new_of_old {
            Some(p) => p[c] as usize,
            None => c,
        }
    }

    /// The sum of row `r` of block `b`, in the order a CSR row of the renumbered columns
    /// takes it (increasing new column index).
    #[inline]
    fn row_sum(&self, b: &Block, r: usize, x: &[f64]) -> f64 {
        let n = self.stencil.n;
        let c = block_cell(b, n, r);
        let (cols, vals) = row_entries(b, n, c);
        let k = entries_of(b.kind);
        let mut t = [(0usize, 0.0f64); 3];
        for e in 0..k {
            t[e] = (self.new_index(cols[e]), vals[e]);
        }
        // sort by new column (at most three entries)
        if k >= 2 && t[1].0 < t[0].0 {
            t.swap(0, 1);
        }
        if k == 3 {
            if t[2].0 < t[1].0 {
                t.swap(1, 2);
            }
            if t[1].0 < t[0].0 {
                t.swap(0, 1);
            }
        }
        let mut s = 0.0;
        for &(j, v) in &t[..k] {
            s += v * x[j];
        }
        s
    }

    /// y = alpha D x + beta y over all stencil rows (canonical order); beta == 0 does not read y.
    pub fn apply(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        assert_eq!(x.len(), self.ncols());
        assert_eq!(y.len(), self.nrows);
        for b in &self.blocks {
            let yb = &mut y[b.row0..b.row0 + b.nrows];
            yb.par_chunks_mut(8192).enumerate().for_each(|(ci, ys)| {
                for (k, yr) in ys.iter_mut().enumerate() {
                    let s = self.row_sum(b, ci * 8192 + k, x);
                    *yr = if beta == 0.0 {
                        alpha * s
                    } else {
                        alpha * s + beta * *yr
                    };
                }
            });
        }
    }

    /// Continue the transposed row sum `s` of the cell at new position `jn` with this
    /// stencil's rows (in increasing row order, the lanes of a CSR row: [`Lanes`]), reading
    /// their values from `y`.
    #[inline]
    pub fn add_transposed(&self, s: &mut Lanes, jn: usize, y: &[f64]) {
        let n = self.stencil.n;
        let c = match &self.old_of_new {
            Some(q) => q[jn] as usize,
            None => jn,
        };
        // The cell's grid position once: the rows at the neighbours along an axis are found
        // from it without dividing (block_row divides three times per call; on `bench --size
        // medium`, one core, compact A^T y went from 33-37 to 27-30 ms with this and the
        // per-row filler check, docs/performance.md).
        // At the grid's faces the neighbour's position wraps to another line or plane, which
        // `block_row` on the neighbour's index gets right, as before.
        let ijk = cell_ijk(n, c);
        let below = |b: &Block, a: usize| -> Option<usize> {
            let st = STRIDE(n, a);
            if ijk[a] >= 1 {
                let mut p = ijk;
                p[a] -= 1;
                block_row_at(b, p)
            } else if c >= st {
                block_row(b, n, c - st)
            } else {
                None
            }
        };
        let above = |b: &Block, a: usize| -> Option<usize> {
            if ijk[a] + 1 < n[a] {
                let mut p = ijk;
                p[a] += 1;
                block_row_at(b, p)
            } else {
                block_row(b, n, c + STRIDE(n, a))
            }
        };
        for b in &self.blocks {
            let w = b.weight;
            match b.kind {
                BlockKind::Norm => s.add(w * y[b.row0 + c]),
                BlockKind::First(a) => {
                    // rows at cell c - e (this cell is its second entry), then at c
                    if let Some(r) = below(b, a) {
                        s.add(w * y[b.row0 + r]);
                    }
                    if let Some(r) = block_row_at(b, ijk) {
                        s.add(-w * y[b.row0 + r]);
                    }
                }
                BlockKind::Second(a) => {
                    // rows centred at c - e (this cell is their last entry), c, c + e
                    if let Some(r) = below(b, a) {
                        s.add(w * y[b.row0 + r]);
                    }
                    if let Some(r) = block_row_at(b, ijk) {
                        s.add(-2.0 * w * y[b.row0 + r]);
                    }
                    if let Some(r) = above(b, a) {
                        s.add(w * y[b.row0 + r]);
                    }
                }
            }
        }
    }

    /// x = alpha D^T y + beta x (x in the renumbered order); beta == 0 does not read x.
    pub fn apply_t(&self, alpha: f64, y: &[f64], beta: f64, x: &mut [f64]) {
        assert_eq!(y.len(), self.nrows);
        assert_eq!(x.len(), self.ncols());
        x.par_chunks_mut(8192).enumerate().for_each(|(ci, xs)| {
            for (k, xj) in xs.iter_mut().enumerate() {
                let mut l = Lanes::default();
                self.add_transposed(&mut l, ci * 8192 + k, y);
                let s = l.sum();
                *xj = if beta == 0.0 {
                    alpha * s
                } else {
                    alpha * s + beta * *xj
                };
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stencils() -> Vec<Stencil> {
        vec![
            Stencil {
                n: [5, 4, 3],
                norm: 0.1,
                first: [0.5, 0.5, 0.5],
                second: [0.0; 3],
            },
            Stencil {
                n: [6, 5, 4],
                norm: 0.0,
                first: [0.0, 0.3, 0.0],
                second: [0.2, 0.7, 1.5],
            },
            Stencil {
                n: [7, 1, 3],
                norm: 2.0,
                first: [1.0, 1.0, 0.0],
                second: [0.1, 0.1, 0.1],
            },
            Stencil {
                n: [2, 2, 2],
                norm: 0.0,
                first: [0.0; 3],
                second: [1.0; 3],
            },
        ]
    }

    #[test]
    fn rows_are_synths_regularisation() {
        for st in stencils() {
            let g = crate::grid::Grid::new(st.n, [0.0; 3], [1.0; 3]);
            let want = crate::grid::regularisation(&g, st.norm, st.first, st.second);
            assert_eq!(st.to_csr(), want, "{st:?}");
            assert_eq!(st.nrows(), want.nrows());
            assert_eq!(st.nnz(), want.nnz());
        }
    }

    #[test]
    fn products_equal_stored_rows_bitwise_also_renumbered() {
        let mut rng = crate::grid::Rng::new(5);
        for st in stencils() {
            let d = st.to_csr();
            let nc = st.ncells();
            let perms: Vec<Option<Vec<u32>>> = vec![
                None,
                Some({
                    // a random permutation of the cells
                    let mut p: Vec<u32> = (0..nc as u32).collect();
                    for i in (1..nc).rev() {
                        p.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    p
                }),
            ];
            for p in perms {
                let dp = match &p {
                    Some(p) => d.permute_columns(p),
                    None => d.clone(),
                };
                let op = StencilOp::new(st, p.clone());
                let x: Vec<f64> = (0..nc).map(|_| rng.uniform() - 0.5).collect();
                let y0: Vec<f64> = (0..d.nrows()).map(|_| rng.uniform() - 0.5).collect();
                let mut y = y0.clone();
                op.apply(1.5, &x, -0.25, &mut y);
                let want = crate::testproblems::axpby(1.5, &dp.matvec(&x), -0.25, &y0);
                assert_eq!(y, want, "{st:?}");
                let mut xt = x.clone();
                op.apply_t(0.75, &y0, 2.0, &mut xt);
                let want = crate::testproblems::axpby(0.75, &dp.transpose().matvec(&y0), 2.0, &x);
                assert_eq!(xt, want, "{st:?} transposed");
            }
        }
    }

    #[test]
    fn detects_the_stencil_suffix_and_nothing_else() {
        let st = Stencil {
            n: [6, 5, 4],
            norm: 0.1,
            first: [0.5, 0.0, 0.25],
            second: [0.0, 0.3, 0.0],
        };
        let d = st.to_csr();
        // alone
        assert_eq!(Stencil::detect_suffix(&d, st.n), Some((0, st)));
        // after other rows (kernel rows, arbitrary damping)
        let k = crate::testproblems::awkward_csr(40, st.ncells(), 3);
        let both = k.vstack_scaled(&d, 1.0).unwrap();
        assert_eq!(Stencil::detect_suffix(&both, st.n), Some((40, st)));
        // a changed value anywhere in the stencil shrinks or kills the match
        let mut bad = both.clone();
        let last = bad.nnz() - 1;
        bad.data_mut()[last] *= 1.0 + 1e-15;
        let got = Stencil::detect_suffix(&bad, st.n);
        assert!(got.is_none_or(|(s, g)| g != st && s > 40), "{got:?}");
        // the wrong grid: nothing
        assert_eq!(Stencil::detect_suffix(&d, [5, 6, 4]), None);
        // scaled rows (a damping weight): detected with scaled weights
        let scaled = Csr::zeros(0, st.ncells()).vstack_scaled(&d, 0.015).unwrap();
        let (s0, g) = Stencil::detect_suffix(&scaled, st.n).unwrap();
        assert_eq!(s0, 0);
        assert_eq!(g.to_csr(), scaled);
    }
}
