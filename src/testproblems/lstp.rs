//! Test problems with known solutions, for tests and benchmarks.
//!
//! [`Lstp`] is Paige & Saunders' LSTP generator (ACM TOMS 8(1), 1982, section 8; the test driver
//! distributed with LSQR): A = H_Y D H_Z with Householder reflectors H_Y = I - 2 hy hy^T,
//! H_Z = I - 2 hz hz^T (hy_i ~ sin(4 pi i / m), hz_i ~ cos(4 pi i / n), unit norm) and
//! D = diag(d_i), d_i = (ceil(i / nduplc) nduplc / min(m, n))^npower, so the SVD is known and the
//! damped least-squares solution can be written down exactly for any b.

use crate::backend::cpu::CpuBackend;
use crate::backend::{Operator, Scale};
use crate::error::Result;
use crate::sparse::Csr;

/// One LSTP problem: the operator, its right-hand side and the known solution.
#[derive(Debug, Clone)]
pub struct Lstp {
    pub m: usize,
    pub n: usize,
    pub damp: f64,
    hy: Vec<f64>,
    hz: Vec<f64>,
    d: Vec<f64>,
    /// Right-hand side built as in the original driver: b = r + A x_true.
    pub b: Vec<f64>,
    /// The generator's x (x_j = n - j); the exact damped solution when m >= n.
    pub x_true: Vec<f64>,
}

/// y = (I - 2 h h^T) x for unit h; h . x by compensated (Neumaier) summation, so that the test
/// operator itself adds as little rounding as possible.
fn householder(h: &[f64], x: &[f64], y: &mut [f64]) {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for (a, b) in h.iter().zip(x) {
        let t = a * b;
        let u = s + t;
        c += if s.abs() >= t.abs() {
            (s - u) + t
        } else {
            (t - u) + s
        };
        s = u;
    }
    let s = s + c;
    for ((yi, &hi), &xi) in y.iter_mut().zip(h).zip(x) {
        *yi = xi - 2.0 * s * hi;
    }
}

impl Lstp {
    pub fn new(m: usize, n: usize, nduplc: usize, npower: i32, damp: f64) -> Lstp {
        let unit = |v: Vec<f64>| {
            let s = v.iter().map(|a| a * a).sum::<f64>().sqrt();
            v.into_iter().map(|a| -a / s).collect::<Vec<_>>()
        };
        let fourpi = 4.0 * std::f64::consts::PI;
        let hy = unit(
            (1..=m)
                .map(|i| (i as f64 * fourpi / m as f64).sin())
                .collect(),
        );
        let hz = unit(
            (1..=n)
                .map(|i| (i as f64 * fourpi / n as f64).cos())
                .collect(),
        );
        let minmn = m.min(n);
        let d: Vec<f64> = (1..=minmn)
            .map(|i| {
                let j = (i - 1 + nduplc) / nduplc;
                ((j * nduplc) as f64 / minmn as f64).powi(npower)
            })
            .collect();
        let x_true: Vec<f64> = (1..=n).map(|j| (n - j) as f64).collect();
        // Residual r = H_Y [s; t], D s = damp^2 H_Z x, t arbitrary (alternating, growing).
        let mut hzx = vec![0.0; n];
        householder(&hz, &x_true, &mut hzx);
        let mut w = vec![0.0; m];
        for i in 0..minmn {
            w[i] = damp * damp * hzx[i] / d[i];
        }
        let mut t = 1.0;
        for (i, wi) in w.iter_mut().enumerate().skip(minmn) {
            *wi = t * (i + 1 - minmn) as f64 / m as f64;
            t = -t;
        }
        let mut b = vec![0.0; m];
        householder(&hy, &w, &mut b);
        let mut p = Lstp {
            m,
            n,
            damp,
            hy,
            hz,
            d,
            b: Vec::new(),
            x_true,
        };
        let ax = p.apply_dense(&p.x_true);
        p.b = b.iter().zip(&ax).map(|(r, a)| r + a).collect();
        p
    }

    /// A x (exact in the reflector form).
    pub fn apply_dense(&self, x: &[f64]) -> Vec<f64> {
        self.through_svd(&self.hz, x, &self.hy, |d, z| d * z)
    }

    /// A^T y.
    pub fn apply_t_dense(&self, y: &[f64]) -> Vec<f64> {
        self.through_svd(&self.hy, y, &self.hz, |d, z| d * z)
    }

    /// The minimiser of ||A x - b||^2 + damp^2 ||x||^2 (minimum norm when damp = 0), from the SVD.
    pub fn exact_solution(&self, b: &[f64]) -> Vec<f64> {
        self.through_svd(&self.hy, b, &self.hz, |d, c| {
            d * c / (d * d + self.damp * self.damp)
        })
    }

    /// H_out S H_in v, the products above in the SVD's terms: `v` reflected by `h_in`, entry i
    /// of that (i < min(m, n)) mapped by `diag(d_i, entry)` and the others set to 0, reflected
    /// by `h_out`.
    fn through_svd(
        &self,
        h_in: &[f64],
        v: &[f64],
        h_out: &[f64],
        diag: impl Fn(f64, f64) -> f64,
    ) -> Vec<f64> {
        let mut z = vec![0.0; h_in.len()];
        householder(h_in, v, &mut z);
        let mut dz = vec![0.0; h_out.len()];
        for i in 0..self.d.len() {
            dz[i] = diag(self.d[i], z[i]);
        }
        let mut y = vec![0.0; h_out.len()];
        householder(h_out, &dz, &mut y);
        y
    }

    /// Condition number of [A; damp I] (as the original driver prints it).
    pub fn cond(&self) -> f64 {
        let dmax = self.d.iter().cloned().fold(0.0, f64::max);
        let dmin = self.d.iter().cloned().fold(f64::INFINITY, f64::min);
        ((dmax * dmax + self.damp * self.damp) / (dmin * dmin + self.damp * self.damp)).sqrt()
    }

    /// The matrix as an explicit (dense) CSR, for tests of the sparse paths and the CLI.
    pub fn to_csr(&self) -> Csr {
        let mut indptr = vec![0u64];
        let mut indices = Vec::with_capacity(self.m * self.n);
        let mut data = Vec::with_capacity(self.m * self.n);
        let mut cols = Vec::with_capacity(self.n);
        for j in 0..self.n {
            let mut e = vec![0.0; self.n];
            e[j] = 1.0;
            cols.push(self.apply_dense(&e));
        }
        for i in 0..self.m {
            for (j, col) in cols.iter().enumerate() {
                if col[i] != 0.0 {
                    indices.push(j as u32);
                    data.push(col[i]);
                }
            }
            indptr.push(indices.len() as u64);
        }
        Csr::try_new(self.m, self.n, indptr, indices, data).expect("LSTP matrix is well formed")
    }
}

impl Operator<CpuBackend> for Lstp {
    fn nrows(&self) -> usize {
        self.m
    }
    fn ncols(&self) -> usize {
        self.n
    }
    fn apply(&self, _b: &CpuBackend, s: Scale, x: &Vec<f64>, y: &mut Vec<f64>) -> Result<()> {
        let ax = self.apply_dense(x);
        for (yi, a) in y.iter_mut().zip(ax) {
            *yi = s.alpha * a + s.beta * *yi;
        }
        Ok(())
    }
    fn apply_t(&self, _b: &CpuBackend, s: Scale, y: &Vec<f64>, x: &mut Vec<f64>) -> Result<()> {
        let aty = self.apply_t_dense(y);
        for (xi, a) in x.iter_mut().zip(aty) {
            *xi = s.alpha * a + s.beta * *xi;
        }
        Ok(())
    }
}
