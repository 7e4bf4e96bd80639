//! Row and column orderings that make the sparse products cache-friendly.
//!
//! LSQR's iterates do not depend on the order of the rows, and a column permutation only renames
//! the unknowns: solving (P_r A P_c) y = P_r b and returning x = P_c y gives the same solution up
//! to the rounding of sums taken in another order. What the order changes is locality: a kernel
//! row gathers x at the cells its ray crosses, and a column of the transpose gathers u at the
//! rays through its cell. In x-fastest cell numbering a ray's cells lie whole planes apart and
//! rays come in acquisition order, so neighbouring gathers rarely share a cache line (on the GPU
//! each 8-byte gather moves a 32-byte sector from L2).
//!
//! - [`Reorder::Rows`]: rows sorted (stably) by their two end columns, the first and last
//!   column with their bits interleaved, so consecutive rows are rays that start near each
//!   other and end near each other: nearly parallel neighbours that cross the same cells. Their
//!   gathers of x share cache lines (on an H100, compact A x: L1 hit rate 19 % -> 32 % and L2
//!   sectors -13 % against sorting by the first column alone; 1.01 -> 0.95-0.98 ms per LSQR
//!   iteration on the 100.7M system), and the rays of a transposed row are close together in u.
//! - [`Reorder::Auto`]: when the unknowns are the cells of a regular grid, also number the cells
//!   in Morton (Z-curve) order, so the cells a ray crosses share cache lines; rows are then sorted
//!   in the new numbering. Without a grid it is [`Reorder::Rows`].
//!
//! Measured in docs/performance.md (the 100.8M-nonzero system on an H100: 1.85 -> 1.51 ms per
//! LSQR iteration).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::sparse::{par, Csr};

/// Which reordering a run applies (config `[solver] reorder`, CLI `--reorder`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reorder {
    /// The system as given.
    #[default]
    None,
    /// Rows sorted by their end columns (first and last, bits interleaved).
    Rows,
    /// Cells in Morton order when the unknowns are a grid's cells, then rows sorted.
    Auto,
}

choice_from_str!(Reorder, "reorder", "none" => Self::None, "rows" => Self::Rows, "auto" => Self::Auto);

/// A row and column permutation of one rank's system.
#[derive(Debug, Clone, Default)]
pub struct Ordering {
    /// New row i is old row `rows[i]`.
    pub rows: Option<Vec<usize>>,
    /// Old column j becomes column `cols[j]`.
    pub cols: Option<Vec<u32>>,
    /// What was done, in words (for the report).
    pub what: String,
}

impl Ordering {
    /// Plan the ordering of `a` (this rank's rows); `grid` = cells along x, y, z when the
    /// unknowns are the cells of a regular grid (column i + nx (j + ny k)).
    pub fn plan(a: &Csr, how: Reorder, grid: Option<[usize; 3]>) -> Ordering {
        let cols = match (how, grid) {
            (Reorder::Auto, Some([nx, ny, nz])) if nx * ny * nz == a.ncols() => {
                Some(morton_order(nx, ny, nz))
            }
            _ => None,
        };
        let rows = match how {
            Reorder::None => None,
            Reorder::Rows | Reorder::Auto => {
                // the row's first and last column in the new numbering, interleaved
                let key = |i: usize| -> u64 {
                    let (c, _) = a.row(i);
                    let (lo, hi) = match &cols {
                        Some(p) => c
                            .iter()
                            .map(|&j| p[j as usize])
                            .fold((u32::MAX, 0), |(l, h), v| (l.min(v), h.max(v))),
                        None => (
                            c.first().copied().unwrap_or(u32::MAX),
                            c.last().copied().unwrap_or(0),
                        ),
                    };
                    let lo = if c.is_empty() { 0 } else { lo };
                    interleave2(lo, hi)
                };
                // (key, row) pairs are distinct, so any sort of them gives the stable sort of
                // the rows by key
                let mut keyed: Vec<(u64, usize)> = if a.nrows() < par::SEQUENTIAL_BELOW {
                    (0..a.nrows()).map(|i| (key(i), i)).collect()
                } else {
                    (0..a.nrows())
                        .into_par_iter()
                        .map(|i| (key(i), i))
                        .collect()
                };
                keyed.par_sort_unstable();
                let order: Vec<usize> = keyed.into_par_iter().map(|(_, i)| i).collect();
                Some(order)
            }
        };
        let what = match (&rows, &cols, grid) {
            (None, _, _) => "none".to_string(),
            (Some(_), Some(_), Some([nx, ny, nz])) => format!(
                "rows sorted by their end columns; columns in Morton order of the {nx}x{ny}x{nz} grid"
            ),
            (Some(_), _, _) => "rows sorted by their end columns".to_string(),
        };
        Ordering { rows, cols, what }
    }

    /// Whether anything changes.
    pub fn is_identity(&self) -> bool {
        self.rows.is_none() && self.cols.is_none()
    }

    /// The reordered system: rows moved and columns renamed in one pass over the rows
    /// ([`Csr::permuted`]: one new copy of the matrix beside the old one, which is then freed;
    /// none when only the columns change).
    pub fn apply(&self, a: Csr, b: Vec<f64>) -> (Csr, Vec<f64>) {
        let b = self.apply_to_rhs(b);
        (a.permuted(self.rows.as_deref(), self.cols.as_deref()), b)
    }

