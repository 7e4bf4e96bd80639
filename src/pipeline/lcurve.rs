//! An L-curve sweep: one LSQR solve per regularisation weight (the corner: [`crate::model::lcurve`]).

use std::path::{Path, PathBuf};

use crate::comm::{Comm, SerialComm};
use crate::error::{Error, Result};
use crate::grid::Coverage;
use crate::io::mtx;
use crate::model::hdf5::{stage_model, ModelInputs};
use crate::model::lcurve::{corner, LPoint};
use crate::pipeline::config::RunConfig;
use crate::pipeline::options::{SolveOptions, SystemSource};
use crate::pipeline::solve::solve_system;
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

impl Sweep {
    /// The sweep's data from a config's Matrix Market system (kernel, data, optional reg rows).
    pub fn from_config(cfg: &RunConfig) -> Result<Sweep> {
        match &cfg.system {
            SystemSource::Mtx {
                matrix, rhs, reg, ..
            } => {
                let g = mtx::read_matrix(matrix)?;
                let d = match rhs {
                    Some(p) => mtx::read_vector(p)?,
                    None => g.matvec(&vec![1.0; g.ncols()]),
                };
                if d.len() != g.nrows() {
                    return Err(Error::format(
                        matrix,
                        format!("{} values for {} rows", d.len(), g.nrows()),
                    ));
                }
                let r = reg.as_deref().map(mtx::read_matrix).transpose()?;
                if let (Some(r), Some(p)) = (&r, reg) {
                    if r.ncols() != g.ncols() {
                        return Err(Error::format(
                            p,
                            format!(
                                "reg matrix has {} columns, the kernel {}",
                                r.ncols(),
                                g.ncols()
                            ),
                        ));
                    }
                }
                Ok(Sweep { g, d, r })
            }
            _ => Err(Error::Invalid(
                "lcurve supports Matrix Market systems ([system] matrix/rhs/reg)".into(),
            )),
        }
    }

    /// What the weights weigh: the reg rows, or LSQR's damping.
    pub fn weight_name(&self) -> &'static str {
        if self.r.is_some() {
            "reg_weight"
        } else {
            "damp"
        }
    }
}

/// The files of an L-curve run.
pub struct LcurveFiles {
    pub csv: PathBuf,
    pub png: PathBuf,
    /// The corner's model.h5 (None: no corner found).
    pub model: Option<PathBuf>,
}

/// The whole `lcurve` run: the data loaded once, one solve per weight (`each` after every
/// solve), lcurve.csv and lcurve.png, and the corner's model.h5 + report.json in `out`, all
/// published as one set. Outputs are checked against the inputs before any work.
pub fn lcurve(
    cfg: &RunConfig,
    weights: &[f64],
    out: &Path,
    each: impl FnMut(usize, &LPoint),
) -> Result<(Vec<LPoint>, Option<usize>, LcurveFiles)> {
    if weights.len() < 3 {
        return Err(Error::Invalid(format!(
            "an L-curve needs at least 3 weights (got {})",
            weights.len()
        )));
    }
    let mut paths = cfg.input_paths();
    for f in [
        "lcurve.csv",
        "lcurve.png",
        "model.h5",
        "model.xdmf",
        "report.json",
    ] {
        paths.output("-o", &out.join(f));
    }
    let _lock = crate::io::outpaths::check_and_lock(&paths)?;
    let sweep = Sweep::from_config(cfg)?;
    let what = sweep.weight_name();
    let pts = sweep.run(weights, &cfg.options, &SerialComm, each)?;
    let triples: Vec<(f64, f64, f64)> = pts
        .iter()
        .map(|p| (p.weight, p.residual_norm, p.model_norm))
        .collect();
    let (c, _) = corner(&triples);
    let mut publ = crate::io::publish::Publication::new("lcurve");
    let csv = out.join("lcurve.csv");
    publ.write(&csv, |w| {
        writeln!(
            w,
            "{what},residual_norm,model_norm,curvature,iterations,istop,corner"
        )?;
        for (i, p) in pts.iter().enumerate() {
            writeln!(
                w,
                "{:e},{:e},{:e},{:e},{},{},{}",
                p.weight,
                p.residual_norm,
                p.model_norm,
                p.curvature,
                p.outcome.report.iterations,
                p.outcome.report.istop,
                u8::from(c == Some(i))
            )?;
        }
        Ok(())
    })?;
    let png = out.join("lcurve.png");
    let l_label = if sweep.r.is_some() {
        "roughness ||R m||"
    } else {
        "model norm ||m||"
    };
    crate::model::plot::lcurve_png(&png, &triples, c, l_label)?;
    let mut model = None;
    if let Some(i) = c {
        let p = &pts[i];
        let spec = cfg.model.spec(sweep.g.ncols())?;
        let cov = Coverage::from_kernel_rows(&sweep.g, sweep.g.nrows());
        let path = out.join("model.h5");
        stage_model(
            &mut publ,
            &path,
            &ModelInputs {
                spec: &spec,
                outcome: &p.outcome,
                coverage: Some(&cov),
                kernel_rows: sweep.g.nrows(),
                config_text: &cfg.text,
            },
        )?;
        let mut report = p.outcome.report.clone();
        report.run_id = publ.run_id().to_string();
        publ.write(&out.join("report.json"), |w| {
            crate::pipeline::publish::json_text(w, &report)
        })?;
        model = Some(path);
    }
    publ.commit()?;
    Ok((pts, c, LcurveFiles { csv, png, model }))
}
