//! Preconditioners for GMRES: z = M^-1 r on this rank's rows.
//!
//! - [`Identity`]: no preconditioning.
//! - [`Jacobi`]: M = diag(A). Zero or missing diagonal entries are replaced by 1 (that row is
//!   left unscaled), the same fallback as the SciPy/PETSc peer scripts; the count is reported.
//! - [`BlockIlu0`]: block Jacobi with one block per rank (the rows and columns this rank owns),
//!   each block factorised by ILU(0) (no fill beyond A's pattern). The triangular solves are exact
//!   (forward/backward substitution) or, as Ma et al. (2021) do on GPUs, a fixed number of Jacobi
//!   sweeps on L y = r and U z = y ([`TriSolve::Jacobi`]). A missing diagonal entry or a zero
//!   pivot is an error by default ([`PivotPolicy::Error`], as PETSc's ILU); with
//!   [`PivotPolicy::Shift`] the diagonal is added to the pattern and a zero (or tiny) pivot is
//!   replaced by the original row's largest magnitude (1 for an empty row), counted in
//!   [`BlockIlu0::replaced_pivots`]. Never NaN.
//!
//! [`Preconditioner`] is the trait a GPU backend implements for its own vectors.

use crate::backend::cpu::CpuBackend;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::sparse::Csr;

/// z = M^-1 r, both vectors of this rank's rows. `&mut self` lets an implementation keep
/// preallocated scratch space. `Send`: a one-rank CPU solve runs on a rayon worker
/// ([`crate::backend::cpu::on_pool`]).
pub trait Preconditioner<B: Backend>: Send {
    /// Short name for reports.
    fn name(&self) -> String;
    fn apply(&mut self, be: &B, r: &B::Vector, z: &mut B::Vector) -> Result<()>;
    /// Some when M^-1 is diagonal: the solver may then fold it into the operator's product
    /// ([`crate::backend::Operator::apply_scaled_rows`]) instead of calling [`Self::apply`].
    fn diagonal(&self) -> Option<Diagonal<'_, B::Vector>> {
        None
    }
}

/// A diagonal M^-1 ([`Preconditioner::diagonal`]).
pub enum Diagonal<'a, V> {
    /// M = I.
    Identity,
    /// M^-1 r = d .* r.
    Scale(&'a V),
}

impl<'a, V> Diagonal<'a, V> {
    /// d, or None for the identity.
    pub fn scale(&self) -> Option<&'a V> {
        match self {
            Diagonal::Identity => None,
            Diagonal::Scale(d) => Some(d),
        }
    }
}

/// z = M^-1 r computed on the host from slices (this rank's entries): a caller's own
/// preconditioner, such as the Python module's `M` (a LinearOperator or a callable). [`OnHost`]
/// makes it a [`Preconditioner`] of any backend.
pub trait HostPreconditioner: Send {
    /// Short name for reports.
    fn name(&self) -> String;
    fn apply(&mut self, r: &[f64], z: &mut [f64]) -> Result<()>;
}

/// A [`HostPreconditioner`] on any backend: r is downloaded into host scratch and z uploaded
/// from it (on a GPU, two transfers per application).
pub struct OnHost<H> {
    inner: H,
    r: Vec<f64>,
    z: Vec<f64>,
}

impl<H: HostPreconditioner> OnHost<H> {
    /// `inner` for vectors of `n` entries (the scratch is allocated here, once).
    pub fn new(inner: H, n: usize) -> Self {
        OnHost {
            inner,
            r: vec![0.0; n],
            z: vec![0.0; n],
        }
    }
}

impl<B: Backend, H: HostPreconditioner> Preconditioner<B> for OnHost<H> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn apply(&mut self, be: &B, r: &B::Vector, z: &mut B::Vector) -> Result<()> {
        if be.len(r) != self.r.len() || be.len(z) != self.z.len() {
            return Err(Error::Invalid(format!(
                "preconditioner {}: sized for {} entries, applied to {}",
                self.inner.name(),
                self.r.len(),
                be.len(r)
            )));
        }
        be.download(r, &mut self.r)?;
        self.inner.apply(&self.r, &mut self.z)?;
        *z = be.upload(&self.z)?;
        Ok(())
    }
}

