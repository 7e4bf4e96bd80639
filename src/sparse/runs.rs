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
}
