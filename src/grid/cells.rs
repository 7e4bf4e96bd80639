//! The model grid: a regular 3-D grid of cells. Cell (i, j, k) (0-based, along x, y, z) has the
//! linear index `i + nx * (j + ny * k)`: x varies fastest. This is the column order of every
//! system built on a grid (synthetic, generated damping) and the order of model vectors.

use serde::{Deserialize, Serialize};

/// A regular grid of `n[0] x n[1] x n[2]` cells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grid {
    /// Cells along x, y, z.
    pub n: [usize; 3],
    /// Corner of cell (0, 0, 0) (its minimum x, y, z).
    pub origin: [f64; 3],
    /// Cell size along x, y, z.
    pub spacing: [f64; 3],
    /// Axis names, e.g. ["x", "y", "depth"].
    #[serde(default = "default_axes")]
    pub axes: [String; 3],
    /// Length unit of origin and spacing, e.g. "km".
    #[serde(default = "default_units")]
    pub units: String,
}

fn default_axes() -> [String; 3] {
    ["x".into(), "y".into(), "z".into()]
}
fn default_units() -> String {
    "km".into()
}

impl Grid {
    pub fn new(n: [usize; 3], origin: [f64; 3], spacing: [f64; 3]) -> Grid {
        Grid {
            n,
            origin,
            spacing,
            axes: default_axes(),
            units: default_units(),
        }
    }
    /// Cells > 0 along each axis (product without overflow), finite origin, spacing finite
    /// and > 0: what the XDMF sidecar, plots and damping stencils rely on.
    pub fn check(&self) -> Result<(), String> {
        if self.n.contains(&0)
            || self.n[0]
                .checked_mul(self.n[1])
                .and_then(|v| v.checked_mul(self.n[2]))
                .is_none()
        {
            return Err(format!(
                "grid cells {:?} must be > 0 along each axis (and their product fit)",
                self.n
            ));
        }
        if let Some(h) = self.spacing.iter().find(|h| !(h.is_finite() && **h > 0.0)) {
            return Err(format!("grid spacing must be finite and > 0 (got {h})"));
        }
        if let Some(o) = self.origin.iter().find(|o| !o.is_finite()) {
            return Err(format!("grid origin must be finite (got {o})"));
        }
        Ok(())
    }
    /// Number of cells.
    pub fn ncells(&self) -> usize {
        self.n[0] * self.n[1] * self.n[2]
    }
    /// Linear index of cell (i, j, k).
    pub fn index(&self, i: usize, j: usize, k: usize) -> usize {
        i + self.n[0] * (j + self.n[1] * k)
    }
    /// (i, j, k) of a linear index.
    pub fn ijk(&self, idx: usize) -> [usize; 3] {
        [
            idx % self.n[0],
            (idx / self.n[0]) % self.n[1],
            idx / (self.n[0] * self.n[1]),
        ]
    }
    /// Centre of a cell.
    pub fn center(&self, idx: usize) -> [f64; 3] {
        let c = self.ijk(idx);
        [0, 1, 2].map(|a| self.origin[a] + (c[a] as f64 + 0.5) * self.spacing[a])
    }
    /// The far corner (maximum x, y, z) of the grid.
    pub fn extent_max(&self) -> [f64; 3] {
        [0, 1, 2].map(|a| self.origin[a] + self.n[a] as f64 * self.spacing[a])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_round_trip() {
        let g = Grid::new([4, 3, 2], [0.0; 3], [1.0, 2.0, 0.5]);
        assert_eq!(g.ncells(), 24);
        for idx in 0..24 {
            let [i, j, k] = g.ijk(idx);
            assert_eq!(g.index(i, j, k), idx);
        }
        assert_eq!(g.index(1, 0, 0), 1);
        assert_eq!(g.index(0, 1, 0), 4);
        assert_eq!(g.center(g.index(1, 1, 1)), [1.5, 3.0, 0.75]);
    }
}
