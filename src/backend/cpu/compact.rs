//! LSQR's operator on the CPU with compact storage: the stored rows (kernel rows and any stored
//! damping rows) in 16-bit-delta form with their explicit transpose in the same form, and the
//! grid-generated damping rows applied as stencils after them.
//!
//! Sums run in the order of the CSR operator with a CSC transpose on the same rows (stored rows
//! first, then the stencil rows in canonical order), so with f64 values the products equal
//! [`super::CpuCsrOperator`]'s bit for bit; with f32 values they equal its products on the
//! f32-rounded matrix.

use rayon::prelude::*;

use super::rows::{rows_par, RowSource};
use super::CpuBackend;
use crate::backend::{Operator, Precision, Scale};
use crate::error::Result;
use crate::grid::StencilOp;
use crate::sparse::{CompactCsr, CompactValues, Csr, Lanes, RowOrder, RowRuns, RowSort};

/// Compact rows + compact transpose + optional stencil rows.
pub struct CpuCompactOperator {
    a: Rows,
    at: Rows,
    stencil: Option<StencilOp>,
}

/// One compact matrix as the row products read it.
struct Rows {
    m: CompactCsr,
    /// Runs of equal short rows of `m` (src/backend/cpu/rows.rs).
    runs: RowRuns,
    /// The order `m`'s rows are stored in ([`RowSort`]; none: in order).
    order: Option<RowOrder>,
    /// The rows that hold escape fillers (bit r % 64 of word r / 64); none if no row does.
    fillers: Option<Vec<u64>>,
}

impl Rows {
    fn new(csr: &Csr, sort: RowSort, precision: Precision) -> Rows {
        let order = sort.order(csr.indptr());
        // encoded straight in that order (no reordered copy of `csr`)
        let old = order.as_ref().map(|o| o.old_of_new());
        let m = CompactCsr::from_rows(csr, old, precision);
        let fillers = (m.entries() > m.nnz()).then(|| {
            let mut bits = vec![0u64; m.nrows().div_ceil(64)];
            let (p, q, nrows) = (m.ptr(), csr.indptr(), m.nrows());
            let len = |r: usize| {
                let o = old.map_or(r, |o| o[r] as usize);
                q[o + 1] - q[o]
            };
            bits.par_iter_mut().enumerate().for_each(|(w, bits)| {
                for r in w * 64..(w * 64 + 64).min(nrows) {
                    if p[r + 1] - p[r] != len(r) {
                        *bits |= 1 << (r % 64);
                    }
                }
            });
            bits
        });
        Rows {
            runs: RowRuns::new(m.ptr()),
            m,
            order,
            fillers,
        }
    }

    fn bytes(&self) -> u64 {
        self.m.bytes()
            + self.order.as_ref().map_or(0, |o| 4 * o.len() as u64)
            + self.fillers.as_ref().map_or(0, |f| 8 * f.len() as u64)
    }
}

impl CpuCompactOperator {
    /// `stored`: the stored rows; `stencil`: rows generated from the grid, appended after them
    /// (their columns in the same numbering as `stored`'s).
    pub fn new(stored: &Csr, stencil: Option<StencilOp>, precision: Precision) -> Self {
        Self::with_row_sort(stored, stencil, precision, RowSort::Auto)
    }

    /// [`Self::new`] with the rows of `stored` and of its transpose kept in the order `sort`
    /// gives (benchmarks and tests compare the orders).
    pub fn with_row_sort(
        stored: &Csr,
        stencil: Option<StencilOp>,
        precision: Precision,
        sort: RowSort,
    ) -> Self {
        if let Some(s) = &stencil {
            assert_eq!(
                s.ncols(),
                stored.ncols(),
                "stencil and rows disagree on columns"
            );
        }
        CpuCompactOperator {
            a: Rows::new(stored, sort, precision),
            at: Rows::new(&stored.transpose(), sort, precision),
            stencil,
        }
    }

    /// The stored rows, in the order [`Self::order`] gives.
    pub fn stored(&self) -> &CompactCsr {
        &self.a.m
    }
    /// The explicit transpose's rows, in the order [`Self::order`] gives.
    pub fn transposed(&self) -> &CompactCsr {
        &self.at.m
    }
    /// The orders the rows of [`Self::stored`] and of [`Self::transposed`] are kept in (none:
    /// in order).
    pub fn order(&self) -> (Option<&RowOrder>, Option<&RowOrder>) {
        (self.a.order.as_ref(), self.at.order.as_ref())
    }
    pub fn stencil(&self) -> Option<&StencilOp> {
        self.stencil.as_ref()
    }
    /// Bytes of matrix storage (both compact copies with their row orders and filler-row
    /// marks; a stencil stores nothing but its renumbering tables).
    pub fn bytes(&self) -> u64 {
        self.a.bytes()
            + self.at.bytes()
            + self
                .stencil
                .as_ref()
                .and_then(|s| s.new_of_old())
                .map(|p| 8 * p.len() as u64)
                .unwrap_or(0)
    }
}

