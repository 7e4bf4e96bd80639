//! Convergent square test systems at any scale: 3-D Poisson and 3-D convection-diffusion on a
//! 7-point stencil (nonsymmetric, like SuiteSparse's atmosmodd/atmosmodl), on an nx x ny x nz
//! grid with Dirichlet boundaries. Cell (i, j, k) is row i + nx (j + ny k), as in
//! [`crate::grid::cells`].
//!
//! Poisson: `6 u_c - sum of the 6 neighbours` (scaled by h^2).
//!
//! Convection-diffusion: -div(K grad u) + b . grad u, central differences, scaled by h^2. The
//! diffusivity K varies from cell to cell (K_c = 10^t_c, t_c in [0, 1) from a fixed hash of the
//! cell index, so the diagonal is not constant and Jacobi scaling matters); a face carries the
//! mean of its two cells (or K_c on the boundary). The row of cell c is
//! `(sum_f K_f) u_c - sum_d [(K_{d+} - p_d) u_{c+e_d} + (K_{d-} + p_d) u_{c-e_d}]` with p_d =
//! b_d h / 2 the cell Peclet number of direction d. For |p_d| < 1 <= K it is an irreducibly
//! diagonally dominant M-matrix: nonsingular, and Jacobi-preconditioned GMRES converges.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sparse::Csr;

/// Which operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SquareKind {
    Poisson,
    Convdiff,
}

choice_from_str!(SquareKind, "square system", "poisson" => Self::Poisson, "convdiff" | "convection-diffusion" => Self::Convdiff);