    /// A right-hand side in the new row order.
    pub fn apply_to_rhs(&self, b: Vec<f64>) -> Vec<f64> {
        match &self.rows {
            Some(r) => r.par_iter().map(|&i| b[i]).collect(),
            None => b,
        }
    }

    /// A vector of the original columns in the new numbering (x0).
    pub fn to_new(&self, x: &[f64]) -> Vec<f64> {
        match &self.cols {
            Some(p) => {
                let mut y = vec![0.0; x.len()];
                for (j, &v) in x.iter().enumerate() {
                    y[p[j] as usize] = v;
                }
                y
            }
            None => x.to_vec(),
        }
    }

    /// A vector in the new column numbering back in the original one (x, var).
    pub fn to_old(&self, y: &[f64]) -> Vec<f64> {
        match &self.cols {
            Some(p) => p.iter().map(|&k| y[k as usize]).collect(),
            None => y.to_vec(),
        }
    }
}

/// The bits of a and b interleaved (a's in the odd places): a key that orders pairs by both.
fn interleave2(a: u32, b: u32) -> u64 {
    let spread = |v: u32| -> u64 {
        let mut x = v as u64;
        x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
        x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
        x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
        x = (x | (x << 2)) & 0x3333_3333_3333_3333;
        x = (x | (x << 1)) & 0x5555_5555_5555_5555;
        x
    };
    (spread(a) << 1) | spread(b)
}

/// `new_of_old[c]` for the cells c = i + nx (j + ny k) of a grid: the rank of c in Morton
/// (bit-interleaved i, j, k) order.
pub fn morton_order(nx: usize, ny: usize, nz: usize) -> Vec<u32> {
    fn spread(mut v: u64) -> u64 {
        let mut out = 0u64;
        let mut b = 0;
        while v > 0 {
            out |= (v & 1) << (3 * b);
            v >>= 1;
            b += 1;
        }
        out
    }
    let n = nx * ny * nz;
    let mut keyed: Vec<(u64, u32)> = (0..n)
        .into_par_iter()
        .map(|c| {
            let (i, j, k) = (c % nx, (c / nx) % ny, c / (nx * ny));
            let key = spread(i as u64) | (spread(j as u64) << 1) | (spread(k as u64) << 2);
            (key, c as u32)
        })
        .collect();
    // the keys are distinct: any sort gives this order
    keyed.par_sort_unstable();
    let mut new_of_old = vec![0u32; n];
    for (new, &(_, old)) in keyed.iter().enumerate() {
        new_of_old[old as usize] = new as u32;
    }
    new_of_old
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn morton_is_a_permutation_with_2x2x2_blocks_first() {
        let p = morton_order(4, 3, 5);
        let mut seen = vec![false; p.len()];
        for &k in &p {
            assert!(!seen[k as usize]);
            seen[k as usize] = true;
        }
        // cells (0..2, 0..2, 0..2) come first
        let c = |i: usize, j: usize, k: usize| p[i + 4 * (j + 3 * k)];
        let mut first: Vec<u32> = (0..8).map(|b| c(b & 1, (b >> 1) & 1, b >> 2)).collect();
        first.sort_unstable();
        assert_eq!(first, (0..8).collect::<Vec<u32>>());
    }

    #[test]
    fn reordered_system_maps_back() {
        let a = crate::testproblems::awkward_csr(300, 4 * 3 * 5, 9);
        let b: Vec<f64> = (0..300).map(|i| i as f64).collect();
        let x: Vec<f64> = (0..60).map(|j| (j as f64).sin()).collect();
        let o = Ordering::plan(&a, Reorder::Auto, Some([4, 3, 5]));
        assert!(o.rows.is_some() && o.cols.is_some());
        assert!(o.what.contains("Morton"), "{}", o.what);
        let (a2, b2) = o.apply(a.clone(), b.clone());
        // (P_r A P_c)(P_c^T x) = P_r (A x)
        let ax = a.matvec(&x);
        let ax2 = a2.matvec(&o.to_new(&x));
        let rows = o.rows.as_ref().unwrap();
        for (i, &r) in rows.iter().enumerate() {
            assert!((ax2[i] - ax[r]).abs() <= 1e-12 * (1.0 + ax[r].abs()));
            assert_eq!(b2[i], b[r]);
        }
        assert_eq!(o.to_old(&o.to_new(&x)), x);
        // rows are sorted by their end columns, interleaved
        let keys: Vec<u64> = (0..a2.nrows())
            .filter_map(|i| {
                let c = a2.row(i).0;
                Some(interleave2(*c.first()?, *c.last()?))
            })
            .collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]));
        // the key orders by both numbers, the higher bits first
        assert_eq!(interleave2(0b10, 0b01), 0b1001);
        assert!(interleave2(1, 0) > interleave2(0, 1) && interleave2(0, 2) > interleave2(1, 1));
        // no grid: rows only; none: identity
        let o = Ordering::plan(&a, Reorder::Auto, None);
        assert!(o.cols.is_none() && o.rows.is_some());
        assert!(Ordering::plan(&a, Reorder::None, Some([4, 3, 5])).is_identity());
    }
}
