//! Runs of consecutive rows that all have the same short length.
//!
//! Damping blocks are tens of thousands of rows of 1-4 nonzeros one after another (australia's
//! roughness block: 23,525 rows of exactly 2). A general row loop reads two row offsets per row
//! and branches on the row's length; over a run of equal short rows the length is known, the
//! entries of row `start + i` begin at `ptr[start] + i * len`, and the row sum can be written out
//! term by term with no branch at all (on one core, australia's roughness rows take 0.023 ms
//! instead of 0.077 this way). [`RowRuns`] finds those runs once, from the row offsets, so that
//! a product can hand each run to a kernel made for its length and every other row to the
//! general loop.
//!
//! **Rows in order of length.** Where the lengths vary from row to row (kernel rows), a row
//! loop's exit branch goes another way on almost every row: one mispredicted branch per row, a
//! large share of a row of ~15 nonzeros. [`RowOrder::by_length`] is the order that sorts the rows
//! by length within windows of rows; a product that stores its rows in that order and writes each
//! row's sum to the row's place meets long stretches of equal rows, whose loop the branch
//! predictor learns (on one core, australia's products took 0.37 ms instead of 0.49 with compact
//! storage). A row's own sum does not change: the order only decides which row is summed when.

use std::ops::Range;

/// The longest row a run may have: damping rows have 1-4 nonzeros (norm damping, first and
/// second differences along one axis, ...).
pub const MAX_RUN_LEN: usize = 4;
/// The fewest rows a run must have to be worth its own loop.
pub const MIN_RUN_ROWS: usize = 32;

/// The runs of a matrix's rows (see the module documentation): sorted, disjoint row ranges,
/// each of rows with the same length `1..=MAX_RUN_LEN` and at least `MIN_RUN_ROWS` long.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowRuns {
    runs: Vec<(Range<usize>, usize)>,
}

impl RowRuns {
    /// The runs of the rows whose entries lie at `ptr[r]..ptr[r + 1]` (`ptr.len()` = rows + 1).
    pub fn new(ptr: &[u64]) -> RowRuns {
        let nrows = ptr.len().saturating_sub(1);
        let len = |r: usize| (ptr[r + 1] - ptr[r]) as usize;
        let mut runs = Vec::new();
        let mut r = 0;
        while r < nrows {
            let l = len(r);
            let mut e = r + 1;
            while e < nrows && len(e) == l {
                e += 1;
            }
            if (1..=MAX_RUN_LEN).contains(&l) && e - r >= MIN_RUN_ROWS {
                runs.push((r..e, l));
            }
            r = e;
        }
        RowRuns { runs }
    }

    /// The runs: (rows, length of each row).
    pub fn runs(&self) -> &[(Range<usize>, usize)] {
        &self.runs
    }

    /// Rows in runs.
    pub fn rows_in_runs(&self) -> usize {
        self.runs.iter().map(|(r, _)| r.len()).sum()
    }

    /// Cuts `rows` into consecutive pieces and calls `f(piece, len)` for each, in order: `len`
    /// is the row length of a piece inside a run, 0 for a piece of rows outside every run.
    pub fn split(&self, rows: Range<usize>, mut f: impl FnMut(Range<usize>, usize)) {
        let mut at = rows.start;
        let first = self.runs.partition_point(|(r, _)| r.end <= at);
        for (run, l) in &self.runs[first..] {
            if at >= rows.end {
                return;
            }
            if run.start > at {
                let e = run.start.min(rows.end);
                f(at..e, 0);
                at = e;
                if at >= rows.end {
                    return;
                }
            }
            let e = run.end.min(rows.end);
            f(at..e, *l);
            at = e;
        }
        if at < rows.end {
            f(at..rows.end, 0);
        }
    }
}

/// The rows a window of [`RowOrder::by_length`] sorts: large enough that the rows of one length
/// form stretches the branch predictor learns, small enough that a window's rows stay close in
/// the matrix (rays and cells reordered for locality keep most of it). On australia windows of
/// 256 to 4096 rows measured the same.
pub const LENGTH_ORDER_WINDOW: usize = 1024;

