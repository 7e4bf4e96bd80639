//! Row partitioning across ranks: pure functions, no MPI.
//!
//! Rule (Huang et al. 2012, extended to damping rows):
//! 1. **Damping rows** (stored blocks followed by rows generated from the grid, numbered
//!    0..D) are split into `size` contiguous ranges ([`RowPartition::contiguous`]): rank r gets
//!    rows `[r * D / size, (r + 1) * D / size)`. Block files are memory-mapped and sliced, so the
//!    number of block files need not equal the number of ranks.
//! 2. Each rank starts with the nonzeros of its damping range as its initial load (exact: the
//!    loader reads them from the block row offsets; estimated as rows x the average damping
//!    nonzeros per row only when a caller has no counts).
//! 3. **Kernel rows** are then walked in descending nnz order (the metadata order; ties by row
//!    index) and each goes to the currently least-loaded rank (ties: lowest rank): greedy LPT.
//!    The load is the nonzero count, which dominates SpMV memory traffic (12 bytes per nonzero
//!    in CSR against 16 per row).
//!
//! LPT's classic bound gives max load <= mean + largest row, so with many rows the imbalance
//! (max / mean) is close to 1.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

use crate::partition::blocks::RowPartition;

/// Greedy LPT: `nnz` lists the kernel rows' nonzero counts in the order to walk (descending
/// nnz); each goes to the least-loaded rank, starting from `initial` loads. Returns the rank of
/// each entry and the final loads.
pub fn lpt(nnz: &[u64], initial: &[u64]) -> (Vec<u32>, Vec<u64>) {
    let size = initial.len().max(1);
    let mut loads: Vec<u64> = if initial.is_empty() {
        vec![0]
    } else {
        initial.to_vec()
    };
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = loads
        .iter()
        .enumerate()
        .map(|(r, &l)| Reverse((l, r as u32)))
        .collect();
    let mut owner = Vec::with_capacity(nnz.len());
    for &k in nnz {
        let Reverse((l, r)) = heap.pop().expect("at least one rank");
        owner.push(r);
        let nl = l + k;
        loads[r as usize] = nl;
        heap.push(Reverse((nl, r)));
    }
    debug_assert_eq!(loads.len(), size);
    (owner, loads)
}

/// The assignment of a whole system to `size` ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    /// Global kernel row indices owned by each rank, ascending.
    pub kernel: Vec<Vec<u64>>,
    /// Damping rows (0..D) of each rank: contiguous blocks of equal row counts.
    pub damping: RowPartition,
    /// Nonzeros of each rank (kernel exact; damping exact or estimated, see [`partition`]).
    pub load: Vec<u64>,
}

impl Partition {
    /// max / mean of the loads (1 = perfect; 1 for an empty system).
    pub fn imbalance(&self) -> f64 {
        imbalance(&self.load)
    }
    /// The damping rows of rank `rank`.
    pub fn damping_range(&self, rank: usize) -> Range<u64> {
        u64_range(self.damping.range(rank))
    }
}

fn u64_range(r: Range<usize>) -> Range<u64> {
    r.start as u64..r.end as u64
}

/// max / mean (1 when all are zero).
pub fn imbalance(loads: &[u64]) -> f64 {
    let total: u64 = loads.iter().sum();
    if total == 0 || loads.is_empty() {
        return 1.0;
    }
    let mean = total as f64 / loads.len() as f64;
    *loads.iter().max().unwrap() as f64 / mean
}

