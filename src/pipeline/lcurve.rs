//! An L-curve sweep: one LSQR solve per regularisation weight (the corner: [`crate::model::lcurve`]).

use crate::comm::Comm;
use crate::error::Result;
use crate::model::lcurve::{corner, LPoint};
use crate::pipeline::{solve_system, SolveOptions};
use crate::sparse::{Csr, System};

/// The data of an L-curve sweep, loaded once.
pub struct Sweep {
    /// Kernel rows G (and the data d).
    pub g: Csr,
    pub d: Vec<f64>,
    /// Regularisation rows R (None: the weight is LSQR's damping).
    pub r: Option<Csr>,
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

impl Sweep {
    /// Solve for every weight; `each` is called after every solve (for progress).
    pub fn run(
        &self,
        weights: &[f64],
        opts: &SolveOptions,
        comm: &dyn Comm,
        mut each: impl FnMut(usize, &LPoint),
    ) -> Result<Vec<LPoint>> {
        let mut pts = Vec::with_capacity(weights.len());
        for (i, &w) in weights.iter().enumerate() {
            let mut o = opts.clone();
            let sys = match &self.r {
                Some(r) => {
                    let a = self.g.vstack_scaled(r, w)?;
                    let mut b = self.d.clone();
                    b.resize(a.nrows(), 0.0);
                    System {
                        a,
                        b,
                        kernel_rows: self.g.nrows(),
                    }
                }
                None => {
                    o.params.damp = w;
                    System {
                        a: self.g.clone(),
                        b: self.d.clone(),
                        kernel_rows: self.g.nrows(),
                    }
                }
            };
            let outcome = solve_system(sys, &o, comm, 0.0, 0)?;
            let x = &outcome.solution.x;
            let gx = self.g.matvec(x);
            let res: Vec<f64> = gx.iter().zip(&self.d).map(|(a, b)| a - b).collect();
            let lm = match &self.r {
                Some(r) => norm(&r.matvec(x)),
                None => norm(x),
            };
            let p = LPoint {
                weight: w,
                residual_norm: norm(&res),
                model_norm: lm,
                curvature: f64::NAN,
                outcome,
            };
            each(i, &p);
            pts.push(p);
        }
        let triples: Vec<(f64, f64, f64)> = pts
            .iter()
            .map(|p| (p.weight, p.residual_norm, p.model_norm))
            .collect();
        let (_, k) = corner(&triples);
        for (p, k) in pts.iter_mut().zip(k) {
            p.curvature = k;
        }
        Ok(pts)
    }
}
