//! The order in which seistomo's CPU code adds up the terms of one sparse row.
//!
//! Term k of a row goes into lane `k % 4`; the four lane sums are combined as
//! `(l0 + l1) + (l2 + l3)`. Four independent chains of additions instead of one let a core keep
//! four multiply-adds in flight: with a single running sum every term waits for the previous
//! addition (4 cycles), and a row product on a cache-resident matrix is bound by that latency,
//! not by its bytes.
//!
//! Every CPU row product follows this one order — [`Csr::matvec`](super::Csr::matvec), the CPU
//! backend's CSR and compact products (fillers of the compact format add no term), and the grid
//! stencils' transposed rows, which continue the lanes of the stored part of a column — so those
//! products stay bitwise equal to each other. Rows of 1-3 terms sum left to right as before.

/// Running lane sums of one row: the terms added so far and where the next one goes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lanes {
    l: [f64; 4],
    k: usize,
}

impl Lanes {
    /// Add the next term of the row.
    #[inline]
    pub fn add(&mut self, t: f64) {
        self.l[self.k & 3] += t;
        self.k += 1;
    }

    /// The row sum: `(l0 + l1) + (l2 + l3)`.
    #[inline]
    pub fn sum(&self) -> f64 {
        (self.l[0] + self.l[1]) + (self.l[2] + self.l[3])
    }

    /// The lanes of the `n` terms `term(0), term(1), ..., term(n - 1)`, called in that order
    /// (so `term` may carry state, e.g. a running column). Same result as `n` calls of
    /// [`Lanes::add`] on a fresh value, unrolled by four.
    // Always inlined: a row loop over short rows (7 nonzeros on australia) spent a third of
    // its time in calls when the compiler kept this out of line.
    #[inline(always)]
    pub fn of(n: usize, mut term: impl FnMut(usize) -> f64) -> Lanes {
        let (mut l0, mut l1, mut l2, mut l3) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        let n4 = n & !3;
        let mut k = 0;
        while k < n4 {
            l0 += term(k);
            l1 += term(k + 1);
            l2 += term(k + 2);
            l3 += term(k + 3);
            k += 4;
        }
        if n4 < n {
            l0 += term(n4);
        }
        if n4 + 1 < n {
            l1 += term(n4 + 1);
        }
        if n4 + 2 < n {
            l2 += term(n4 + 2);
        }
        Lanes {
            l: [l0, l1, l2, l3],
            k: n,
        }
    }

    /// The sum of a row of exactly `L` terms (`L` <= 4), bitwise `Lanes::of(L, term).sum()`,
    /// written out without the lanes that stay zero: `0 + t0`, then left to right for up to
    /// three terms, `((0 + t0) + t1) + ((0 + t2) + t3)` for four. (`0 + t0` turns a -0 into
    /// +0, as a lane does; no other lane's `0 +` can change a sum, since a sum is -0 only when
    /// both addends are.) For the kernels of runs of equal short rows.
    #[inline(always)]
    pub fn sum_fixed<const L: usize>(mut term: impl FnMut(usize) -> f64) -> f64 {
        const { assert!(L >= 1 && L <= 4, "sum_fixed: rows of 1 to 4 terms") };
        let s = 0.0 + term(0);
        match L {
            1 => s,
            2 => s + term(1),
            3 => {
                let s = s + term(1);
                s + term(2)
            }
            _ => {
                let s = s + term(1);
                let t = 0.0 + term(2);
                s + (t + term(3))
            }
        }
    }

