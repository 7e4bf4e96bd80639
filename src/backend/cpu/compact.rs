//! LSQR's operator on the CPU with compact storage: the stored rows (kernel rows and any stored
//! damping rows) in 16-bit-delta form with their explicit transpose in the same form, and the
//! grid-generated damping rows applied as stencils after them.
//!
//! Sums run in the order of the CSR operator with a CSC transpose on the same rows (stored rows
//! first, then the stencil rows in canonical order), so with f64 values the products equal
//! [`super::CpuCsrOperator`]'s bit for bit; with f32 values they equal its products on the
//! f32-rounded matrix.

use super::rows::{rows_par, RowSource};
use super::CpuBackend;
use crate::backend::{Operator, Precision, Scale};
use crate::error::Result;
use crate::grid::StencilOp;
use crate::sparse::{
    CompactCsr, CompactValues, Csr, Lanes, RowOrder, RowRuns, LENGTH_ORDER_WINDOW,
};

/// Compact rows + compact transpose + optional stencil rows.
pub struct CpuCompactOperator {
    a: CompactCsr,
    at: CompactCsr,
    stencil: Option<StencilOp>,
    /// Runs of equal short rows of `a` and `at` (src/backend/cpu/rows.rs).
    runs: (RowRuns, RowRuns),
    /// The order `a`'s and `at`'s rows are stored in (none: in order), by length
    /// ([`RowOrder::by_length`]).
    order: (Option<RowOrder>, Option<RowOrder>),
}

impl CpuCompactOperator {
    /// `stored`: the stored rows; `stencil`: rows generated from the grid, appended after them
    /// (their columns in the same numbering as `stored`'s).
    pub fn new(stored: &Csr, stencil: Option<StencilOp>, precision: Precision) -> Self {
        Self::with_order_window(stored, stencil, precision, LENGTH_ORDER_WINDOW)
    }

    /// [`Self::new`] with the rows of `stored` and of its transpose stored sorted by length in
    /// windows of `window` rows (1: in their order; benchmarks compare the two).
    pub fn with_order_window(
        stored: &Csr,
        stencil: Option<StencilOp>,
        precision: Precision,
        window: usize,
    ) -> Self {
        if let Some(s) = &stencil {
            assert_eq!(
                s.ncols(),
                stored.ncols(),
                "stencil and rows disagree on columns"
            );
        }
        let (a, order_a) = ordered(stored, window, precision);
        let (at, order_t) = ordered(&stored.transpose(), window, precision);
        let runs = (RowRuns::new(a.ptr()), RowRuns::new(at.ptr()));
        CpuCompactOperator {
            a,
            at,
            stencil,
            runs,
            order: (order_a, order_t),
        }
    }

    /// The stored rows, in the order [`Self::order`] gives.
    pub fn stored(&self) -> &CompactCsr {
        &self.a
    }
    /// The explicit transpose's rows, in the order [`Self::order`] gives.
    pub fn transposed(&self) -> &CompactCsr {
        &self.at
    }
    /// The orders the rows of [`Self::stored`] and of [`Self::transposed`] are kept in (none:
    /// in order).
    pub fn order(&self) -> (Option<&RowOrder>, Option<&RowOrder>) {
        (self.order.0.as_ref(), self.order.1.as_ref())
    }
    pub fn stencil(&self) -> Option<&StencilOp> {
        self.stencil.as_ref()
    }
    /// Bytes of matrix storage (both compact copies; a stencil stores nothing but its
    /// renumbering tables).
    pub fn bytes(&self) -> u64 {
        let order = |o: &Option<RowOrder>| o.as_ref().map_or(0, |o| 4 * o.len() as u64);
        self.a.bytes()
            + self.at.bytes()
            + order(&self.order.0)
            + order(&self.order.1)
            + self
                .stencil
                .as_ref()
                .and_then(|s| s.new_of_old())
                .map(|p| 8 * p.len() as u64)
                .unwrap_or(0)
    }
}

/// `m`'s rows in compact form, sorted by length in windows of `window` rows, and their order
/// (none: kept in order).
fn ordered(m: &Csr, window: usize, precision: Precision) -> (CompactCsr, Option<RowOrder>) {
    match RowOrder::by_length(m.indptr(), window) {
        Some(o) => (
            CompactCsr::from_csr(&m.select_rows(&o.rows()), precision),
            Some(o),
        ),
        None => (CompactCsr::from_csr(m, precision), None),
    }
}

/// The type of a product's absent `extra`.
type NoExtra = fn(&mut Lanes, usize);

/// Rows of a compact matrix with filler entries times `x`: fillers add no term (checked per
/// entry), each row's lanes continued by `extra` (the stencil's transposed terms).
struct FillerRows<'a, E> {
    m: &'a CompactCsr,
    x: &'a [f64],
    extra: Option<&'a E>,
}