impl<H: HostPreconditioner + ?Sized> HostPreconditioner for Box<H> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn apply(&mut self, r: &[f64], z: &mut [f64]) -> Result<()> {
        (**self).apply(r, z)
    }
}

/// M = I.
pub struct Identity;

impl<B: Backend> Preconditioner<B> for Identity {
    fn name(&self) -> String {
        "none".into()
    }
    fn apply(&mut self, be: &B, r: &B::Vector, z: &mut B::Vector) -> Result<()> {
        be.copy(r, z)
    }
    fn diagonal(&self) -> Option<Diagonal<'_, B::Vector>> {
        Some(Diagonal::Identity)
    }
}

/// M = diag(A); zero/missing diagonal entries count as 1.
pub struct Jacobi<B: Backend> {
    inv_diag: B::Vector,
    /// Rows whose diagonal was zero or missing (left unscaled).
    pub zero_diagonals: usize,
}

impl<B: Backend> Jacobi<B> {
    /// `diag` holds this rank's diagonal entries (0 where absent).
    pub fn new(be: &B, diag: &[f64]) -> Result<Self> {
        let mut zero = 0usize;
        let inv: Vec<f64> = diag
            .iter()
            .map(|&d| {
                if d != 0.0 && d.is_finite() {
                    1.0 / d
                } else {
                    zero += 1;
                    1.0
                }
            })
            .collect();
        Ok(Jacobi {
            inv_diag: be.upload(&inv)?,
            zero_diagonals: zero,
        })
    }
}

impl<B: Backend> Preconditioner<B> for Jacobi<B> {
    fn name(&self) -> String {
        "jacobi".into()
    }
    fn apply(&mut self, be: &B, r: &B::Vector, z: &mut B::Vector) -> Result<()> {
        be.pointwise_mul(&self.inv_diag, r, z)
    }
    fn diagonal(&self) -> Option<Diagonal<'_, B::Vector>> {
        Some(Diagonal::Scale(&self.inv_diag))
    }
}

/// What ILU(0) does with a missing diagonal entry or a zero pivot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PivotPolicy {
    /// Stop with an error naming the row.
    Error,
    /// Insert the diagonal; replace a zero or tiny pivot by the row's largest magnitude.
    Shift,
}

choice_from_str!(PivotPolicy, "pivot policy", "error" => Self::Error, "shift" => Self::Shift);

/// How the triangular systems of ILU(0) are solved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "sweeps")]
pub enum TriSolve {
    /// Forward and backward substitution.
    Exact,
    /// This many Jacobi sweeps on each triangular system (Ma et al. 2021), from y = r and
    /// z = D^-1 y.
    Jacobi(usize),
}

/// Block-Jacobi ILU(0), one block per rank (host memory).
pub struct BlockIlu0 {
    n: usize,
    /// L (strictly lower, unit diagonal implied) and U (with diagonal) in one CSR pattern.
    indptr: Vec<usize>,
    indices: Vec<u32>,
    lu: Vec<f64>,
    /// Position of the diagonal in each row.
    diag: Vec<usize>,
    inv_diag: Vec<f64>,
    tri: TriSolve,
    y: Vec<f64>,
    tmp: Vec<f64>,
    /// Pivots replaced under [`PivotPolicy::Shift`].
    pub replaced_pivots: usize,
    /// Diagonal entries inserted into the pattern under [`PivotPolicy::Shift`].
    pub inserted_diagonals: usize,
}

