//! The rows of a CPU block product ([`super::block_rows`]) with AVX2 intrinsics: four members an
//! instruction, a group of up to 12 members (three vectors) a pass over the row.
//!
//! The numbers are the portable kernel's bit for bit (`Product::rows_any`): each term is
//! `a x_j` or `(a f_j) x_j` (separate IEEE products, never fused), added into lane `t % 4` of
//! the row (the four lanes then `(l0 + l1) + (l2 + l3)`), rows of one to four entries as
//! [`crate::sparse::Lanes::sum_fixed`] writes them out, and `alpha s + beta_j y_j` (y_j not
//! used where `beta_j == 0`). The compiler's code for the portable kernel keeps a group of 11
//! members' 44 lane sums partly on the stack; here they are twelve registers.
//!
//! A group of w members that is not a multiple of four (w >= 4) takes its last vector at
//! members w - 4 .. w, overlapping the one before: the members both hold are computed twice
//! with the same operations (the same bits), and no value outside the group is read or
//! written, with no masks.

use std::arch::x86_64::*;

use super::block_rows::{Classes, Product};

/// How a row's terms are weighted (a const parameter, so each way is a loop of its own): not
/// at all, the whole row by `w_j`, or entry by entry by its class (1 or `w_j`).
const UNWEIGHTED: u8 = 0;
const ROW: u8 = 1;
const ENTRY: u8 = 2;

/// The members `j0..j0 + w` (4 <= w <= 12) of rows `r0..` of `p` into `out` (their k values
/// each).
///
/// # Safety
/// The CPU must have AVX2. `p` must be a consistent product: its offsets, columns and values
/// a CSR matrix's, `p.x` holding `ncols x k` values, `out` `rows x k` for rows `r0..` of the
/// matrix, entry or row classes one per entry or row, `j0 + w <= k`, and `p.w` (where not
/// empty) and `p.beta` k values each.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn group(p: &Product, r0: usize, j0: usize, w: usize, out: &mut [f64]) {
    // SAFETY: the caller's contract.
    unsafe { group_body(p, r0, j0, w, out) }
}

/// [`group`] compiled with AVX-512's 32 vector registers (its instructions on 256-bit
/// vectors, the same operations): a group of 9-12 members keeps its 12 lane sums and every
/// temporary in registers.
///
/// # Safety
/// As [`group`], and the CPU must have AVX-512F and AVX-512VL.
#[target_feature(enable = "avx2,avx512f,avx512vl")]
pub(super) unsafe fn group_avx512(p: &Product, r0: usize, j0: usize, w: usize, out: &mut [f64]) {
    // SAFETY: the caller's contract.
    unsafe { group_body(p, r0, j0, w, out) }
}

/// [`group`]'s body, inlined into each entry point (compiled for its instructions).
#[inline(always)]
unsafe fn group_body(p: &Product, r0: usize, j0: usize, w: usize, out: &mut [f64]) {
    debug_assert!((4..=12).contains(&w) && j0 + w <= p.k);
    // SAFETY (all arms): the caller's contract, and w fits the arm's vectors.
    match w.div_ceil(4) {
        1 => unsafe { group_nv::<1>(p, r0, j0, w, out) },
        2 => unsafe { group_nv::<2>(p, r0, j0, w, out) },
        _ => unsafe { group_nv::<3>(p, r0, j0, w, out) },
    }
}

/// [`group`] for NV vectors of members.
#[inline(always)]
unsafe fn group_nv<const NV: usize>(p: &Product, r0: usize, j0: usize, w: usize, out: &mut [f64]) {
    let k = p.k;
    // vector v's first member (the last vector's overlapping the one before where 4 ∤ w)
    let mut off = [0usize; NV];
    for (v, o) in off.iter_mut().enumerate() {
        *o = if v == NV - 1 { w - 4 } else { 4 * v };
    }
    // the members' weights (unread where no row is weighted)
    let mut wts = [1.0f64; 12];
    if !p.w.is_empty() {
        wts[..w].copy_from_slice(&p.w[j0..j0 + w]);
    }
    let mut b = [_mm256_setzero_pd(); NV];
    for (bv, &o) in b.iter_mut().zip(&off) {
        // SAFETY: o + 4 <= w and beta holds k >= j0 + w values.
        *bv = unsafe { _mm256_loadu_pd(p.beta.as_ptr().add(j0 + o)) };
    }
    let g = Group::<NV> {
        p,
        k,
        j0,
        off,
        wts: &wts,
    };
    let alpha = _mm256_set1_pd(p.alpha);
    let zero = _mm256_setzero_pd();
    for (i, orow) in out.chunks_exact_mut(k).enumerate() {
        let r = r0 + i;
        // SAFETY: r + 1 < ptr.len() (out holds rows r0.. of the matrix).
        let (s, e) = unsafe {
            (
                *p.ptr.get_unchecked(r) as usize,
                *p.ptr.get_unchecked(r + 1) as usize,
            )
        };
        // SAFETY: entries s..e are the row's (the caller's contract).
        let sums = unsafe {
            match p.class {
                Classes::None => g.sums::<UNWEIGHTED>(s, e, &[]),
                Classes::Rows(c) => match *c.get_unchecked(r) {
                    0 => g.sums::<UNWEIGHTED>(s, e, &[]),
                    _ => g.sums::<ROW>(s, e, &[]),
                },
                Classes::Entries(c) => g.sums::<ENTRY>(s, e, c),
            }
        };
        let o = orow[j0..j0 + w].as_mut_ptr();
        // every vector's old values read before any is written (the last overlaps)
        let mut res = [zero; NV];
        for v in 0..NV {
            // SAFETY: off[v] + 4 <= w: inside the row's group values.
            unsafe {
                let a_s = _mm256_mul_pd(alpha, sums[v]);
                let with_b =
                    _mm256_add_pd(a_s, _mm256_mul_pd(b[v], _mm256_loadu_pd(o.add(off[v]))));
                res[v] = _mm256_blendv_pd(with_b, a_s, _mm256_cmp_pd::<_CMP_EQ_OQ>(b[v], zero));
            }
        }
        for v in 0..NV {
            // SAFETY: as above.
            unsafe { _mm256_storeu_pd(o.add(off[v]), res[v]) };
        }
    }
}