/// Diffusivity of cell c: 10^t, t in [0, 1) from a fixed integer hash (splitmix64) of c.
pub fn diffusivity(c: usize) -> f64 {
    let mut z = (c as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    10f64.powf((z >> 11) as f64 / (1u64 << 53) as f64)
}

/// The cell Peclet numbers used by default for convection-diffusion.
pub const DEFAULT_PECLET: [f64; 3] = [0.6, 0.4, 0.2];

/// Build the 7-point matrix on an nx x ny x nz grid with cell Peclet numbers `peclet`
/// (ignored for Poisson). Rows are built directly in CSR order (no triplets), in parallel over
/// z-planes; 2 million rows take well under a second.
pub fn stencil7(
    kind: SquareKind,
    nx: usize,
    ny: usize,
    nz: usize,
    peclet: [f64; 3],
) -> Result<Csr> {
    if nx == 0 || ny == 0 || nz == 0 {
        return Err(Error::Invalid(format!(
            "square system grid {nx} x {ny} x {nz} is empty"
        )));
    }
    let n = nx
        .checked_mul(ny)
        .and_then(|v| v.checked_mul(nz))
        .filter(|&v| v <= u32::MAX as usize)
        .ok_or_else(|| Error::Invalid(format!("grid {nx} x {ny} x {nz} too large")))?;
    let p = match kind {
        SquareKind::Poisson => [0.0; 3],
        SquareKind::Convdiff => peclet,
    };
    if p.iter().any(|v| !v.is_finite()) {
        return Err(Error::Invalid("Peclet numbers must be finite".into()));
    }
    let (sx, sy) = (1usize, nx);
    let sz = nx * ny;
    let mut indptr = vec![0u64; n + 1];
    for c in 0..n {
        let (i, j, k) = (c % nx, (c / nx) % ny, c / sz);
        let cnt = 1
            + (k > 0) as u64
            + (j > 0) as u64
            + (i > 0) as u64
            + (i + 1 < nx) as u64
            + (j + 1 < ny) as u64
            + (k + 1 < nz) as u64;
        indptr[c + 1] = indptr[c] + cnt;
    }
    let nnz = indptr[n] as usize;
    let mut idx = vec![0u32; nnz];
    let mut val = vec![0f64; nnz];
    // Fill plane by plane in parallel: each z-plane owns a contiguous range of entries.
    use rayon::prelude::*;
    let mut chunks: Vec<(usize, &mut [u32], &mut [f64])> = Vec::with_capacity(nz);
    {
        let (mut ri, mut rv) = (&mut idx[..], &mut val[..]);
        for k in 0..nz {
            let len = (indptr[(k + 1) * sz] - indptr[k * sz]) as usize;
            let (a, b) = ri.split_at_mut(len);
            let (c, d) = rv.split_at_mut(len);
            chunks.push((k, a, c));
            ri = b;
            rv = d;
        }
    }
    chunks.into_par_iter().for_each(|(k, ci, cv)| {
        let mut q = 0usize;
        let var = kind == SquareKind::Convdiff;
        let kc = |c: usize| if var { diffusivity(c) } else { 1.0 };
        for j in 0..ny {
            for i in 0..nx {
                let c = i + nx * (j + ny * k);
                let k0 = kc(c);
                let face = |nb: usize| 0.5 * (k0 + kc(nb));
                // faces: -z, -y, -x, +x, +y, +z (K_c where the neighbour is outside)
                let fzm = if k > 0 { face(c - sz) } else { k0 };
                let fym = if j > 0 { face(c - sy) } else { k0 };
                let fxm = if i > 0 { face(c - sx) } else { k0 };
                let fxp = if i + 1 < nx { face(c + sx) } else { k0 };
                let fyp = if j + 1 < ny { face(c + sy) } else { k0 };
                let fzp = if k + 1 < nz { face(c + sz) } else { k0 };
                let mut push = |col: usize, v: f64| {
                    ci[q] = col as u32;
                    cv[q] = v;
                    q += 1;
                };
                if k > 0 {
                    push(c - sz, -(fzm + p[2]));
                }
                if j > 0 {
                    push(c - sy, -(fym + p[1]));
                }
                if i > 0 {
                    push(c - sx, -(fxm + p[0]));
                }
                push(c, fzm + fym + fxm + fxp + fyp + fzp);
                if i + 1 < nx {
                    push(c + sx, -(fxp - p[0]));
                }
                if j + 1 < ny {
                    push(c + sy, -(fyp - p[1]));
                }
                if k + 1 < nz {
                    push(c + sz, -(fzp - p[2]));
                }
            }
        }
    });
    Ok(Csr::from_trusted(n, n, indptr, idx, val))
}

/// A cube of side `n` with the default Peclet numbers.
pub fn cube(kind: SquareKind, n: usize) -> Result<Csr> {
    stencil7(kind, n, n, n, DEFAULT_PECLET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stencil_rows_and_symmetry() {
        let a = cube(SquareKind::Poisson, 5).unwrap();
        assert_eq!(a.nrows(), 125);
        // interior 27 cells x 7 + faces ...: nnz = 7 n^3 - 6 n^2
        assert_eq!(a.nnz(), 7 * 125 - 6 * 25);
        assert_eq!(a, a.transpose());
        let row_sum: f64 = a.row(62).1.iter().sum(); // centre cell: interior
        assert_eq!(row_sum, 0.0);
        let c = stencil7(SquareKind::Convdiff, 4, 3, 2, DEFAULT_PECLET).unwrap();
        assert_eq!(c.nrows(), 24);
        assert_ne!(c, c.transpose());
        // validates as a CSR (sorted columns, in range)
        let (m, n, ip, ix, v) = c.clone().into_parts();
        assert_eq!(Csr::try_new(m, n, ip, ix, v).unwrap(), c);
        // interior rows sum to zero (diffusion and central convection are conservative);
        // boundary rows have a positive sum; the diagonal varies
        let c = stencil7(SquareKind::Convdiff, 6, 6, 6, DEFAULT_PECLET).unwrap();
        let interior = 1 + 6 * (1 + 6);
        let s: f64 = c.row(interior).1.iter().sum();
        assert!(s.abs() < 1e-12, "{s}");
        assert!(c.row(0).1.iter().sum::<f64>() > 0.1);
        let d = c.diagonal();
        assert!(d.iter().any(|&v| (v - d[0]).abs() > 0.5));
        // upwind side heavier: entry (c, c-1) = -(K_f + p_0)
        let (cols, vals) = c.row(interior);
        let k = cols.binary_search(&(interior as u32 - 1)).unwrap();
        let kf = 0.5 * (diffusivity(interior) + diffusivity(interior - 1));
        assert!((vals[k] + kf + 0.6).abs() < 1e-15);
    }
}
