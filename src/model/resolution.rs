//! Resolution tests (`[resolution]`, `seistomo resolution`): synthetic models on the model grid
//! (checkerboards of several cell sizes, spikes), their data computed through the kernel rows,
//! inverted with the same settings as the real data, and how well each came back: the
//! correlation of the true and recovered models per depth layer, and for a spike its recovered
//! amplitude, its spread (the radius holding half of the recovered energy) and its leakage (the
//! share of the recovered energy outside the spike).

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::grid::synthetic::{checkerboard, correlation, spike};
use crate::grid::Grid;

/// `[resolution]` as written in a config.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResolution {
    /// Checkerboards: grid cells per checker along x, y, z, one test each.
    #[serde(default)]
    pub checkerboard: Vec<[usize; 3]>,
    /// The checkers' amplitude (model units; default 0.05).
    pub amplitude: Option<f64>,
    /// Spikes: the centre cell (i, j, k) of each, one test each.
    #[serde(default)]
    pub spikes: Vec<[usize; 3]>,
    /// Half-width of a spike in cells (Chebyshev distance; default 1: 3 x 3 x 3 cells).
    pub spike_width: Option<usize>,
    /// The spikes' amplitude (default 0.1).
    pub spike_amplitude: Option<f64>,
    /// Standard deviation of Gaussian noise added to the synthetic data (default 0).
    pub noise: Option<f64>,
    /// Seed of that noise (default 1).
    pub seed: Option<u64>,
}

/// What a test is.
#[derive(Debug, Clone, PartialEq)]
pub enum TestKind {
    /// Cells per checker along x, y, z.
    Checkerboard([usize; 3]),
    /// Centre cell and half-width.
    Spike { at: [usize; 3], width: usize },
}

/// The validated `[resolution]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolutionSpec {
    pub checkerboards: Vec<[usize; 3]>,
    pub amplitude: f64,
    pub spikes: Vec<[usize; 3]>,
    pub spike_width: usize,
    pub spike_amplitude: f64,
    pub noise: f64,
    pub seed: u64,
}

impl ResolutionSpec {
    /// Check the table's values (the grid is checked by [`ResolutionSpec::tests`]).
    pub fn from_raw(r: RawResolution) -> std::result::Result<ResolutionSpec, String> {
        let finite_pos = |key: &str, v: f64| -> std::result::Result<f64, String> {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(format!(
                    "[resolution] {key} must be finite and > 0 (got {v})"
                ))
            }
        };
        if r.checkerboard.is_empty() && r.spikes.is_empty() {
            return Err(
                "[resolution] gives no test: set checkerboard = [[NX, NY, NZ], ...] and/or spikes = [[I, J, K], ...]"
                    .into(),
            );
        }
        if let Some(c) = r.checkerboard.iter().find(|c| c.contains(&0)) {
            return Err(format!(
                "[resolution] checkerboard {c:?}: cells per checker must be >= 1"
            ));
        }
        let noise = r.noise.unwrap_or(0.0);
        if !(noise.is_finite() && noise >= 0.0) {
            return Err(format!(
                "[resolution] noise must be finite and >= 0 (got {noise})"
            ));
        }
        Ok(ResolutionSpec {
            checkerboards: r.checkerboard,
            amplitude: finite_pos("amplitude", r.amplitude.unwrap_or(0.05))?,
            spikes: r.spikes,
            spike_width: r.spike_width.unwrap_or(1),
            spike_amplitude: finite_pos("spike_amplitude", r.spike_amplitude.unwrap_or(0.1))?,
            noise,
            seed: r.seed.unwrap_or(1),
        })
    }

    /// The tests' names, in the table's order (checkerboards, then spikes).
    pub fn names(&self) -> Vec<String> {
        let cb = self
            .checkerboards
            .iter()
            .map(|c| format!("checkerboard_{}x{}x{}", c[0], c[1], c[2]));
        let sp = self
            .spikes
            .iter()
            .map(|a| format!("spike_{}_{}_{}", a[0], a[1], a[2]));
        cb.chain(sp).collect()
    }

    /// The tests on `grid`, in the table's order (checkerboards, then spikes), each with its
    /// name and true model; an error naming a spike outside the grid.
    pub fn tests(&self, grid: &Grid) -> Result<Vec<(String, TestKind, Vec<f64>)>> {
        if let Some(at) = self
            .spikes
            .iter()
            .find(|at| (0..3).any(|a| at[a] >= grid.n[a]))
        {
            return Err(Error::Invalid(format!(
                "[resolution] spike at cell {at:?} is outside the grid of {:?} cells",
                grid.n
            )));
        }
        let width = self.spike_width;
        let checkers = self.checkerboards.iter().map(|&c| {
            let m = checkerboard(grid, c, self.amplitude);
            (TestKind::Checkerboard(c), m)
        });
        let spikes = self.spikes.iter().map(|&at| {
            let m = spike(grid, at, width, self.spike_amplitude);
            (TestKind::Spike { at, width }, m)
        });
        Ok(self
            .names()
            .into_iter()
            .zip(checkers.chain(spikes))
            .map(|(name, (kind, m))| (name, kind, m))
            .collect())
    }
}

