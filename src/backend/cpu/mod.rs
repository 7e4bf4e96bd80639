//! The CPU backend: rayon-parallel sparse products and fused vector kernels on host memory.
//!
//! Reductions sum fixed-size chunks and then the chunk sums in order, so every result is the
//! same whatever the thread count or scheduling (bitwise reproducible runs and resumes).

mod block;
#[cfg(target_arch = "x86_64")]
mod block_avx2;
mod block_rows;
mod compact;
mod rows;

pub use block::{CpuBlock, CpuBlockOperator};
pub use compact::CpuCompactOperator;

pub mod square;

use std::sync::Mutex;

use rayon::prelude::*;

use super::{Backend, Measure, Operator, ScalarSlots, Scale, TransposeStrategy, XwState, XwStep};
use crate::comm::Comm;
use crate::error::Result;
use crate::sparse::{Csr, RowOrder, RowRuns, RowSort};

/// Elements per reduction chunk (and below twice this, vector kernels run on one thread).
const CHUNK: usize = 16 * 1024;

/// Host vectors and rayon kernels.
pub struct CpuBackend {
    partials: Mutex<Vec<f64>>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            partials: Mutex::new(Vec::new()),
        }
    }

    /// Batched reductions over the chunks of `reduce`: per chunk, first `update(range)`, then
    /// out[j] partials = lane sums of basis[j] . w (or, with `norm`, out[0] = w . w). Chunk sums
    /// are added in chunk order, so every out[j] is bitwise the `dot` of the same vectors.
    fn multi_reduce<U>(
        &self,
        basis: &[Vec<f64>],
        n: usize,
        out: &mut [f64],
        update: U,
        w: SharedMut,
        norm: bool,
    ) where
        U: Fn(std::ops::Range<usize>) + Sync,
    {
        let k = out.len();
        let nchunks = n.div_ceil(CHUNK);
        // A task takes BLOCK consecutive chunks: the update runs over the whole block, then each
        // basis vector is streamed over the block (long streams for the prefetcher) while the
        // partial sums stay per chunk (so every out[j] is still bitwise `dot`'s).
        const BLOCK: usize = 8;
        let block = |b: usize, dst: &mut [f64]| {
            let c0 = b * BLOCK;
            let c1 = (c0 + BLOCK).min(nchunks);
            let r = c0 * CHUNK..(c1 * CHUNK).min(n);
            update(r.clone());
            for c in c0..c1 {
                let rc = c * CHUNK..((c + 1) * CHUNK).min(n);
                // SAFETY: `w` points to n live elements for the whole call; this block's range
                // was updated above by this same call, and no other call touches it.
                let ws: &[f64] = unsafe { w.slice(rc.clone()) };
                let d = &mut dst[(c - c0) * k..(c - c0 + 1) * k];
                if norm {
                    d[0] = lane_sum(ws.len(), |i| ws[i] * ws[i]);
                }
            }
            if !norm {
                for (j, v) in basis.iter().enumerate() {
                    for c in c0..c1 {
                        let rc = c * CHUNK..((c + 1) * CHUNK).min(n);
                        // SAFETY: as above.
                        let ws: &[f64] = unsafe { w.slice(rc.clone()) };
                        let vs = &v[rc];
                        dst[(c - c0) * k + j] = lane_sum(ws.len(), |i| vs[i] * ws[i]);
                    }
                }
            }
        };
        let mut p = self.partials.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < nchunks * k {
            p.resize(nchunks * k, 0.0);
        }
        let parts = &mut p[..nchunks * k];
        let nblocks = nchunks.div_ceil(BLOCK);
        if k == 0 {
            // nothing to sum; the update still runs
            for b in 0..nblocks {
                block(b, &mut []);
            }
        } else if nblocks <= 1 {
            block(0, parts);
        } else {
            parts
                .par_chunks_mut(BLOCK * k)
                .enumerate()
                .for_each(|(b, dst)| block(b, dst));
        }
        for (j, o) in out.iter_mut().enumerate() {
            *o = (0..nchunks).map(|c| parts[c * k + j]).sum();
        }
    }

    /// Deterministic chunked reduction of `f(chunk_index, range)` partial sums.
    fn reduce<F>(&self, n: usize, f: F) -> f64
    where
        F: Fn(std::ops::Range<usize>) -> f64 + Sync,
    {
        let nchunks = n.div_ceil(CHUNK);
        if nchunks <= 2 {
            return (0..nchunks)
                .map(|c| f(c * CHUNK..((c + 1) * CHUNK).min(n)))
                .sum();
        }
        let mut p = self.partials.lock().unwrap_or_else(|e| e.into_inner());
        p.resize(nchunks, 0.0);
        p.par_iter_mut()
            .enumerate()
            .for_each(|(c, s)| *s = f(c * CHUNK..((c + 1) * CHUNK).min(n)));
        p.iter().sum()
    }
}

