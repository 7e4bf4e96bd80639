//! Ray coverage of the cells: hit count and derivative weight sum (DWS).

use rayon::prelude::*;

use crate::sparse::{par, Csr};

/// Per-cell ray coverage from the kernel rows of a system.
#[derive(Debug, Clone, PartialEq)]
pub struct Coverage {
    /// Number of kernel rows (rays) with a nonzero entry in the cell.
    pub hit_count: Vec<u32>,
    /// Derivative weight sum: the sum over kernel rows of |G_ij| (ray length in the cell for
    /// travel-time kernels).
    pub dws: Vec<f64>,
}

impl Coverage {
    /// Coverage of the first `kernel_rows` rows of `a` (the data rows; the remaining rows are
    /// damping/regularisation and are not counted).
    ///
    /// A cell's DWS is summed over the rows in row order. In parallel every task takes a range
    /// of cells and walks all the rows, each row's entries in its range found by bisection (a
    /// row's columns are sorted): each cell still sums its rows in order, so the result is the
    /// sequential loop's bit for bit.
    pub fn from_kernel_rows(a: &Csr, kernel_rows: usize) -> Coverage {
        let n = a.ncols();
        let m = kernel_rows.min(a.nrows());
        let mut hit_count = vec![0u32; n];
        let mut dws = vec![0.0; n];
        let nnz = a.indptr()[m] as usize;
        // A task bisects every row twice: worth it for rows of many entries (rays) on several
        // threads (with 2, the bisections cost what the second thread saves), one task per
        // thread; each task's cells then stay in cache.
        let long_rows = nnz >= 32 * m;
        let tasks = if long_rows && rayon::current_num_threads() >= 4 {
            par::blocks_for(nnz, 1)
        } else {
            1
        };
        let width = n.div_ceil(tasks).max(1);
        hit_count
            .par_chunks_mut(width)
            .zip(dws.par_chunks_mut(width))
            .enumerate()
            .for_each(|(t, (hits, dws))| {
                let (c0, c1) = ((t * width) as u32, (t * width + hits.len()) as u32);
                for i in 0..m {
                    let (cols, vals) = a.row(i);
                    let (s, e) = if tasks == 1 {
                        (0, cols.len())
                    } else {
                        (
                            cols.partition_point(|&c| c < c0),
                            cols.partition_point(|&c| c < c1),
                        )
                    };
                    for (&c, &v) in cols[s..e].iter().zip(&vals[s..e]) {
                        if v != 0.0 {
                            let c = (c - c0) as usize;
                            hits[c] = hits[c].saturating_add(1);
                            dws[c] += v.abs();
                        }
                    }
                }
            });
        Coverage { hit_count, dws }
    }
    /// Sum the coverage of several ranks' kernel rows (element-wise).
    pub fn merge(&mut self, other: &Coverage) {
        for (a, b) in self.hit_count.iter_mut().zip(&other.hit_count) {
            *a = a.saturating_add(*b);
        }
        for (a, b) in self.dws.iter_mut().zip(&other.dws) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_counts_kernel_rows_only() {
        let a =
            Csr::from_triplets(3, 3, &[0, 0, 1, 2], &[0, 1, 1, 2], &[2.0, -1.0, 3.0, 5.0]).unwrap();
        let c = Coverage::from_kernel_rows(&a, 2);
        assert_eq!(c.hit_count, vec![1, 2, 0]);
        assert_eq!(c.dws, vec![2.0, 4.0, 0.0]);
    }
}