/// How well a spike came back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpikeRecovery {
    /// Recovered over true value at the centre cell.
    pub peak: f64,
    /// The radius (in cells) around the centre that holds half of the recovered model's
    /// energy (m^2): the true spike's own for a perfect recovery, larger the more it is
    /// smeared (faint noise far away moves it little, unlike a mean distance).
    pub spread: f64,
    /// Fraction of the recovered energy outside the spike's cells.
    pub leakage: f64,
    /// The true spike's own spread (what a perfect recovery gives).
    pub true_spread: f64,
}

/// One test's outcome.
#[derive(Debug, Clone)]
pub struct TestResult {
    pub name: String,
    pub kind: TestKind,
    pub true_model: Vec<f64>,
    pub recovered: Vec<f64>,
    /// Correlation of true and recovered over the whole grid.
    pub correlation: f64,
    /// Correlation per depth layer (k = 0 .. nz): 0 where a layer is constant.
    pub depth_correlation: Vec<f64>,
    /// Spikes only.
    pub spike: Option<SpikeRecovery>,
    pub iterations: usize,
    pub istop: u32,
}

/// Correlation of the true model `a` and the recovered `b` in each depth layer of `grid`: NaN
/// where the true layer is constant (a spike's empty layers: nothing to recover), 0 where only
/// the recovered one is.
pub fn depth_correlation(grid: &Grid, a: &[f64], b: &[f64]) -> Vec<f64> {
    // a depth layer's cells are contiguous (Grid::index: x fastest, then y)
    let per = (grid.n[0] * grid.n[1]).max(1);
    a.chunks(per)
        .zip(b.chunks(per))
        .map(|(la, lb)| {
            if la.iter().all(|&v| v == la[0]) {
                f64::NAN
            } else {
                correlation(la, lb)
            }
        })
        .collect()
}

/// The least and the mean of the finite values of `v` (NaN, NaN when there are none).
pub fn min_mean(v: &[f64]) -> (f64, f64) {
    let f: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if f.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let min = f.iter().copied().fold(f64::INFINITY, f64::min);
    (min, f.iter().sum::<f64>() / f.len() as f64)
}

/// The radius around `at` (cells) within which half of the energy `v^2` lies: the distances
/// of the cells in increasing order, the first where the running sum reaches half (0 for a
/// model without energy).
fn half_energy_radius(grid: &Grid, v: &[f64], at: [usize; 3]) -> f64 {
    let mut cells: Vec<(f64, f64)> = v
        .iter()
        .enumerate()
        .filter(|(_, &m)| m != 0.0)
        .map(|(idx, &m)| {
            let c = grid.ijk(idx);
            let d2: f64 = (0..3).map(|a| (c[a] as f64 - at[a] as f64).powi(2)).sum();
            (d2, m * m)
        })
        .collect();
    let total: f64 = cells.iter().map(|c| c.1).sum();
    if total <= 0.0 {
        return 0.0;
    }
    cells.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut acc = 0.0;
    for (d2, e) in cells {
        acc += e;
        if acc >= 0.5 * total {
            return d2.sqrt();
        }
    }
    0.0
}

/// [`SpikeRecovery`] of `recovered` for a spike of `amplitude` at `at` of half-width `width`.
pub fn spike_recovery(
    grid: &Grid,
    recovered: &[f64],
    at: [usize; 3],
    width: usize,
    amplitude: f64,
) -> SpikeRecovery {
    let (mut e, mut outside) = (0.0, 0.0);
    for (idx, &m) in recovered.iter().enumerate() {
        let c = grid.ijk(idx);
        e += m * m;
        if (0..3).any(|a| c[a].abs_diff(at[a]) > width) {
            outside += m * m;
        }
    }
    let centre = recovered[grid.index(at[0], at[1], at[2])];
    let truth = crate::grid::synthetic::spike(grid, at, width, 1.0);
    SpikeRecovery {
        peak: centre / amplitude,
        spread: half_energy_radius(grid, recovered, at),
        leakage: if e > 0.0 { outside / e } else { 0.0 },
        true_spread: half_energy_radius(grid, &truth, at),
    }
}

impl TestResult {
    /// A test's result from its recovered model.
    pub fn new(
        grid: &Grid,
        (name, kind, true_model): (String, TestKind, Vec<f64>),
        recovered: Vec<f64>,
        (iterations, istop): (usize, u32),
        spike_amplitude: f64,
    ) -> TestResult {
        let spike = match kind {
            TestKind::Spike { at, width } => {
                Some(spike_recovery(grid, &recovered, at, width, spike_amplitude))
            }
            TestKind::Checkerboard(_) => None,
        };
        TestResult {
            correlation: correlation(&true_model, &recovered),
            depth_correlation: depth_correlation(grid, &true_model, &recovered),
            name,
            kind,
            true_model,
            recovered,
            spike,
            iterations,
            istop,
        }
    }
}