/// [`RowOrder::for_products`] sorts the rows of a matrix only if the median length of its rows
/// longer than [`MAX_RUN_LEN`] is below this: a mispredicted branch costs about as much as a
/// row of ~15 entries, so longer rows gain little, and out of cache the order could cost
/// locality (the 12.6M-nonzero `bench --size medium` system, rows of ~80 entries: no gain
/// measured). The median, not the mean: australia's cells (A^T's rows) have a median of 18
/// entries but a mean of 37 (a few cells crossed by many rays), and gain 15 %.
pub const SORT_BELOW_MEDIAN_LEN: u64 = 32;

/// How a row product orders its rows (see [`RowOrder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowSort {
    /// [`RowOrder::for_products`] with windows of [`LENGTH_ORDER_WINDOW`] rows: sorted if the
    /// rows are short.
    Auto,
    /// Sorted by length in windows of this many rows, whatever the lengths.
    Windows(usize),
    /// Kept in order.
    Keep,
}

impl RowSort {
    /// The order for rows at `ptr` (none: in order).
    pub fn order(self, ptr: &[u64]) -> Option<RowOrder> {
        match self {
            RowSort::Auto => RowOrder::for_products(ptr, LENGTH_ORDER_WINDOW),
            RowSort::Windows(w) => RowOrder::by_length(ptr, w),
            RowSort::Keep => None,
        }
    }
}

/// An order of a matrix's rows: `old_of_new[i]` is the row stored at place `i`. Always a
/// permutation of `0..len` (products write row sums through it without checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowOrder {
    old_of_new: Vec<u32>,
}

impl RowOrder {
    /// The rows whose entries lie at `ptr[r]..ptr[r + 1]`, each window of `window` rows sorted
    /// by length, longest first, ties in their order; None if that is the order they have (or
    /// there are 2^32 rows or more, which a u32 cannot number).
    pub fn by_length(ptr: &[u64], window: usize) -> Option<RowOrder> {
        let nrows = ptr.len().saturating_sub(1);
        if nrows > u32::MAX as usize {
            return None;
        }
        let len = |r: u32| ptr[r as usize + 1] - ptr[r as usize];
        let mut old_of_new: Vec<u32> = (0..nrows as u32).collect();
        for w in old_of_new.chunks_mut(window.max(1)) {
            w.sort_by_key(|&r| std::cmp::Reverse(len(r)));
        }
        let same = old_of_new.iter().enumerate().all(|(i, &r)| r as usize == i);
        (!same).then_some(RowOrder { old_of_new })
    }

    /// The order a row product keeps the rows in: [`Self::by_length`] in windows of `window`
    /// rows if the rows longer than [`MAX_RUN_LEN`] (the rows outside runs) have a median
    /// length below [`SORT_BELOW_MEDIAN_LEN`], else none.
    pub fn for_products(ptr: &[u64], window: usize) -> Option<RowOrder> {
        let mut long: Vec<u64> = ptr
            .windows(2)
            .map(|w| w[1] - w[0])
            .filter(|&l| l > MAX_RUN_LEN as u64)
            .collect();
        if long.is_empty() {
            return None;
        }
        let mid = long.len() / 2;
        let (_, median, _) = long.select_nth_unstable(mid);
        if *median >= SORT_BELOW_MEDIAN_LEN {
            return None;
        }
        RowOrder::by_length(ptr, window)
    }

    /// The row stored at each place.
    pub fn old_of_new(&self) -> &[u32] {
        &self.old_of_new
    }

    /// The same as `usize`s (for [`crate::sparse::Csr::select_rows`]).
    pub fn rows(&self) -> Vec<usize> {
        self.old_of_new.iter().map(|&r| r as usize).collect()
    }

    pub fn len(&self) -> usize {
        self.old_of_new.len()
    }
    pub fn is_empty(&self) -> bool {
        self.old_of_new.is_empty()
    }

