//! The CPU backend's row products, y = alpha (row sums) + beta y, for every storage: the rows are
//! split across rayon's threads by entries, and within a thread's rows each run of equal short
//! rows ([`RowRuns`]: damping blocks) goes to a loop made for its length, every other row to
//! the general loop with a branch-free row end ([`Lanes::of_masked`]). A storage may keep its
//! rows in another order ([`RowOrder`]: by length); each sum is then written to its row's place.
//! Every loop computes a row's sum in [`Lanes`]' order, so the result does not depend on the
//! split, the runs, the order or the storage.

use std::ops::Range;

use crate::sparse::{Lanes, RowOrder, RowRuns};

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

/// out[row] = alpha * sum(row) + beta * out[row] for every row of `src` (beta == 0 does not
/// read out). `runs` are the runs of `src`'s rows (or none); `order` says which row each stored
/// row is (`src`'s rows stored in that order; none: in order). The loops below test beta once
/// per piece, not per row: per row, that test cost the general loop a fifth of its time on
/// australia's short rows.
pub(super) fn rows_par<S: RowSource>(
    src: &S,
    runs: Option<&RowRuns>,
    order: Option<&RowOrder>,
    out: &mut [f64],
    ab: (f64, f64),
) {
    assert_eq!(
        src.ptr().len(),
        out.len() + 1,
        "row product: rows and out disagree"
    );
    let rows = 0..out.len();
    match order {
        None => Job {
            src,
            runs,
            sink: InOrder(out.as_mut_ptr()),
            ab,
        }
        .split(rows),
        Some(o) => {
            assert_eq!(o.len(), out.len(), "row product: order and rows disagree");
            Job {
                src,
                runs,
                sink: Ordered(out.as_mut_ptr(), o),
                ab,
            }
            .split(rows)
        }
    }
}

/// Where the sum of stored row `i` goes. The places of distinct rows are distinct and lie in
/// the `out` the sink was made from (`rows_par` checks the lengths; a [`RowOrder`] is a
/// permutation), so threads given disjoint row ranges write disjoint elements.
trait Sink: Copy + Send + Sync {
    /// # Safety
    /// `i` must be a row of the product (< out.len()), and no other thread may hold row `i`.
    unsafe fn at(self, i: usize) -> *mut f64;
}

#[derive(Clone, Copy)]
struct InOrder(*mut f64);
#[derive(Clone, Copy)]
struct Ordered<'a>(*mut f64, &'a RowOrder);

// SAFETY: a sink only writes through its pointer under `at`'s contract (disjoint rows per
// thread, within the `out` it was made from, which `rows_par` borrows mutably for the whole
// product).
unsafe impl Send for InOrder {}
// SAFETY: as above.
unsafe impl Sync for InOrder {}
// SAFETY: as above.
unsafe impl Send for Ordered<'_> {}
// SAFETY: as above.
unsafe impl Sync for Ordered<'_> {}

impl Sink for InOrder {
    #[inline(always)]
    unsafe fn at(self, i: usize) -> *mut f64 {
        // SAFETY: i < out.len() by the contract.
        unsafe { self.0.add(i) }
    }
}
impl Sink for Ordered<'_> {
    #[inline(always)]
    unsafe fn at(self, i: usize) -> *mut f64 {
        // SAFETY: i < out.len() == order.len() by the contract, and an order's rows are < len.
        unsafe { self.0.add(self.1.old_unchecked(i)) }
    }
}

/// One product: where its row sums come from, their runs, where they go, and (alpha, beta).
struct Job<'a, S, K> {
    src: &'a S,
    runs: Option<&'a RowRuns>,
    sink: K,
    ab: (f64, f64),
}