/// The type of a product's absent `extra`.
type NoExtra = fn(&mut Lanes, usize);

/// Rows of a compact matrix (`ptr`, `base`, `delta`, values `v`) times `x`, each row's lanes
/// continued by `extra`. If FILLERS, a row marked in `fillers` (one that holds escape fillers)
/// is summed by [`CompactCsr::row_lanes`], which skips them; every other row by a loop that
/// decodes without looking for fillers. Reads x without bounds checks: built only by [`product`], which asserts
/// the bound.
struct CompactRows<'a, V, E, const FILLERS: bool> {
    /// `m`'s ptr, base and delta, held here so that the row loop reads them directly.
    arrays: (&'a [u64], &'a [u32], &'a [u16]),
    v: &'a [V],
    x: &'a [f64],
    extra: Option<&'a E>,
    m: &'a CompactCsr,
    fillers: Option<&'a [u64]>,
}

impl<V, E: Fn(&mut Lanes, usize) + Sync, const FILLERS: bool> CompactRows<'_, V, E, FILLERS> {
    #[inline(always)]
    fn has_fillers(&self, r: usize) -> bool {
        FILLERS && self.fillers.is_some_and(|f| f[r / 64] >> (r % 64) & 1 != 0)
    }
    /// Row r, which holds fillers.
    #[cold]
    #[inline(never)]
    fn filler_row(&self, r: usize) -> f64 {
        let mut l = self.m.row_lanes(r, self.x);
        if let Some(extra) = self.extra {
            extra(&mut l, r);
        }
        l.sum()
    }
}

impl<V: Copy + Sync, E: Fn(&mut Lanes, usize) + Sync, const FILLERS: bool> RowSource
    for CompactRows<'_, V, E, FILLERS>
where
    f64: From<V>,
{
    fn ptr(&self) -> &[u64] {
        self.arrays.0
    }
    #[inline(always)]
    fn row(&self, r: usize) -> f64 {
        if self.has_fillers(r) {
            return self.filler_row(r);
        }
        let (ptr, base, delta) = self.arrays;
        let (v, x) = (self.v, self.x);
        debug_assert!(r + 1 < ptr.len() && r < base.len());
        // SAFETY: rows_par asks only for rows < nrows, and a CompactCsr has nrows + 1 offsets
        // and nrows bases.
        let (s, e, mut c) = unsafe {
            let s = *ptr.get_unchecked(r) as usize;
            (
                s,
                *ptr.get_unchecked(r + 1) as usize,
                *base.get_unchecked(r) as usize,
            )
        };
        debug_assert!(s <= e && e <= delta.len() && e <= v.len());
        // SAFETY: a CompactCsr is built from a valid Csr, so its offsets lie within delta and
        // the values and every decoded column is < ncols, and `product` asserts x.len() >=
        // ncols; s + k < e (of_masked clamps the tail slots to the row, and an invalid slot
        // adds no step to the running column).
        let mut l = Lanes::of_masked(e - s, |k, valid| unsafe {
            c += if valid {
                *delta.get_unchecked(s + k) as usize
            } else {
                0
            };
            debug_assert!(c < x.len());
            f64::from(*v.get_unchecked(s + k)) * x.get_unchecked(c)
        });
        if let Some(extra) = self.extra {
            extra(&mut l, r);
        }
        l.sum()
    }
    #[inline(always)]
    fn fixed<const L: usize>(&self, r: usize, s: usize) -> f64 {
        if self.has_fillers(r) {
            return self.filler_row(r);
        }
        let (_, base, delta) = self.arrays;
        let (v, x) = (self.v, self.x);
        debug_assert!(r < base.len() && s + L <= delta.len() && s + L <= v.len());
        // SAFETY: as in `row`: row r < nrows has its L entries at s..s + L.
        let mut c = unsafe { *base.get_unchecked(r) as usize };
        // SAFETY: as in `row`; s + k < s + L, the row's end.
        let term = |k: usize| unsafe {
            c += *delta.get_unchecked(s + k) as usize;
            debug_assert!(c < x.len());
            f64::from(*v.get_unchecked(s + k)) * x.get_unchecked(c)
        };
        match self.extra {
            None => Lanes::sum_fixed::<L>(term),
            Some(extra) => {
                let mut l = Lanes::of(L, term);
                extra(&mut l, r);
                l.sum()
            }
        }
    }
}