    /// The row stored at place `i`, unchecked: `i < len()`.
    ///
    /// # Safety
    /// `i` must be less than `len()`.
    #[inline(always)]
    pub unsafe fn old_unchecked(&self, i: usize) -> usize {
        debug_assert!(i < self.old_of_new.len());
        // SAFETY: the caller keeps i < len.
        unsafe { *self.old_of_new.get_unchecked(i) as usize }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr_of(lens: &[usize]) -> Vec<u64> {
        let mut p = vec![0u64];
        for &l in lens {
            p.push(p.last().unwrap() + l as u64);
        }
        p
    }

    #[test]
    fn finds_runs_of_short_equal_rows_and_splits_any_range_into_them() {
        // 10 long rows, 40 rows of 2, 5 rows of 1 (too few), 33 rows of 4, 40 of 5 (too long),
        // 31 of 3 (too few), 32 empty rows (length 0: general), 64 rows of 1 at the end
        let mut lens = vec![17usize; 10];
        lens.extend([2; 40]);
        lens.extend([1; 5]);
        lens.extend([4; 33]);
        lens.extend([5; 40]);
        lens.extend([3; 31]);
        lens.extend([0; 32]);
        lens.extend([1; 64]);
        let ptr = ptr_of(&lens);
        let runs = RowRuns::new(&ptr);
        assert_eq!(
            runs.runs(),
            &[(10..50, 2), (55..88, 4), (191..255, 1)],
            "{runs:?}"
        );
        assert_eq!(runs.rows_in_runs(), 40 + 33 + 64);
        let n = lens.len();
        for a in [
            0, 9, 10, 11, 49, 50, 54, 55, 60, 88, 190, 191, 200, 254, 255,
        ] {
            for b in [a, a + 1, a + 7, 50, 55, 120, 191, 254, n] {
                if b < a || b > n {
                    continue;
                }
                let mut pieces = Vec::new();
                runs.split(a..b, |p, l| pieces.push((p, l)));
                // the pieces tile a..b in order, none empty
                let mut at = a;
                for (p, l) in &pieces {
                    assert_eq!(p.start, at, "{a}..{b}: {pieces:?}");
                    assert!(p.end > p.start, "{a}..{b}: {pieces:?}");
                    at = p.end;
                    for r in p.clone() {
                        let inside = runs.runs().iter().find(|(q, _)| q.contains(&r));
                        assert_eq!(inside.map_or(0, |(_, l)| *l), *l, "row {r}");
                        if *l > 0 {
                            assert_eq!(lens[r], *l);
                        }
                    }
                }
                assert_eq!(at, b, "{a}..{b}: {pieces:?}");
                // neighbouring pieces differ in kind (no needless cuts) unless two runs touch
                for w in pieces.windows(2) {
                    assert!(w[0].1 != w[1].1 || w[0].1 != 0, "{pieces:?}");
                }
            }
        }
        assert!(RowRuns::new(&[0]).runs().is_empty());
        assert!(RowRuns::new(&[]).runs().is_empty());
        let mut none = Vec::new();
        RowRuns::new(&[0]).split(0..0, |p, l| none.push((p, l)));
        assert!(none.is_empty());
    }

    #[test]
    fn length_order_sorts_each_window_longest_first_and_keeps_ties_in_order() {
        let lens = [3usize, 1, 3, 0, 7, 2, 2, 9, 1, 1];
        let ptr = ptr_of(&lens);
        let o = RowOrder::by_length(&ptr, 4).expect("not sorted yet");
        assert_eq!(o.old_of_new(), &[0, 2, 1, 3, 7, 4, 5, 6, 8, 9]);
        assert_eq!(o.rows(), vec![0, 2, 1, 3, 7, 4, 5, 6, 8, 9]);
        let global = RowOrder::by_length(&ptr, usize::MAX).unwrap();
        assert_eq!(global.old_of_new(), &[7, 4, 0, 2, 5, 6, 1, 8, 9, 3]);
        // a permutation whatever the window
        for w in [1, 2, 3, 5, 100] {
            if let Some(o) = RowOrder::by_length(&ptr, w) {
                let mut seen = o.old_of_new().to_vec();
                seen.sort_unstable();
                assert_eq!(seen, (0..10).collect::<Vec<u32>>());
            }
        }
        // already in order (or windows of one row): none
        assert!(RowOrder::by_length(&ptr_of(&[5, 5, 2, 0]), 4096).is_none());
        assert!(RowOrder::by_length(&ptr, 1).is_none());
        assert!(RowOrder::by_length(&[0], 4096).is_none());
        // for products: short rows sorted, long rows (runs aside) kept in order
        assert_eq!(RowOrder::for_products(&ptr, 4), Some(o));
        let mut long = vec![2usize; 100];
        long.extend([40, 33, 90, 31, 5]);
        assert!(RowOrder::for_products(&ptr_of(&long), 4096).is_none());
        long.extend([3, 1, 5, 6]);
        assert!(RowOrder::for_products(&ptr_of(&long), 4096).is_some());
        assert!(RowOrder::for_products(&ptr_of(&[3, 1, 4, 4]), 4096).is_none());
    }
}