impl<E: Fn(&mut Lanes, usize) + Sync> RowSource for FillerRows<'_, E> {
    fn ptr(&self) -> &[u64] {
        self.m.ptr()
    }
    fn row(&self, r: usize) -> f64 {
        let mut l = self.m.row_lanes(r, self.x);
        if let Some(extra) = self.extra {
            extra(&mut l, r);
        }
        l.sum()
    }
}

/// Rows of a compact matrix without fillers (`ptr`, `base`, `delta`, values `v`) times `x`,
/// each row's lanes continued by `extra`. Reads x without bounds checks: built only by
/// [`product`], which asserts the bound.
struct PlainRows<'a, V, E> {
    arrays: (&'a [u64], &'a [u32], &'a [u16]),
    v: &'a [V],
    x: &'a [f64],
    extra: Option<&'a E>,
}

impl<V: Copy + Sync, E: Fn(&mut Lanes, usize) + Sync> RowSource for PlainRows<'_, V, E>
where
    f64: From<V>,
{
    fn ptr(&self) -> &[u64] {
        self.arrays.0
    }
    #[inline(always)]
    fn row(&self, r: usize) -> f64 {
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
/// place) before they are summed; `runs` are `m`'s runs, `order` the rows `m` stores (none: in
/// order). Whether `m` has fillers and its value type are decided once per product.
fn product<E: Fn(&mut Lanes, usize) + Sync>(
    (m, runs, order): (&CompactCsr, &RowRuns, Option<&RowOrder>),
    x: &[f64],
    out: &mut [f64],
    ab: (f64, f64),
    extra: Option<&E>,
) {
    // the bound PlainRows' unchecked reads rely on
    assert!(
        x.len() >= m.ncols(),
        "compact product: x shorter than the columns"
    );
    let arrays = (m.ptr(), m.base(), m.delta());
    if m.entries() > m.nnz() {
        rows_par(&FillerRows { m, x, extra }, None, order, out, ab);
        return;
    }
    match m.values() {
        CompactValues::F64(v) => {
            let src = PlainRows {
                arrays,
                v,
                x,
                extra,
            };
            rows_par(&src, Some(runs), order, out, ab)
        }
        CompactValues::F32(v) => {
            let src = PlainRows {
                arrays,
                v,
                x,
                extra,
            };
            rows_par(&src, Some(runs), order, out, ab)
        }
    }
}

impl Operator<CpuBackend> for CpuCompactOperator {
    fn nrows(&self) -> usize {
        self.a.nrows() + self.stencil.as_ref().map_or(0, |s| s.nrows())
    }
    fn ncols(&self) -> usize {
        self.a.ncols()
    }
    fn apply(&self, _b: &CpuBackend, s: Scale, x: &Vec<f64>, y: &mut Vec<f64>) -> Result<()> {
        assert_eq!(x.len(), self.ncols());
        assert_eq!(y.len(), self.nrows());
        let (ys, yd) = y.split_at_mut(self.a.nrows());
        let a = (&self.a, &self.runs.0, self.order.0.as_ref());
        product::<NoExtra>(a, x, ys, (s.alpha, s.beta), None);
        if let Some(st) = &self.stencil {
            st.apply(s.alpha, x, s.beta, yd);
        }
        Ok(())
    }
    fn apply_t(&self, _b: &CpuBackend, s: Scale, y: &Vec<f64>, x: &mut Vec<f64>) -> Result<()> {
        assert_eq!(y.len(), self.nrows());
        assert_eq!(x.len(), self.ncols());
        let (ys, yd) = y.split_at(self.a.nrows());
        let ab = (s.alpha, s.beta);
        let order = self.order.1.as_ref();
        let at = (&self.at, &self.runs.1, order);
        match &self.stencil {
            None => product::<NoExtra>(at, ys, x, ab, None),
            Some(st) => {
                // the stored row at place i is cell old_of_new[i]
                let cell = |i: usize| order.map_or(i, |o| o.old_of_new()[i] as usize);
                let extra = |l: &mut Lanes, i| st.add_transposed(l, cell(i), yd);
                product(at, ys, x, ab, Some(&extra))
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
            let a = crate::testproblems::runs_csr(ncols, seed);
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
                // (with fillers the product takes no runs, whatever the rows' entries show)
                assert!(
                    fillers || op.runs.0.rows_in_runs() > 1000,
                    "the test needs runs"
                );
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
                // rows sorted by length in the default windows, in one window, and as given
                let sten = || Some(StencilOp::new(st, p.clone()));
                let ops = [
                    CpuCompactOperator::new(&k, sten(), Precision::F64),
                    CpuCompactOperator::new(&full, None, Precision::F64),
                    CpuCompactOperator::with_order_window(&k, sten(), Precision::F64, usize::MAX),
                    CpuCompactOperator::with_order_window(&k, sten(), Precision::F64, 1),
                ];
                let (oa, ot) = ops[0].order();
                assert!(
                    m < 700 || (oa.is_some() && ot.is_some()),
                    "the test needs orders"
                );
                assert_eq!(ops[3].order(), (None, None));
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
