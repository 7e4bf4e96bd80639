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
        // four lanes: 1e16 + 1 + (-1e16) + 1 sums the two ones in lanes 1 and 3
        let mut l = Lanes::default();
        [1e16, 1.0, -1e16, 1.0].iter().for_each(|&v| l.add(v));
        assert_eq!(l.sum(), (1e16 + 1.0) + (-1e16 + 1.0));
    }
}
