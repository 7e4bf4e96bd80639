//! Contiguous row blocks, one per rank: the one type of every contiguous split (the rows of a
//! square system for GMRES, the rows rank 0 sends out in `comm::distribute_system`, the damping
//! rows of the LSQR load plan). Pure functions, no MPI.

use std::ops::Range;

use crate::error::{Error, Result};

/// Contiguous row blocks: rank r owns rows `bounds[r]..bounds[r + 1]` (a block may be empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPartition {
    pub bounds: Vec<usize>,
}

impl RowPartition {
    /// Equal row counts: rank r owns rows `[r n / parts, (r + 1) n / parts)`.
    pub fn contiguous(n: usize, parts: usize) -> Self {
        let p = parts.max(1) as u128;
        RowPartition {
            bounds: (0..=p).map(|r| (n as u128 * r / p) as usize).collect(),
        }
    }

    /// About equal nonzero counts (row offsets `indptr` of the whole matrix): block r > 0
    /// starts at the first row whose nonzeros start at or after r T / P (T = total nonzeros).
    /// The square systems' `--partition nnz`.
    pub fn by_nnz(indptr: &[u64], parts: usize) -> Self {
        Self::by_nnz_cut(indptr, parts, |row| indptr[row] as u128)
    }

    /// About equal nonzero counts, rounded at row midpoints: block r > 0 starts at the first row
    /// whose nonzero midpoint reaches r T / P, so each rank is within one row's nonzeros of
    /// T / P. The split rank 0 sends out (`comm::distribute_system`). With more ranks than rows
    /// (or one huge row) some ranks get none.
    pub fn by_nnz_midpoints(indptr: &[u64], parts: usize) -> Self {
        Self::by_nnz_cut(indptr, parts, |row| {
            indptr[row] as u128 + (indptr[row + 1] - indptr[row]) as u128 / 2
        })
    }

    /// Block r > 0 starts at the first row with `at(row) >= r T / P`; `at` (where a row counts,
    /// in nonzeros before it) must not decrease.
    fn by_nnz_cut(indptr: &[u64], parts: usize, at: impl Fn(usize) -> u128) -> Self {
        let p = parts.max(1);
        let n = indptr.len() - 1;
        let total = indptr[n] as u128;
        let mut bounds = Vec::with_capacity(p + 1);
        bounds.push(0);
        for r in 1..p {
            let target = total * r as u128 / p as u128;
            bounds.push(first_row(n, |row| at(row) >= target));
        }
        bounds.push(n);
        RowPartition { bounds }
    }

    pub fn parts(&self) -> usize {
        self.bounds.len() - 1
    }

    /// The rows of rank `r`.
    pub fn range(&self, r: usize) -> Range<usize> {
        self.bounds[r]..self.bounds[r + 1]
    }

    /// The rank owning global row/column g.
    pub fn owner(&self, g: usize) -> usize {
        self.bounds.partition_point(|&b| b <= g) - 1
    }

    /// Error unless these are `parts` blocks covering rows 0..nrows in order.
    pub fn check(&self, nrows: usize, parts: usize) -> Result<()> {
        if self.bounds.len() != parts + 1 {
            return Err(Error::Invalid(format!(
                "row partition has {} parts, the job has {parts}",
                self.bounds.len().saturating_sub(1)
            )));
        }
        let ordered = self.bounds.windows(2).all(|w| w[0] <= w[1]);
        if self.bounds[0] != 0 || self.bounds[parts] != nrows || !ordered {
            return Err(Error::Invalid(format!(
                "row partition {:?} does not cover rows 0..{nrows} in order",
                self.bounds
            )));
        }
        Ok(())
    }
}

