//! Synthetic straight-ray travel-time tomography on a 3-D [`Grid`].
//!
//! Every ray runs in a straight line from a source to a receiver, both on the grid's boundary
//! faces (half of the receivers on the surface face z = z_min, the rest on any face; the source
//! on a different face). Row `r` of the kernel holds the exact length of ray `r` in every cell it
//! crosses, found by grid traversal (Amanatides & Woo 1987, "A fast voxel traversal algorithm for
//! ray tracing"): the ray parameter steps from one cell face to the next, so every segment length
//! is exact up to rounding and the lengths of a row sum to the ray's straight-line length.
//!
//! Rays are generated in parallel (rayon) from a per-ray seeded generator, so the kernel is the
//! same for a seed whatever the number of threads. Two passes keep memory at ~12 bytes per
//! nonzero plus one chunk per thread: the kernel of 600k rays on a 128 x 128 x 80 grid (~100 M
//! nonzeros) takes ~1.3 GB.
//!
//! The regularisation (`regularisation`) and true models (`checkerboard`, `spike`) use the
//! same column order as the grid (`i + nx * (j + ny * k)`).

use rayon::prelude::*;

use crate::grid::{gaussian, Grid, Rng};
use crate::sparse::Csr;

/// Rays per parallel work item.
const CHUNK: usize = 2048;

/// SplitMix64 finaliser: a well-mixed 64-bit value from a counter.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator of ray `ray` for `seed` (independent of threads and chunking).
fn ray_rng(seed: u64, ray: u64) -> Rng {
    Rng::new(splitmix64(seed ^ splitmix64(ray)))
}

/// A uniformly random point on face `face` of the grid box: faces 0..6 are x_min, x_max, y_min,
/// y_max, z_min (the surface), z_max.
fn point_on_face(grid: &Grid, face: usize, rng: &mut Rng) -> [f64; 3] {
    let lo = grid.origin;
    let hi = grid.extent_max();
    let axis = face / 2;
    let mut p = [0.0; 3];
    for a in 0..3 {
        p[a] = if a == axis {
            if face % 2 == 0 {
                lo[a]
            } else {
                hi[a]
            }
        } else {
            lo[a] + rng.uniform() * (hi[a] - lo[a])
        };
    }
    p
}

/// Source and receiver of ray `ray` for `seed`.
pub fn ray_endpoints(grid: &Grid, seed: u64, ray: u64) -> ([f64; 3], [f64; 3]) {
    let mut rng = ray_rng(seed, ray);
    // Receiver: surface (z_min) half of the time, else any face.
    let rface = if rng.uniform() < 0.5 {
        4
    } else {
        rng.below(6) as usize
    };
    // Source: any other face.
    let mut sface = rng.below(5) as usize;
    if sface >= rface {
        sface += 1;
    }
    let src = point_on_face(grid, sface, &mut rng);
    let rcv = point_on_face(grid, rface, &mut rng);
    (src, rcv)
}

/// Straight-line distance between two points.
pub fn distance(p: [f64; 3], q: [f64; 3]) -> f64 {
    ((q[0] - p[0]).powi(2) + (q[1] - p[1]).powi(2) + (q[2] - p[2]).powi(2)).sqrt()
}

