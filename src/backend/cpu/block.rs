//! Blocks of k vectors on the CPU (row-major, [`crate::backend::batch`]) and the block products
//! of a CSR matrix with weighted rows ([`CpuBlockOperator`]).
//!
//! Every member's numbers are bitwise those of the single-vector kernels on its column: a row
//! sum adds its terms in [`crate::sparse::Lanes`]' four lanes, a weighted entry is `(a w_j)
//! x_j` (the single solve stores `a w_j`), and norms sum [`CHUNK`] rows at a time in
//! `lane_sum`'s eight lanes, the chunk sums in order. Rows are split across rayon's threads by
//! entries; a block's rows are contiguous, so each thread writes its own slice.

use rayon::prelude::*;

use super::block_rows::{Classes, Product, GROUP};
use super::{CpuBackend, CHUNK};
use crate::backend::batch::{check, weighted_rows, BatchBackend, BlockOperator, BlockScale, Side};
use crate::backend::XwStep;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::sparse::par::{blocks_for, row_blocks, split_parts};
use crate::sparse::Csr;

/// `rows x k` values, row-major: entry (i, j) at `i * k + j`.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuBlock {
    data: Vec<f64>,
    rows: usize,
    k: usize,
}

impl CpuBlock {
    /// The values, row-major.
    pub fn data(&self) -> &[f64] {
        &self.data
    }
}

/// One chunk of the LSQR update: w, x, v, var and the partial sums.
type UpdateJob<'a> = (
    (
        ((&'a mut [f64], &'a mut [f64]), &'a [f64]),
        Option<&'a mut [f64]>,
    ),
    &'a mut [f64],
);

fn check_shape(what: &str, x: &CpuBlock, rows: usize, k: usize) -> Result<()> {
    check::shape(what, (x.rows, x.k), rows, k)
}

/// `f` (one value per member) repeated for 8 rows: the factors of a flat loop over 8 rows of a
/// block, so per-member kernels run as long loops over contiguous values.
fn rep8(f: &[f64]) -> Vec<f64> {
    (0..8 * f.len()).map(|i| f[i % f.len()]).collect()
}

/// `lane_sum` of `term(value, fac[j])` over the rows of one chunk (`d`: rows of k values) for
/// every member j at once: out[j] is bitwise `lane_sum(rows, |i| term(d[i * k + j], fac[j]))`.
/// Row i goes into lane i % 8, the lanes combined as `lane_sum` does; 8 rows are one flat
/// loop (lane l of member j at l k + j).
#[inline(always)]
fn lane_sums(d: &[f64], fac: &[f64], out: &mut [f64], term: impl Fn(f64, f64) -> f64) {
    let k = fac.len();
    let rows = d.len() / k;
    let rep = rep8(fac);
    let mut acc = vec![0.0f64; 8 * k];
    let n8 = rows - rows % 8;
    for block in d[..n8 * k].chunks_exact(8 * k) {
        for ((a, &v), &f) in acc.iter_mut().zip(block).zip(&rep) {
            *a += term(v, f);
        }
    }
    for (j, o) in out.iter_mut().enumerate() {
        let a = |l: usize| acc[l * k + j];
        let p = [a(0) + a(4), a(1) + a(5), a(2) + a(6), a(3) + a(7)];
        *o = (p[0] + p[2]) + (p[1] + p[3]);
    }
    for row in d[n8 * k..].chunks_exact(k) {
        for ((o, &v), &f) in out.iter_mut().zip(row).zip(fac) {
            *o += term(v, f);
        }
    }
}

