//! LSQR's operator on the CPU with compact storage: the stored rows (kernel rows and any stored
//! damping rows) in 16-bit-delta form with their explicit transpose in the same form, and the
//! grid-generated damping rows applied as stencils after them.
//!
//! Sums run in the order of the CSR operator with a CSC transpose on the same rows (stored rows
//! first, then the stencil rows in canonical order), so with f64 values the products equal
//! [`super::CpuCsrOperator`]'s bit for bit; with f32 values they equal its products on the
//! f32-rounded matrix.

use super::CpuBackend;
use crate::backend::{Operator, Precision, Scale};
use crate::error::Result;
use crate::grid::StencilOp;
use crate::sparse::{CompactCsr, CompactValues, Csr, Lanes};

/// Entries below which a product is not split further across threads.
const GRAIN: u64 = 32 * 1024;

/// Compact rows + compact transpose + optional stencil rows.
pub struct CpuCompactOperator {
    a: CompactCsr,
    at: CompactCsr,
    stencil: Option<StencilOp>,
}

impl CpuCompactOperator {
    /// `stored`: the stored rows; `stencil`: rows generated from the grid, appended after them
    /// (their columns in the same numbering as `stored`'s).
    pub fn new(stored: &Csr, stencil: Option<StencilOp>, precision: Precision) -> Self {
        if let Some(s) = &stencil {
            assert_eq!(
                s.ncols(),
                stored.ncols(),
                "stencil and rows disagree on columns"
            );
        }
        let a = CompactCsr::from_csr(stored, precision);
        let at = CompactCsr::from_csr(&stored.transpose(), precision);
        CpuCompactOperator { a, at, stencil }
    }

    pub fn stored(&self) -> &CompactCsr {
        &self.a
    }
    pub fn transposed(&self) -> &CompactCsr {
        &self.at
    }
    pub fn stencil(&self) -> Option<&StencilOp> {
        self.stencil.as_ref()
    }
    /// Bytes of matrix storage (both compact copies; a stencil stores nothing but its
    /// renumbering tables).
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

/// The lanes of row `r`'s sum ([`Lanes`]: the CSR operator's order) for a matrix with filler
/// entries, which add no term (checked per entry).
fn filler_lanes(m: &CompactCsr, r: usize, x: &[f64]) -> Lanes {
    let mut l = Lanes::default();
    m.for_row(r, |c, v, filler| {
        if !filler {
            l.add(v * x[c as usize]);
        }
    });
    l
}

/// The lanes of row `r`'s sum for a matrix without fillers, from its arrays (`ptr`, `base`,
/// `delta`, values `v`), without bounds checks on x: inlined into the row loop, so that a short
/// row costs no call and no dispatch on the value type.
#[inline(always)]
fn plain_lanes<V: Copy>(
    (ptr, base, delta): (&[u64], &[u32], &[u16]),
    v: &[V],
    r: usize,
    x: &[f64],
) -> Lanes
where
    f64: From<V>,
{
    let (s, e) = (ptr[r] as usize, ptr[r + 1] as usize);
    let (d, v) = (&delta[s..e], &v[s..e]);
    let mut c = base[r] as usize;
    // SAFETY: a CompactCsr is built from a valid Csr, so every decoded column is < ncols, and
    // `product`, the only caller, asserts x.len() >= ncols; k < d.len() == v.len().
    Lanes::of(d.len(), |k| unsafe {
        c += *d.get_unchecked(k) as usize;
        debug_assert!(c < x.len());
        f64::from(*v.get_unchecked(k)) * x.get_unchecked(c)
    })
}

/// out = alpha * (rows of `m`) x + beta * out, each row's lanes continued by `extra` (the
/// stencil's transposed terms) before they are summed. Whether `m` has fillers and its value
/// type are decided once per product.
fn product<E: Fn(&mut Lanes, usize) + Sync>(
    m: &CompactCsr,
    x: &[f64],
    out: &mut [f64],
    (alpha, beta): (f64, f64),
    extra: &E,
) {
    // the bound plain_lanes' unchecked reads rely on
    assert!(
        x.len() >= m.ncols(),
        "compact product: x shorter than the columns"
    );
    let arrays = (m.ptr(), m.base(), m.delta());
    if m.entries() > m.nnz() {
        rows_par(m.ptr(), 0, out, alpha, beta, &|r| {
            let mut l = filler_lanes(m, r, x);
            extra(&mut l, r);
            l.sum()
        });
        return;
    }
    match m.values() {
        CompactValues::F64(v) => rows_par(m.ptr(), 0, out, alpha, beta, &|r| {
            let mut l = plain_lanes(arrays, v, r, x);
            extra(&mut l, r);
            l.sum()
        }),
        CompactValues::F32(v) => rows_par(m.ptr(), 0, out, alpha, beta, &|r| {
            let mut l = plain_lanes(arrays, v, r, x);
            extra(&mut l, r);
            l.sum()
        }),
    }
}

/// out[k] = alpha * f(row0 + k) + beta * out[k] for the rows of `out`, split by entries.
fn rows_par<F: Fn(usize) -> f64 + Sync>(
    ptr: &[u64],
    row0: usize,
    out: &mut [f64],
    alpha: f64,
    beta: f64,
    f: &F,
) {
    let nrows = out.len();
    let work = ptr[row0 + nrows] - ptr[row0] + nrows as u64;
    if work <= GRAIN || nrows < 2 {
        for (k, o) in out.iter_mut().enumerate() {
            let s = f(row0 + k);
            *o = if beta == 0.0 {
                alpha * s
            } else {
                alpha * s + beta * *o
            };
        }
        return;
    }
    let target = ptr[row0] + (ptr[row0 + nrows] - ptr[row0]) / 2;
    let mid = ptr[row0..=row0 + nrows]
        .partition_point(|&p| p <= target)
        .clamp(1, nrows - 1);
    let (lo, hi) = out.split_at_mut(mid);
    rayon::join(
        || rows_par(ptr, row0, lo, alpha, beta, f),
        || rows_par(ptr, row0 + mid, hi, alpha, beta, f),
    );
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
        product(&self.a, x, ys, (s.alpha, s.beta), &|_, _| {});
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
        match &self.stencil {
            None => product(&self.at, ys, x, ab, &|_, _| {}),
            Some(st) => product(&self.at, ys, x, ab, &|l, j| st.add_transposed(l, j, yd)),
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
                let ops = [
                    CpuCompactOperator::new(
                        &k,
                        Some(StencilOp::new(st, p.clone())),
                        Precision::F64,
                    ),
                    CpuCompactOperator::new(&full, None, Precision::F64),
                ];
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