    /// The same lanes as [`Lanes::of`], with a row end that does not branch on the row's
    /// length: the last `n % 4` terms are computed for all three tail slots and the slots past
    /// the row are dropped by selects. `term(k, valid)` is called for k = 0..n rounded down to
    /// four with `valid` true, in order, then (when `n % 4 != 0`) once for each of the three
    /// tail slots, in order, with k clamped to `n - 1` and `valid` telling whether the slot is
    /// in the row; an invalid slot's value is discarded, so it may be anything, but `term` must
    /// not change its state for it (a running column adds no step there).
    ///
    /// Why: a row loop over rows of varied length spends most of a short row's time on
    /// mispredicted tail branches (australia's kernel rows, 15 nonzeros on average: A x 11 %
    /// faster on one core with this end, bitwise the same sums).
    #[inline(always)]
    pub fn of_masked(n: usize, mut term: impl FnMut(usize, bool) -> f64) -> Lanes {
        let (mut l0, mut l1, mut l2, mut l3) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        let n4 = n & !3;
        let mut k = 0;
        while k < n4 {
            l0 += term(k, true);
            l1 += term(k + 1, true);
            l2 += term(k + 2, true);
            l3 += term(k + 3, true);
            k += 4;
        }
        if n4 < n {
            let last = n - 1;
            let (v1, v2) = (n4 + 1 < n, n4 + 2 < n);
            let t0 = term(n4, true);
            let t1 = term((n4 + 1).min(last), v1);
            let t2 = term((n4 + 2).min(last), v2);
            // A lane is never -0 (it starts at +0, and a sum is -0 only when both addends
            // are), so adding +0 leaves it bitwise unchanged, as skipping the slot would.
            l0 += t0;
            l1 += if v1 { t1 } else { 0.0 };
            l2 += if v2 { t2 } else { 0.0 };
        }
        Lanes {
            l: [l0, l1, l2, l3],
            k: n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unrolled_equals_term_by_term_and_short_rows_sum_left_to_right() {
        let mut rng = crate::grid::Rng::new(9);
        for n in 0..40usize {
            let t: Vec<f64> = (0..n).map(|_| rng.uniform() - 0.3).collect();
            let mut one = Lanes::default();
            t.iter().for_each(|&v| one.add(v));
            let un = Lanes::of(n, |k| t[k]);
            assert_eq!(one.sum().to_bits(), un.sum().to_bits(), "n = {n}");
            // continuing an unrolled row term by term
            let mut cont = Lanes::of(n / 2, |k| t[k]);
            t[n / 2..].iter().for_each(|&v| cont.add(v));
            assert_eq!(cont.sum().to_bits(), one.sum().to_bits(), "n = {n}");
            if n <= 3 {
                let seq = t.iter().fold(0.0, |s, &v| s + v);
                assert_eq!(one.sum(), seq, "n = {n}");
            }
        }
        // the branch-free row end: same lanes, also for -0 terms and with a running state
        for n in 0..40usize {
            let t = crate::testproblems::with_negative_zeros(n, 3, &mut rng);
            let want = Lanes::of(n, |k| t[k]);
            let got = Lanes::of_masked(n, |k, _| t[k]);
            assert_eq!(got.l.map(f64::to_bits), want.l.map(f64::to_bits), "n = {n}");
            assert_eq!(got.sum().to_bits(), want.sum().to_bits(), "n = {n}");
            let mut running = 0usize;
            let st = Lanes::of_masked(n, |k, valid| {
                running += usize::from(valid);
                t[k] + if valid { 0.0 } else { f64::NAN }
            });
            assert_eq!(running, n, "n = {n}: the state steps once per term");
            assert_eq!(st.sum().to_bits(), want.sum().to_bits(), "n = {n}");
            // continued term by term like Lanes::of's
            let mut cont = Lanes::of_masked(n, |k, _| t[k]);
            cont.add(0.25);
            let mut one = want;
            one.add(0.25);
            assert_eq!(cont.sum().to_bits(), one.sum().to_bits(), "n = {n}");
        }
        // the written-out sums of 1-4 terms, -0 terms in every position included
        let vals = [-0.0, 0.0, 1.5, -2.25, 1e-300];
        for code in 0..vals.len().pow(4) {
            let t: Vec<f64> = (0..4).map(|i| vals[(code / 5usize.pow(i)) % 5]).collect();
            let want = |n: usize| Lanes::of(n, |k| t[k]).sum().to_bits();
            assert_eq!(Lanes::sum_fixed::<1>(|k| t[k]).to_bits(), want(1), "{t:?}");
            assert_eq!(Lanes::sum_fixed::<2>(|k| t[k]).to_bits(), want(2), "{t:?}");
            assert_eq!(Lanes::sum_fixed::<3>(|k| t[k]).to_bits(), want(3), "{t:?}");
            assert_eq!(Lanes::sum_fixed::<4>(|k| t[k]).to_bits(), want(4), "{t:?}");
        }
        // four lanes: 1e16 + 1 + (-1e16) + 1 sums the two ones in lanes 1 and 3
        let mut l = Lanes::default();
        [1e16, 1.0, -1e16, 1.0].iter().for_each(|&v| l.add(v));
        assert_eq!(l.sum(), (1e16 + 1.0) + (-1e16 + 1.0));
    }
}
