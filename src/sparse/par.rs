//! Data-parallel pieces of the set-up (transposes, permutations, encodings: the phases of
//! src/ui/phases.rs).
//!
//! Work is cut into blocks of consecutive rows (balanced by entries) whose outputs are disjoint:
//! a block writes its own range of the output arrays, or, in a counting sort (a transpose, the
//! segments of a tile), its own places in each bucket, after the places of the blocks before it.
//! So every result is the one the plain sequential loop gives, bit for bit, whatever the thread
//! count, and small inputs take the sequential loop itself.

use std::marker::PhantomData;

use rayon::prelude::*;

/// Work (entries) below which a set-up loop runs on the calling thread: forking costs more.
pub const SEQUENTIAL_BELOW: usize = 1 << 16;

/// Blocks to cut `work` entries into on this pool: 1 below [`SEQUENTIAL_BELOW`], else `per_thread`
/// per rayon thread (more than one evens out blocks that take longer), at most one per
/// [`SEQUENTIAL_BELOW`] / 4 entries.
pub fn blocks_for(work: usize, per_thread: usize) -> usize {
    if work < SEQUENTIAL_BELOW {
        return 1;
    }
    (rayon::current_num_threads() * per_thread.max(1))
        .min(work / (SEQUENTIAL_BELOW / 4))
        .max(1)
}

/// The first row of each of `parts` blocks of consecutive rows with about equal work (entries
/// plus rows) for rows whose entries lie at `ptr[r]..ptr[r + 1]`; the row count after the last
/// (`parts + 1` nondecreasing bounds, 0 first).
pub fn row_blocks(ptr: &[u64], parts: usize) -> Vec<usize> {
    let nrows = ptr.len().saturating_sub(1);
    let parts = parts.max(1);
    let total = ptr.last().map_or(0, |&e| e - ptr[0]) + nrows as u64;
    let mut b = Vec::with_capacity(parts + 1);
    b.push(0);
    for k in 1..parts {
        let target = (total as u128 * k as u128 / parts as u128) as u64;
        // the first row r whose work before it, (ptr[r] - ptr[0]) + r, reaches the target
        let (mut lo, mut hi) = (*b.last().unwrap(), nrows);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if ptr[mid] - ptr[0] + mid as u64 >= target {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        b.push(lo);
    }
    b.push(nrows);
    b
}

/// `v` cut into consecutive parts of lengths `lens` (what is left after them is dropped).
pub fn split_parts<T>(mut v: &mut [T], lens: impl Iterator<Item = usize>) -> Vec<&mut [T]> {
    let mut parts = Vec::with_capacity(lens.size_hint().0);
    for len in lens {
        let (part, rest) = std::mem::take(&mut v).split_at_mut(len);
        parts.push(part);
        v = rest;
    }
    parts
}

/// `v` cut at the entries of rows `bounds[k]..bounds[k + 1]` (`bounds` from [`row_blocks`],
/// `ptr` the rows' entry offsets, `v` holding entries `ptr[0]..`).
pub fn split_rows<'a, T>(v: &'a mut [T], ptr: &[u64], bounds: &[usize]) -> Vec<&'a mut [T]> {
    split_parts(
        v,
        bounds.windows(2).map(|w| (ptr[w[1]] - ptr[w[0]]) as usize),
    )
}

/// `[0, l0, l0 + l1, ...]`: the offsets of consecutive parts of lengths `lens` (summed in
/// parallel blocks when there are many).
pub fn offsets(lens: &[u64]) -> Vec<u64> {
    let n = lens.len();
    let mut out = vec![0u64; n + 1];
    let parts = blocks_for(n, 1);
    if parts <= 1 {
        let mut s = 0u64;
        for (o, &l) in out[1..].iter_mut().zip(lens) {
            s += l;
            *o = s;
        }
        return out;
    }
    let size = n.div_ceil(parts);
    let sums: Vec<u64> = lens.par_chunks(size).map(|c| c.iter().sum()).collect();
    let mut base = Vec::with_capacity(sums.len());
    let mut s = 0u64;
    for &x in &sums {
        base.push(s);
        s += x;
    }
    out[1..]
        .par_chunks_mut(size)
        .zip(lens.par_chunks(size))
        .zip(base)
        .for_each(|((o, l), mut s)| {
            for (o, &l) in o.iter_mut().zip(l) {
                s += l;
                *o = s;
            }
        });
    out
}