impl BlockIlu0 {
    /// Factorise the block `a[0..n, 0..n]` of this rank's rows (`a` may have more columns: ghost
    /// columns >= n are dropped). `row0` is the global index of local row 0, for messages.
    pub fn new(a: &Csr, n: usize, row0: usize, policy: PivotPolicy, tri: TriSolve) -> Result<Self> {
        if a.nrows() != n || a.ncols() < n {
            return Err(Error::Invalid(format!(
                "block ILU(0): local matrix is {} x {}, expected {n} rows and >= {n} columns",
                a.nrows(),
                a.ncols()
            )));
        }
        if let TriSolve::Jacobi(0) = tri {
            return Err(Error::Invalid(
                "block ILU(0): the Jacobi triangular solve needs at least one sweep".into(),
            ));
        }
        let mut indptr = Vec::with_capacity(n + 1);
        let mut indices = Vec::with_capacity(a.nnz() + n);
        let mut lu = Vec::with_capacity(a.nnz() + n);
        let mut diag = vec![0usize; n];
        let mut rowmax = vec![0f64; n];
        let mut inserted = 0usize;
        indptr.push(0);
        for (i, d) in diag.iter_mut().enumerate() {
            let (c, v) = a.row(i);
            let mut have_diag = false;
            for (&j, &x) in c.iter().zip(v) {
                if (j as usize) >= n {
                    continue;
                }
                if !have_diag && j as usize > i {
                    // missing diagonal: insert before the first upper entry
                    no_diagonal(policy, row0 + i)?;
                    *d = indices.len();
                    indices.push(i as u32);
                    lu.push(0.0);
                    inserted += 1;
                    have_diag = true;
                }
                if j as usize == i {
                    *d = indices.len();
                    have_diag = true;
                }
                rowmax[i] = rowmax[i].max(x.abs());
                indices.push(j);
                lu.push(x);
            }
            if !have_diag {
                no_diagonal(policy, row0 + i)?;
                *d = indices.len();
                indices.push(i as u32);
                lu.push(0.0);
                inserted += 1;
            }
            indptr.push(indices.len());
        }
        // IKJ ILU(0) with a marker array.
        let mut pos = vec![usize::MAX; n];
        let mut replaced = 0usize;
        for i in 0..n {
            let (s, e) = (indptr[i], indptr[i + 1]);
            for p in s..e {
                pos[indices[p] as usize] = p;
            }
            for p in s..diag[i] {
                let k = indices[p] as usize;
                let lik = lu[p] / lu[diag[k]];
                lu[p] = lik;
                for q in diag[k] + 1..indptr[k + 1] {
                    let jcol = indices[q] as usize;
                    let t = pos[jcol];
                    if t != usize::MAX {
                        lu[t] -= lik * lu[q];
                    }
                }
            }
            let piv = lu[diag[i]];
            let scale = if rowmax[i] > 0.0 { rowmax[i] } else { 1.0 };
            if !piv.is_finite() || piv.abs() <= 1e-14 * scale {
                match policy {
                    PivotPolicy::Error => {
                        return Err(Error::Invalid(format!(
                            "block ILU(0): zero pivot ({piv:e}) at row {} (use --ilu-pivot shift, or the jacobi preconditioner)",
                            row0 + i
                        )))
                    }
                    PivotPolicy::Shift => {
                        lu[diag[i]] = if piv < 0.0 { -scale } else { scale };
                        replaced += 1;
                    }
                }
            }
            for p in s..e {
                pos[indices[p] as usize] = usize::MAX;
            }
        }
        let inv_diag = diag.iter().map(|&d| 1.0 / lu[d]).collect();
        Ok(BlockIlu0 {
            n,
            indptr,
            indices,
            lu,
            diag,
            inv_diag,
            tri,
            y: vec![0.0; n],
            tmp: vec![0.0; n],
            replaced_pivots: replaced,
            inserted_diagonals: inserted,
        })
    }