/// Per chunk of [`CHUNK`] rows, `f(the chunk's values, its partial sums)`;
/// then out[j] = member j's chunk sums added in chunk order (as `CpuBackend::reduce` adds them).
fn chunked_sums<F>(rows: usize, k: usize, data: &[f64], out: &mut [f64], f: F)
where
    F: Fn(&[f64], &mut [f64]) + Sync,
{
    if k == 0 {
        return;
    }
    let nchunks = rows.div_ceil(CHUNK);
    let mut parts = vec![0.0; nchunks * k];
    let per = CHUNK * k;
    let one = |(c, p): (usize, &mut [f64])| {
        let d = &data[c * per..((c + 1) * per).min(data.len())];
        f(d, p)
    };
    if nchunks <= 2 {
        parts.chunks_mut(k).enumerate().for_each(one);
    } else {
        parts.par_chunks_mut(k).enumerate().for_each(one);
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = (0..nchunks).map(|c| parts[c * k + j]).sum();
    }
}

/// Apply `f(values)` to the block's rows in parallel chunks of [`CHUNK`] rows.
fn par_rows(x: &mut CpuBlock, f: impl Fn(&mut [f64]) + Sync) {
    let per = (CHUNK * x.k).max(1);
    if x.data.len() <= 2 * per {
        f(&mut x.data);
    } else {
        x.data.par_chunks_mut(per).for_each(&f);
    }
}

impl BatchBackend for CpuBackend {
    type Block = CpuBlock;