/// The places of a stable counting sort done by blocks: `counts` holds, block after block,
/// each block's count of items in each of `nbuckets` buckets; they become each block's first
/// place in each bucket (bucket by bucket, the blocks in order), and the buckets' first places
/// come back (`nbuckets + 1`, the item count last). A block that then puts its items, in its
/// order, at its places (each place taken moving that bucket's place on by one) writes exactly
/// where the sequential counting sort would.
pub fn block_starts(counts: &mut [u64], nbuckets: usize) -> Vec<u64> {
    if nbuckets == 0 {
        return vec![0];
    }
    let nblocks = counts.len() / nbuckets;
    const COLS: usize = 4096;
    // the bucket totals
    let mut totals = vec![0u64; nbuckets];
    {
        let c: &[u64] = counts;
        totals.par_chunks_mut(COLS).enumerate().for_each(|(k, t)| {
            for b in 0..nblocks {
                let row = &c[b * nbuckets + k * COLS..][..t.len()];
                for (t, &x) in t.iter_mut().zip(row) {
                    *t += x;
                }
            }
        });
    }
    let starts = offsets(&totals);
    // each block's places: per column chunk, every block's slice of it
    let nchunks = nbuckets.div_ceil(COLS);
    let mut per_chunk: Vec<Vec<&mut [u64]>> =
        (0..nchunks).map(|_| Vec::with_capacity(nblocks)).collect();
    for block in counts.chunks_mut(nbuckets) {
        for (k, s) in block.chunks_mut(COLS).enumerate() {
            per_chunk[k].push(s);
        }
    }
    per_chunk
        .into_par_iter()
        .enumerate()
        .for_each(|(k, mut blocks)| {
            let width = blocks.first().map_or(0, |s| s.len());
            for i in 0..width {
                let mut at = starts[k * COLS + i];
                for s in blocks.iter_mut() {
                    let c = s[i];
                    s[i] = at;
                    at += c;
                }
            }
        });
    starts
}

/// A slice that several threads write at places no two of them share (the places of
/// [`block_starts`], a permutation's targets).
pub struct Scatter<'a, T> {
    ptr: *mut T,
    len: usize,
    _slice: PhantomData<&'a mut [T]>,
}

// SAFETY: a Scatter only writes (through `put`), and `put`'s contract makes the places of
// different threads disjoint; T: Send lets the values move to the thread that writes them.
unsafe impl<T: Send> Send for Scatter<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Scatter<'_, T> {}

impl<'a, T: Copy> Scatter<'a, T> {
    pub fn new(v: &'a mut [T]) -> Self {
        Scatter {
            ptr: v.as_mut_ptr(),
            len: v.len(),
            _slice: PhantomData,
        }
    }

    /// Write `value` at place `i` (checked against the length).
    ///
    /// # Safety
    /// No other thread may read or write place `i` while the Scatter lives.
    #[inline(always)]
    pub unsafe fn put(&self, i: usize, value: T) {
        assert!(i < self.len, "scatter place {i} out of {}", self.len);
        // SAFETY: in bounds (checked above), and the caller keeps the place to this thread;
        // T is Copy, so the old value needs no drop.
        unsafe { self.ptr.add(i).write(value) }
    }
}

/// Ask the processor to bring the cache line holding `p` into cache ahead of its use (a hint:
/// results never depend on it). For gathers in a permuted order, where each row starts at an
/// address the hardware prefetcher cannot guess.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults, whatever the address
    // (the pointer is never dereferenced).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Host copies of a matrix (gigabytes) that can give their memory back to the system in
