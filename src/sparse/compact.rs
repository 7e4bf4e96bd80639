//! Compact storage of sparse rows: f32 (or f64) values and 16-bit column deltas.
//!
//! A general CSR library moves at least 12 bytes per nonzero (an f64 value and a u32 column)
//! plus the row offsets. Tomography kernel rows have structure such a library cannot use: once
//! rays and cells are reordered for locality (src/grid/reorder.rs), the columns of a row are close
//! to each other, so the step from one column to the next fits in 16 bits almost always. This
//! format stores, per row,
//!
//! - `base[r]`: the row's first column (u32),
//! - `ptr[r]..ptr[r+1]`: its entries (u64 offsets),
//!
//! and per entry a `delta` (u16: column minus the previous entry's column; 0 for the first
//! entry) and a value (f32 or f64). The column of entry k of row r is
//! `base[r] + delta[ptr[r]] + ... + delta[k]`: a prefix sum, which a GPU warp decodes for 32
//! entries at once with one shuffle scan and a CPU core with one add per entry.
//!
//! **Escapes.** A step of 65536 or more is written as filler entries of delta 65535 and value
//! 0 followed by the entry with the rest of the step, so every matrix with sorted columns (every
//! [`Csr`]) is representable, decoding stays a plain prefix sum, and a filler only adds an exact
//! 0 to a row sum (`s + 0 * x[c] == s`; its column lies between two real columns of the row, so
//! it is always a valid index). [`GapHistogram`] measures how often that happens.
//!
//! Bytes per stored entry: 6 with f32 values, 10 with f64, against 12 (f64 + u32) for CSR.

use rayon::prelude::*;

use crate::sparse::Precision;
use crate::sparse::{par, Csr, Lanes};

/// The largest column step one entry can hold; larger steps take fillers.
pub const MAX_DELTA: u32 = u16::MAX as u32;

/// Fillers needed before an entry whose column is `gap` (>= 1) past the previous one.
#[inline]
fn fillers_for(gap: u32) -> u64 {
    ((gap.max(1) - 1) / MAX_DELTA) as u64
}

/// Encode the rows `old(i)` of `a` for the places i of each block of `bounds` into the
/// block's range of `delta` and `vals` (`ptr`: each place's first entry), in parallel.
fn encode_blocks<V: Copy + Send>(
    a: &Csr,
    old: &(impl Fn(usize) -> usize + Sync),
    ptr: &[u64],
    bounds: &[usize],
    delta: &mut [u16],
    vals: &mut [V],
    conv: impl Fn(f64) -> V + Sync,
) {
    let ds = par::split_rows(delta, ptr, bounds);
    let vs = par::split_rows(vals, ptr, bounds);
    ds.into_par_iter()
        .zip(vs)
        .enumerate()
        .for_each(|(b, (delta, vals))| {
            let mut k = 0;
            let mut push = |d: u16, v: f64| {
                delta[k] = d;
                vals[k] = conv(v);
                k += 1;
            };
            for i in bounds[b]..bounds[b + 1] {
                let (ci, va) = a.row(old(i));
                for j in 0..ci.len() {
                    let mut gap = if j == 0 { 0 } else { ci[j] - ci[j - 1] };
                    while gap > MAX_DELTA {
                        push(MAX_DELTA as u16, 0.0);
                        gap -= MAX_DELTA;
                    }
                    // A real entry that looks like a filler (maximal delta, value +0) is stored
                    // with value -0 instead, so decoding can tell them apart; both add an exact
                    // zero.
                    let v = if gap == MAX_DELTA && va[j] == 0.0 {
                        -0.0
                    } else {
                        va[j]
                    };
                    push(gap as u16, v);
                }
            }
            debug_assert_eq!(k, delta.len());
        });
}

/// Values of a compact matrix.
#[derive(Debug, Clone, PartialEq)]
pub enum CompactValues {
    F64(Vec<f64>),
    F32(Vec<f32>),
}

impl CompactValues {
    pub fn len(&self) -> usize {
        match self {
            Self::F64(v) => v.len(),
            Self::F32(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn precision(&self) -> Precision {
        match self {
            Self::F64(_) => Precision::F64,
            Self::F32(_) => Precision::F32,
        }
    }
}

/// Sparse rows with 16-bit column deltas (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct CompactCsr {
    nrows: usize,
    ncols: usize,
    nnz: usize,
    ptr: Vec<u64>,
    base: Vec<u32>,
    delta: Vec<u16>,
    values: CompactValues,
}

/// Sizes of a compact matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CompactStats {
    pub rows: usize,
    pub nnz: usize,
    /// Stored entries (nonzeros + escape fillers).
    pub entries: usize,
    pub fillers: usize,
    pub bytes: u64,
}

impl CompactCsr {
    /// Encode a CSR matrix (whose rows have sorted, unique columns) with values in `precision`.
    pub fn from_csr(a: &Csr, precision: Precision) -> CompactCsr {
        Self::from_rows(a, None, precision)
    }