    fn block_zeros(&self, rows: usize, k: usize) -> Result<CpuBlock> {
        let len = check::len(rows, k)?;
        Ok(CpuBlock {
            data: vec![0.0; len],
            rows,
            k,
        })
    }
    fn block_shape(&self, x: &CpuBlock) -> (usize, usize) {
        (x.rows, x.k)
    }
    fn block_column(&self, x: &CpuBlock, j: usize) -> Result<Vec<f64>> {
        check::column(j, x.k)?;
        Ok(x.data.iter().skip(j).step_by(x.k).copied().collect())
    }
    fn block_set_column(&self, x: &mut CpuBlock, j: usize, col: &[f64]) -> Result<()> {
        check::set_column(j, col.len(), (x.rows, x.k))?;
        for (r, &v) in x.data.chunks_exact_mut(x.k).zip(col) {
            r[j] = v;
        }
        Ok(())
    }
    fn block_keep(&self, x: &mut CpuBlock, keep: &[usize]) -> Result<()> {
        if !check::keep(keep, x.k)? {
            return Ok(());
        }
        let k2 = keep.len();
        let mut data = vec![0.0; x.rows * k2];
        if k2 > 0 {
            for (dst, src) in data.chunks_exact_mut(k2).zip(x.data.chunks_exact(x.k)) {
                for (d, &j) in dst.iter_mut().zip(keep) {
                    *d = src[j];
                }
            }
        }
        x.data = data;
        x.k = k2;
        Ok(())
    }
    fn block_norms_sq(&self, x: &CpuBlock, factor: Option<&[f64]>, out: &mut [f64]) -> Result<()> {
        let k = x.k;
        if out.len() != k || factor.is_some_and(|f| f.len() != k) {
            return Err(Error::Invalid("block norms: one value per column".into()));
        }
        let ones = vec![1.0; k];
        chunked_sums(x.rows, k, &x.data, out, |d, p| match factor {
            None => lane_sums(d, &ones, p, |v, _| v * v),
            Some(f) => lane_sums(d, f, p, |v, f| {
                let v = v * f;
                v * v
            }),
        });
        Ok(())
    }
    fn block_scale(&self, x: &mut CpuBlock, a: &[f64]) -> Result<()> {
        let k = x.k;
        if a.len() != k {
            return Err(Error::Invalid("block scale: one value per column".into()));
        }
        if k > 0 {
            let rep = rep8(a);
            par_rows(x, |d| {
                for r in d.chunks_mut(8 * k) {
                    r.iter_mut().zip(&rep).for_each(|(v, &s)| *v *= s);
                }
            });
        }
        Ok(())
    }
    fn block_axpby(&self, a: f64, x: &CpuBlock, b: &[f64], y: &mut CpuBlock) -> Result<()> {
        check_shape("block axpby", y, x.rows, x.k)?;
        let k = x.k;
        if b.len() != k {
            return Err(Error::Invalid("block axpby: one value per column".into()));
        }
        if k == 0 {
            return Ok(());
        }
        let per = CHUNK * k;
        let rep = rep8(b);
        y.data
            .par_chunks_mut(per)
            .zip(x.data.par_chunks(per))
            .for_each(|(ys, xs)| {
                for (yr, xr) in ys.chunks_mut(8 * k).zip(xs.chunks(8 * k)) {
                    for ((yi, &xi), &bj) in yr.iter_mut().zip(xr).zip(&rep) {
                        *yi = a * xi + bj * *yi;
                    }
                }
            });
        Ok(())
    }
    fn block_lsqr_update(
        &self,
        steps: &[XwStep],
        v: &CpuBlock,
        (x, w): (&mut CpuBlock, &mut CpuBlock),
        var: Option<&mut CpuBlock>,
        out: &mut [f64],
    ) -> Result<()> {
        let (rows, k) = (v.rows, v.k);
        check_shape("block update x", x, rows, k)?;
        check_shape("block update w", w, rows, k)?;
        if steps.len() != k || out.len() != k {
            return Err(Error::Invalid("block update: one step per column".into()));
        }
        if k == 0 {
            return Ok(());
        }
        if let Some(vr) = var.as_deref() {
            check_shape("block update var", vr, rows, k)?;
        }
        let per = CHUNK * k;
        let nchunks = rows.div_ceil(CHUNK);
        let mut parts = vec![0.0; nchunks * k];
        let vars: Vec<Option<&mut [f64]>> = match var {
            Some(vr) => vr.data.chunks_mut(per).map(Some).collect(),
            None => (0..nchunks).map(|_| None).collect(),
        };
        let jobs: Vec<_> = w
            .data
            .chunks_mut(per)
            .zip(x.data.chunks_mut(per))
            .zip(v.data.chunks(per))
            .zip(vars)
            .zip(parts.chunks_mut(k))
            .collect();
        let inv_rho: Vec<f64> = steps.iter().map(|st| st.inv_rho).collect();
        let (r_inv, r_t1, r_t2) = (
            rep8(&inv_rho),
            rep8(&steps.iter().map(|st| st.t1).collect::<Vec<_>>()),
            rep8(&steps.iter().map(|st| st.t2).collect::<Vec<_>>()),
        );
        let one = |((((ws, xs), vs), var), p): UpdateJob<'_>| {
            // ||dk||^2 = ||w / rho||^2 of the old w, in lanes (as `lsqr_update`).
            lane_sums(ws, &inv_rho, p, |w, f| (f * w) * (f * w));
            if let Some(vr) = var {
                for (vb, wb) in vr.chunks_mut(8 * k).zip(ws.chunks(8 * k)) {
                    for ((vi, &wi), &f) in vb.iter_mut().zip(wb).zip(&r_inv) {
                        let dk = f * wi;
                        *vi += dk * dk;
                    }
                }
            }
            let blocks = xs.chunks_mut(8 * k).zip(ws.chunks_mut(8 * k));
            for ((xb, wb), vb) in blocks.zip(vs.chunks(8 * k)) {
                let it = xb.iter_mut().zip(wb.iter_mut()).zip(vb);
                for ((((xi, wi), &vi), &t1), &t2) in it.zip(&r_t1).zip(&r_t2) {
                    let w0 = *wi;
                    *xi += t1 * w0;
                    *wi = vi + t2 * w0;
                }
            }
        };
        if nchunks <= 2 {
            jobs.into_iter().for_each(one);
        } else {
            jobs.into_par_iter().for_each(one);
        }
        for (j, o) in out.iter_mut().enumerate() {
            *o = (0..nchunks).map(|c| parts[c * k + j]).sum();
        }
        Ok(())
    }
    fn block_allreduce_sum(&self, comm: &dyn Comm, x: &mut CpuBlock) -> Result<()> {
        comm.allreduce_sum(&mut x.data)
    }
}

