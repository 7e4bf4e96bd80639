//! The CPU backend's row products, y = alpha (row sums) + beta y, for every storage: the rows are
//! split across rayon's threads by entries, and within a thread's rows each run of equal short
//! rows ([`RowRuns`]: damping blocks) goes to a loop made for its length, every other row to
//! the general loop with a branch-free row end ([`Lanes::of_masked`]). Both compute a row's sum
//! in [`Lanes`]' order, so the result does not depend on the split, the runs or the storage.

use std::ops::Range;

use crate::sparse::{Lanes, RowRuns};

/// Entries (plus rows) below which a product is not split further across threads.
const GRAIN: u64 = 32 * 1024;

/// Where a row product gets its row sums from: a storage format and the vector it multiplies.
pub(super) trait RowSource: Sync {
    /// Row offsets: the entries of row r are `ptr[r]..ptr[r + 1]`.
    fn ptr(&self) -> &[u64];
    /// The sum of row `r`, any length.
    fn row(&self, r: usize) -> f64;
    /// The sum of row `r`, which has exactly `L` entries, the first one at entry `s`
    /// (`ptr[r] == s`). Must equal `row(r)` bitwise; the default is `row(r)`.
    #[inline(always)]
    fn fixed<const L: usize>(&self, r: usize, s: usize) -> f64 {
        debug_assert_eq!(self.ptr()[r] as usize, s);
        self.row(r)
    }
}

/// out[k] = alpha * sum(row0 + k) + beta * out[k] for the rows of `out` (beta == 0 does not read
/// out), `runs` being the runs of `src`'s rows (or none). The loops below test beta once per
/// piece, not per row: per row, that test cost the general loop a fifth of its time on
/// australia's short rows.
pub(super) fn rows_par<S: RowSource>(
    src: &S,
    runs: Option<&RowRuns>,
    row0: usize,
    out: &mut [f64],
    (alpha, beta): (f64, f64),
) {
    let ptr = src.ptr();
    let nrows = out.len();
    let work = ptr[row0 + nrows] - ptr[row0] + nrows as u64;
    if work <= GRAIN || nrows < 2 {
        leaf(src, runs, row0, out, (alpha, beta));
        return;
    }
    let target = ptr[row0] + (ptr[row0 + nrows] - ptr[row0]) / 2;
    let mid = ptr[row0..=row0 + nrows]
        .partition_point(|&p| p <= target)
        .clamp(1, nrows - 1);
    let (lo, hi) = out.split_at_mut(mid);
    rayon::join(
        || rows_par(src, runs, row0, lo, (alpha, beta)),
        || rows_par(src, runs, row0 + mid, hi, (alpha, beta)),
    );
}

/// One thread's rows: runs by their kernels, the rest by the general loop.
fn leaf<S: RowSource>(
    src: &S,
    runs: Option<&RowRuns>,
    row0: usize,
    out: &mut [f64],
    ab: (f64, f64),
) {
    let rows = row0..row0 + out.len();
    let Some(runs) = runs else {
        general(src, rows, out, ab);
        return;
    };
    runs.split(rows, |p, len| {
        let o = &mut out[p.start - row0..p.end - row0];
        match len {
            1 => fixed::<S, 1>(src, p, o, ab),
            2 => fixed::<S, 2>(src, p, o, ab),
            3 => fixed::<S, 3>(src, p, o, ab),
            4 => fixed::<S, 4>(src, p, o, ab),
            _ => general(src, p, o, ab),
        }
    });
}

// `general` and `fixed` write the same store loop out each: one helper taking the row sum as a
// closure measured 12-15 % slower on australia's products (the row sums no longer inlined).
fn general<S: RowSource>(src: &S, rows: Range<usize>, out: &mut [f64], (alpha, beta): (f64, f64)) {
    let r0 = rows.start;
    if beta == 0.0 {
        for (i, o) in out.iter_mut().enumerate() {
            *o = alpha * src.row(r0 + i);
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            *o = alpha * src.row(r0 + i) + beta * *o;
        }
    }
}

