//! Derived model fields (velocity, slowness, perturbations).

use rayon::prelude::*;

use crate::model::spec::{ModelSpec, Parameterisation, Reference, Unknowns};

/// The model fields written to model.h5, each one value per unknown (grid order).
#[derive(Debug, Clone)]
pub struct Fields {
    pub slowness: Vec<f64>,
    /// 1 / slowness (NaN where the slowness is not positive).
    pub velocity: Vec<f64>,
    pub reference_velocity: Vec<f64>,
    /// Slowness minus the reference slowness.
    pub slowness_perturbation: Vec<f64>,
    /// Relative velocity perturbation 100 (v - v_ref) / v_ref, in percent.
    pub perturbation: Vec<f64>,
    pub true_velocity: Option<Vec<f64>>,
    pub true_perturbation: Option<Vec<f64>>,
}

fn interp(profile: &[(f64, f64)], z: f64) -> f64 {
    let first = profile[0];
    let last = profile[profile.len() - 1];
    if z <= first.0 {
        return first.1;
    }
    if z >= last.0 {
        return last.1;
    }
    for w in profile.windows(2) {
        let ((z0, v0), (z1, v1)) = (w[0], w[1]);
        if z <= z1 {
            return v0 + (v1 - v0) * (z - z0) / (z1 - z0);
        }
    }
    last.1
}

fn inv(s: f64) -> f64 {
    if s > 0.0 {
        1.0 / s
    } else {
        f64::NAN
    }
}

impl Fields {
    /// Derive every field from the solution vector `x` (length checked by `spec.check`). Each
    /// field is made on rayon's threads (value by value, the same numbers as one loop): a
    /// run whose heap holds no freed memory (one from prepared storage) faults in every page
    /// of its 10-11 arrays (115 MB at 1.31M cells), 0.11 s on one thread of the H100's host.
    pub fn derive(spec: &ModelSpec, x: &[f64]) -> Fields {
        let n = x.len();
        let each = |f: &(dyn Fn(usize) -> f64 + Sync)| -> Vec<f64> {
            (0..n).into_par_iter().map(f).collect()
        };
        // Reference slowness per cell.
        let ref_slow: Vec<f64> = match &spec.reference {
            Reference::Constant(v) => each(&|_| 1.0 / v),
            Reference::Profile(p) => match &spec.param {
                Parameterisation::Grid(g) => each(&|i| 1.0 / interp(p, g.center(i)[2])),
                // Validated away; fall back to the profile's first velocity.
                _ => each(&|_| 1.0 / p[0].1),
            },
            Reference::Mean => {
                // (in order, on one thread: the sum's bits)
                let mean = match spec.unknowns {
                    Unknowns::Slowness => x.iter().sum::<f64>(),
                    Unknowns::SlownessPerturbation => (0..n).map(|_| 0.0).sum::<f64>(),
                } / n.max(1) as f64;
                each(&|_| mean)
            }
        };
        let to_slowness = |v: &[f64]| -> Vec<f64> {
            match spec.unknowns {
                Unknowns::Slowness => each(&|i| v[i]),
                Unknowns::SlownessPerturbation => each(&|i| ref_slow[i] + v[i]),
            }
        };
        let pert = |s: &[f64]| -> Vec<f64> { each(&|i| 100.0 * (inv(s[i]) * ref_slow[i] - 1.0)) };
        let slowness = to_slowness(x);
        let velocity = each(&|i| inv(slowness[i]));
        let perturbation = pert(&slowness);
        let slowness_perturbation = each(&|i| slowness[i] - ref_slow[i]);
        let (true_velocity, true_perturbation) = match &spec.true_model {
            Some(t) => {
                let s = to_slowness(t);
                (Some(each(&|i| inv(s[i]))), Some(pert(&s)))
            }
            None => (None, None),
        };
        Fields {
            slowness,
            velocity,
            reference_velocity: each(&|i| inv(ref_slow[i])),
            slowness_perturbation,
            perturbation,
            true_velocity,
            true_perturbation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::Grid;

    #[test]
    fn perturbation_of_a_profile_reference() {
        let mut g = Grid::new([1, 1, 2], [0.0; 3], [1.0, 1.0, 10.0]);
        g.axes[2] = "depth".into();
        let spec = ModelSpec {
            param: Parameterisation::Grid(g),
            unknowns: Unknowns::SlownessPerturbation,
            slowness_unit: "s/km".into(),
            reference: Reference::Profile(vec![(0.0, 4.0), (20.0, 6.0)]),
            true_model: Some(vec![0.0, 0.0]),
        };
        // Cell centres at depth 5 and 15: v_ref 4.5 and 5.5.
        let x = [1.0 / 4.95 - 1.0 / 4.5, 0.0];
        let f = Fields::derive(&spec, &x);
        assert!((f.reference_velocity[0] - 4.5).abs() < 1e-12);
        assert!((f.reference_velocity[1] - 5.5).abs() < 1e-12);
        assert!((f.velocity[0] - 4.95).abs() < 1e-12);
        assert!((f.perturbation[0] - 10.0).abs() < 1e-9);
        assert_eq!(f.perturbation[1], 0.0);
        assert_eq!(f.true_perturbation.unwrap(), vec![0.0, 0.0]);
    }
}