/// Append the (cell, length) segments of the straight ray from `p0` to `p1` (both inside or on
/// the grid box) to `cells` / `lens`, in traversal order. Zero-length touches are skipped; the
/// lengths sum to |p1 - p0| up to rounding.
pub fn trace_ray(
    grid: &Grid,
    p0: [f64; 3],
    p1: [f64; 3],
    cells: &mut Vec<u32>,
    lens: &mut Vec<f64>,
) {
    let len = distance(p0, p1);
    if len == 0.0 || grid.ncells() == 0 {
        return;
    }
    let n = grid.n;
    let mut cell = [0i64; 3];
    let mut step = [0i64; 3];
    let mut t_max = [f64::INFINITY; 3];
    let mut t_delta = [f64::INFINITY; 3];
    for a in 0..3 {
        let h = grid.spacing[a];
        let d = p1[a] - p0[a];
        let u = (p0[a] - grid.origin[a]) / h;
        let mut c = u.floor() as i64;
        // A start point on a face belongs to the cell the ray enters.
        if d < 0.0 && (u - u.floor()) == 0.0 {
            c -= 1;
        }
        c = c.clamp(0, n[a] as i64 - 1);
        cell[a] = c;
        if d > 0.0 {
            step[a] = 1;
            t_delta[a] = h / d;
            t_max[a] = ((grid.origin[a] + (c + 1) as f64 * h) - p0[a]) / d;
        } else if d < 0.0 {
            step[a] = -1;
            t_delta[a] = -h / d;
            t_max[a] = ((grid.origin[a] + c as f64 * h) - p0[a]) / d;
        }
    }
    let mut t = 0.0f64;
    loop {
        // The axis whose next face comes first.
        let a = if t_max[0] <= t_max[1] && t_max[0] <= t_max[2] {
            0
        } else if t_max[1] <= t_max[2] {
            1
        } else {
            2
        };
        let t_next = t_max[a].min(1.0);
        let idx = cell[0] as usize + n[0] * (cell[1] as usize + n[1] * cell[2] as usize);
        if t_next > t {
            cells.push(idx as u32);
            lens.push((t_next - t) * len);
            t = t_next;
        }
        if t >= 1.0 {
            break;
        }
        cell[a] += step[a];
        t_max[a] += t_delta[a];
        if cell[a] < 0 || cell[a] >= n[a] as i64 {
            // Rounding put the exit a hair before t = 1: the rest belongs to the last cell.
            if t < 1.0 {
                if let Some(l) = lens.last_mut() {
                    *l += (1.0 - t) * len;
                }
            }
            break;
        }
    }
}

/// One ray's row: its segments sorted by cell (a straight ray visits a cell at most once).
fn ray_row(grid: &Grid, seed: u64, ray: u64, cells: &mut Vec<u32>, lens: &mut Vec<f64>) {
    cells.clear();
    lens.clear();
    let (s, r) = ray_endpoints(grid, seed, ray);
    trace_ray(grid, s, r, cells, lens);
    let mut pairs: Vec<(u32, f64)> = cells.iter().copied().zip(lens.iter().copied()).collect();
    pairs.sort_unstable_by_key(|p| p.0);
    // Merge repeats (possible only through rounding at a corner).
    cells.clear();
    lens.clear();
    for (c, l) in pairs {
        if cells.last() == Some(&c) {
            *lens.last_mut().unwrap() += l;
        } else {
            cells.push(c);
            lens.push(l);
        }
    }
}

/// The straight-ray kernel of `nrays` rays (rows) on `grid` (columns), deterministic for `seed`.
pub fn straight_ray_kernel(grid: &Grid, nrays: usize, seed: u64) -> Csr {
    straight_ray_kernel_with(grid, nrays, seed, false)
}