/// What the terms of one group of members read.
struct Group<'a, 'p, const NV: usize> {
    p: &'a Product<'p>,
    k: usize,
    j0: usize,
    /// Each vector's first member in the group.
    off: [usize; NV],
    /// The group's weights (12 values, w of them the members').
    wts: &'a [f64; 12],
}

impl<const NV: usize> Group<'_, '_, NV> {
    /// Entry q's terms for the group's members (weighted as HOW; `class`: the entries'
    /// classes, for ENTRY).
    ///
    /// # Safety
    /// Called from AVX2 code; q < nnz; the product is consistent ([`group`]).
    #[inline(always)]
    unsafe fn term<const HOW: u8>(&self, q: usize, class: &[u8]) -> [__m256d; NV] {
        let p = self.p;
        // SAFETY: q < nnz, a column < ncols and x holds ncols x k values: the group's values
        // of x's row lie at c k + j0 .. + w, and off[v] + 4 <= w; the entry classes hold one
        // per entry; wts holds 12 >= w values.
        unsafe {
            let a = _mm256_set1_pd(*p.vals.get_unchecked(q));
            let c = *p.cols.get_unchecked(q) as usize;
            let xr = p.x.as_ptr().add(c * self.k + self.j0);
            // an entry of class 0 is `a x_j` (a 1 = a: the same bits as (a 1) x_j), and a
            // branch, not a factor, where the rows' classes come in runs
            let weighted = match HOW {
                UNWEIGHTED => false,
                ROW => true,
                _ => *class.get_unchecked(q) != 0,
            };
            let mut t = [_mm256_setzero_pd(); NV];
            if weighted {
                let f = self.wts.as_ptr();
                for (v, tv) in t.iter_mut().enumerate() {
                    let xv = _mm256_loadu_pd(xr.add(self.off[v]));
                    let av = _mm256_mul_pd(a, _mm256_loadu_pd(f.add(self.off[v])));
                    *tv = _mm256_mul_pd(av, xv);
                }
            } else {
                for (v, tv) in t.iter_mut().enumerate() {
                    *tv = _mm256_mul_pd(a, _mm256_loadu_pd(xr.add(self.off[v])));
                }
            }
            t
        }
    }

    /// The sums of entries s..e for the group's members, in the lanes' order.
    ///
    /// # Safety
    /// As [`Self::term`], for every entry of s..e.
    #[inline(always)]
    unsafe fn sums<const HOW: u8>(&self, s: usize, e: usize, class: &[u8]) -> [__m256d; NV] {
        let z = _mm256_setzero_pd();
        // SAFETY: every q below lies in s..e (the caller's contract).
        let t = |q: usize| unsafe { self.term::<HOW>(q, class) };
        let add = |a: [__m256d; NV], b: [__m256d; NV]| -> [__m256d; NV] {
            let mut r = a;
            for (rv, bv) in r.iter_mut().zip(b) {
                *rv = _mm256_add_pd(*rv, bv);
            }
            r
        };
        let zp = |a: [__m256d; NV]| add([z; NV], a);
        match e - s {
            0 => return [z; NV],
            1 => return zp(t(s)),
            2 => return add(zp(t(s)), t(s + 1)),
            3 => return add(add(zp(t(s)), t(s + 1)), t(s + 2)),
            4 => return add(add(zp(t(s)), t(s + 1)), add(zp(t(s + 2)), t(s + 3))),
            _ => {}
        }
        let (mut l0, mut l1, mut l2, mut l3) = ([z; NV], [z; NV], [z; NV], [z; NV]);
        let n4 = s + ((e - s) & !3);
        let mut q = s;
        while q < n4 {
            l0 = add(l0, t(q));
            l1 = add(l1, t(q + 1));
            l2 = add(l2, t(q + 2));
            l3 = add(l3, t(q + 3));
            q += 4;
        }
        if n4 < e {
            l0 = add(l0, t(n4));
        }
        if n4 + 1 < e {
            l1 = add(l1, t(n4 + 1));
        }
        if n4 + 2 < e {
            l2 = add(l2, t(n4 + 2));
        }
        add(add(l0, l1), add(l2, l3))
    }
}
