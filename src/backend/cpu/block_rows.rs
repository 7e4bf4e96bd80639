//! The rows of a CPU block product ([`super::block`]): what one product reads ([`Product`]),
//! its member groups, and the portable kernel, which the vector kernels of
//! `block_avx2.rs` (x86-64) equal bit for bit. A row sum adds its terms in
//! [`crate::sparse::Lanes`]' four lanes, a weighted entry is `(a w_j) x_j` (the single solve
//! stores `a w_j`).

/// Members per pass over a row: 4 lanes of W sums stay in registers.
pub(super) const GROUP: usize = 12;

/// The member groups of a block of k: (first member, members), at most [`GROUP`] each, as
/// equal as can be (13 members: 7 + 6).
pub(super) fn groups(k: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = k.div_ceil(GROUP);
    (0..n).scan(0, move |j0, gi| {
        let g = k / n + usize::from(gi < k % n);
        let at = *j0;
        *j0 += g;
        Some((at, g))
    })
}

/// The factors of a group of W members: [ones, weights].
fn factors<const W: usize>(w: &[f64], j0: usize) -> [[f64; W]; 2] {
    let mut f = [[1.0; W]; 2];
    if !w.is_empty() {
        f[1].copy_from_slice(&w[j0..j0 + W]);
    }
    f
}

/// One product's rows: `src` rows (offsets, columns, values), entry classes (None: none
/// weighted), the multiplied block `x` (k columns), members' weights `w`, and (alpha, beta).
pub(super) struct Product<'a> {
    pub(super) ptr: &'a [u64],
    pub(super) cols: &'a [u32],
    pub(super) vals: &'a [f64],
    /// Weighted rows by row (A X) or by entry (A^T Y).
    pub(super) class: Classes<'a>,
    pub(super) x: &'a [f64],
    pub(super) k: usize,
    pub(super) w: &'a [f64],
    pub(super) alpha: f64,
    pub(super) beta: &'a [f64],
}