/// Partition kernel rows (`rows[i]`, `nnz[i]`, in metadata order: descending nnz) and `D`
/// damping rows with `damping_nnz` nonzeros in all over `size` ranks. `damping_range_nnz`
/// gives the nonzeros of a damping range when known exactly; otherwise pass `None` and the
/// average is used.
pub fn partition(
    rows: &[u64],
    nnz: &[u64],
    damping_rows: u64,
    damping_nnz: u64,
    damping_range_nnz: Option<&dyn Fn(Range<u64>) -> u64>,
    size: usize,
) -> Partition {
    assert_eq!(rows.len(), nnz.len());
    let size = size.max(1);
    let damping = RowPartition::contiguous(damping_rows as usize, size);
    let initial: Vec<u64> = (0..size)
        .map(|rank| u64_range(damping.range(rank)))
        .map(|r| match damping_range_nnz {
            Some(f) => f(r.clone()),
            None if damping_rows > 0 => {
                ((r.end - r.start) as u128 * damping_nnz as u128 / damping_rows as u128) as u64
            }
            None => 0,
        })
        .collect();
    let (owner, load) = lpt(nnz, &initial);
    let mut kernel = vec![Vec::new(); size];
    for (&row, &r) in rows.iter().zip(&owner) {
        kernel[r as usize].push(row);
    }
    kernel.iter_mut().for_each(|k| k.sort_unstable());
    Partition {
        kernel,
        damping,
        load,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::Rng;
    use crate::io::dataset::kernel_rows::descending_order;

    #[test]
    fn every_row_exactly_once_for_1_to_8_ranks() {
        for seed in 0..40u64 {
            let mut rng = Rng::new(seed);
            let m = rng.below(300) as usize;
            let nnz_raw: Vec<u64> = (0..m)
                .map(|_| match rng.below(4) {
                    0 => rng.below(20_000),
                    1 => 0,
                    _ => rng.below(50),
                })
                .collect();
            let order = descending_order(&nnz_raw);
            let rows: Vec<u64> = order.iter().map(|&i| i as u64).collect();
            let nnz: Vec<u64> = order.iter().map(|&i| nnz_raw[i]).collect();
            let d = rng.below(1000);
            let dnnz = d * (1 + rng.below(3));
            for size in 1..=8 {
                let p = partition(&rows, &nnz, d, dnnz, None, size);
                assert_eq!(p.kernel.len(), size);
                let mut seen = vec![0u32; m];
                for k in &p.kernel {
                    assert!(k.windows(2).all(|w| w[0] < w[1]));
                    for &r in k {
                        seen[r as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "seed {seed} size {size}");
                // Damping ranges tile 0..d.
                p.damping.check(d as usize, size).unwrap();
                // Loads add up and obey the LPT bound max <= min + largest row.
                let kernel_total: u64 = nnz.iter().sum();
                let total: u64 = p.load.iter().sum();
                assert!(total >= kernel_total);
                let largest = nnz.first().copied().unwrap_or(0);
                let (mx, mn) = (p.load.iter().max().unwrap(), p.load.iter().min().unwrap());
                let dmax = (0..size)
                    .map(|rank| p.damping_range(rank))
                    .map(|r| (r.end - r.start) * dnnz / d.max(1) + 3)
                    .max()
                    .unwrap();
                assert!(*mx <= mn + largest.max(dmax), "seed {seed} size {size}");
            }
        }
    }

    #[test]
    fn lpt_balances_equal_rows_and_breaks_ties_by_rank() {
        let (owner, loads) = lpt(&[5, 5, 5, 5], &[0, 0]);
        assert_eq!(owner, vec![0, 1, 0, 1]);
        assert_eq!(loads, vec![10, 10]);
        // The initial (damping) load steers kernel rows away.
        let (owner, loads) = lpt(&[4, 3, 2], &[6, 0]);
        assert_eq!(owner, vec![1, 1, 0]);
        assert_eq!(loads, vec![8, 7]);
        assert_eq!(imbalance(&[8, 7]), 8.0 / 7.5);
        assert_eq!(imbalance(&[0, 0]), 1.0);
    }

    #[test]
    fn descending_order_is_stable_by_index() {
        assert_eq!(descending_order(&[1, 3, 3, 0, 2]), vec![1, 2, 4, 0, 3]);
    }
}