/// w[r] -= sum_j coeffs[j] basis[j][r], subtracting c_0 v_0 first (the order of successive
/// `axpby` calls, bit for bit).
fn axpy_chunk(coeffs: &[f64], basis: &[Vec<f64>], r: std::ops::Range<usize>, ws: &mut [f64]) {
    for (&c, v) in coeffs.iter().zip(basis) {
        for (wi, &vi) in ws.iter_mut().zip(&v[r.clone()]) {
            *wi += -c * vi;
        }
    }
}

/// Sum of `term(0..n)` in 8 interleaved lanes (combined pairwise, then the tail): the order of
/// an unrolled BLAS dot. Besides vectorising, it keeps rounding close to the BLAS that SciPy and
/// PETSc use: with a plain left-to-right sum LSQR's iteration counts on the ill-conditioned
/// Harwell-Boeing systems drift 3-4 % from SciPy's, with lanes they stay within 1 %.
#[inline]
fn lane_sum(n: usize, term: impl Fn(usize) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let n8 = n - n % 8;
    let mut i = 0;
    while i < n8 {
        for (l, a) in acc.iter_mut().enumerate() {
            *a += term(i + l);
        }
        i += 8;
    }
    let a = [
        acc[0] + acc[4],
        acc[1] + acc[5],
        acc[2] + acc[6],
        acc[3] + acc[7],
    ];
    let mut s = (a[0] + a[2]) + (a[1] + a[3]);
    for j in n8..n {
        s += term(j);
    }
    s
}

/// The most CPU threads a run may ask for.
pub const MAX_THREADS: usize = 4096;

/// Use `threads` rayon workers for the rest of the process (when given; 1..=[`MAX_THREADS`]).
/// Without a count, rayon's default (RAYON_NUM_THREADS or the cores) is built up front, so the
/// pool's threads start before the solve, not inside its first timed iteration.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    let mut b = rayon::ThreadPoolBuilder::new();
    let t = match threads {
        Some(t) if !(1..=MAX_THREADS).contains(&t) => {
            return Err(crate::error::Error::Invalid(format!(
                "--threads must be in 1..={MAX_THREADS} (got {t})"
            )));
        }
        Some(t) => Some(t),
        // Rayon would read RAYON_NUM_THREADS itself, unchecked: it is read (and checked) here.
        None => env_threads()?,
    };
    if let Some(t) = t {
        b = b.num_threads(t);
    }
    // A second call in one process (tests) finds the pool built: not an error.
    let _ = b.build_global();
    Ok(())
}

/// `RAYON_NUM_THREADS`, checked like `--threads`: None when unset or 0 (one thread per core),
/// else a count in 1..=[`MAX_THREADS`]; anything else is an error naming the variable.
pub fn env_threads() -> Result<Option<usize>> {
    let Some(v) = crate::settings::launch::rayon_num_threads() else {
        return Ok(None);
    };
    match v.trim().parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(t) if t <= MAX_THREADS => Ok(Some(t)),
        _ => Err(crate::error::Error::Invalid(format!(
            "RAYON_NUM_THREADS={v}: must be in 1..={MAX_THREADS} (or 0: one thread per core)"
        ))),
    }
}

static KEEPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static WARM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Say that the set-up ran on the heap (the loaded rows, their reordered copy, the encodings:
/// gigabytes freed into it), so that [`warm_heap`] has nothing to do: the outputs reuse
/// those blocks.
pub fn set_up_on_heap() {
    WARM.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Fault in `bytes` of heap for the allocations that follow, 2 MiB at a time: once freed
/// memory is kept ([`keep_freed_memory`]), a block of that size is taken from the heap,
/// advised to huge pages, touched once per 2 MiB in parallel and freed, so that the next
/// blocks (the model file's image: HDF5's buffer and its copy, ~2.5 x the model's fields)
/// reuse pages already there instead of faulting 4 KiB at a time (a run from prepared
/// storage: its model file written 0.43 -> 0.31 s on an H100's host). Before
/// [`keep_freed_memory`] (glibc would map such a block on its own and unmap it on free), after
/// a set-up on the heap ([`set_up_on_heap`]: there it cost 0.05 s and gained nothing) or below
/// 64 MiB it does nothing.
pub fn warm_heap(bytes: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    if !KEEPING.load(Relaxed) || WARM.load(Relaxed) || bytes < (64 << 20) {
        return;
    }
    let mut block = vec![0u8; bytes];
    crate::sparse::par::advise_huge(&mut block);
    block.par_chunks_mut(2 << 20).for_each(|c| c[0] = 1);
    drop(block);
}

/// Keep large freed blocks in the process for the next allocation instead of handing them
/// back to the kernel (glibc: blocks up to 1 GiB from the heap, not from their own mappings,
/// and up to 2 GiB of free heap kept). The set-up's steps each write a new copy of the matrix
/// and free the one before (the loaded rows, the reordered rows, a transpose, the encodings):
/// a freshly mapped page costs a fault on first touch (on the 2-core build VM ~0.4 us a page,
/// 140 MB in ~65 ms: 15 times the copy itself), a reused one nothing. The peak is unchanged;
/// freed memory stays with the process until it exits. Elsewhere (not glibc) it does nothing.
///
/// Called when the set-up starts ([`crate::pipeline`]'s `prepare`), not before the load: the
/// load's large buffers from the heap instead of their own mappings cost 0.14 -> 0.18 s on the
/// 150k-ray dataset (2-core VM) and 0.82 -> 1.46 s on the 600k-ray one (H200 host, 16 cores).
pub fn keep_freed_memory() {
    KEEPING.store(true, std::sync::atomic::Ordering::Relaxed);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters (no memory is touched); called before
    // the set-up allocates, and glibc takes its own lock for it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Runs `f` on a worker of rayon's pool and waits for it, when `comm` has one rank.
///
/// The backend's kernels fork with rayon. Called from a thread outside the pool (the main
/// thread), every fork is injected into the pool and the caller sleeps until a worker finishes
/// it: a wake-up and a sleep per kernel, several per LSQR iteration (on australia, one thread,
/// 0.3 of a 0.9 ms iteration went to the scheduler). Run from a worker, the same forks are
/// pushed on its own deque and, with one thread, run inline. Drive a solve on the CPU backend
/// through this.
///
/// With several ranks `f` runs where it is called: ranks that are threads of one process
/// ([`crate::comm::ThreadComm`]) wait for each other in collectives, and a rank holding a worker
/// while it waits could starve the ranks that need one. Not for the Python module either:
/// Python runs signal handlers on its main thread only, so a solve on a worker would never see
/// Ctrl-C (`PyErr_CheckSignals` does nothing elsewhere).
pub fn on_pool<R: Send>(comm: &dyn Comm, f: impl FnOnce() -> R + Send) -> R {
    if comm.size() > 1 || rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::scope(|_| f())
}

fn par_for<F>(n: usize, f: F)
where
    F: Fn(std::ops::Range<usize>) + Sync,
{
    if n <= 2 * CHUNK {
        f(0..n);
    } else {
        (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .for_each(|c| f(c * CHUNK..((c + 1) * CHUNK).min(n)));
    }
}

/// A raw pointer that may be shared across threads when every thread touches disjoint indices.
#[derive(Clone, Copy)]
struct SharedMut(*mut f64);
// SAFETY: used only by `par_for` bodies whose index ranges are disjoint, so no two threads
// access the same element.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}
impl SharedMut {
    /// # Safety
    /// `r` must be in bounds of the original slice and not accessed by any other thread.
    unsafe fn slice<'a>(self, r: std::ops::Range<usize>) -> &'a mut [f64] {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(r.start), r.len()) }
    }
}

impl Backend for CpuBackend {
    type Vector = Vec<f64>;

    fn name(&self) -> &'static str {
        "cpu"
    }
    fn describe(&self) -> String {
        match rayon::current_num_threads() {
            1 => "cpu (rayon, 1 thread)".to_string(),
            t => format!("cpu (rayon, {t} threads)"),
        }
    }
    fn zeros(&self, n: usize) -> Result<Vec<f64>> {
        Ok(vec![0.0; n])
    }
    fn upload(&self, x: &[f64]) -> Result<Vec<f64>> {
        Ok(x.to_vec())
    }
    fn download(&self, x: &Vec<f64>, out: &mut [f64]) -> Result<()> {
        out.copy_from_slice(x);
        Ok(())
    }
    fn download_range(&self, x: &Vec<f64>, start: usize, out: &mut [f64]) -> Result<()> {
        crate::backend::copy_range(x, start, out)
    }
    fn len(&self, x: &Vec<f64>) -> usize {
        x.len()
    }
    fn copy(&self, src: &Vec<f64>, dst: &mut Vec<f64>) -> Result<()> {
        dst.copy_from_slice(src);
        Ok(())
    }
    fn fill(&self, x: &mut Vec<f64>, value: f64) -> Result<()> {
        x.fill(value);
        Ok(())
    }
    fn scale(&self, x: &mut Vec<f64>, a: f64) -> Result<()> {
        let p = SharedMut(x.as_mut_ptr());
        par_for(x.len(), |r| {
            // SAFETY: par_for hands out disjoint in-bounds ranges.
            unsafe { p.slice(r) }.iter_mut().for_each(|v| *v *= a)
        });
        Ok(())
    }
    fn axpby(&self, a: f64, x: &Vec<f64>, b: f64, y: &mut Vec<f64>) -> Result<()> {
        assert_eq!(x.len(), y.len());
        let p = SharedMut(y.as_mut_ptr());
        par_for(x.len(), |r| {
            // SAFETY: par_for hands out disjoint in-bounds ranges.
            let ys = unsafe { p.slice(r.clone()) };
            for (yi, &xi) in ys.iter_mut().zip(&x[r]) {
                *yi = a * xi + b * *yi;
            }
        });
        Ok(())
    }
    fn pointwise_mul(&self, x: &Vec<f64>, y: &Vec<f64>, z: &mut Vec<f64>) -> Result<()> {
        assert!(x.len() == y.len() && y.len() == z.len());
        let p = SharedMut(z.as_mut_ptr());
        par_for(x.len(), |r| {
            // SAFETY: par_for hands out disjoint in-bounds ranges.
            let zs = unsafe { p.slice(r.clone()) };
            for ((zi, &xi), &yi) in zs.iter_mut().zip(&x[r.clone()]).zip(&y[r]) {
                *zi = xi * yi;
            }
        });
        Ok(())
    }
    fn dot(&self, x: &Vec<f64>, y: &Vec<f64>) -> Result<f64> {
        assert_eq!(x.len(), y.len());
        Ok(self.reduce(x.len(), |r| {
            let (xs, ys) = (&x[r.clone()], &y[r]);
            lane_sum(xs.len(), |i| xs[i] * ys[i])
        }))
    }
    fn multi_dot(&self, basis: &[Vec<f64>], w: &Vec<f64>, out: &mut [f64]) -> Result<()> {
        assert_eq!(basis.len(), out.len());
        // Only read through the pointer.
        let pw = SharedMut(w.as_ptr() as *mut f64);
        self.multi_reduce(basis, w.len(), out, |_r| {}, pw, false);
        Ok(())
    }
    fn multi_axpy(&self, coeffs: &[f64], basis: &[Vec<f64>], w: &mut Vec<f64>) -> Result<()> {
        assert_eq!(coeffs.len(), basis.len());
        let n = w.len();
        let p = SharedMut(w.as_mut_ptr());
        par_for(n, |r| {
            // SAFETY: par_for hands out disjoint in-bounds ranges.
            let ws = unsafe { p.slice(r.clone()) };
            axpy_chunk(coeffs, basis, r, ws);
        });
        Ok(())
    }
    fn multi_axpy_measure(
        &self,
        then: Measure,
        coeffs: &[f64],
        basis: &[Vec<f64>],
        w: &mut Vec<f64>,
        out: &mut [f64],
    ) -> Result<()> {
        let outs = if then == Measure::Dots {
            basis.len()
        } else {
            1
        };
        assert!(coeffs.len() == basis.len() && out.len() == outs);
        let n = w.len();
        let p = SharedMut(w.as_mut_ptr());
        self.multi_reduce(
            basis,
            n,
            out,
            |r| {
                // SAFETY: multi_reduce hands each chunk to exactly one call: disjoint ranges.
                let ws = unsafe { p.slice(r.clone()) };
                axpy_chunk(coeffs, basis, r, ws);
            },
            p,
            then == Measure::NormSq,
        );
        Ok(())
    }
    fn norm_sq(&self, x: &Vec<f64>) -> Result<f64> {
        Ok(self.reduce(x.len(), |r| {
            let xs = &x[r];
            lane_sum(xs.len(), |i| xs[i] * xs[i])
        }))
    }
    fn lsqr_update(&self, k: XwStep, v: &Vec<f64>, s: XwState<Vec<f64>>) -> Result<f64> {
        let (XwStep { t1, t2, inv_rho }, XwState { x, w, var }) = (k, s);
        let n = x.len();
        assert!(w.len() == n && v.len() == n);
        let (px, pw) = (SharedMut(x.as_mut_ptr()), SharedMut(w.as_mut_ptr()));
        let pvar = var.map(|v| {
            assert_eq!(v.len(), n);
            SharedMut(v.as_mut_ptr())
        });
        Ok(self.reduce(n, |r| {
            // SAFETY: reduce hands each chunk index to exactly one closure call, so the ranges
            // are disjoint and in bounds.
            let (xs, ws) = unsafe { (px.slice(r.clone()), pw.slice(r.clone())) };
            let vs = &v[r.clone()];
            // ||dk||^2 = ||w / rho||^2 of the old w, summed in lanes like dot and norm_sq.
            let s = lane_sum(ws.len(), |i| (inv_rho * ws[i]) * (inv_rho * ws[i]));
            if let Some(pv) = pvar {
                // SAFETY: as above.
                let var = unsafe { pv.slice(r) };
                for (vi, &wi) in var.iter_mut().zip(ws.iter()) {
                    let dk = inv_rho * wi;
                    *vi += dk * dk;
                }
            }
            for ((xi, wi), &vi) in xs.iter_mut().zip(ws.iter_mut()).zip(vs) {
                let w0 = *wi;
                *xi += t1 * w0;
                *wi = vi + t2 * w0;
            }
            s
        }))
    }
    fn allreduce_sum(&self, comm: &dyn Comm, x: &mut Vec<f64>) -> Result<()> {
        comm.allreduce_sum(x)
    }
}

impl ScalarSlots for CpuBackend {
    fn multi_dot_to(
        &self,
        basis: &[Vec<f64>],
        w: &Vec<f64>,
        sc: &mut Vec<f64>,
        at: usize,
    ) -> Result<()> {
        self.multi_dot(basis, w, &mut sc[at..at + basis.len()])
    }
    fn multi_axpy_measure_to(
        &self,
        basis: &[Vec<f64>],
        w: &mut Vec<f64>,
        sc: &mut Vec<f64>,
        (coef_at, out_at): (usize, usize),
        then: Measure,
    ) -> Result<()> {
        let k = basis.len();
        match then {
            Measure::Dots if coef_at + k <= out_at => {
                let (c, out) = sc.split_at_mut(out_at);
                self.multi_axpy_measure(then, &c[coef_at..coef_at + k], basis, w, &mut out[..k])
            }
            _ => {
                let c = sc[coef_at..coef_at + k].to_vec();
                let outs = if then == Measure::Dots { k } else { 1 };
                self.multi_axpy_measure(then, &c, basis, w, &mut sc[out_at..out_at + outs])
            }
        }
    }
    fn copy_inv_sqrt(
        &self,
        sc: &Vec<f64>,
        at: usize,
        x: &Vec<f64>,
        y: &mut Vec<f64>,
    ) -> Result<()> {
        self.copy_scaled(1.0 / sc[at].max(0.0).sqrt(), x, y)
    }
    fn allreduce_scalars(
        &self,
        comm: &dyn Comm,
        sc: &mut Vec<f64>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        if comm.size() <= 1 {
            return Ok(());
        }
        comm.allreduce_sum(&mut sc[at..at + len])
    }
    fn read_scalars(&self, sc: &Vec<f64>, at: usize, out: &mut [f64]) -> Result<()> {
        out.copy_from_slice(&sc[at..at + out.len()]);
        Ok(())
    }
    fn write_scalars(&self, sc: &mut Vec<f64>, at: usize, vals: &[f64]) -> Result<()> {
        sc[at..at + vals.len()].copy_from_slice(vals);
        Ok(())
    }
}

/// Row ranges of about equal nonzero count (for the per-thread scatter).
fn nnz_chunks(a: &Csr, parts: usize) -> Vec<usize> {
    let ip = a.indptr();
    let nnz = a.nnz() as u64;
    let mut b = vec![0usize];
    for k in 1..parts {
        let target = nnz * k as u64 / parts as u64;
        let r = ip
            .partition_point(|&p| p <= target)
            .saturating_sub(1)
            .max(*b.last().unwrap_or(&0));
        b.push(r.min(a.nrows()));
    }
    b.push(a.nrows());
    b
}

enum TransposeImpl {
    /// A^T's rows (A's columns) as CSR, in the operator's `order.1`.
    Csc(Csr),
    Scatter {
        bounds: Vec<usize>,
        bufs: Mutex<Vec<Vec<f64>>>,
    },
}

/// A CSR matrix on the CPU, with A^T applied through a CSC copy or a per-thread scatter.
pub struct CpuCsrOperator {
    a: Csr,
    t: TransposeImpl,
    /// Runs of equal short rows of `a` and of the CSC copy's rows (src/backend/cpu/rows.rs).
    runs: (RowRuns, RowRuns),
    /// The orders the rows of `a` and of the CSC copy are stored in, by length ([`RowSort`];
    /// none: in order; with the scatter transpose `a` keeps its order).
    order: (Option<RowOrder>, Option<RowOrder>),
}

impl CpuCsrOperator {
    /// `Auto` chooses the CSC copy (fastest here); `Library` means CSC on the CPU.
    pub fn new(a: Csr, strategy: TransposeStrategy) -> Self {
        Self::with_row_sort(a, strategy, RowSort::Auto)
    }

    /// [`Self::new`] with the rows of `a` and of its CSC copy kept in the order `sort` gives
    /// (benchmarks and tests compare the orders). The scatter transpose keeps `a` in order (it
    /// walks A's rows with y's entries).
    pub fn with_row_sort(a: Csr, strategy: TransposeStrategy, sort: RowSort) -> Self {
        // rows kept in `order` (none: as they are)
        let stored = |m: Csr, order: &Option<RowOrder>| match order {
            Some(o) => m.select_rows(&o.rows()),
            None => m,
        };
        let (t, order_t) = match strategy {
            TransposeStrategy::Scatter => {
                let parts = rayon::current_num_threads().max(1);
                let bounds = nnz_chunks(&a, parts);
                let bufs = (0..parts).map(|_| vec![0.0; a.ncols()]).collect();
                let t = TransposeImpl::Scatter {
                    bounds,
                    bufs: Mutex::new(bufs),
                };
                (t, None)
            }
            _ => {
                let at = a.transpose();
                let order = sort.order(at.indptr());
                (TransposeImpl::Csc(stored(at, &order)), order)
            }
        };
        let order_a = match t {
            TransposeImpl::Scatter { .. } => None,
            TransposeImpl::Csc(_) => sort.order(a.indptr()),
        };
        let a = stored(a, &order_a);
        let runs = (
            RowRuns::new(a.indptr()),
            match &t {
                TransposeImpl::Csc(t) => RowRuns::new(t.indptr()),
                TransposeImpl::Scatter { .. } => RowRuns::default(),
            },
        );
        CpuCsrOperator {
            a,
            t,
            runs,
            order: (order_a, order_t),
        }
    }
    pub fn strategy(&self) -> TransposeStrategy {
        match self.t {
            TransposeImpl::Csc(_) => TransposeStrategy::Csc,
            TransposeImpl::Scatter { .. } => TransposeStrategy::Scatter,
        }
    }
    /// Bytes of matrix storage this operator holds.
    pub fn bytes(&self) -> usize {
        let csr = |m: &Csr| m.nnz() * 12 + (m.nrows() + 1) * 8;
        let order = |o: &Option<RowOrder>| o.as_ref().map_or(0, |o| 4 * o.len());
        csr(&self.a)
            + order(&self.order.0)
            + order(&self.order.1)
            + match &self.t {
                TransposeImpl::Csc(t) => csr(t),
                TransposeImpl::Scatter { bufs, .. } => {
                    bufs.lock().map(|b| b.len()).unwrap_or(0) * self.a.ncols() * 8
                }
            }
    }
}

impl Operator<CpuBackend> for CpuCsrOperator {
    fn nrows(&self) -> usize {
        self.a.nrows()
    }
    fn ncols(&self) -> usize {
        self.a.ncols()
    }
    fn apply(&self, _b: &CpuBackend, s: Scale, x: &Vec<f64>, y: &mut Vec<f64>) -> Result<()> {
        assert_eq!(x.len(), self.a.ncols());
        assert_eq!(y.len(), self.a.nrows());
        let src = rows::CsrRows::new(&self.a, x);
        let order = self.order.0.as_ref();
        rows::rows_par(&src, Some(&self.runs.0), order, y, (s.alpha, s.beta));
        Ok(())
    }
    fn apply_t(&self, _b: &CpuBackend, s: Scale, y: &Vec<f64>, x: &mut Vec<f64>) -> Result<()> {
        assert_eq!(y.len(), self.a.nrows());
        assert_eq!(x.len(), self.a.ncols());
        match &self.t {
            TransposeImpl::Csc(t) => {
                let src = rows::CsrRows::new(t, y);
                let order = self.order.1.as_ref();
                rows::rows_par(&src, Some(&self.runs.1), order, x, (s.alpha, s.beta))
            }
            TransposeImpl::Scatter { bounds, bufs } => {
                let mut bufs = bufs.lock().unwrap_or_else(|e| e.into_inner());
                let a = &self.a;
                bufs.par_iter_mut().enumerate().for_each(|(t, buf)| {
                    buf.fill(0.0);
                    let rows = bounds[t]..bounds[t + 1];
                    for (r, &yr) in rows.clone().zip(&y[rows]) {
                        let (c, v) = a.row(r);
                        for (&j, &aij) in c.iter().zip(v) {
                            buf[j as usize] += aij * yr;
                        }
                    }
                });
                let bufs = &*bufs;
                let p = SharedMut(x.as_mut_ptr());
                par_for(x.len(), |r| {
                    // SAFETY: par_for hands out disjoint in-bounds ranges.
                    let xs = unsafe { p.slice(r.clone()) };
                    for (k, xi) in xs.iter_mut().enumerate() {
                        let j = r.start + k;
                        let acc: f64 = bufs.iter().map(|b| b[j]).sum();
                        *xi = if s.beta == 0.0 {
                            s.alpha * acc
                        } else {
                            s.alpha * acc + s.beta * *xi
                        };
                    }
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_gram_schmidt_kernels_equal_the_unfused_calls_bitwise() {
        let be = CpuBackend::new();
        let mut rng = crate::grid::Rng::new(11);
        for &n in &[5usize, 2 * CHUNK + 3, 5 * CHUNK + 7] {
            for &k in &[0usize, 1, 7] {
                let basis: Vec<Vec<f64>> = (0..k)
                    .map(|_| (0..n).map(|_| rng.uniform() - 0.5).collect())
                    .collect();
                let w0: Vec<f64> = (0..n).map(|_| rng.uniform() - 0.5).collect();
                let c: Vec<f64> = (0..k).map(|_| rng.uniform() - 0.5).collect();
                // reference: one dot / axpby per basis vector
                let dots = |w: &Vec<f64>| -> Vec<f64> {
                    basis.iter().map(|v| be.dot(v, w).unwrap()).collect()
                };
                let mut wr = w0.clone();
                for (cj, v) in c.iter().zip(&basis) {
                    be.axpby(-cj, v, 1.0, &mut wr).unwrap();
                }
                let bits = |a: &[f64]| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();

                let mut out = vec![0.0; k];
                be.multi_dot(&basis, &w0, &mut out).unwrap();
                assert_eq!(bits(&out), bits(&dots(&w0)), "multi_dot n={n} k={k}");

                let mut w = w0.clone();
                be.multi_axpy(&c, &basis, &mut w).unwrap();
                assert_eq!(bits(&w), bits(&wr), "multi_axpy n={n} k={k}");

                let mut w = w0.clone();
                be.multi_axpy_measure(Measure::Dots, &c, &basis, &mut w, &mut out)
                    .unwrap();
                assert_eq!(bits(&w), bits(&wr));
                assert_eq!(bits(&out), bits(&dots(&wr)), "multi_axpy_dot n={n} k={k}");

                let mut w = w0.clone();
                let mut nn = [0.0];
                be.multi_axpy_measure(Measure::NormSq, &c, &basis, &mut w, &mut nn)
                    .unwrap();
                assert_eq!(bits(&w), bits(&wr));
                assert_eq!(nn[0].to_bits(), be.norm_sq(&wr).unwrap().to_bits());
            }
        }
    }

    #[test]
    fn products_match_reference_both_transposes() {
        let be = CpuBackend::new();
        for &(m, n) in &[(2000usize, 700usize), (300, 9000), (100_000, 50)] {
            let a = crate::testproblems::awkward_csr(m, n, (m * n) as u64 + 1);
            let x: Vec<f64> = (0..n).map(|i| (i as f64).sin()).collect();
            let y0: Vec<f64> = (0..m).map(|i| (i as f64).cos()).collect();
            let at = a.transpose();
            let want_y = crate::testproblems::axpby(2.0, &a.matvec(&x), -0.5, &y0);
            let want_x = crate::testproblems::axpby(-1.0, &at.matvec(&y0), 3.0, &x);
            // rows as the products choose, sorted by length in windows of 7 rows, kept as given
            let ops = [
                (TransposeStrategy::Csc, RowSort::Auto),
                (TransposeStrategy::Csc, RowSort::Windows(7)),
                (TransposeStrategy::Csc, RowSort::Keep),
                (TransposeStrategy::Scatter, RowSort::Auto),
            ];
            for (strat, sort) in ops {
                let op = CpuCsrOperator::with_row_sort(a.clone(), strat, sort);
                if sort == RowSort::Windows(7) {
                    assert!(
                        op.order.0.is_some() && op.order.1.is_some(),
                        "the test needs orders"
                    );
                }
                let mut y = y0.clone();
                op.apply(&be, Scale::new(2.0, -0.5), &x, &mut y).unwrap();
                let mut xx = x.clone();
                op.apply_t(&be, Scale::new(-1.0, 3.0), &y0, &mut xx)
                    .unwrap();
                for (p, q) in y.iter().zip(&want_y) {
                    assert!((p - q).abs() <= 1e-12 * (1.0 + q.abs()));
                }
                for (p, q) in xx.iter().zip(&want_x) {
                    assert!(
                        (p - q).abs() <= 1e-12 * (1.0 + q.abs()),
                        "{strat}: {p} vs {q}"
                    );
                }
            }
        }
    }

    #[test]
    fn vector_kernels_and_deterministic_reductions() {
        let be = CpuBackend::new();
        let n = 100_003;
        let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e-3).collect();
        let y: Vec<f64> = (0..n)
            .map(|i| ((i * 104_729) % 997) as f64 * 1e-3)
            .collect();
        let d1 = be.dot(&x, &y).unwrap();
        let d2 = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| be.dot(&x, &y).unwrap());
        assert_eq!(d1.to_bits(), d2.to_bits());
        let naive: f64 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
        assert!((d1 - naive).abs() < 1e-9 * naive);
        let mut z = y.clone();
        be.axpby(2.0, &x, -1.0, &mut z).unwrap();
        assert_eq!(z[12345], 2.0 * x[12345] - y[12345]);
        let (mut xx, mut w, v) = (x.clone(), y.clone(), x.clone());
        let mut var = vec![0.0; n];
        let s = be
            .lsqr_update(
                XwStep {
                    t1: 0.5,
                    t2: -0.25,
                    inv_rho: 2.0,
                },
                &v,
                XwState {
                    x: &mut xx,
                    w: &mut w,
                    var: Some(&mut var),
                },
            )
            .unwrap();
        let want: f64 = y.iter().map(|a| 4.0 * a * a).sum();
        assert!((s - want).abs() < 1e-9 * want);
        assert_eq!(xx[7], x[7] + 0.5 * y[7]);
        assert_eq!(w[7], v[7] - 0.25 * y[7]);
        assert_eq!(var[7], (2.0 * y[7]) * (2.0 * y[7]));
    }
}