/// The first row of 0..n for which `reached` holds (n if none); `reached` must not go from true
/// back to false.
fn first_row(n: usize, reached: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if reached(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::Rng;

    /// The splits as they were written before they shared `by_nnz_cut` (graph.rs and
    /// comm/distribute.rs), to hold them to the same rows per rank.
    fn by_nnz_then(indptr: &[u64], parts: usize) -> Vec<usize> {
        let p = parts.max(1);
        let n = indptr.len() - 1;
        let nnz = indptr[n];
        let mut bounds = vec![0usize];
        for r in 1..p {
            let target = nnz * r as u64 / p as u64;
            let b = indptr.partition_point(|&x| x < target).min(n);
            bounds.push(b.max(*bounds.last().unwrap_or(&0)));
        }
        bounds.push(n);
        bounds
    }
    fn midpoints_then(row_nnz: &[u64], nranks: usize) -> Vec<usize> {
        let nranks = nranks.max(1);
        let total: u128 = row_nnz.iter().map(|&c| c as u128).sum();
        let (mut bounds, mut prefix, mut row) = (vec![0], 0u128, 0usize);
        for r in 0..nranks {
            if r + 1 == nranks {
                bounds.push(row_nnz.len());
                continue;
            }
            let target = total * (r as u128 + 1) / nranks as u128;
            while row < row_nnz.len() && prefix + (row_nnz[row] as u128) / 2 < target {
                prefix += row_nnz[row] as u128;
                row += 1;
            }
            bounds.push(row);
        }
        bounds
    }

    #[test]
    fn nnz_splits_keep_their_rows_per_rank() {
        let mut rng = Rng::new(11);
        for seed_rows in [0usize, 1, 2, 3, 10, 97, 1000] {
            for _ in 0..5 {
                let row_nnz: Vec<u64> = (0..seed_rows)
                    .map(|_| match rng.below(5) {
                        0 => 0,
                        1 => rng.below(2000),
                        _ => 1 + rng.below(40),
                    })
                    .collect();
                let mut indptr = vec![0u64];
                for &k in &row_nnz {
                    indptr.push(indptr.last().unwrap() + k);
                }
                for parts in 1..=9 {
                    let a = RowPartition::by_nnz(&indptr, parts);
                    assert_eq!(a.bounds, by_nnz_then(&indptr, parts));
                    let b = RowPartition::by_nnz_midpoints(&indptr, parts);
                    assert_eq!(b.bounds, midpoints_then(&row_nnz, parts));
                    a.check(seed_rows, parts).unwrap();
                    b.check(seed_rows, parts).unwrap();
                }
            }
        }
    }

    #[test]
    fn midpoint_split_balances_nnz_and_leaves_ranks_empty_when_rows_run_out() {
        let mut rng = Rng::new(7);
        let row_nnz: Vec<u64> = (0..997).map(|_| 1 + rng.below(40)).collect();
        let mut indptr = vec![0u64];
        for &k in &row_nnz {
            indptr.push(indptr.last().unwrap() + k);
        }
        let total = *indptr.last().unwrap() as f64;
        let p = RowPartition::by_nnz_midpoints(&indptr, 4);
        for r in 0..4 {
            let rows = p.range(r);
            let share = (indptr[rows.end] - indptr[rows.start]) as f64;
            assert!((share - total / 4.0).abs() <= 40.0, "share {share}");
        }
        // More ranks than rows: one rank owns nothing, every row is owned once.
        let p = RowPartition::by_nnz_midpoints(&[0, 5, 10, 15], 4);
        assert_eq!((0..4).filter(|&r| p.range(r).is_empty()).count(), 1);
        // One dominant row: both ranks get rows.
        let p = RowPartition::by_nnz_midpoints(&[0, 1, 1001, 1002, 1003], 2);
        assert!((0..2).all(|r| !p.range(r).is_empty()));
    }

    #[test]
    fn contiguous_owner_and_check() {
        let p = RowPartition::contiguous(10, 3);
        assert_eq!(p.bounds, vec![0, 3, 6, 10]);
        assert_eq!(
            (p.owner(0), p.owner(5), p.owner(6), p.owner(9)),
            (0, 1, 2, 2)
        );
        assert_eq!(RowPartition::contiguous(7, 0).bounds, vec![0, 7]);
        assert!(p.check(10, 2).is_err());
        assert!(p.check(11, 3).is_err());
        assert!(RowPartition {
            bounds: vec![0, 4, 2, 10]
        }
        .check(10, 3)
        .is_err());
    }
}