/// A run of rows of `L` entries each: no row offsets read, no branch on the length.
fn fixed<S: RowSource, const L: usize>(
    src: &S,
    rows: Range<usize>,
    out: &mut [f64],
    (alpha, beta): (f64, f64),
) {
    let (r0, s0) = (rows.start, src.ptr()[rows.start] as usize);
    if beta == 0.0 {
        for (i, o) in out.iter_mut().enumerate() {
            *o = alpha * src.fixed::<L>(r0 + i, s0 + i * L);
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            *o = alpha * src.fixed::<L>(r0 + i, s0 + i * L) + beta * *o;
        }
    }
}

/// Rows of a CSR matrix times `x` (the CSR operator's A x, and its A^T y through the CSC copy).
pub(super) struct CsrRows<'a> {
    parts: (&'a [u64], &'a [u32], &'a [f64]),
    x: &'a [f64],
}

impl<'a> CsrRows<'a> {
    /// Panics unless `x` has the matrix's columns (the bound of the unchecked reads).
    pub(super) fn new(a: &'a crate::sparse::Csr, x: &'a [f64]) -> Self {
        assert_eq!(
            x.len(),
            a.ncols(),
            "row product: x and the columns disagree"
        );
        CsrRows {
            parts: (a.indptr(), a.indices(), a.data()),
            x,
        }
    }
}

impl RowSource for CsrRows<'_> {
    fn ptr(&self) -> &[u64] {
        self.parts.0
    }
    #[inline(always)]
    fn row(&self, r: usize) -> f64 {
        let ((ip, ci, va), x) = (self.parts, self.x);
        debug_assert!(r + 1 < ip.len());
        // SAFETY: rows_par only asks for rows < nrows, and a Csr has nrows + 1 offsets.
        let (s, e) = unsafe {
            (
                *ip.get_unchecked(r) as usize,
                *ip.get_unchecked(r + 1) as usize,
            )
        };
        Lanes::of_masked(e - s, |k, _| {
            debug_assert!(s + k < ci.len() && (ci[s + k] as usize) < x.len());
            // SAFETY: s + k < e <= nnz (of_masked clamps k to the row), and a Csr's columns are
            // < ncols == x.len() (checked in `new`).
            unsafe { va.get_unchecked(s + k) * x.get_unchecked(*ci.get_unchecked(s + k) as usize) }
        })
        .sum()
    }
    #[inline(always)]
    fn fixed<const L: usize>(&self, _r: usize, s: usize) -> f64 {
        let (_, ci, va) = self.parts;
        debug_assert!(s + L <= ci.len());
        Lanes::sum_fixed::<L>(|k| {
            // SAFETY: the row's L entries s..s + L are entries of the Csr; columns < x.len().
            unsafe {
                va.get_unchecked(s + k) * self.x.get_unchecked(*ci.get_unchecked(s + k) as usize)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_rows_with_and_without_runs_equal_the_reference_bitwise() {
        for (ncols, seed) in [(50usize, 1u64), (4000, 2), (3, 3)] {
            let a = crate::testproblems::runs_csr(ncols, seed);
            let runs = RowRuns::new(a.indptr());
            assert!(runs.rows_in_runs() > 1000, "the test needs runs");
            let mut rng = crate::grid::Rng::new(seed + 10);
            let x = crate::testproblems::with_negative_zeros(ncols, 5, &mut rng);
            let want = a.matvec(&x);
            let y0: Vec<f64> = (0..a.nrows()).map(|_| rng.uniform()).collect();
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for r in [None, Some(&runs)] {
                let mut y = y0.clone();
                rows_par(&CsrRows::new(&a, &x), r, 0, &mut y, (1.0, 0.0));
                assert_eq!(bits(&y), bits(&want), "runs {}", r.is_some());
                let mut y = y0.clone();
                rows_par(&CsrRows::new(&a, &x), r, 0, &mut y, (-0.5, 2.0));
                let w: Vec<f64> = want
                    .iter()
                    .zip(&y0)
                    .map(|(s, y)| -0.5 * s + 2.0 * y)
                    .collect();
                assert_eq!(bits(&y), bits(&w), "runs {}", r.is_some());
            }
        }
    }
}