    /// [`Self::from_csr`] with the rows of `a` stored in the order `order` (place i holds row
    /// `order[i]`, a permutation of the rows; none: in order), so that no reordered copy of
    /// `a` is needed. Rows are counted and encoded by blocks in parallel, each block into its
    /// own range of the arrays: the same arrays as one sequential pass.
    pub fn from_rows(a: &Csr, order: Option<&[u32]>, precision: Precision) -> CompactCsr {
        let m = a.nrows();
        if let Some(o) = order {
            assert_eq!(o.len(), m, "an order of every row");
        }
        let old = |i: usize| order.map_or(i, |o| o[i] as usize);
        // entries of each row (fillers included), so every array is allocated once
        let entries_of = |i: usize| {
            let (c, _) = a.row(old(i));
            c.len() as u64 + c.windows(2).map(|w| fillers_for(w[1] - w[0])).sum::<u64>()
        };
        let first = |i: usize| a.row(old(i)).0.first().copied().unwrap_or(0);
        let (lens, base): (Vec<u64>, Vec<u32>) = if a.nnz() + m < par::SEQUENTIAL_BELOW {
            (
                (0..m).map(entries_of).collect(),
                (0..m).map(first).collect(),
            )
        } else {
            (
                (0..m).into_par_iter().map(entries_of).collect(),
                (0..m).into_par_iter().map(first).collect(),
            )
        };
        let ptr = par::offsets(&lens);
        drop(lens);
        let entries = ptr[m] as usize;
        let mut delta = vec![0u16; entries];
        let bounds = par::row_blocks(&ptr, par::blocks_for(entries + m, 4));
        let values = match precision {
            Precision::F64 => {
                let mut v = vec![0f64; entries];
                encode_blocks(a, &old, &ptr, &bounds, &mut delta, &mut v, |x| x);
                CompactValues::F64(v)
            }
            Precision::F32 => {
                let mut v = vec![0f32; entries];
                encode_blocks(a, &old, &ptr, &bounds, &mut delta, &mut v, |x| x as f32);
                CompactValues::F32(v)
            }
        };
        CompactCsr {
            nrows: m,
            ncols: a.ncols(),
            nnz: a.nnz(),
            ptr,
            base,
            delta,
            values,
        }
    }

    pub fn nrows(&self) -> usize {
        self.nrows
    }
    pub fn ncols(&self) -> usize {
        self.ncols
    }
    /// Nonzeros (fillers not counted).
    pub fn nnz(&self) -> usize {
        self.nnz
    }
    /// Stored entries (nonzeros + fillers).
    pub fn entries(&self) -> usize {
        self.delta.len()
    }
    pub fn ptr(&self) -> &[u64] {
        &self.ptr
    }
    pub fn base(&self) -> &[u32] {
        &self.base
    }
    pub fn delta(&self) -> &[u16] {
        &self.delta
    }
    pub fn values(&self) -> &CompactValues {
        &self.values
    }
    pub fn precision(&self) -> Precision {
        self.values.precision()
    }

    /// Bytes of storage: entries (delta + value), per row a u64 offset and a u32 base.
    pub fn bytes(&self) -> u64 {
        Self::bytes_for(self.nrows, self.entries() as u64, self.precision())
    }

    /// Bytes of a compact matrix with `rows` rows and `entries` stored entries.
    pub fn bytes_for(rows: usize, entries: u64, precision: Precision) -> u64 {
        entries * (2 + precision.bytes() as u64) + rows as u64 * 12 + 8
    }

    pub fn stats(&self) -> CompactStats {
        CompactStats {
            rows: self.nrows,
            nnz: self.nnz,
            entries: self.entries(),
            fillers: self.entries() - self.nnz,
            bytes: self.bytes(),
        }
    }

    /// Decode back to CSR (fillers dropped); f32 values come back widened.
    pub fn to_csr(&self) -> Csr {
        let mut indptr = Vec::with_capacity(self.nrows + 1);
        let mut indices = Vec::with_capacity(self.nnz);
        let mut data = Vec::with_capacity(self.nnz);
        indptr.push(0u64);
        for r in 0..self.nrows {
            self.for_row(r, |c, v, filler| {
                if !filler {
                    indices.push(c);
                    data.push(v);
                }
            });
            indptr.push(indices.len() as u64);
        }
        Csr::from_trusted(self.nrows, self.ncols, indptr, indices, data)
    }