/// out = alpha * (rows of `m`) x + beta * out, each row's lanes continued by `extra` (the
/// stencil's transposed terms; none: a fn type stands in for E; it is given the stored row's
/// place) before they are summed.
fn product<E: Fn(&mut Lanes, usize) + Sync>(
    rows: &Rows,
    x: &[f64],
    out: &mut [f64],
    ab: (f64, f64),
    extra: Option<&E>,
) {
    let m = &rows.m;
    // the bound CompactRows' unchecked reads rely on
    assert!(
        x.len() >= m.ncols(),
        "compact product: x shorter than the columns"
    );
    // whether any row holds fillers, and the value type: decided once per product
    match (m.values(), rows.fillers.is_some()) {
        (CompactValues::F64(v), false) => run::<_, E, false>(rows, v, x, out, ab, extra),
        (CompactValues::F64(v), true) => run::<_, E, true>(rows, v, x, out, ab, extra),
        (CompactValues::F32(v), false) => run::<_, E, false>(rows, v, x, out, ab, extra),
        (CompactValues::F32(v), true) => run::<_, E, true>(rows, v, x, out, ab, extra),
    }
}

/// [`product`] with values `v` (`rows`' own), looking for rows with fillers if FILLERS.
fn run<V: Copy + Sync, E: Fn(&mut Lanes, usize) + Sync, const FILLERS: bool>(
    rows: &Rows,
    v: &[V],
    x: &[f64],
    out: &mut [f64],
    ab: (f64, f64),
    extra: Option<&E>,
) where
    f64: From<V>,
{
    let m = &rows.m;
    let src = CompactRows::<V, E, FILLERS> {
        arrays: (m.ptr(), m.base(), m.delta()),
        v,
        x,
        extra,
        m,
        fillers: rows.fillers.as_deref(),
    };
    rows_par(&src, Some(&rows.runs), rows.order.as_ref(), out, ab)
}