/// [`straight_ray_kernel`] with an optional progress bar.
pub fn straight_ray_kernel_with(grid: &Grid, nrays: usize, seed: u64, progress: bool) -> Csr {
    let ncols = grid.ncells();
    assert!(
        ncols <= u32::MAX as usize,
        "grid has too many cells for 32-bit columns"
    );
    let nchunks = nrays.div_ceil(CHUNK);
    let pb = crate::ui::progress::bar(nrays as u64, "rays", progress);
    // Each chunk traces its rays into its own arrays; chunks are then concatenated in order.
    let chunks: Vec<(Vec<u64>, Vec<u32>, Vec<f64>)> = (0..nchunks)
        .into_par_iter()
        .map(|c| {
            let (r0, r1) = (c * CHUNK, ((c + 1) * CHUNK).min(nrays));
            let mut counts = Vec::with_capacity(r1 - r0);
            let mut idx = Vec::new();
            let mut val = Vec::new();
            let (mut cells, mut lens) = (Vec::new(), Vec::new());
            for r in r0..r1 {
                ray_row(grid, seed, r as u64, &mut cells, &mut lens);
                idx.extend_from_slice(&cells);
                val.extend_from_slice(&lens);
                counts.push(cells.len() as u64);
            }
            idx.shrink_to_fit();
            val.shrink_to_fit();
            pb.inc((r1 - r0) as u64);
            (counts, idx, val)
        })
        .collect();
    pb.finish_and_clear();
    let nnz: usize = chunks.iter().map(|c| c.1.len()).sum();
    let mut indptr = Vec::with_capacity(nrays + 1);
    indptr.push(0u64);
    let mut indices = Vec::with_capacity(nnz);
    let mut data = Vec::with_capacity(nnz);
    let mut acc = 0u64;
    for (counts, idx, val) in chunks {
        for k in counts {
            acc += k;
            indptr.push(acc);
        }
        indices.extend_from_slice(&idx);
        data.extend_from_slice(&val);
    }
    Csr::from_trusted(nrays, ncols, indptr, indices, data)
}

/// Straight-line length of every ray of [`straight_ray_kernel`] (for checks).
pub fn ray_lengths(grid: &Grid, nrays: usize, seed: u64) -> Vec<f64> {
    (0..nrays as u64)
        .into_par_iter()
        .map(|r| {
            let (s, q) = ray_endpoints(grid, seed, r);
            distance(s, q)
        })
        .collect()
}

/// Checkerboard model: `amplitude * (-1)^(i/s0 + j/s1 + k/s2)` with `cell` = (s0, s1, s2) grid
/// cells per checker along x, y, z.
pub fn checkerboard(grid: &Grid, cell: [usize; 3], amplitude: f64) -> Vec<f64> {
    let s = cell.map(|c| c.max(1));
    (0..grid.ncells())
        .map(|idx| {
            let [i, j, k] = grid.ijk(idx);
            if (i / s[0] + j / s[1] + k / s[2]) % 2 == 0 {
                amplitude
            } else {
                -amplitude
            }
        })
        .collect()
}

/// Spike model: `amplitude` in the cells within `half_width` cells (Chebyshev distance) of cell
/// `at`, zero elsewhere.
pub fn spike(grid: &Grid, at: [usize; 3], half_width: usize, amplitude: f64) -> Vec<f64> {
    (0..grid.ncells())
        .map(|idx| {
            let c = grid.ijk(idx);
            if (0..3).all(|a| c[a].abs_diff(at[a]) <= half_width) {
                amplitude
            } else {
                0.0
            }
        })
        .collect()
}

/// Travel times `b = A m` plus independent Gaussian noise of standard deviation `noise_sd`
/// (deterministic for `seed`; none when `noise_sd` is 0).
pub fn travel_times(a: &Csr, m: &[f64], noise_sd: f64, seed: u64) -> Vec<f64> {
    assert_eq!(m.len(), a.ncols());
    (0..a.nrows())
        .into_par_iter()
        .map(|i| {
            let (c, v) = a.row(i);
            let t: f64 = c.iter().zip(v).map(|(&j, &x)| x * m[j as usize]).sum();
            if noise_sd > 0.0 {
                t + noise_sd * gaussian(&mut ray_rng(seed ^ 0x006E_6F69_7365, i as u64))
            } else {
                t
            }
        })
        .collect()
}

/// Pearson correlation of two vectors (0 when either is constant).
pub fn correlation(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len());
    let n = x.len() as f64;
    if x.is_empty() {
        return 0.0;
    }
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (&a, &b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    if sxx == 0.0 || syy == 0.0 {
        0.0
    } else {
        sxy / (sxx * syy).sqrt()
    }
}