/// A CSR matrix applied to blocks: its rows for A X, an explicit transpose (CSR of A^T, the
/// single CPU operator's CSC copy) for A^T Y; rows of class 1 are weighted (member j's
/// `w[j]`).
pub struct CpuBlockOperator {
    a: Csr,
    at: Csr,
    /// Per row of `a`: 1 where weighted (None: no weighted rows).
    row_class: Option<Vec<u8>>,
    /// Per entry of `at`: the class of the row it came from.
    entry_class: Option<Vec<u8>>,
}

impl CpuBlockOperator {
    /// `a` with the rows where `weighted[r]` is true weighted per member (None: no weighted
    /// rows, the members differ by LSQR's damping only).
    pub fn new(a: Csr, weighted: Option<Vec<bool>>) -> Result<Self> {
        if let Some(w) = &weighted {
            if w.len() != a.nrows() {
                return Err(Error::Invalid(format!(
                    "{} row weights flags for {} rows",
                    w.len(),
                    a.nrows()
                )));
            }
        }
        let at = a.transpose();
        let row_class: Option<Vec<u8>> = weighted.map(|w| w.iter().map(|&b| u8::from(b)).collect());
        let entry_class = row_class
            .as_ref()
            .map(|c| at.indices().iter().map(|&r| c[r as usize]).collect());
        Ok(CpuBlockOperator {
            a,
            at,
            row_class,
            entry_class,
        })
    }
    /// The matrix (rows as stored).
    pub fn matrix(&self) -> &Csr {
        &self.a
    }
}

impl Product<'_> {
    /// The rows `r0..` of the product into `out` (their k values each): with AVX2's
    /// intrinsics where the CPU has it (four members an instruction; the same sums bit for bit:
    /// src/backend/cpu/block_avx2.rs), else the portable kernel.
    fn rows(&self, r0: usize, out: &mut [f64]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // (AVX-512's 32 registers hold a group's lane sums and temporaries: the same
            // operations on 256-bit vectors)
            let avx512 = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl");
            // SAFETY: the CPU has AVX2, and AVX-512F and VL where `avx512` (checked above).
            unsafe { self.rows_vector(r0, out, avx512) };
            return;
        }
        self.rows_any(r0, out)
    }

    /// [`Self::rows`] with the vector kernels (`avx512`: built with AVX-512's registers).
    ///
    /// # Safety
    /// The CPU must have AVX2, and AVX-512F and AVX-512VL where `avx512`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_vector(&self, r0: usize, out: &mut [f64], avx512: bool) {
        for (j0, g) in super::block_rows::groups(self.k) {
            if g < 4 {
                // (fewer members than a vector holds: the portable kernel, compiled for AVX2;
                // its lanes are scalars)
                // SAFETY: the CPU has AVX2 (the caller's contract).
                unsafe { self.group_any_avx2(r0, j0, g, out) };
                continue;
            }
            // SAFETY: the caller's contract on the CPU; the product is consistent (`product`
            // checked the blocks' shapes and the factors' counts; the offsets, columns and
            // classes are the operator's own), and j0 + g <= k, 4 <= g <= GROUP.
            unsafe {
                if avx512 {
                    super::block_avx2::group_avx512(self, r0, j0, g, out)
                } else {
                    super::block_avx2::group(self, r0, j0, g, out)
                }
            };
        }
    }

    /// All rows, split across rayon's threads by entries.
    fn run(&self, out: &mut [f64]) {
        let nrows = self.ptr.len() - 1;
        let k = self.k;
        if k == 0 || nrows == 0 {
            return;
        }
        let work = (self.ptr[nrows] - self.ptr[0]) as usize * k.min(GROUP) + nrows;
        let parts = blocks_for(work, 4);
        if parts <= 1 {
            self.rows(0, out);
            return;
        }
        let bounds = row_blocks(self.ptr, parts);
        let pieces = split_parts(out, bounds.windows(2).map(|b| (b[1] - b[0]) * k));
        pieces
            .into_par_iter()
            .zip(bounds.par_windows(2))
            .for_each(|(o, b)| self.rows(b[0], o));
    }
}