impl Operator<CpuBackend> for CpuCompactOperator {
    fn nrows(&self) -> usize {
        self.a.m.nrows() + self.stencil.as_ref().map_or(0, |s| s.nrows())
    }
    fn ncols(&self) -> usize {
        self.a.m.ncols()
    }
    fn apply(&self, _b: &CpuBackend, s: Scale, x: &Vec<f64>, y: &mut Vec<f64>) -> Result<()> {
        assert_eq!(x.len(), self.ncols());
        assert_eq!(y.len(), self.nrows());
        let (ys, yd) = y.split_at_mut(self.a.m.nrows());
        product::<NoExtra>(&self.a, x, ys, (s.alpha, s.beta), None);
        if let Some(st) = &self.stencil {
            st.apply(s.alpha, x, s.beta, yd);
        }
        Ok(())
    }
    fn apply_t(&self, _b: &CpuBackend, s: Scale, y: &Vec<f64>, x: &mut Vec<f64>) -> Result<()> {
        assert_eq!(y.len(), self.nrows());
        assert_eq!(x.len(), self.ncols());
        let (ys, yd) = y.split_at(self.a.m.nrows());
        let ab = (s.alpha, s.beta);
        match &self.stencil {
            None => product::<NoExtra>(&self.at, ys, x, ab, None),
            Some(st) => {
                // the stored row at place i is cell old_of_new[i]
                let order = self.at.order.as_ref();
                let cell = |i: usize| order.map_or(i, |o| o.old_of_new()[i] as usize);
                let extra = |l: &mut Lanes, i| st.add_transposed(l, cell(i), yd);
                product(&self.at, ys, x, ab, Some(&extra))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuCsrOperator;
    use crate::backend::TransposeStrategy;
    use crate::grid::Stencil;

    #[test]
    fn damping_runs_and_fillers_give_the_reference_sums_bitwise() {
        let be = CpuBackend::new();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // 5000 columns: no escapes, runs taken; 300,000: gaps >= 65536 need fillers
        for (ncols, seed, fillers) in [(5000usize, 5u64, false), (300_000, 6, true)] {
            let mut a = crate::testproblems::runs_csr(ncols, seed);
            if fillers {
                // and a run of rows with one filler each: columns i and i + 70,000
                let (r, c): (Vec<u64>, Vec<u64>) = (0..80u64)
                    .map(|k| (k / 2, k / 2 + (k % 2) * 70_000))
                    .unzip();
                let v: Vec<f64> = (0..80).map(|k| 0.25 + k as f64).collect();
                let run = Csr::from_triplets(40, ncols, &r, &c, &v).unwrap();
                a = a.vstack_scaled(&run, 1.0).unwrap();
            }
            let mut rng = crate::grid::Rng::new(seed);
            let x = crate::testproblems::with_negative_zeros(ncols, 7, &mut rng);
            let y: Vec<f64> = (0..a.nrows()).map(|_| rng.uniform() - 0.5).collect();
            for precision in [Precision::F64, Precision::F32] {
                let mut ar = a.clone();
                if precision == Precision::F32 {
                    ar.data_mut().iter_mut().for_each(|v| *v = *v as f32 as f64);
                }
                let op = CpuCompactOperator::new(&a, None, precision);
                assert_eq!(op.stored().entries() > op.stored().nnz(), fillers);
                // runs, and with fillers rows marked and unmarked inside runs and outside
                let rows = &op.a;
                assert!(rows.runs.rows_in_runs() > 500, "the test needs runs");
                assert_eq!(rows.fillers.is_some(), fillers);
                if let Some(f) = &rows.fillers {
                    let marked = |r: usize| f[r / 64] >> (r % 64) & 1 != 0;
                    let in_runs = |r: usize| rows.runs.runs().iter().any(|(q, _)| q.contains(&r));
                    for (inside, mark) in
                        [(true, true), (true, false), (false, true), (false, false)]
                    {
                        assert!(
                            (0..a.nrows()).any(|r| in_runs(r) == inside && marked(r) == mark),
                            "the test needs a row in a run {inside}, with fillers {mark}"
                        );
                    }
                }
                let mut got = vec![f64::NAN; a.nrows()];
                op.apply(&be, Scale::new(1.0, 0.0), &x, &mut got).unwrap();
                assert_eq!(bits(&got), bits(&ar.matvec(&x)), "{ncols} {precision}");
                let mut got = vec![f64::NAN; ncols];
                op.apply_t(&be, Scale::new(1.0, 0.0), &y, &mut got).unwrap();
                let want = ar.transpose().matvec(&y);
                assert_eq!(bits(&got), bits(&want), "{ncols} {precision}");
            }
        }
    }

    #[test]
    fn equals_the_csr_operator_bitwise_with_and_without_stencil() {
        let be = CpuBackend::new();
        let st = Stencil {
            n: [9, 7, 5],
            norm: 0.1,
            first: [0.5, 0.5, 0.0],
            second: [0.0, 0.0, 0.3],
        };
        let nc = st.ncells();
        let mut rng = crate::grid::Rng::new(3);
        let perm = {
            let mut p: Vec<u32> = (0..nc as u32).collect();
            for i in (1..nc).rev() {
                p.swap(i, rng.below(i as u64 + 1) as usize);
            }
            p
        };
        for &(m, seed) in &[(700usize, 1u64), (3, 2), (5000, 3)] {
            let k = crate::testproblems::awkward_csr(m, nc, seed);
            for p in [None, Some(perm.clone())] {
                let d = match &p {
                    Some(p) => st.to_csr().permute_columns(p),
                    None => st.to_csr(),
                };
                let full = k.vstack_scaled(&d, 1.0).unwrap();
                let reference = CpuCsrOperator::new(full.clone(), TransposeStrategy::Csc);
                // rows sorted by length as products choose, in one window, in windows of 5 rows
                // and kept as given
                use {Precision::F64, RowSort::Windows};
                let sten = || Some(StencilOp::new(st, p.clone()));
                let ops = [
                    CpuCompactOperator::new(&k, sten(), Precision::F64),
                    CpuCompactOperator::new(&full, None, Precision::F64),
                    CpuCompactOperator::with_row_sort(&k, sten(), F64, Windows(usize::MAX)),
                    CpuCompactOperator::with_row_sort(&k, sten(), F64, Windows(5)),
                    CpuCompactOperator::with_row_sort(&k, sten(), F64, RowSort::Keep),
                ];
                let (oa, ot) = ops[2].order();
                assert!(
                    m < 700 || (oa.is_some() && ot.is_some()),
                    "the test needs orders"
                );
                assert_eq!(ops[4].order(), (None, None));
                let x: Vec<f64> = (0..nc).map(|_| rng.uniform() - 0.5).collect();
                let y0: Vec<f64> = (0..full.nrows()).map(|_| rng.uniform() - 0.5).collect();
                let mut want_y = y0.clone();
                reference
                    .apply(&be, Scale::new(1.25, -0.5), &x, &mut want_y)
                    .unwrap();
                let mut want_x = x.clone();
                reference
                    .apply_t(&be, Scale::new(-0.75, 2.0), &y0, &mut want_x)
                    .unwrap();
                for op in &ops {
                    assert_eq!(op.nrows(), full.nrows());
                    let mut y = y0.clone();
                    op.apply(&be, Scale::new(1.25, -0.5), &x, &mut y).unwrap();
                    assert_eq!(y, want_y);
                    let mut xx = x.clone();
                    op.apply_t(&be, Scale::new(-0.75, 2.0), &y0, &mut xx)
                        .unwrap();
                    assert_eq!(xx, want_x);
                }
            }
        }
    }
}
