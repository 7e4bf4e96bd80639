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