    /// The factors as strictly lower L (unit diagonal implied) and strictly upper U, each n x n
    /// with the pattern's order kept, the inverted diagonal of U, and the triangular solve
    /// (for a device copy that repeats [`BlockIlu0::solve`]'s arithmetic).
    pub fn split_factors(&self) -> Result<(Csr, Csr, Vec<f64>, TriSolve)> {
        let n = self.n;
        let (mut lp, mut li, mut lv) = (vec![0u64], Vec::new(), Vec::new());
        let (mut up, mut ui, mut uv) = (vec![0u64], Vec::new(), Vec::new());
        for i in 0..n {
            for p in self.indptr[i]..self.diag[i] {
                li.push(self.indices[p]);
                lv.push(self.lu[p]);
            }
            for p in self.diag[i] + 1..self.indptr[i + 1] {
                ui.push(self.indices[p]);
                uv.push(self.lu[p]);
            }
            lp.push(li.len() as u64);
            up.push(ui.len() as u64);
        }
        Ok((
            Csr::try_new(n, n, lp, li, lv)?,
            Csr::try_new(n, n, up, ui, uv)?,
            self.inv_diag.clone(),
            self.tri,
        ))
    }

    /// z = U^-1 L^-1 r on host slices.
    pub fn solve(&mut self, r: &[f64], z: &mut [f64]) {
        let n = self.n;
        debug_assert!(r.len() == n && z.len() == n);
        let (ip, ix, lu, dg) = (&self.indptr, &self.indices, &self.lu, &self.diag);
        match self.tri {
            TriSolve::Exact => {
                let y = &mut self.y;
                for i in 0..n {
                    let mut s = r[i];
                    for p in ip[i]..dg[i] {
                        s -= lu[p] * y[ix[p] as usize];
                    }
                    y[i] = s;
                }
                for i in (0..n).rev() {
                    let mut s = y[i];
                    for p in dg[i] + 1..ip[i + 1] {
                        s -= lu[p] * z[ix[p] as usize];
                    }
                    z[i] = s * self.inv_diag[i];
                }
            }
            TriSolve::Jacobi(sweeps) => {
                // L y = r: y <- r - (L - I) y, from y = r.
                let (y, tmp) = (&mut self.y, &mut self.tmp);
                y.copy_from_slice(r);
                for _ in 0..sweeps {
                    for i in 0..n {
                        let mut s = r[i];
                        for p in ip[i]..dg[i] {
                            s -= lu[p] * y[ix[p] as usize];
                        }
                        tmp[i] = s;
                    }
                    std::mem::swap(y, tmp);
                }
                // U z = y: z <- D^-1 (y - (U - D) z), from z = D^-1 y.
                for i in 0..n {
                    z[i] = y[i] * self.inv_diag[i];
                }
                for _ in 0..sweeps {
                    for i in 0..n {
                        let mut s = y[i];
                        for p in dg[i] + 1..ip[i + 1] {
                            s -= lu[p] * z[ix[p] as usize];
                        }
                        tmp[i] = s * self.inv_diag[i];
                    }
                    z.copy_from_slice(tmp);
                }
            }
        }
    }
}

impl Preconditioner<CpuBackend> for BlockIlu0 {
    fn name(&self) -> String {
        match self.tri {
            TriSolve::Exact => "block-ilu0".into(),
            TriSolve::Jacobi(s) => format!("block-ilu0 (jacobi triangular solves, {s} sweeps)"),
        }
    }
    fn apply(&mut self, _be: &CpuBackend, r: &Vec<f64>, z: &mut Vec<f64>) -> Result<()> {
        self.solve(r, z);
        Ok(())
    }
}