#[derive(Clone, Copy)]
pub(super) enum Classes<'a> {
    None,
    Rows(&'a [u8]),
    Entries(&'a [u8]),
}

impl Product<'_> {
    /// [`Self::group_any`] compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn group_any_avx2(&self, r0: usize, j0: usize, g: usize, out: &mut [f64]) {
        self.group_any(r0, j0, g, out)
    }

    /// The rows in member groups of up to [`GROUP`], portable (the AVX2 kernel's reference).
    #[inline(always)]
    pub(super) fn rows_any(&self, r0: usize, out: &mut [f64]) {
        for (j0, g) in groups(self.k) {
            self.group_any(r0, j0, g, out);
        }
    }

    /// The members j0..j0 + g (g <= [`GROUP`]) of rows r0.., portable.
    #[inline(always)]
    pub(super) fn group_any(&self, r0: usize, j0: usize, g: usize, out: &mut [f64]) {
        {
            match g {
                1 => self.group::<1>(r0, j0, out),
                2 => self.group::<2>(r0, j0, out),
                3 => self.group::<3>(r0, j0, out),
                4 => self.group::<4>(r0, j0, out),
                5 => self.group::<5>(r0, j0, out),
                6 => self.group::<6>(r0, j0, out),
                7 => self.group::<7>(r0, j0, out),
                8 => self.group::<8>(r0, j0, out),
                9 => self.group::<9>(r0, j0, out),
                10 => self.group::<10>(r0, j0, out),
                11 => self.group::<11>(r0, j0, out),
                _ => self.group::<12>(r0, j0, out),
            }
        }
    }

    #[inline(always)]
    fn group<const W: usize>(&self, r0: usize, j0: usize, out: &mut [f64]) {
        let (k, alpha) = (self.k, self.alpha);
        let fac = factors::<W>(self.w, j0);
        let beta: [f64; W] = std::array::from_fn(|j| self.beta[j0 + j]);
        for (i, orow) in out.chunks_exact_mut(k).enumerate() {
            let r = r0 + i;
            let (s, e) = (self.ptr[r] as usize, self.ptr[r + 1] as usize);
            let sums = match self.class {
                Classes::None => self.sums::<W, false>((s, e), j0, &fac, None),
                Classes::Rows(c) => match c[r] {
                    0 => self.sums::<W, false>((s, e), j0, &fac, None),
                    _ => self.sums::<W, true>((s, e), j0, &fac, None),
                },
                Classes::Entries(c) => self.sums::<W, true>((s, e), j0, &fac, Some(c)),
            };
            let o = &mut orow[j0..j0 + W];
            for j in 0..W {
                o[j] = if beta[j] == 0.0 {
                    alpha * sums[j]
                } else {
                    alpha * sums[j] + beta[j] * o[j]
                };
            }
        }
    }

    /// Term p (an entry) for W members: `a x_j`, or `(a w_j) x_j` where weighted: with entry
    /// classes the factor is 1 (exact) or w_j by entry; without, w_j (`fac[1]`: all entries of
    /// a weighted row).
    #[inline(always)]
    fn term<const W: usize, const WEIGHTED: bool>(
        &self,
        p: usize,
        j0: usize,
        fac: &[[f64; W]; 2],
        entry_class: Option<&[u8]>,
    ) -> [f64; W] {
        let (k, x) = (self.k, self.x);
        // SAFETY: p < nnz (the rows' offsets are a Csr's); a Csr's columns are < its ncols,
        // and `product` checked that x has ncols rows of k values, j0 + W <= k.
        let (a, xs) = unsafe {
            let c = *self.cols.get_unchecked(p) as usize;
            debug_assert!((c + 1) * k <= x.len() && j0 + W <= k);
            let xs: &[f64; W] = &*(x.as_ptr().add(c * k + j0) as *const [f64; W]);
            (*self.vals.get_unchecked(p), xs)
        };
        if WEIGHTED {
            let f = match entry_class {
                // SAFETY: entry classes have one per entry (made with the matrix).
                Some(c) => &fac[usize::from(unsafe { *c.get_unchecked(p) } != 0)],
                None => &fac[1],
            };
            std::array::from_fn(|j| (a * f[j]) * xs[j])
        } else {
            std::array::from_fn(|j| a * xs[j])
        }
    }

    /// The sums of entries s..e for W members: term t of the row into lane t % 4, the lanes
    /// added as `(l0 + l1) + (l2 + l3)` ([`crate::sparse::Lanes`]). The lanes are four local
    /// arrays indexed by constants only, so they stay in registers. Rows of 1 to 4 entries sum
    /// as [`crate::sparse::Lanes::sum_fixed`] writes them out (bitwise the lanes' sums).
    #[inline(always)]
    fn sums<const W: usize, const WEIGHTED: bool>(
        &self,
        (s, e): (usize, usize),
        j0: usize,
        fac: &[[f64; W]; 2],
        entry_class: Option<&[u8]>,
    ) -> [f64; W] {
        debug_assert!(e <= self.cols.len() && e <= self.vals.len());
        let term = |p: usize| self.term::<W, WEIGHTED>(p, j0, fac, entry_class);
        let zero_plus = |t: [f64; W]| -> [f64; W] { std::array::from_fn(|j| 0.0 + t[j]) };
        let plus = |a: [f64; W], t: [f64; W]| -> [f64; W] { std::array::from_fn(|j| a[j] + t[j]) };
        match e - s {
            0 => return [0.0; W],
            1 => return zero_plus(term(s)),
            2 => return plus(zero_plus(term(s)), term(s + 1)),
            3 => return plus(plus(zero_plus(term(s)), term(s + 1)), term(s + 2)),
            4 => {
                let a = plus(zero_plus(term(s)), term(s + 1));
                let b = plus(zero_plus(term(s + 2)), term(s + 3));
                return plus(a, b);
            }
            _ => {}
        }
        #[inline(always)]
        fn add<const W: usize>(lane: &mut [f64; W], t: [f64; W]) {
            for j in 0..W {
                lane[j] += t[j];
            }
        }
        let (mut l0, mut l1, mut l2, mut l3) = ([0.0f64; W], [0.0f64; W], [0.0f64; W], [0.0f64; W]);
        let n4 = s + ((e - s) & !3);
        let mut p = s;
        while p < n4 {
            add(&mut l0, term(p));
            add(&mut l1, term(p + 1));
            add(&mut l2, term(p + 2));
            add(&mut l3, term(p + 3));
            p += 4;
        }
        if n4 < e {
            add(&mut l0, term(n4));
        }
        if n4 + 1 < e {
            add(&mut l1, term(n4 + 1));
        }
        if n4 + 2 < e {
            add(&mut l2, term(n4 + 2));
        }
        std::array::from_fn(|j| (l0[j] + l1[j]) + (l2[j] + l3[j]))
    }
}