impl CpuBlockOperator {
    fn product(
        &self,
        (m, classes): (&Csr, Classes<'_>),
        BlockScale { w, alpha, beta }: BlockScale,
        x: &CpuBlock,
        y: &mut CpuBlock,
    ) -> Result<()> {
        let k = x.k;
        check_shape("block product x", x, m.ncols(), k)?;
        check_shape("block product y", y, m.nrows(), k)?;
        if beta.len() != k || (self.row_class.is_some() && w.len() != k) {
            return Err(Error::Invalid(format!(
                "block product: {} betas and {} weights for {k} members",
                beta.len(),
                w.len()
            )));
        }
        let p = Product {
            ptr: m.indptr(),
            cols: m.indices(),
            vals: m.data(),
            class: classes,
            x: &x.data,
            k,
            w: if self.row_class.is_some() { w } else { &[] },
            alpha,
            beta,
        };
        p.run(&mut y.data);
        Ok(())
    }
}

impl BlockOperator<CpuBackend> for CpuBlockOperator {
    fn nrows(&self) -> usize {
        self.a.nrows()
    }
    fn ncols(&self) -> usize {
        self.a.ncols()
    }
    fn has_weighted_rows(&self) -> bool {
        self.row_class.is_some()
    }
    fn describe(&self) -> String {
        crate::backend::storage::describe_csr(crate::backend::Precision::F64)
    }
    fn member_matrix(&self, w: f64) -> Csr {
        weighted_rows(&self.a, self.row_class.as_deref(), w)
    }
    fn apply_block(
        &self,
        _: &CpuBackend,
        side: Side,
        s: BlockScale,
        input: &CpuBlock,
        out: &mut CpuBlock,
    ) -> Result<()> {
        let m = match side {
            Side::A => (
                &self.a,
                self.row_class
                    .as_deref()
                    .map_or(Classes::None, Classes::Rows),
            ),
            Side::At => (
                &self.at,
                self.entry_class
                    .as_deref()
                    .map_or(Classes::None, Classes::Entries),
            ),
        };
        self.product(m, s, input, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{cpu::CpuCsrOperator, TransposeStrategy};
    use crate::backend::{Backend, Operator, Scale, XwState};

    fn bits(x: &[f64]) -> Vec<u64> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn block_kernels_equal_the_single_kernels_column_by_column_bitwise() {
        let be = CpuBackend::new();
        let mut rng = crate::grid::Rng::new(3);
        // 3 chunks and a tail: the chunked sums in parallel; k over a group of 8
        for (rows, k) in [(2 * CHUNK + 77, 11usize), (1000, 3), (5, 1)] {
            let cols: Vec<Vec<f64>> = (0..k)
                .map(|_| crate::testproblems::with_negative_zeros(rows, 7, &mut rng))
                .collect();
            let mut x = be.block_zeros(rows, k).unwrap();
            for (j, c) in cols.iter().enumerate() {
                be.block_set_column(&mut x, j, c).unwrap();
            }
            let mut out = vec![0.0; k];
            be.block_norms_sq(&x, None, &mut out).unwrap();
            let f: Vec<f64> = (0..k).map(|j| 0.5 + j as f64).collect();
            let mut outf = vec![0.0; k];
            be.block_norms_sq(&x, Some(&f), &mut outf).unwrap();
            for j in 0..k {
                assert_eq!(out[j].to_bits(), be.norm_sq(&cols[j]).unwrap().to_bits());
                let mut y = vec![0.0; rows];
                be.copy_scaled(f[j], &cols[j], &mut y).unwrap();
                assert_eq!(outf[j].to_bits(), be.norm_sq(&y).unwrap().to_bits());
            }
            // the fused update, with var
            let steps: Vec<XwStep> = (0..k)
                .map(|j| XwStep {
                    t1: 0.3 + j as f64,
                    t2: -0.7 / (1.0 + j as f64),
                    inv_rho: 1.5 - 0.1 * j as f64,
                })
                .collect();
            let (mut xb, mut wb, mut vb) = (
                be.block_zeros(rows, k).unwrap(),
                be.block_zeros(rows, k).unwrap(),
                be.block_zeros(rows, k).unwrap(),
            );
            let mut var = be.block_zeros(rows, k).unwrap();
            let vs: Vec<Vec<f64>> = (0..k)
                .map(|_| (0..rows).map(|_| rng.uniform()).collect())
                .collect();
            for j in 0..k {
                be.block_set_column(&mut wb, j, &cols[j]).unwrap();
                be.block_set_column(&mut vb, j, &vs[j]).unwrap();
                be.block_set_column(&mut xb, j, &vs[(j + 1) % k]).unwrap();
            }
            let mut dk = vec![0.0; k];
            be.block_lsqr_update(&steps, &vb, (&mut xb, &mut wb), Some(&mut var), &mut dk)
                .unwrap();
            // member j's single update: (||d_k||^2, x, w, var)
            let single = |j: usize| {
                let (mut x1, mut w1) = (vs[(j + 1) % k].clone(), cols[j].clone());
                let mut v1 = vec![0.0; rows];
                let xw = XwState {
                    x: &mut x1,
                    w: &mut w1,
                    var: Some(&mut v1),
                };
                let s = be.lsqr_update(steps[j], &vs[j], xw).unwrap();
                (s, x1, w1, v1)
            };
            for (j, d) in dk.iter().enumerate() {
                let (s, x1, w1, v1) = single(j);
                assert_eq!(d.to_bits(), s.to_bits(), "rows {rows} k {k} j {j}");
                assert_eq!(bits(&be.block_column(&xb, j).unwrap()), bits(&x1));
                assert_eq!(bits(&be.block_column(&wb, j).unwrap()), bits(&w1));
                assert_eq!(bits(&be.block_column(&var, j).unwrap()), bits(&v1));
            }
            // keep: columns dropped and reordered
            let keep: Vec<usize> = (0..k).rev().step_by(2).collect();
            be.block_keep(&mut xb, &keep).unwrap();
            assert_eq!(be.block_shape(&xb), (rows, keep.len()));
            for (c, &j) in keep.iter().enumerate() {
                let x1 = single(j).1;
                assert_eq!(bits(&be.block_column(&xb, c).unwrap()), bits(&x1));
            }
        }
    }

    #[test]
    fn vector_kernels_equal_the_portable_kernel_bitwise() {
        // every group width (k 1..=25: groups of 1-12 members, whole and overlapping vectors),
        // every way of weighting, rows of 0-4 entries and longer ones, and betas of zero
        let a = crate::testproblems::awkward_csr(700, 90, 5);
        let mut rng = crate::grid::Rng::new(17);
        let row_class: Vec<u8> = (0..a.nrows()).map(|i| u8::from(i % 3 == 1)).collect();
        let entry_class: Vec<u8> = (0..a.nnz()).map(|p| u8::from(p % 5 < 2)).collect();
        for k in 1..=25usize {
            let x: Vec<f64> = crate::testproblems::with_negative_zeros(a.ncols() * k, 7, &mut rng);
            let y0: Vec<f64> = (0..a.nrows() * k).map(|_| rng.uniform() - 0.5).collect();
            let w: Vec<f64> = (0..k).map(|j| 0.3 + 0.17 * j as f64).collect();
            let beta: Vec<f64> = (0..k)
                .map(|j| if j % 3 == 0 { 0.0 } else { -0.25 * j as f64 })
                .collect();
            for class in [
                Classes::None,
                Classes::Rows(&row_class),
                Classes::Entries(&entry_class),
            ] {
                let p = Product {
                    ptr: a.indptr(),
                    cols: a.indices(),
                    vals: a.data(),
                    class,
                    x: &x,
                    k,
                    w: if matches!(class, Classes::None) {
                        &[]
                    } else {
                        &w
                    },
                    alpha: 1.5,
                    beta: &beta,
                };
                let mut want = y0.clone();
                p.rows_any(0, &mut want);
                let mut got = y0.clone();
                p.rows(0, &mut got);
                assert_eq!(bits(&got), bits(&want), "k {k}");
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    for avx512 in [false, true] {
                        if avx512
                            && !(std::arch::is_x86_feature_detected!("avx512f")
                                && std::arch::is_x86_feature_detected!("avx512vl"))
                        {
                            continue;
                        }
                        let mut got = y0.clone();
                        // SAFETY: the CPU has the features (checked above).
                        unsafe { p.rows_vector(0, &mut got, avx512) };
                        assert_eq!(bits(&got), bits(&want), "k {k} avx512 {avx512}");
                    }
                }
            }
        }
    }

    #[test]
    fn block_products_with_weighted_rows_equal_the_single_products_bitwise() {
        let be = CpuBackend::new();
        let g = crate::testproblems::awkward_csr(30_000, 900, 5);
        let r = crate::testproblems::awkward_csr(5000, 900, 6);
        let a = g.vstack_scaled(&r, 1.0).unwrap();
        // rows mixed: weighted rows between the others, as a row reordering leaves them
        let perm: Vec<usize> = (0..a.nrows()).map(|i| (i * 7919) % a.nrows()).collect();
        let a = a.select_rows(&perm);
        let flags: Vec<bool> = perm.iter().map(|&i| i >= g.nrows()).collect();
        let mut rng = crate::grid::Rng::new(9);
        for k in [1usize, 5, 11, 13] {
            let w: Vec<f64> = (0..k).map(|j| 0.01 * (j as f64 + 1.0).powi(2)).collect();
            let op = CpuBlockOperator::new(a.clone(), Some(flags.clone())).unwrap();
            let xs: Vec<Vec<f64>> = (0..k)
                .map(|_| crate::testproblems::with_negative_zeros(900, 5, &mut rng))
                .collect();
            let ys: Vec<Vec<f64>> = (0..k)
                .map(|_| (0..a.nrows()).map(|_| rng.uniform() - 0.5).collect())
                .collect();
            let (mut xb, mut yb) = (
                be.block_zeros(900, k).unwrap(),
                be.block_zeros(a.nrows(), k).unwrap(),
            );
            for j in 0..k {
                be.block_set_column(&mut xb, j, &xs[j]).unwrap();
                be.block_set_column(&mut yb, j, &ys[j]).unwrap();
            }
            let beta: Vec<f64> = (0..k)
                .map(|j| if j == 1 { 0.0 } else { -0.5 * j as f64 })
                .collect();
            let (mut yo, mut xo) = (yb.clone(), xb.clone());
            let s = BlockScale {
                w: &w,
                alpha: 1.0,
                beta: &beta,
            };
            op.apply_block(&be, Side::A, s, &xb, &mut yo).unwrap();
            op.apply_block(&be, Side::At, s, &yb, &mut xo).unwrap();
            for j in 0..k {
                let mut aw = a.clone();
                let vals: Vec<f64> = (0..aw.nrows())
                    .flat_map(|i| {
                        let f = if flags[i] { w[j] } else { 1.0 };
                        a.row(i).1.iter().map(move |v| v * f).collect::<Vec<_>>()
                    })
                    .collect();
                aw.data_mut().copy_from_slice(&vals);
                let single = CpuCsrOperator::new(aw, TransposeStrategy::Csc);
                let mut y1 = ys[j].clone();
                single
                    .apply(&be, Scale::new(1.0, beta[j]), &xs[j], &mut y1)
                    .unwrap();
                let mut x1 = xs[j].clone();
                single
                    .apply_t(&be, Scale::new(1.0, beta[j]), &ys[j], &mut x1)
                    .unwrap();
                assert_eq!(
                    bits(&be.block_column(&yo, j).unwrap()),
                    bits(&y1),
                    "A x, k {k} j {j}"
                );
                assert_eq!(
                    bits(&be.block_column(&xo, j).unwrap()),
                    bits(&x1),
                    "A^T y, k {k} j {j}"
                );
            }
        }
    }
}
