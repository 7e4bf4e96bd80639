//! Row partitioning across ranks: pure functions, no MPI.
//!
//! Rule (Huang et al. 2012, extended to damping rows and balanced by cost, not nonzeros):
//! 1. **Cost**: a row costs what one LSQR iteration moves for it ([`RowCost`]: bytes per row and
//!    per nonzero, kernel and damping rows apart). A damping row of 1-2 nonzeros costs far more
//!    per nonzero than a kernel row of hundreds, and as a grid stencil it costs no index or
//!    value traffic at all: balancing nonzeros left the rank with the damping rows slow.
//! 2. **Damping rows** (stored blocks followed by rows generated from the grid, numbered
//!    0..D): when they form whole grid-stencil blocks (norm damping, first or second
//!    differences along an axis: `cuts` are the block boundaries), each rank gets whole blocks,
//!    contiguous, from the last rank down, as many as keep it under the mean cost; a rank's
//!    damping rows are then a stencil of their own, which compact storage applies matrix-free
//!    on every rank. Otherwise they are split into `size` contiguous ranges of equal rows
//!    ([`RowPartition::contiguous`]). Block files are memory-mapped and sliced, so the number of
//!    block files need not equal the number of ranks.
//! 3. Each rank starts with the cost of its damping rows as its initial load (their nonzeros
//!    exact where the loader reads the block row offsets, else the average).
//! 4. **Kernel rows** are then walked in descending nnz order (the metadata order; ties by row
//!    index) and each goes to the currently least-loaded rank (ties: lowest rank): greedy LPT.
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

/// What a row costs in one LSQR iteration (its A x and A^T y passes), in bytes of memory
/// traffic: per row (offsets, the entry of y it writes and reads) and per nonzero (index and
/// value, the entry of x it gathers), kernel and damping rows apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowCost {
    pub kernel_row: u64,
    pub kernel_nnz: u64,
    pub damping_row: u64,
    pub damping_nnz: u64,
}

impl RowCost {
    /// Bytes per kernel row, per kernel nonzero, per damping row, per damping nonzero.
    pub const fn new(kernel_row: u64, kernel_nnz: u64, damping_row: u64, damping_nnz: u64) -> Self {
        RowCost {
            kernel_row,
            kernel_nnz,
            damping_row,
            damping_nnz,
        }
    }
    /// Nonzeros alone (Huang et al. 2012's rule).
    pub const NONZEROS: RowCost = RowCost::new(0, 1, 0, 1);
    /// CSR with f64 values, both products: 12 bytes per nonzero and 16 per row each way;
    /// damping rows are CSR rows too.
    pub const CSR: RowCost = RowCost::new(32, 24, 32, 24);
    /// Compact storage with grid stencils on the GPU: about 10.5 bytes per stored nonzero each
    /// way (16-bit column deltas, f64 values), and a stencil row costs its y entry and its x
    /// gathers (mostly cached), no index or value traffic.
    pub const COMPACT_GPU: RowCost = RowCost::new(32, 21, 48, 0);
    /// Compact storage with grid stencils on the CPU: the stencil's transposed terms gather y
    /// in cell order, about 11 kernel nonzeros' time per stencil row (measured on the 64x64x40
    /// synthetic dataset, 2 ranks of one thread: 19 ns per stencil row against 1.65 ns per stored nonzero,
    /// A x and A^T y together).
    pub const COMPACT_CPU: RowCost = RowCost::new(32, 21, 240, 0);

    /// A kernel row of `nnz` nonzeros.
    pub fn kernel(&self, nnz: u64) -> u64 {
        self.kernel_row + self.kernel_nnz * nnz
    }
    /// `rows` damping rows with `nnz` nonzeros in all.
    pub fn damping(&self, rows: u64, nnz: u64) -> u64 {
        self.damping_row * rows + self.damping_nnz * nnz
    }
    /// A whole system's cost (kernel rows first): what [`partition`] gives a single rank.
    pub fn of_system(&self, sys: &crate::sparse::System) -> u64 {
        let ip = sys.a.indptr();
        let (k, m) = (sys.kernel_rows, sys.a.nrows());
        let (knnz, nnz) = (ip[k], ip[m]);
        self.kernel_row * k as u64
            + self.kernel_nnz * knnz
            + self.damping(m as u64 - k as u64, nnz - knnz)
    }
}

/// The damping rows of a system: how many, their nonzeros (exact per range where known), and
/// the boundaries of the grid-stencil blocks they form, if they do (ascending, ending at the
/// row count; see the module docs).
pub struct Damping<'a> {
    pub rows: u64,
    pub nnz: u64,
    pub range_nnz: Option<&'a dyn Fn(Range<u64>) -> u64>,
    pub cuts: Option<&'a [u64]>,
}

/// The assignment of a whole system to `size` ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    /// Global kernel row indices owned by each rank, ascending.
    pub kernel: Vec<Vec<u64>>,
    /// Damping rows (0..D) of each rank: contiguous blocks of equal row counts.
    pub damping: RowPartition,
    /// The cost of each rank ([`RowCost`]; damping nonzeros exact or estimated, see
    /// [`partition`]).
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