/// pieces before they are dropped: see [`drop_in_background`].
pub trait GiveBack: Send + 'static {
    /// Give the pages of every large buffer back ([`give_back_pages`]); the values are then
    /// zero and the value is only fit to be dropped.
    fn give_back(&mut self);
}

static SYSTEM_ALLOCATOR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Let [`give_back_pages`] ask glibc about the blocks it gets (without it, it does nothing).
///
/// # Safety
/// The process's global allocator must be the system allocator (glibc's malloc): the seistomo
/// binary's is; a program that links the library with another allocator must not call this.
pub unsafe fn assume_system_allocator() {
    SYSTEM_ALLOCATOR.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Give the pages of `v` back to the system in 64 MiB pieces (`madvise(MADV_DONTNEED)`: the
/// memory stays mapped and reads as zeros), so that dropping `v` afterwards unmaps an empty
/// range. Each piece holds the process's memory-map lock only for reading, where one `munmap`
/// of gigabytes holds it for writing throughout (~0.1 s per GB), stalling every other thread
/// that pins or maps memory meanwhile: the GPU driver's copies, page faults. Buffers below
/// 64 MiB are left to the drop. Elsewhere than Linux it does nothing.
pub fn give_back_pages<T: Zeroable>(v: &mut Vec<T>) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const PIECE: usize = 64 << 20;
        let bytes = std::mem::size_of_val(v.as_slice());
        if bytes < PIECE {
            return;
        }
        // SAFETY: sysconf only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        // Only a buffer in its own mapping: one from the heap (glibc hands out blocks below
        // its mmap threshold there, 1 GiB once the set-up keeps freed memory,
        // `backend::cpu::keep_freed_memory`) is not unmapped when freed, and its pages are
        // reused by the next allocation. glibc's mapped chunks span whole pages: their usable
        // size is a page multiple less the two-word header.
        if !SYSTEM_ALLOCATOR.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // SAFETY: `v` holds at least PIECE bytes, so its pointer is the start of a live block
        // of the global allocator, which is the system's malloc (`assume_system_allocator`).
        let usable = unsafe { libc::malloc_usable_size(v.as_mut_ptr().cast()) };
        if (usable + 2 * std::mem::size_of::<usize>()) % page != 0 {
            return;
        }
        let start = v.as_mut_ptr() as usize;
        let (first, end) = (start.div_ceil(page) * page, (start + bytes) / page * page);
        let mut at = first;
        while at < end {
            let len = PIECE.min(end - at);
            // SAFETY: [at, at + len) lies inside `v`'s allocation, which this function borrows
            // mutably (no other reference reads it meanwhile), and is page-aligned. After
            // MADV_DONTNEED private anonymous pages read as zeros, and an all-zero value is a
            // valid T (`Zeroable`); file-backed or shared memory is never a Vec's. A failed
            // call changes nothing.
            unsafe {
                libc::madvise(at as *mut libc::c_void, len, libc::MADV_DONTNEED);
            }
            at += len;
        }
    }
}