    /// Call `f(column, value, is_filler)` for every stored entry of row `r`, in order.
    #[inline]
    pub fn for_row(&self, r: usize, mut f: impl FnMut(u32, f64, bool)) {
        let (s, e) = (self.ptr[r] as usize, self.ptr[r + 1] as usize);
        let mut c = self.base[r];
        for k in s..e {
            let d = self.delta[k];
            c += d as u32;
            let v = match &self.values {
                CompactValues::F64(v) => v[k],
                CompactValues::F32(v) => v[k] as f64,
            };
            // A filler has the maximal delta and the value +0 (a real entry like it is stored
            // as -0), and is never a row's first entry (that one has delta 0).
            f(c, v, d as u32 == MAX_DELTA && v.to_bits() == 0 && k > s);
        }
    }

    /// The lanes of `value * x[column]` over the nonzeros of row `r` in the order of a CSR row
    /// sum ([`Lanes`]; fillers add no term), to be summed or continued. `x` must hold `ncols`
    /// values.
    #[inline]
    pub fn row_lanes(&self, r: usize, x: &[f64]) -> Lanes {
        let mut l = Lanes::default();
        self.for_row(r, |c, v, filler| {
            if !filler {
                l.add(v * x[c as usize]);
            }
        });
        l
    }

    /// Sum of `value * x[column]` over the nonzeros of row `r` ([`Self::row_lanes`] summed).
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f64]) -> f64 {
        self.row_lanes(r, x).sum()
    }

    /// y = alpha A x + beta y, serially (the reference for tests; beta == 0 does not read y).
    pub fn matvec_into(&self, alpha: f64, x: &[f64], beta: f64, y: &mut [f64]) {
        assert_eq!(x.len(), self.ncols);
        assert_eq!(y.len(), self.nrows);
        for (r, yr) in y.iter_mut().enumerate() {
            let s = self.row_dot(r, x);
            *yr = if beta == 0.0 {
                alpha * s
            } else {
                alpha * s + beta * *yr
            };
        }
    }

    /// x = alpha A^T y + beta x by a serial scatter (reference for tests).
    pub fn matvec_t_into(&self, alpha: f64, y: &[f64], beta: f64, x: &mut [f64]) {
        assert_eq!(y.len(), self.nrows);
        assert_eq!(x.len(), self.ncols);
        let mut t = vec![0.0; self.ncols];
        for (r, &yr) in y.iter().enumerate() {
            self.for_row(r, |c, v, _| t[c as usize] += v * yr);
        }
        for (xi, ti) in x.iter_mut().zip(t) {
            *xi = if beta == 0.0 {
                alpha * ti
            } else {
                alpha * ti + beta * *xi
            };
        }
    }
}

/// How far apart consecutive columns of the rows of a matrix are: counts of steps in the
/// buckets 1, 2-3, 4-7, ..., 2^15..2^16-1, and 2^16 and beyond (the steps that need escape
/// fillers).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GapHistogram {
    /// `counts[b]` = steps g with 2^b <= g < 2^(b+1), b = 0..16; `counts[16]` = steps >= 65536.
    pub counts: [u64; 17],
    /// Fillers the escapes need (a step g takes (g - 1) / 65535 of them).
    pub fillers: u64,
    /// Steps counted (nonzeros minus nonempty rows).
    pub steps: u64,
}

impl GapHistogram {
    pub fn of(a: &Csr) -> GapHistogram {
        let ip = a.indptr();
        let bounds = par::row_blocks(ip, par::blocks_for(a.nnz() + a.nrows(), 4));
        let parts: Vec<GapHistogram> = bounds
            .par_windows(2)
            .map(|w| Self::of_rows(a, w[0]..w[1]))
            .collect();
        let mut h = GapHistogram {
            counts: [0; 17],
            fillers: 0,
            steps: 0,
        };
        for p in parts {
            for (c, x) in h.counts.iter_mut().zip(p.counts) {
                *c += x;
            }
            h.fillers += p.fillers;
            h.steps += p.steps;
        }
        h
    }

    /// The histogram of rows `rows` of `a`.
    fn of_rows(a: &Csr, rows: std::ops::Range<usize>) -> GapHistogram {
        let (ip, ci) = (a.indptr(), a.indices());
        let mut counts = [0u64; 17];
        let mut fillers = 0u64;
        let mut steps = 0u64;
        for r in rows {
            for k in ip[r] as usize + 1..ip[r + 1] as usize {
                let g = ci[k] - ci[k - 1];
                let b = (31 - g.leading_zeros()).min(16) as usize;
                counts[b] += 1;
                fillers += fillers_for(g);
                steps += 1;
            }
        }
        GapHistogram {
            counts,
            fillers,
            steps,
        }
    }

