//! The small least-squares problem of a cycle on the host: Givens rotations of the Hessenberg
//! columns (the residual estimate |g[j+1]| after each step), the triangular solve for y, and the
//! coefficients of the update x += V y (left) or x += M^-1 V y (right).

use crate::error::{Error, Result};

/// A Givens rotation (c, s) with c a + s b = r, -s a + c b = 0.
fn givens(a: f64, b: f64) -> (f64, f64) {
    if b == 0.0 {
        (1.0, 0.0)
    } else if b.abs() > a.abs() {
        let t = a / b;
        let s = 1.0 / (1.0 + t * t).sqrt();
        (s * t, s)
    } else {
        let t = b / a;
        let c = 1.0 / (1.0 + t * t).sqrt();
        (c, c * t)
    }
}

/// Solve the leading k x k upper-triangular part of H y = g; trailing zero diagonals (from a
/// breakdown) give zero components, as SciPy's UPDATE does.
fn solve_upper(h: &[f64], ld: usize, g: &[f64], y: &mut [f64], k: usize) {
    let mut kk = k;
    while kk > 0 && h[(kk - 1) * ld + kk - 1] == 0.0 {
        y[kk - 1] = 0.0;
        kk -= 1;
    }
    for i in (0..kk).rev() {
        let mut s = g[i];
        for j in i + 1..kk {
            s -= h[j * ld + i] * y[j];
        }
        let d = h[i * ld + i];
        y[i] = if d != 0.0 { s / d } else { 0.0 };
    }
}

/// Negated y of H y = g for the cycle's k columns, in `coef[..k]` (for
/// [`crate::backend::Backend::multi_axpy`], which subtracts).
pub(super) fn solve_krylov(
    h: &[f64],
    ld: usize,
    g: &[f64],
    (y, coef): (&mut [f64], &mut [f64]),
    k: usize,
) {
    solve_upper(h, ld, g, y, k);
    for (c, yi) in coef[..k].iter_mut().zip(&y[..k]) {
        *c = -yi;
    }
}

/// The Givens state of a cycle: rotations so far, the rotated right-hand side g (|g[j+1]| is
/// the residual estimate after step j), and g[j] before rotation j (DCGS2 redoes a rotation).
pub(super) struct Givens {
    cs: Vec<f64>,
    sn: Vec<f64>,
    pub(super) g: Vec<f64>,
    gsave: Vec<f64>,
}

impl Givens {
    /// For GMRES(m).
    pub(super) fn new(m: usize) -> Self {
        Givens {
            cs: vec![0.0; m],
            sn: vec![0.0; m],
            g: vec![0.0; m + 1],
            gsave: vec![0.0; m + 1],
        }
    }

    /// A new cycle from a residual of norm beta: g = beta e_1.
    pub(super) fn start(&mut self, beta: f64) {
        self.g.fill(0.0);
        self.g[0] = beta;
    }

    /// Apply rotations 0..j to column `col` (entries 0..=j+1), compute rotation j from it and
    /// apply it to g[j], g[j+1].
    fn rotate_column(&mut self, col: &mut [f64], j: usize) {
        let Givens { cs, sn, g, .. } = self;
        for i in 0..j {
            let (a, bb) = (col[i], col[i + 1]);
            col[i] = cs[i] * a + sn[i] * bb;
            col[i + 1] = -sn[i] * a + cs[i] * bb;
        }
        let (c, s) = givens(col[j], col[j + 1]);
        cs[j] = c;
        sn[j] = s;
        col[j] = c * col[j] + s * col[j + 1];
        col[j + 1] = 0.0;
        g[j + 1] = -s * g[j];
        g[j] *= c;
    }

    /// DCGS2: column j (unrotated) was corrected after rotation j: redo the rotation.
    pub(super) fn redo(&mut self, col: &mut [f64], j: usize) {
        self.g[j] = self.gsave[j];
        self.rotate_column(col, j);
    }

    /// The host's end of Arnoldi step j (both loops), once column j of H (entries 0..=j) and
    /// the new vector's norm `hn` are known: the non-finite check, the breakdown test (H[j+1,
    /// j] = hn, or 0 and `hraw_next` = 0 on breakdown), rotation j. Returns the residual
    /// estimate |g[j+1]| and whether the Krylov space broke down (then the new vector is not
    /// used).
    pub(super) fn end_step(
        &mut self,
        col: &mut [f64],
        hraw_next: &mut f64,
        hn: f64,
        j: usize,
        its: usize,
    ) -> Result<(f64, bool)> {
        let colnorm = (col[..=j].iter().map(|a| a * a).sum::<f64>() + hn * hn).sqrt();
        if !hn.is_finite() || !colnorm.is_finite() {
            return Err(Error::Invalid(format!(
                "GMRES: Arnoldi vector became non-finite at iteration {its} (operator or preconditioner produces NaN/Inf)"
            )));
        }
        let breakdown = hn <= f64::EPSILON * colnorm;
        if breakdown {
            col[j + 1] = 0.0;
            *hraw_next = 0.0;
        } else {
            col[j + 1] = hn;
        }
        self.gsave[j] = self.g[j];
        self.rotate_column(col, j);
        Ok((self.g[j + 1].abs(), breakdown))
    }
}