/// The depth layer a figure of a test shows: the one where the true model has the most energy
/// (a spike's own layer), the one nearest the middle among equals (a checkerboard's).
pub fn display_layer(grid: &Grid, truth: &[f64]) -> usize {
    let nz = grid.n[2];
    // a depth layer's cells are contiguous (Grid::index: x fastest, then y)
    let per = (grid.n[0] * grid.n[1]).max(1);
    let e: Vec<f64> = truth
        .chunks(per)
        .map(|l| l.iter().map(|v| v * v).sum())
        .collect();
    let max = e.iter().copied().fold(0.0, f64::max);
    (0..nz)
        .filter(|&k| e[k] >= max * (1.0 - 1e-12))
        .min_by_key(|&k| k.abs_diff(nz / 2))
        .unwrap_or(nz / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(n: [usize; 3]) -> Grid {
        Grid {
            n,
            origin: [0.0; 3],
            spacing: [1.0; 3],
            axes: ["x".into(), "y".into(), "z".into()],
            units: "km".into(),
        }
    }

    #[test]
    fn a_perfect_recovery_scores_one_and_a_smeared_spike_spreads() {
        let g = grid([9, 9, 5]);
        let spec = ResolutionSpec::from_raw(RawResolution {
            checkerboard: vec![[3, 3, 1]],
            spikes: vec![[4, 4, 2]],
            spike_width: Some(0),
            ..Default::default()
        })
        .unwrap();
        let tests = spec.tests(&g).unwrap();
        assert_eq!(tests.len(), 2);
        let (cb, sp) = (tests[0].clone(), tests[1].clone());
        assert_eq!(cb.0, "checkerboard_3x3x1");
        assert_eq!(sp.0, "spike_4_4_2");
        let r = TestResult::new(&g, cb.clone(), cb.2.clone(), (10, 2), 0.1);
        assert!((r.correlation - 1.0).abs() < 1e-12);
        assert!(r.depth_correlation.iter().all(|c| (c - 1.0).abs() < 1e-12));
        // the negated model correlates -1; a constant layer 0
        let neg: Vec<f64> = cb.2.iter().map(|v| -v).collect();
        let r = TestResult::new(&g, cb.clone(), neg, (10, 2), 0.1);
        assert!((r.correlation + 1.0).abs() < 1e-12);
        assert_eq!(
            depth_correlation(&g, &cb.2, &vec![1.0; g.ncells()]),
            vec![0.0; 5]
        );
        let d = depth_correlation(&g, &sp.2, &sp.2);
        assert!(
            d[2] == 1.0 && d.iter().filter(|c| c.is_nan()).count() == 4,
            "{d:?}"
        );
        assert_eq!(min_mean(&d), (1.0, 1.0));
        // a point spike recovered exactly: peak 1, no spread, no leakage
        let r = TestResult::new(&g, sp.clone(), sp.2.clone(), (10, 2), 0.1);
        let s = r.spike.unwrap();
        assert_eq!(
            (s.peak, s.spread, s.leakage, s.true_spread),
            (1.0, 0.0, 0.0, 0.0)
        );
        // a 3 x 3 x 3 spike's own spread: sqrt(3 x 2/3)
        let s3 = spike_recovery(&g, &spike(&g, [4, 4, 2], 1, 0.1), [4, 4, 2], 1, 0.1);
        assert!(
            (s3.spread - 2f64.sqrt()).abs() < 1e-12 && (s3.true_spread - 2f64.sqrt()).abs() < 1e-12
        );
        assert_eq!(display_layer(&g, &sp.2), 2);
        assert_eq!(display_layer(&g, &cb.2), 2, "a checkerboard's middle layer");
        // half the amplitude at the centre, the same on its 6 neighbours: half the energy
        // within 1 cell, leakage 6/7
        let mut m = vec![0.0; g.ncells()];
        m[g.index(4, 4, 2)] = 0.05;
        for (i, j, k) in [
            (3, 4, 2),
            (5, 4, 2),
            (4, 3, 2),
            (4, 5, 2),
            (4, 4, 1),
            (4, 4, 3),
        ] {
            m[g.index(i, j, k)] = 0.05;
        }
        let s = TestResult::new(&g, sp, m, (10, 2), 0.1).spike.unwrap();
        assert!((s.peak - 0.5).abs() < 1e-12);
        assert_eq!(s.spread, 1.0);
        assert!((s.leakage - 6.0 / 7.0).abs() < 1e-12);
    }

    #[test]
    fn bad_tables_are_refused_with_the_key() {
        let e = ResolutionSpec::from_raw(RawResolution::default()).unwrap_err();
        assert!(e.contains("no test"), "{e}");
        let e = ResolutionSpec::from_raw(RawResolution {
            checkerboard: vec![[0, 2, 2]],
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("checkerboard [0, 2, 2]"), "{e}");
        let e = ResolutionSpec::from_raw(RawResolution {
            spikes: vec![[1, 1, 1]],
            amplitude: Some(-1.0),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("amplitude"), "{e}");
        let spec = ResolutionSpec::from_raw(RawResolution {
            spikes: vec![[9, 1, 1]],
            ..Default::default()
        })
        .unwrap();
        let e = spec.tests(&grid([9, 9, 5])).unwrap_err().to_string();
        assert!(e.contains("outside the grid"), "{e}");
    }
}