/// A row without a diagonal entry: an error under [`PivotPolicy::Error`], else a zero diagonal
/// is inserted (and shifted like any zero pivot).
fn no_diagonal(policy: PivotPolicy, row: usize) -> Result<()> {
    if policy == PivotPolicy::Error {
        return Err(Error::Invalid(format!(
            "block ILU(0): row {row} has no diagonal entry (use --ilu-pivot shift, or the jacobi preconditioner)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tridiag(n: usize) -> Csr {
        let (mut r, mut c, mut v) = (vec![], vec![], vec![]);
        for i in 0..n {
            r.push(i as u64);
            c.push(i as u64);
            v.push(4.0);
            if i > 0 {
                r.push(i as u64);
                c.push(i as u64 - 1);
                v.push(-1.0);
            }
            if i + 1 < n {
                r.push(i as u64);
                c.push(i as u64 + 1);
                v.push(-2.0);
            }
        }
        Csr::from_triplets(n, n, &r, &c, &v).unwrap()
    }

    #[test]
    fn ilu0_of_tridiagonal_is_exact_lu() {
        // ILU(0) of a tridiagonal matrix has no dropped fill: M^-1 A x = x.
        let a = tridiag(50);
        let x: Vec<f64> = (0..50).map(|i| (i as f64 * 0.3).sin() + 1.0).collect();
        let b = a.matvec(&x);
        let mut p = BlockIlu0::new(&a, 50, 0, PivotPolicy::Error, TriSolve::Exact).unwrap();
        let mut z = vec![0.0; 50];
        p.solve(&b, &mut z);
        for (zi, xi) in z.iter().zip(&x) {
            assert!((zi - xi).abs() < 1e-12, "{zi} vs {xi}");
        }
        // Jacobi sweeps converge to the exact triangular solves (n sweeps are exact for a
        // bidiagonal factor).
        let mut pj = BlockIlu0::new(&a, 50, 0, PivotPolicy::Error, TriSolve::Jacobi(50)).unwrap();
        let mut zj = vec![0.0; 50];
        pj.solve(&b, &mut zj);
        for (zi, xi) in zj.iter().zip(&x) {
            assert!((zi - xi).abs() < 1e-10, "{zi} vs {xi}");
        }
        // A few sweeps give an approximation, not NaN.
        let mut p3 = BlockIlu0::new(&a, 50, 0, PivotPolicy::Error, TriSolve::Jacobi(3)).unwrap();
        p3.solve(&b, &mut zj);
        assert!(zj.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn missing_diagonal_is_an_error_or_a_counted_shift() {
        // [[0 1],[1 0]]: no diagonal at all.
        let a = Csr::from_triplets(2, 2, &[0, 1], &[1, 0], &[1.0, 1.0]).unwrap();
        let e = BlockIlu0::new(&a, 2, 10, PivotPolicy::Error, TriSolve::Exact)
            .err()
            .unwrap();
        assert!(e.to_string().contains("row 10 has no diagonal"), "{e}");
        let mut p = BlockIlu0::new(&a, 2, 0, PivotPolicy::Shift, TriSolve::Exact).unwrap();
        assert_eq!(p.inserted_diagonals, 2);
        assert!(p.replaced_pivots >= 1);
        let mut z = vec![0.0; 2];
        p.solve(&[1.0, 2.0], &mut z);
        assert!(z.iter().all(|v| v.is_finite()));
        // zero pivot present in the pattern
        let a =
            Csr::from_triplets(2, 2, &[0, 0, 1, 1], &[0, 1, 0, 1], &[0.0, 1.0, 1.0, 1.0]).unwrap();
        let e = BlockIlu0::new(&a, 2, 0, PivotPolicy::Error, TriSolve::Exact)
            .err()
            .unwrap();
        assert!(e.to_string().contains("zero pivot"), "{e}");
    }

    #[test]
    fn jacobi_zero_diagonal_falls_back_to_one() {
        let be = CpuBackend::new();
        let mut j = Jacobi::new(&be, &[2.0, 0.0, -4.0]).unwrap();
        assert_eq!(j.zero_diagonals, 1);
        let mut z = vec![0.0; 3];
        j.apply(&be, &vec![1.0, 1.0, 1.0], &mut z).unwrap();
        assert_eq!(z, vec![0.5, 1.0, -0.25]);
    }
}
