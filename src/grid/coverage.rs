//! Ray coverage of the cells: hit count and derivative weight sum (DWS).

use crate::sparse::Csr;

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
    pub fn from_kernel_rows(a: &Csr, kernel_rows: usize) -> Coverage {
        let n = a.ncols();
        let mut hit_count = vec![0u32; n];
        let mut dws = vec![0.0; n];
        for i in 0..kernel_rows.min(a.nrows()) {
            let (cols, vals) = a.row(i);
            for (&c, &v) in cols.iter().zip(vals) {
                if v != 0.0 {
                    hit_count[c as usize] = hit_count[c as usize].saturating_add(1);
                    dws[c as usize] += v.abs();
                }
            }
        }
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