    /// Steps that need an escape (>= 65536), as a fraction of all steps.
    pub fn escape_fraction(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.counts[16] as f64 / self.steps as f64
        }
    }

    /// One line per nonempty bucket: "2^b..2^(b+1)-1: count (percent)".
    pub fn table(&self) -> String {
        let mut s = String::new();
        for (b, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let label = if b == 16 {
                ">= 65536 (escape)".to_string()
            } else {
                format!("{}..{}", 1u64 << b, (1u64 << (b + 1)) - 1)
            };
            s.push_str(&format!(
                "  {label:>18}: {c:>12} ({:.3} %)\n",
                100.0 * c as f64 / self.steps.max(1) as f64
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(ncols: usize, rows: &[&[(u32, f64)]]) -> Csr {
        let mut ip = vec![0u64];
        let (mut ci, mut va) = (Vec::new(), Vec::new());
        for r in rows {
            for &(c, v) in r.iter() {
                ci.push(c);
                va.push(v);
            }
            ip.push(ci.len() as u64);
        }
        Csr::try_new(rows.len(), ncols, ip, ci, va).unwrap()
    }

    #[test]
    fn escapes_encode_any_gap_and_decode_back() {
        let n = 400_000usize;
        let a = csr(
            n,
            &[
                &[(0, 1.0), (65_535, 2.0), (131_071, 3.0), (399_999, 4.0)],
                &[],
                &[(5, -1.0)],
                &[(65_536, 7.0), (65_537, 8.0)],
                &[(0, 1.5), (200_000, 2.5)],
                &[(1, 1.0), (65_536, 0.0), (65_537, 3.0)],
            ],
        );
        for p in [Precision::F64, Precision::F32] {
            let c = CompactCsr::from_csr(&a, p);
            assert_eq!(c.nnz(), a.nnz());
            // gaps: 65535 (no filler), 65536 (1), 268928 (4); 200000 (3)
            assert_eq!(c.entries() - c.nnz(), 1 + 4 + 3);
            // the explicit zero one maximal step after a column is not mistaken for a filler
            assert_eq!(c.to_csr(), a);
            let h = GapHistogram::of(&a);
            assert_eq!(h.fillers as usize, c.entries() - c.nnz());
            assert_eq!(h.counts[16], 3);
            assert_eq!(h.steps, 7);
        }
    }

    #[test]
    fn products_equal_csr_bitwise_f64_and_on_rounded_values_f32() {
        for &(m, n, seed) in &[
            (2000usize, 700usize, 1u64),
            (300, 200_000, 2),
            (7, 3, 3),
            (50_000, 64, 4),
        ] {
            let a = crate::testproblems::awkward_csr(m, n, seed);
            let x: Vec<f64> = (0..n).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
            let y0: Vec<f64> = (0..m).map(|i| ((i * 13) % 17) as f64 * 0.25).collect();
            let c = CompactCsr::from_csr(&a, Precision::F64);
            let mut y = y0.clone();
            c.matvec_into(2.0, &x, -0.5, &mut y);
            let want = crate::testproblems::axpby(2.0, &a.matvec(&x), -0.5, &y0);
            assert_eq!(y, want);
            // f32 values: the same as CSR with the rounded values
            let mut a32 = a.clone();
            a32.data_mut()
                .iter_mut()
                .for_each(|v| *v = *v as f32 as f64);
            let c32 = CompactCsr::from_csr(&a, Precision::F32);
            assert_eq!(c32.to_csr(), a32);
            let mut y = vec![f64::NAN; m];
            c32.matvec_into(1.0, &x, 0.0, &mut y);
            assert_eq!(y, a32.matvec(&x));
            // transpose against the explicit transpose
            let mut xt = x.clone();
            c.matvec_t_into(1.0, &y0, 1.0, &mut xt);
            let at = a.transpose().matvec(&y0);
            for ((p, q), x0) in xt.iter().zip(&at).zip(&x) {
                assert!((p - (q + x0)).abs() <= 1e-12 * (1.0 + p.abs()));
            }
        }
    }

    #[test]
    fn bytes_count_values_deltas_and_rows() {
        let a = crate::testproblems::awkward_csr(100, 50, 9);
        let c = CompactCsr::from_csr(&a, Precision::F32);
        assert_eq!(c.bytes(), c.entries() as u64 * 6 + 100 * 12 + 8);
        let c = CompactCsr::from_csr(&a, Precision::F64);
        assert_eq!(c.bytes(), c.entries() as u64 * 10 + 100 * 12 + 8);
        assert_eq!(c.stats().fillers, 0);
    }
}
