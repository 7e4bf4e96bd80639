//! Random matrices with awkward structure for kernel tests (every backend against the CPU).

use crate::grid::Rng;
use crate::sparse::Csr;

/// A random sparse matrix with awkward structure for kernel tests: empty rows, one very long
/// row, columns never touched, short damping-like rows.
pub fn awkward_csr(m: usize, n: usize, seed: u64) -> Csr {
    let mut rng = Rng::new(seed);
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    let untouched = n / 10; // the last tenth of the columns stays empty
    let ncol = (n - untouched).max(1) as u64;
    for i in 0..m {
        let len = match i % 7 {
            0 => 0,
            1 if i == 1 => (n * 3).min(20_000),
            2 | 3 => 1 + rng.below(4) as usize,
            _ => rng.below(40) as usize,
        };
        for _ in 0..len {
            r.push(i as u64);
            c.push(rng.below(ncol));
            v.push(rng.uniform() * 2.0 - 1.0);
        }
    }
    Csr::from_triplets(m, n, &r, &c, &v).expect("generated entries are in range")
}

/// A random square matrix, not symmetric: `diag` on the diagonal and, per row, fewer than
/// `extra` more entries uniform in [-0.5, 0.5) at random columns (a repeat is summed); for the
/// partition and distributed GMRES tests.
pub fn random_square(n: usize, diag: f64, extra: u64, seed: u64) -> Csr {
    let mut rng = Rng::new(seed);
    let (mut r, mut c, mut v) = (vec![], vec![], vec![]);
    for i in 0..n {
        r.push(i as u64);
        c.push(i as u64);
        v.push(diag);
        for _ in 0..rng.below(extra) {
            r.push(i as u64);
            c.push(rng.below(n as u64));
            v.push(rng.uniform() - 0.5);
        }
    }
    Csr::from_triplets(n, n, &r, &c, &v).expect("generated entries are in range")
}

/// A random sparse matrix in blocks of rows of one length, as damping blocks come: long rows,
/// blocks of 1-5 entries per row both shorter and longer than a run
/// ([`crate::sparse::runs::MIN_RUN_ROWS`]), empty rows, and values that are -0 (a row of few
/// columns may come out shorter: columns are drawn with repeats, then deduplicated).
pub fn runs_csr(ncols: usize, seed: u64) -> Csr {
    let mut rng = Rng::new(seed);
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    let mut row = 0u64;
    let mut push_row = |len: usize, rng: &mut Rng| {
        let mut cols: Vec<u64> = (0..len).map(|_| rng.below(ncols as u64)).collect();
        cols.sort_unstable();
        cols.dedup();
        for &col in &cols {
            r.push(row);
            c.push(col);
            v.push(if rng.below(9) == 0 {
                -0.0
            } else {
                rng.uniform() - 0.5
            });
        }
        row += 1;
    };
    for block in 0..40 {
        let len = [0usize, 1, 2, 3, 4, 5, 17, 300][block % 8];
        let rows = [3usize, 31, 32, 33, 100, 700][(block * 7) % 6];
        for _ in 0..rows {
            push_row(len, &mut rng);
        }
    }
    Csr::from_triplets(row as usize, ncols, &r, &c, &v).expect("generated entries are in range")
}

/// n values uniform in [-0.5, 0.5) from `rng`, with -0 at every index divisible by `every`
/// (signed zeros are where a reordered sum would show).
pub fn with_negative_zeros(n: usize, every: usize, rng: &mut Rng) -> Vec<f64> {
    (0..n)
        .map(|i| {
            if i % every == 0 {
                -0.0
            } else {
                rng.uniform() - 0.5
            }
        })
        .collect()
}

/// An m x n matrix with `per_row` entries a row at uniformly random columns (duplicates
/// summed), values uniform in [-1, 1): the solvers' batch and damping tests' system.
pub fn uniform_rows(m: usize, n: usize, per_row: usize, seed: u64) -> Csr {
    let mut rng = Rng::new(seed);
    let (mut r, mut c, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..m {
        for _ in 0..per_row {
            r.push(i as u64);
            c.push(rng.below(n as u64));
            v.push(rng.uniform() * 2.0 - 1.0);
        }
    }
    Csr::from_triplets(m, n, &r, &c, &v).expect("entries within the shape")
}