impl<S: RowSource, K: Sink> Job<'_, S, K> {
    /// Splits `rows` across rayon's threads by entries, down to GRAIN.
    fn split(&self, rows: Range<usize>) {
        let ptr = self.src.ptr();
        let (r0, r1) = (rows.start, rows.end);
        let work = ptr[r1] - ptr[r0] + (r1 - r0) as u64;
        if work <= GRAIN || r1 - r0 < 2 {
            self.leaf(rows);
            return;
        }
        let target = ptr[r0] + (ptr[r1] - ptr[r0]) / 2;
        let mid = r0
            + ptr[r0..=r1]
                .partition_point(|&p| p <= target)
                .clamp(1, r1 - r0 - 1);
        rayon::join(|| self.split(r0..mid), || self.split(mid..r1));
    }

    /// One thread's rows: runs by their kernels, the rest by the general loop.
    fn leaf(&self, rows: Range<usize>) {
        let (src, sink, ab) = (self.src, self.sink, self.ab);
        let Some(runs) = self.runs else {
            general(src, sink, rows, ab);
            return;
        };
        runs.split(rows, |p, len| match len {
            1 => fixed::<S, K, 1>(src, sink, p, ab),
            2 => fixed::<S, K, 2>(src, sink, p, ab),
            3 => fixed::<S, K, 3>(src, sink, p, ab),
            4 => fixed::<S, K, 4>(src, sink, p, ab),
            _ => general(src, sink, p, ab),
        });
    }
}

// `general` and `fixed` write the same store loop out each: one helper taking the row sum as a
// closure measured 12-15 % slower on australia's products (the row sums no longer inlined).
// SAFETY (every `sink.at` below): the rows come from `split`, which hands each thread its own
// range of the product's rows.
fn general<S: RowSource, K: Sink>(src: &S, sink: K, rows: Range<usize>, (alpha, beta): (f64, f64)) {
    if beta == 0.0 {
        for r in rows {
            // SAFETY: see above.
            unsafe { *sink.at(r) = alpha * src.row(r) };
        }
    } else {
        for r in rows {
            // SAFETY: see above.
            unsafe {
                let o = sink.at(r);
                *o = alpha * src.row(r) + beta * *o;
            }
        }
    }
}

/// A run of rows of `L` entries each: no row offsets read, no branch on the length.
fn fixed<S: RowSource, K: Sink, const L: usize>(
    src: &S,
    sink: K,
    rows: Range<usize>,
    (alpha, beta): (f64, f64),
) {
    let (r0, s0) = (rows.start, src.ptr()[rows.start] as usize);
    if beta == 0.0 {
        for r in rows {
            // SAFETY: see `general`.
            unsafe { *sink.at(r) = alpha * src.fixed::<L>(r, s0 + (r - r0) * L) };
        }
    } else {
        for r in rows {
            // SAFETY: see `general`.
            unsafe {
                let o = sink.at(r);
                *o = alpha * src.fixed::<L>(r, s0 + (r - r0) * L) + beta * *o;
            }
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
    fn csr_rows_in_any_order_with_and_without_runs_equal_the_reference_bitwise() {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (ncols, seed) in [(50usize, 1u64), (4000, 2), (3, 3)] {
            let a = crate::testproblems::runs_csr(ncols, seed);
            let mut rng = crate::grid::Rng::new(seed + 10);
            let x = crate::testproblems::with_negative_zeros(ncols, 5, &mut rng);
            let want = a.matvec(&x);
            let y0: Vec<f64> = (0..a.nrows()).map(|_| rng.uniform()).collect();
            let scaled = crate::testproblems::axpby(-0.5, &want, 2.0, &y0);
            // stored as given, and sorted by length in windows of 7 rows and of all rows
            let orders = [7, usize::MAX].map(|w| RowOrder::by_length(a.indptr(), w).unwrap());
            let stored = [None, Some(&orders[0]), Some(&orders[1])].map(|o| {
                let m = o.map_or_else(|| a.clone(), |o| a.select_rows(&o.rows()));
                (m, o)
            });
            for (m, order) in &stored {
                let runs = RowRuns::new(m.indptr());
                assert!(runs.rows_in_runs() > 1000, "the test needs runs");
                for r in [None, Some(&runs)] {
                    let what = format!(
                        "ncols {ncols}, runs {}, order {}",
                        r.is_some(),
                        order.is_some()
                    );
                    let mut y = y0.clone();
                    rows_par(&CsrRows::new(m, &x), r, *order, &mut y, (1.0, 0.0));
                    assert_eq!(bits(&y), bits(&want), "{what}");
                    let mut y = y0.clone();
                    rows_par(&CsrRows::new(m, &x), r, *order, &mut y, (-0.5, 2.0));
                    assert_eq!(bits(&y), bits(&scaled), "{what}");
                }
            }
        }
    }
}
