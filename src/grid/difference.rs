//! Difference operators on a [`Grid`] as explicit sparse rows: norm damping, first differences
//! (flattening) and second differences (smoothing), in the canonical row order that
//! [`crate::grid::stencil`] recognises and applies matrix-free.

use crate::grid::Grid;
use crate::sparse::Csr;

/// Regularisation (damping) rows on `grid`: `norm` * I (norm damping, λ0; skipped when 0), then
/// for each axis x, y, z with a nonzero weight the first differences `w (m[c+e] - m[c])`
/// (flattening, 2 nonzeros) and the second differences `w (m[c-e] - 2 m[c] + m[c+e])`
/// (smoothing / roughness, 3 nonzeros) over every cell where the stencil fits.
pub fn regularisation(grid: &Grid, norm: f64, first: [f64; 3], second: [f64; 3]) -> Csr {
    let n = grid.n;
    let ncells = grid.ncells();
    let stride = [1usize, n[0], n[0] * n[1]];
    let mut indptr = vec![0u64];
    let mut indices: Vec<u32> = Vec::new();
    let mut data: Vec<f64> = Vec::new();
    let mut push_row = |cols: &[usize], vals: &[f64]| {
        for (&c, &v) in cols.iter().zip(vals) {
            indices.push(c as u32);
            data.push(v);
        }
        indptr.push(indices.len() as u64);
    };
    if norm != 0.0 {
        for c in 0..ncells {
            push_row(&[c], &[norm]);
        }
    }
    for a in 0..3 {
        let w = first[a];
        if w != 0.0 && n[a] >= 2 {
            for c in 0..ncells {
                if grid.ijk(c)[a] + 1 < n[a] {
                    push_row(&[c, c + stride[a]], &[-w, w]);
                }
            }
        }
    }
    for a in 0..3 {
        let w = second[a];
        if w != 0.0 && n[a] >= 3 {
            for c in 0..ncells {
                let i = grid.ijk(c)[a];
                if i >= 1 && i + 1 < n[a] {
                    push_row(&[c - stride[a], c, c + stride[a]], &[w, -2.0 * w, w]);
                }
            }
        }
    }
    let nrows = indptr.len() - 1;
    Csr::from_trusted(nrows, ncells, indptr, indices, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regularisation_rows() {
        let g = Grid::new([4, 3, 2], [0.0; 3], [1.0; 3]);
        let r = regularisation(&g, 0.5, [1.0, 2.0, 3.0], [1.0, 1.0, 0.0]);
        // norm 24; first: x 3*3*2=18, y 4*2*2=16, z 4*3*1=12; second: x 2*3*2=12, y 4*1*2=8.
        assert_eq!(r.nrows(), 24 + 18 + 16 + 12 + 12 + 8);
        // Difference rows annihilate constants; the norm rows do not.
        let y = r.matvec(&[1.0; 24]);
        assert!(y[..24].iter().all(|&v| v == 0.5));
        assert!(y[24..].iter().all(|&v| v == 0.0));
        // Second differences annihilate linear functions of x.
        let lin: Vec<f64> = (0..24).map(|c| g.ijk(c)[0] as f64).collect();
        let y = r.matvec(&lin);
        assert!(y[24 + 18 + 16 + 12..24 + 18 + 16 + 12 + 12]
            .iter()
            .all(|&v| v.abs() < 1e-15));
        assert!(y[24..24 + 18].iter().all(|&v| v == 1.0));
        assert!(r.check().is_ok());
    }
}
