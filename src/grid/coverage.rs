//! Ray coverage of the cells: hit count and derivative weight sum (DWS).

use rayon::prelude::*;

use crate::sparse::{par, Csr};

/// Entries of the kernel rows a block of [`Coverage::from_kernel_rows`] holds (12 bytes each:
/// about 4 MB, which stays in the shared cache while every task walks it).
const BLOCK_ENTRIES: usize = 1 << 18;

/// A coverage computed on a thread of its own (from rows it owns and drops after), for a run
/// that has other work to do meanwhile: a GPU run's coverage while the GPU solves; or one
/// already computed.
#[derive(Clone)]
pub struct PendingCoverage(std::sync::Arc<std::sync::Mutex<Option<Pending>>>);

enum Pending {
    Ready(Coverage),
    Running(std::thread::JoinHandle<Option<Coverage>>),
}

impl std::fmt::Debug for PendingCoverage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingCoverage")
    }
}

impl PendingCoverage {
    /// `work` started on a thread of its own.
    pub fn spawn(work: impl FnOnce() -> Option<Coverage> + Send + 'static) -> PendingCoverage {
        Self::of(Pending::Running(std::thread::spawn(work)))
    }
    /// A coverage already computed.
    pub fn ready(c: Coverage) -> PendingCoverage {
        Self::of(Pending::Ready(c))
    }
    fn of(p: Pending) -> PendingCoverage {
        PendingCoverage(std::sync::Arc::new(std::sync::Mutex::new(Some(p))))
    }
    /// The coverage, once (waiting for the thread); None after the first call, where the work
    /// gave none, or if the thread panicked.
    pub fn take(&self) -> Option<Coverage> {
        match self.0.lock().unwrap_or_else(|e| e.into_inner()).take()? {
            Pending::Ready(c) => Some(c),
            Pending::Running(h) => h.join().ok().flatten(),
        }
    }
}

/// Per-cell ray coverage from the kernel rows of a system.
/// (Default: none yet, for a run that computes it later.)
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Coverage {
    /// Number of kernel rows (rays) with a nonzero entry in the cell.
    pub hit_count: Vec<u32>,
    /// Derivative weight sum: the sum over kernel rows of |G_ij| (ray length in the cell for
    /// travel-time kernels).
    pub dws: Vec<f64>,
}

impl Coverage {
    /// `work()` here and, meanwhile, the coverage of the first `kernel_rows` rows of `g` on a
    /// thread of its own (computed here after `work` where no thread can be started): a sweep
    /// that solves on the GPU leaves the host's cores idle (0.2-0.3 s at 92M kernel nonzeros).
    /// A panic on that thread goes on here.
    pub fn beside<R: Send>(g: &Csr, kernel_rows: usize, work: impl FnOnce() -> R) -> (R, Coverage) {
        std::thread::scope(|sc| {
            let cov = std::thread::Builder::new()
                .name("seistomo-coverage".into())
                .spawn_scoped(sc, || Coverage::from_kernel_rows(g, kernel_rows));
            let r = work();
            let c = match cov {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(_) => Coverage::from_kernel_rows(g, kernel_rows),
            };
            (r, c)
        })
    }

    /// Coverage of the first `kernel_rows` rows of `a` (the data rows; the remaining rows are
    /// damping/regularisation and are not counted).
    ///
    /// A cell's DWS is summed over the rows in row order. In parallel every task takes a range
    /// of cells and walks the rows, each row's entries in its range found by bisection (a
    /// row's columns are sorted): each cell still sums its rows in order, so the result is the
    /// sequential loop's bit for bit. The tasks walk the rows block by block, all of them
    /// through one block (about 4 MB of entries, in the shared cache) before the next, so that
    /// the matrix comes from memory about once, not once per task (measured on 32 cores,
    /// 369M nonzeros: 0.65 s, against 0.84 s in another call when every task walked all the
    /// rows on its own; 101M: 0.17-0.22 s against 0.23 s in the same call).
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
        // row blocks of about BLOCK_ENTRIES entries (one block when there is one task)
        let blocks = if tasks == 1 {
            1
        } else {
            (nnz / BLOCK_ENTRIES).max(1)
        };
        let bounds = par::row_blocks(&a.indptr()[..=m], blocks);
        for rows in bounds.windows(2) {
            let (r0, r1) = (rows[0], rows[1]);
            hit_count
                .par_chunks_mut(width)
                .zip(dws.par_chunks_mut(width))
                .enumerate()
                .for_each(|(t, (hits, dws))| {
                    let (c0, c1) = ((t * width) as u32, (t * width + hits.len()) as u32);
                    for i in r0..r1 {
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
    fn blocks_and_tasks_give_the_sequential_loop_bit_for_bit() {
        // long rows (rays), enough of them for several blocks, on 4 and 8 threads
        let a = crate::testproblems::awkward_csr(20_000, 3000, 21);
        let mut r = Vec::new();
        let (mut c, mut v) = (Vec::new(), Vec::new());
        let mut x = 0.37f64;
        for i in 0..40_000u64 {
            for k in 0..40u64 {
                r.push(i);
                c.push((i * 7 + k * 61) % 3000);
                x = (x * 3.9).fract() + 1e-3;
                v.push(if k % 13 == 0 { 0.0 } else { x - 0.5 });
            }
        }
        let b = Csr::from_triplets(40_000, 3000, &r, &c, &v).unwrap();
        for (a, kr) in [(&a, 15_000), (&b, 39_000)] {
            let mut want = Coverage {
                hit_count: vec![0; a.ncols()],
                dws: vec![0.0; a.ncols()],
            };
            for i in 0..kr {
                let (cols, vals) = a.row(i);
                for (&c, &v) in cols.iter().zip(vals) {
                    if v != 0.0 {
                        want.hit_count[c as usize] += 1;
                        want.dws[c as usize] += v.abs();
                    }
                }
            }
            for threads in [1, 4, 8] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let got = pool.install(|| Coverage::from_kernel_rows(a, kr));
                assert_eq!(got.hit_count, want.hit_count, "{threads} threads");
                let bits = |d: &[f64]| d.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.dws), bits(&want.dws), "{threads} threads");
            }
        }
    }

    #[test]
    fn coverage_counts_kernel_rows_only() {
        let a =
            Csr::from_triplets(3, 3, &[0, 0, 1, 2], &[0, 1, 1, 2], &[2.0, -1.0, 3.0, 5.0]).unwrap();
        let c = Coverage::from_kernel_rows(&a, 2);
        assert_eq!(c.hit_count, vec![1, 2, 0]);
        assert_eq!(c.dws, vec![2.0, 4.0, 0.0]);
    }
}