/// The straight-ray system of the CuPy peer (`straight_ray_system` in bench/peers/cupy_lsqr.py,
/// used by `seistomo bench`) on an nx x ny x nz grid: rays from random points on the top face to
/// random points on the bottom face, K = 2 (nx+ny+nz) samples per ray with duplicates summed per
/// cell, then 0.1 I norm damping and first-difference smoothing rows (-0.5, +0.5) along x, y and
/// z. `sort_rays` orders the rays by their first cell.
pub fn peer_system(
    nx: usize,
    ny: usize,
    nz: usize,
    nrays: usize,
    seed: u64,
    sort_rays: bool,
) -> Csr {
    let ncell = nx * ny * nz;
    let k = 2 * (nx + ny + nz);
    let rows: Vec<Vec<(u32, f64)>> = (0..nrays)
        .into_par_iter()
        .map(|r| {
            let mut rng = Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(r as u64));
            let src = [rng.uniform() * nx as f64, rng.uniform() * ny as f64, 0.0];
            let rcv = [
                rng.uniform() * nx as f64,
                rng.uniform() * ny as f64,
                nz as f64 - 1e-6,
            ];
            let d = [rcv[0] - src[0], rcv[1] - src[1], rcv[2] - src[2]];
            let seg = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt() / k as f64;
            let mut cols: Vec<u32> = (0..k)
                .map(|s| {
                    let t = (s as f64 + 0.5) / k as f64;
                    let c = |a: usize, n: usize| ((src[a] + t * d[a]).max(0.0) as usize).min(n - 1);
                    ((c(2, nz) * ny + c(1, ny)) * nx + c(0, nx)) as u32
                })
                .collect();
            cols.sort_unstable();
            let mut row: Vec<(u32, f64)> = Vec::with_capacity(cols.len());
            for c in cols {
                match row.last_mut() {
                    Some((lc, v)) if *lc == c => *v += seg,
                    _ => row.push((c, seg)),
                }
            }
            row
        })
        .collect();
    let mut rows = rows;
    if sort_rays {
        rows.par_sort_by_key(|r| r.first().map(|e| e.0).unwrap_or(0));
    }
    let mut indptr = Vec::with_capacity(nrays + 4 * ncell + 1);
    indptr.push(0u64);
    let nnz_est: usize = rows.iter().map(|r| r.len()).sum::<usize>() + 7 * ncell;
    let mut indices = Vec::with_capacity(nnz_est);
    let mut data = Vec::with_capacity(nnz_est);
    for row in rows {
        for (c, v) in row {
            indices.push(c);
            data.push(v);
        }
        indptr.push(indices.len() as u64);
    }
    for c in 0..ncell {
        indices.push(c as u32);
        data.push(0.1);
        indptr.push(indices.len() as u64);
    }
    for (stride, dimlen, axis) in [(1, nx, 0), (nx, ny, 1), (nx * ny, nz, 2)] {
        for c in 0..ncell {
            let coord = match axis {
                0 => c % nx,
                1 => (c / nx) % ny,
                _ => c / (nx * ny),
            };
            if coord + 1 < dimlen {
                indices.extend([c as u32, (c + stride) as u32]);
                data.extend([-0.5, 0.5]);
                indptr.push(indices.len() as u64);
            }
        }
    }
    let m = indptr.len() - 1;
    Csr::try_new(m, ncell, indptr, indices, data).expect("generated system is well formed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid {
        Grid::new([7, 5, 4], [-3.0, 10.0, 0.0], [1.5, 2.0, 0.75])
    }

    #[test]
    fn lengths_sum_to_ray_length() {
        let g = grid();
        let a = straight_ray_kernel(&g, 3000, 42);
        let lens = ray_lengths(&g, 3000, 42);
        assert_eq!(a.nrows(), 3000);
        let check = a.check();
        assert!(check.is_ok(), "{check:?}");
        for (i, &l) in lens.iter().enumerate() {
            let (_, v) = a.row(i);
            let s: f64 = v.iter().sum();
            assert!((s - l).abs() <= 1e-9 * l.max(1.0), "ray {i}: {s} vs {l}");
            assert!(v.iter().all(|&x| x > 0.0));
            // No segment longer than the cell diagonal.
            let diag = distance([0.0; 3], g.spacing);
            assert!(v.iter().all(|&x| x <= diag * (1.0 + 1e-12)));
        }
    }

    #[test]
    fn axis_aligned_ray_is_exact() {
        let g = grid();
        let (mut c, mut l) = (Vec::new(), Vec::new());
        // Along x through the middle of row j = 2, k = 1, from x_min to x_max.
        let y = g.origin[1] + 2.5 * g.spacing[1];
        let z = g.origin[2] + 1.5 * g.spacing[2];
        trace_ray(&g, [-3.0, y, z], [-3.0 + 7.0 * 1.5, y, z], &mut c, &mut l);
        assert_eq!(
            c,
            (0..7).map(|i| g.index(i, 2, 1) as u32).collect::<Vec<_>>()
        );
        assert!(l.iter().all(|&x| (x - 1.5).abs() < 1e-12));
        // Reversed direction, starting on the x_max face.
        c.clear();
        l.clear();
        trace_ray(&g, [-3.0 + 7.0 * 1.5, y, z], [-3.0, y, z], &mut c, &mut l);
        assert_eq!(c.len(), 7);
        assert_eq!(c[0] as usize, g.index(6, 2, 1));
    }

    #[test]
    fn diagonal_ray_through_corners() {
        // A cube grid and the main diagonal: passes exactly through cell corners.
        let g = Grid::new([4, 4, 4], [0.0; 3], [1.0; 3]);
        let (mut c, mut l) = (Vec::new(), Vec::new());
        trace_ray(&g, [0.0; 3], [4.0; 3], &mut c, &mut l);
        let total: f64 = l.iter().sum();
        assert!((total - 48f64.sqrt()).abs() < 1e-12);
        for i in 0..4 {
            assert!(c.contains(&(g.index(i, i, i) as u32)));
        }
    }

    #[test]
    fn deterministic_for_a_seed_and_thread_count() {
        let g = grid();
        let a = straight_ray_kernel(&g, 5000, 7);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let b = pool.install(|| straight_ray_kernel(&g, 5000, 7));
        assert_eq!(a, b);
        let c = straight_ray_kernel(&g, 5000, 8);
        assert_ne!(a, c);
    }

    #[test]
    fn models_and_noise() {
        let g = Grid::new([4, 4, 2], [0.0; 3], [1.0; 3]);
        let m = checkerboard(&g, [2, 2, 1], 0.1);
        assert_eq!(m[g.index(0, 0, 0)], 0.1);
        assert_eq!(m[g.index(2, 0, 0)], -0.1);
        assert_eq!(m[g.index(2, 2, 0)], 0.1);
        assert_eq!(m[g.index(0, 0, 1)], -0.1);
        let s = spike(&g, [1, 1, 0], 0, 1.0);
        assert_eq!(s.iter().sum::<f64>(), 1.0);
        let a = straight_ray_kernel(&g, 2000, 1);
        let clean = travel_times(&a, &m, 0.0, 3);
        // G m (summed left to right here; the CPU products sum in lanes: equal to rounding)
        for (t, gm) in clean.iter().zip(a.matvec(&m)) {
            assert!((t - gm).abs() <= 1e-14 * gm.abs().max(1.0), "{t} vs {gm}");
        }
        let noisy = travel_times(&a, &m, 0.01, 3);
        let d: Vec<f64> = noisy.iter().zip(&clean).map(|(x, y)| x - y).collect();
        let sd = (d.iter().map(|x| x * x).sum::<f64>() / d.len() as f64).sqrt();
        assert!((sd - 0.01).abs() < 0.001, "{sd}");
        assert!(correlation(&clean, &noisy) > 0.9);
    }
}