/// Partition kernel rows (`rows[i]`, `nnz[i]`, in metadata order: descending nnz) and the
/// damping rows over `size` ranks, balancing `cost` (see the module docs).
pub fn partition(
    rows: &[u64],
    nnz: &[u64],
    damping: &Damping,
    size: usize,
    cost: RowCost,
) -> Partition {
    assert_eq!(rows.len(), nnz.len());
    let size = size.max(1);
    let d = damping.rows;
    let range_cost = |r: Range<u64>| {
        let n = match damping.range_nnz {
            Some(f) => f(r.clone()),
            None if d > 0 => ((r.end - r.start) as u128 * damping.nnz as u128 / d as u128) as u64,
            None => 0,
        };
        cost.damping(r.end - r.start, n)
    };
    let kernel_total: u64 = nnz.iter().map(|&k| cost.kernel(k)).sum();
    if size == 1 {
        // One rank: every row, nothing to balance (what the loop below gives, without its
        // heap and sorts: rows that are 0..n in some order sort to 0..n).
        let mut seen = vec![false; rows.len()];
        let permutation = rows
            .iter()
            .all(|&r| (r as usize) < seen.len() && !std::mem::replace(&mut seen[r as usize], true));
        let kernel = if permutation {
            (0..rows.len() as u64).collect()
        } else {
            let mut k = rows.to_vec();
            k.sort_unstable();
            k
        };
        return Partition {
            kernel: vec![kernel],
            damping: RowPartition::contiguous(d as usize, 1),
            load: vec![range_cost(0..d) + kernel_total],
        };
    }
    let split = match damping.cuts {
        Some(cuts) if cuts.last() == Some(&d) => {
            whole_blocks(cuts, size, kernel_total + range_cost(0..d), &range_cost)
        }
        _ => RowPartition::contiguous(d as usize, size),
    };
    let initial: Vec<u64> = (0..size)
        .map(|rank| range_cost(u64_range(split.range(rank))))
        .collect();
    let costs: Vec<u64> = nnz.iter().map(|&k| cost.kernel(k)).collect();
    let (owner, load) = lpt(&costs, &initial);
    let mut kernel = vec![Vec::new(); size];
    for (&row, &r) in rows.iter().zip(&owner) {
        kernel[r as usize].push(row);
    }
    kernel.iter_mut().for_each(|k| k.sort_unstable());
    Partition {
        kernel,
        damping: split,
        load,
    }
}

/// Whole blocks (`cuts`: their ends) to ranks, contiguous, from the last rank down: each rank
/// takes at least one block (while blocks are left) and more while it stays within the mean
/// cost `total / size`; rank 0 takes what remains.
fn whole_blocks(
    cuts: &[u64],
    size: usize,
    total: u64,
    range_cost: &dyn Fn(Range<u64>) -> u64,
) -> RowPartition {
    let mean = total / size as u64;
    let start_of = |k: usize| if k == 0 { 0 } else { cuts[k - 1] };
    let mut bounds = vec![*cuts.last().unwrap_or(&0) as usize; size + 1];
    let mut end = cuts.len(); // blocks 0..end are not given yet
    for rank in (1..size).rev() {
        let hi = start_of(end);
        let mut k = end;
        while k > 0 && (k == end || range_cost(start_of(k - 1)..hi) <= mean) {
            k -= 1;
        }
        bounds[rank] = start_of(k) as usize;
        end = k;
    }
    bounds[0] = 0;
    RowPartition { bounds }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::Rng;
    use crate::io::dataset::kernel_rows::descending_order;

    #[test]
    fn a_systems_cost_is_what_one_rank_is_given() {
        for seed in 0..20u64 {
            let mut rng = Rng::new(seed);
            let (k, d) = (rng.below(200) as usize, rng.below(300) as usize);
            let counts: Vec<u64> = (0..k + d)
                .map(|i| {
                    if i < k {
                        rng.below(500)
                    } else {
                        1 + rng.below(4)
                    }
                })
                .collect();
            let mut indptr = vec![0u64];
            for c in &counts {
                indptr.push(indptr.last().unwrap() + c);
            }
            let nnz = *indptr.last().unwrap() as usize;
            let a =
                crate::sparse::Csr::from_trusted(k + d, 1, indptr, vec![0; nnz], vec![1.0; nnz]);
            let sys = crate::sparse::System {
                a,
                b: vec![0.0; k + d],
                kernel_rows: k,
            };
            let ip = sys.a.indptr().to_vec();
            let exact = |r: Range<u64>| ip[k + r.end as usize] - ip[k + r.start as usize];
            let damping = Damping {
                rows: d as u64,
                nnz: ip[k + d] - ip[k],
                range_nnz: Some(&exact),
                cuts: None,
            };
            let rows: Vec<u64> = (0..k as u64).collect();
            for cost in [
                RowCost::NONZEROS,
                RowCost::CSR,
                RowCost::COMPACT_GPU,
                RowCost::COMPACT_CPU,
            ] {
                let p = partition(&rows, &counts[..k], &damping, 1, cost);
                assert_eq!(p.load, vec![cost.of_system(&sys)], "seed {seed}");
            }
        }
    }

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
                let damping = Damping {
                    rows: d,
                    nnz: dnnz,
                    range_nnz: None,
                    cuts: None,
                };
                let p = partition(&rows, &nnz, &damping, size, RowCost::NONZEROS);
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