/// Ask for huge pages behind a large buffer not yet touched (Linux; advice only: nothing
/// changes where the kernel does not follow it). Filling it then faults it in 2 MiB at a time
/// instead of 4 KiB (reading prepared storage: 0.39 -> 0.19 s for 2.2 GB on an H100's host).
pub fn advise_huge<T>(v: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_mut_ptr() as usize;
        let bytes = std::mem::size_of_val(v);
        let (first, end) = (start.div_ceil(HUGE) * HUGE, (start + bytes) / HUGE * HUGE);
        if end > first {
            // SAFETY: [first, end) lies inside `v`, which is borrowed mutably; MADV_HUGEPAGE
            // only advises how to back the range, its contents stay as they are.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
}

/// Types whose all-zero bytes are a valid value (the numbers sparse arrays hold).
///
/// # Safety
/// The all-zero bit pattern must be a valid value of the type.
pub unsafe trait Zeroable: Copy {}
// SAFETY: zero is a valid u8, u16, u32, u64, f32 (+0.0) and f64 (+0.0).
unsafe impl Zeroable for u8 {}
// SAFETY: as above.
unsafe impl Zeroable for u16 {}
// SAFETY: as above.
unsafe impl Zeroable for u32 {}
// SAFETY: as above.
unsafe impl Zeroable for u64 {}
// SAFETY: as above.
unsafe impl Zeroable for f32 {}
// SAFETY: as above.
unsafe impl Zeroable for f64 {}

impl<A: GiveBack, B: GiveBack> GiveBack for (A, B) {
    fn give_back(&mut self) {
        self.0.give_back();
        self.1.give_back();
    }
}

/// Drop `v` (host copies of a matrix, gigabytes) on a thread of its own, its pages given back
/// in pieces first ([`GiveBack`]): the caller need not wait for the memory to go back to the
/// system (~0.1 s per GB), and the pieces never stall the threads that go on (the GPU's
/// set-up and solve). Where no thread can be started, it is dropped here.
pub fn drop_in_background<T: GiveBack>(v: T) {
    let cell = std::sync::Arc::new(std::sync::Mutex::new(Some(v)));
    let theirs = cell.clone();
    let started = std::thread::Builder::new()
        .name("seistomo-free".into())
        .spawn(move || {
            if let Ok(mut g) = theirs.lock() {
                if let Some(mut v) = g.take() {
                    v.give_back();
                }
            }
        });
    if started.is_err() {
        drop(cell.lock().map(|mut g| g.take()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_given_back_read_as_zeros_and_small_or_unknown_blocks_are_left() {
        // Blocks from 1 GiB on are glibc's own mappings whatever the thresholds: given back.
        let mut big = vec![0u8; (1 << 30) + (3 << 20)];
        for k in (0..big.len()).step_by(1 << 20) {
            big[k] = 7;
        }
        let touched = |v: &[u8]| (0..v.len()).step_by(1 << 20).filter(|&k| v[k] == 7).count();
        // without the allocator's word nothing happens
        give_back_pages(&mut big);
        assert_eq!(touched(&big), big.len().div_ceil(1 << 20));
        // SAFETY: the test binary's global allocator is the system's.
        unsafe { assume_system_allocator() };
        let mut small = vec![7u64; 1000];
        give_back_pages(&mut small);
        assert!(small.iter().all(|&x| x == 7));
        give_back_pages(&mut big);
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            // the pages wholly inside the block are zeros again (the first and last may be
            // shared with the allocator's header and are kept)
            let inner = (0..big.len())
                .step_by(1 << 20)
                .filter(|&k| k >= 4096 && k + 4096 < big.len());
            assert!(inner.clone().all(|k| big[k] == 0));
            assert!(inner.count() > 1000);
        }
        drop(big);
    }

    #[test]
    fn blocks_cover_the_rows_in_order_and_offsets_add_up() {
        let ptr: Vec<u64> = (0..=1000u64).map(|r| r * r).collect();
        for parts in [1, 2, 3, 7, 64, 2000] {
            let b = row_blocks(&ptr, parts);
            assert_eq!(b.len(), parts + 1);
            assert_eq!((b[0], b[parts]), (0, 1000));
            assert!(b.windows(2).all(|w| w[0] <= w[1]));
        }
        let lens: Vec<u64> = (0..300_000u64).map(|i| i % 7).collect();
        let o = offsets(&lens);
        let mut s = 0;
        for (i, &l) in lens.iter().enumerate() {
            assert_eq!(o[i], s);
            s += l;
        }
        assert_eq!(o[lens.len()], s);
    }

    #[test]
    fn block_starts_place_blocks_in_order_within_buckets() {
        // 3 blocks, 5 buckets
        let mut c = vec![1, 0, 2, 0, 1, 0, 3, 1, 0, 0, 2, 1, 0, 0, 4];
        let starts = block_starts(&mut c, 5);
        assert_eq!(starts, vec![0, 3, 7, 10, 10, 15]);
        assert_eq!(c, vec![0, 3, 7, 10, 10, 1, 3, 9, 10, 11, 1, 6, 10, 10, 11]);
    }
}
