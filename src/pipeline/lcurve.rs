//! An L-curve sweep: every weight solved, by default as one batch of LSQR solves sharing each
//! pass over the matrix (src/pipeline/batch.rs), or one solve after another (`--separate`,
//! the same numbers); the corner ([`crate::model::lcurve`]), GCV's minimum (the trace of the
//! influence matrix estimated by Hutchinson's method: random probes solved in the same batch)
//! and the discrepancy principle's weight.

use std::path::{Path, PathBuf};

use crate::backend::Precision;
use crate::comm::{Comm, SerialComm};
use crate::error::{Error, Result};
use crate::grid::Coverage;
use crate::io::mtx;
use crate::model::hdf5::{stage_model, ModelInputs};
use crate::model::lcurve::{
    corner, discrepancy_weight, gcv_minimum, gcv_value, LPoint, WeightChoice,
};
use crate::model::report::{Fit, Outcome};
use crate::pipeline::batch::{batch_blocker, solve_batch, BatchSystem, Member};
use crate::pipeline::config::RunConfig;
use crate::pipeline::operators::{choose_backend, BackendProbe};
use crate::pipeline::options::{BackendChoice, SolveOptions, SystemSource};
use crate::pipeline::solve::{same_values, solve_system};
use crate::sparse::{Csr, System};

/// The data of an L-curve sweep, loaded once.
pub struct Sweep {
    /// Kernel rows G (and the data d).
    pub g: Csr,
    pub d: Vec<f64>,
    /// Regularisation rows R (None: the weight is LSQR's damping).
    pub r: Option<Csr>,
    /// A dataset's grid (lets `reorder = "auto"` number the cells as an inversion of the
    /// dataset does; resolution tests are made on it).
    pub grid: Option<crate::grid::Grid>,
    /// A synthetic dataset's true model.
    pub true_model: Option<Vec<f64>>,
    /// The weights are LSQR's damping on [G; R] (R kept at its weight) instead of R's weight
    /// (`[solver] weight_on = "damp"`); without R they are the damping anyway.
    pub on_damp: bool,
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// How a sweep runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct SweepMode {
    /// One solve after another instead of one batch (the same numbers; for comparison, and
    /// what runs where the batch cannot: [`batch_blocker`]).
    pub separate: bool,
    /// Random probes per weight for GCV's trace estimate (0: no GCV).
    pub gcv_probes: usize,
    /// tau sqrt(m) sigma: the discrepancy principle's target (None: not chosen).
    pub noise_norm: Option<f64>,
}

/// A finished sweep: the points in the order of the weights, the corner's index and every
/// rule's choice.
pub struct Curve {
    pub points: Vec<LPoint>,
    pub corner: Option<usize>,
    pub choice: WeightChoice,
    /// Seconds of the solves (set-up included, the data's load not).
    pub seconds: f64,
}

/// The seed of GCV's probes (the same probes for every weight: GCV's curve is smooth in w).
const PROBE_SEED: u64 = 0x6763_7633;

impl Sweep {
    /// GCV's probes: `p` vectors of +-1 over the data rows (Rademacher).
    fn probes(&self, p: usize) -> Vec<Vec<f64>> {
        let mut rng = crate::grid::Rng::new(PROBE_SEED);
        (0..p)
            .map(|_| {
                (0..self.g.nrows())
                    .map(|_| if rng.uniform() < 0.5 { -1.0 } else { 1.0 })
                    .collect()
            })
            .collect()
    }

    /// All rows of a right-hand side: `data` on G's rows, 0 on R's.
    pub fn full_rhs(&self, data: &[f64]) -> Vec<f64> {
        let mut b = data.to_vec();
        b.resize(
            self.g.nrows() + self.r.as_ref().map_or(0, |r| r.nrows()),
            0.0,
        );
        b
    }

    /// The point of weight `w` solved as `outcome` (norms; no curvature or GCV yet): the tests'
    /// single solves ([`Self::points`] for the sweep's).
    #[cfg(test)]
    fn point(&self, w: f64, outcome: Outcome) -> LPoint {
        let gx = self.g.par_matvec(&outcome.solution.x);
        self.point_from(w, outcome, &gx, None)
    }

    /// The points of several solutions (weight index, outcome): from each outcome's fit (its
    /// products made on the operator it was solved on: the GPU's runs), the others with one
    /// pass over G on the host for all, each point as [`Self::point`] makes it, bit for bit
    /// (16 points at the iteration limit of the 101M-nonzero system took 0.57 s on 16 cores).
    fn points(&self, weights: &[f64], data: Vec<(usize, Outcome)>) -> Vec<(usize, LPoint)> {
        let (fitted, host): (Vec<_>, Vec<_>) = data
            .into_iter()
            .partition(|(_, o)| self.fit_of(o).is_some());
        let xs: Vec<&[f64]> = host.iter().map(|(_, o)| o.solution.x.as_slice()).collect();
        let gxs = self.g.par_matvec_many(&xs);
        let mut out: Vec<(usize, LPoint)> = host
            .into_iter()
            .zip(gxs)
            .map(|((i, o), gx)| (i, self.point_from(weights[i], o, &gx, None)))
            .collect();
        for (i, o) in fitted {
            // (the outcome keeps its fit: the caller may read G x from it)
            let fit = o.fit.clone().unwrap_or_default();
            // ||R x|| from the fit's ||w R x|| (the members of a weight sweep are [G; w R])
            let reg =
                (fit.reg_norm.is_finite() && weights[i] > 0.0).then(|| fit.reg_norm / weights[i]);
            out.push((i, self.point_from(weights[i], o, &fit.gx, reg)));
        }
        out.sort_by_key(|(i, _)| *i);
        out
    }

    /// The fit made on `o`'s operator, where it has one for G's rows.
    fn fit_of<'o>(&self, o: &'o Outcome) -> Option<&'o Fit> {
        o.fit.as_ref().filter(|f| f.gx.len() == self.g.nrows())
    }

    /// The point of `outcome`, G x given (on the host: its rows summed in parallel, the same
    /// sums as one row after another, which took 4 s for 16 points of the 101M-nonzero
    /// system), and ||R x|| where it is known (`rx`: the model norm of a sweep of R's weight).
    fn point_from(&self, w: f64, outcome: Outcome, gx: &[f64], rx: Option<f64>) -> LPoint {
        let x = &outcome.solution.x;
        let res: Vec<f64> = gx.iter().zip(&self.d).map(|(a, b)| a - b).collect();
        let lm = match &self.r {
            Some(r) if !self.on_damp => rx.unwrap_or_else(|| norm(&r.par_matvec(x))),
            _ => norm(x),
        };
        LPoint {
            weight: w,
            residual_norm: norm(&res),
            model_norm: lm,
            curvature: f64::NAN,
            trace: f64::NAN,
            gcv: f64::NAN,
            outcome,
        }
    }

    /// Members of one matrix [G; w R] (or G), differing by right-hand side and damping, solved
    /// on one operator, the set-up paid once: one after another, each its own solve
    /// ([`Self::solve_one`]'s numbers), or with `one_pass` the members of one right-hand side
    /// in one bidiagonalisation (each its host-loop solve bit for bit: `solver::lsqr_damps`).
    /// None where the layout's rows cannot be followed (then one by one).
    pub fn solve_shared(
        &self,
        w: f64,
        (members, rhs): (&[Member], &[&[f64]]),
        opts: &SolveOptions,
        comm: &dyn Comm,
        one_pass: bool,
    ) -> Result<Option<Vec<Outcome>>> {
        let damps: Vec<f64> = members.iter().map(|m| m.damp).collect();
        crate::pipeline::solve::solve_system_many(
            self.system(w, rhs[0])?,
            (rhs, &damps, one_pass),
            opts,
            comm,
        )
    }

    /// The system [G; w R] (or G) with right-hand side `b` (all rows).
    fn system(&self, w: f64, b: &[f64]) -> Result<System> {
        let a = match &self.r {
            Some(r) => self.g.vstack_scaled(r, w)?,
            None => self.g.clone(),
        };
        Ok(System {
            a,
            b: b.to_vec(),
            kernel_rows: self.g.nrows(),
        })
    }

    /// One member solved on its own (`--separate`): [G; w R] or G with damp w.
    pub fn solve_one(
        &self,
        m: Member,
        b: &[f64],
        opts: &SolveOptions,
        comm: &dyn Comm,
    ) -> Result<Outcome> {
        let mut o = opts.clone();
        o.params.damp = m.damp;
        solve_system(self.system(m.weight, b)?, &o, comm, 0.0, 0)
    }

    /// Solve `members` (their weights and damping) for right-hand sides `rhs` (all rows): as one
    /// batch, or one by one where `separate` asks or the batch cannot run ([`batch_blocker`],
    /// said on stderr). `take(group)` with the `(j, outcome)` of the members that finished
    /// (together).
    pub fn solve_members(
        &self,
        members: &[Member],
        rhs: &[&[f64]],
        opts: &SolveOptions,
        comm: &dyn Comm,
        separate: bool,
        take: &mut (dyn FnMut(Vec<(usize, Outcome)>) + Send),
    ) -> Result<()> {
        let nnz = self.g.nnz() + self.r.as_ref().map_or(0, |r| r.nnz());
        // Members of one matrix (the same weight, or no weighted rows) share one set-up.
        let w0 = members.first().map_or(1.0, |m| m.weight);
        let shared = self.r.is_none() || members.iter().all(|m| m.weight == w0);
        // On the GPU, unless `gpu_batch` says, they run one after another on that one operator
        // (each its own solve bit for bit; the batch saves little per member there, 0.60
        // against 0.75 ms an iteration at k = 16, and has no set-up to share).
        let gpu = matches!(
            choose_backend(opts.operator.backend),
            Ok((BackendChoice::Cuda, _))
        );
        // Members of one matrix and one right-hand side (an L-curve over LSQR's damping, GCV's
        // probes at every damping) share one bidiagonalisation, on any backend: about one
        // solve's products for all of them, each its own solve's numbers.
        let repeated = (1..rhs.len()).any(|j| rhs[..j].iter().any(|b| same_values(b, rhs[j])));
        if shared && repeated && !separate && comm.size() == 1 {
            if let Some(outs) = self.solve_shared(w0, (members, rhs), opts, comm, true)? {
                take(outs.into_iter().enumerate().collect());
                return Ok(());
            }
        }
        let blocker = if shared && gpu && opts.operator.tuning.gpu_batch.is_none() {
            Some("members of one matrix share one GPU operator, one solve after another".into())
        } else {
            batch_blocker(opts, nnz)
        };
        if separate || blocker.is_some() {
            if let (false, Some(why)) = (separate, &blocker) {
                eprintln!("note: the solves run one by one ({why})");
            }
            if shared && members.len() > 1 {
                if let Some(outs) = self.solve_shared(w0, (members, rhs), opts, comm, false)? {
                    take(outs.into_iter().enumerate().collect());
                    return Ok(());
                }
            }
            for (j, &m) in members.iter().enumerate() {
                take(vec![(j, self.solve_one(m, rhs[j], opts, comm)?)]);
            }
            return Ok(());
        }
        let a = match &self.r {
            Some(r) => self.g.vstack_scaled(r, 1.0)?,
            None => self.g.clone(),
        };
        let sys = BatchSystem {
            a,
            reg_from: self.r.as_ref().map(|_| self.g.nrows()),
        };
        solve_batch(sys, rhs, members, opts, comm, take)
    }

    /// Solve for every weight; `each` is called as each weight's data solve finishes (in the
    /// order they finish).
    pub fn run(
        &self,
        weights: &[f64],
        opts: &SolveOptions,
        comm: &dyn Comm,
        mode: SweepMode,
        mut each: impl FnMut(usize, &LPoint) + Send,
    ) -> Result<Curve> {
        let started = std::time::Instant::now();
        // On the GPU each solution's products are made on its operator (milliseconds) instead
        // of a pass over G on the host for each point and probe; where its values are f64 (f32
        // values would move a residual of 1e-3 of ||d|| in its fifth digit).
        let gpu = matches!(
            choose_backend(opts.operator.backend),
            Ok((BackendChoice::Cuda, _))
        );
        let opts = &SolveOptions {
            grid: opts.grid.or(self.grid.as_ref().map(|g| g.n)),
            fit: opts.fit || (gpu && opts.operator.precision == Precision::F64),
            ..opts.clone()
        };
        let p = mode.gcv_probes;
        let per = 1 + p;
        let member = |w: f64| match &self.r {
            Some(_) if !self.on_damp => Member {
                weight: w,
                damp: opts.params.damp,
            },
            _ => Member {
                weight: 1.0,
                damp: w,
            },
        };
        let members: Vec<Member> = weights
            .iter()
            .flat_map(|&w| std::iter::repeat_n(member(w), per))
            .collect();
        let probes = self.probes(p);
        let data = self.full_rhs(&self.d);
        let probe_rhs: Vec<Vec<f64>> = probes.iter().map(|z| self.full_rhs(z)).collect();
        let rhs_of = |j: usize| match j % per {
            0 => &data,
            q => &probe_rhs[q - 1],
        };
        let mut points: Vec<Option<LPoint>> = (0..weights.len()).map(|_| None).collect();
        // G x of each probe's solution (GCV's trace)
        let mut probe_gx: Vec<Option<Vec<f64>>> = vec![None; members.len()];
        let mut take = |group: Vec<(usize, Outcome)>| {
            let mut data = Vec::with_capacity(group.len());
            for (j, out) in group {
                if j % per == 0 {
                    data.push((j / per, out));
                } else {
                    let usable = self.fit_of(&out).is_some();
                    probe_gx[j] = Some(match out.fit {
                        Some(f) if usable => f.gx,
                        _ => self.g.par_matvec(&out.solution.x),
                    });
                }
            }
            let (t, n) = (std::time::Instant::now(), data.len());
            for (i, pt) in self.points(weights, data) {
                each(i, &pt);
                points[i] = Some(pt);
            }
            crate::ui::phases::trace(format_args!(
                "points of {n} members in {:.3} s",
                t.elapsed().as_secs_f64()
            ));
        };
        let rhs: Vec<&[f64]> = (0..members.len()).map(|j| rhs_of(j).as_slice()).collect();
        self.solve_members(&members, &rhs, opts, comm, mode.separate, &mut take)?;
        let mut pts: Vec<LPoint> = points
            .into_iter()
            .map(|p| p.ok_or_else(|| Error::Invalid("lcurve: a weight has no solution".into())))
            .collect::<Result<_>>()?;
        self.fill_gcv(&mut pts, &probes, &probe_gx, per);
        let mut c = self.choose(pts, weights, mode);
        c.seconds = started.elapsed().as_secs_f64();
        Ok(c)
    }

    /// Each point's trace estimate (1/p sum_q z_q^T G x_q, x_q the solve of [z_q; 0]; `gxs`
    /// holds each probe member's G x_q) and GCV.
    fn fill_gcv(
        &self,
        pts: &mut [LPoint],
        probes: &[Vec<f64>],
        gxs: &[Option<Vec<f64>>],
        per: usize,
    ) {
        if probes.is_empty() {
            return;
        }
        let m = self.g.nrows();
        for (i, pt) in pts.iter_mut().enumerate() {
            let t: f64 = probes
                .iter()
                .enumerate()
                .map(|(q, z)| match &gxs[i * per + q + 1] {
                    Some(gx) => gx.iter().zip(z).map(|(a, b)| a * b).sum(),
                    None => f64::NAN,
                })
                .sum::<f64>()
                / probes.len() as f64;
            pt.trace = t;
            pt.gcv = gcv_value(m, pt.residual_norm, t);
        }
    }

    /// The curvatures, the corner and every rule's choice.
    fn choose(&self, mut pts: Vec<LPoint>, weights: &[f64], mode: SweepMode) -> Curve {
        let triples: Vec<(f64, f64, f64)> = pts
            .iter()
            .map(|p| (p.weight, p.residual_norm, p.model_norm))
            .collect();
        let (c, k) = corner(&triples);
        for (p, k) in pts.iter_mut().zip(k) {
            p.curvature = k;
        }
        let gcv: Vec<(f64, f64)> = pts.iter().map(|p| (p.weight, p.gcv)).collect();
        let res: Vec<(f64, f64)> = pts.iter().map(|p| (p.weight, p.residual_norm)).collect();
        let choice = WeightChoice {
            what: self.weight_name().to_string(),
            rule: None,
            weight: None,
            corner: c.map(|i| pts[i].weight),
            gcv: if mode.gcv_probes > 0 {
                gcv_minimum(&gcv)
            } else {
                None
            },
            discrepancy: mode.noise_norm.and_then(|t| discrepancy_weight(&res, t)),
            noise_norm: mode.noise_norm,
            gcv_probes: mode.gcv_probes,
            tried: weights.to_vec(),
        };
        Curve {
            points: pts,
            corner: c,
            choice,
            seconds: 0.0,
        }
    }
}

impl Sweep {
    /// The sweep's data from a config's system: Matrix Market (kernel, data, optional reg rows)
    /// or a dataset (its kernel rows and data; its damping rows are R, each weight a factor on
    /// them, so weight 1 is the dataset as written).
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
                Ok(Sweep {
                    g,
                    d,
                    r,
                    grid: None,
                    true_model: None,
                    on_damp: cfg.weight.on_damp,
                })
            }
            SystemSource::Dataset { .. } => {
                let o = &cfg.options.operator;
                let loaded = crate::pipeline::load::load(
                    &cfg.system,
                    &SerialComm,
                    &o.tuning,
                    crate::partition::RowCost::CSR,
                )?;
                let System {
                    a,
                    mut b,
                    kernel_rows,
                } = loaded.system;
                b.truncate(kernel_rows);
                let (g, r) = a.split_at_row(kernel_rows);
                Ok(Sweep {
                    g,
                    d: b,
                    r: (r.nrows() > 0).then_some(r),
                    grid: loaded.grid,
                    true_model: loaded.true_model,
                    on_damp: cfg.weight.on_damp,
                })
            }
        }
    }

    /// [`Self::from_config`] with the run's backend chosen, and a GPU's context and kernels
    /// made, on another thread meanwhile (as `invert` does beside its read: 0.15-0.3 s of a
    /// GPU's start off the run's time). Hold the probe until the solves have made their
    /// backend: they find the context and kernels made.
    pub fn load_beside_backend(cfg: &RunConfig) -> Result<(Sweep, BackendProbe)> {
        let o = &cfg.options.operator;
        let probe = BackendProbe::start(o.backend, &SerialComm, &o.tuning);
        Ok((Sweep::from_config(cfg)?, probe))
    }

    /// What the weights weigh: the reg rows, or LSQR's damping.
    pub fn weight_name(&self) -> &'static str {
        if self.r.is_some() && !self.on_damp {
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

/// The whole `lcurve` run: the data loaded once, every weight solved (one batch, or one by one
/// with `separate`; `each(what the weights weigh, i, point)` as each weight's solve finishes),
/// lcurve.csv and lcurve.png, and the
/// corner's model.h5 + report.json (with every rule's choice) in `out`, all published as one
/// set. Outputs are checked against the inputs before any work.
pub fn lcurve(
    cfg: &RunConfig,
    weights: &[f64],
    out: &Path,
    separate: bool,
    mut each: impl FnMut(&'static str, usize, &LPoint) + Send,
) -> Result<(Curve, LcurveFiles)> {
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
    let (sweep, _probe) = Sweep::load_beside_backend(cfg)?;
    // The model side, checked before the solves: a dataset's grid and true model describe it
    // where `[model]` does not, as in `invert`.
    let kernel_rows = sweep.g.nrows();
    // The ray coverage is computed beside the solves (below); the model side is checked first.
    let later = Coverage::default();
    let known = crate::pipeline::model::Known {
        ncols: sweep.g.ncols(),
        grid: sweep.grid.as_ref(),
        true_model: sweep.true_model.as_ref(),
        kernel_rows,
    };
    let mut run_model = crate::pipeline::model::RunModel::with_coverage(cfg, known, later, false)?;
    let what = sweep.weight_name();
    let mode = SweepMode {
        separate,
        gcv_probes: cfg.weight.gcv_probes,
        noise_norm: cfg.weight.noise_norm(sweep.g.nrows()),
    };
    let (curve, coverage) = Coverage::beside(&sweep.g, kernel_rows, || {
        sweep.run(weights, &cfg.options, &SerialComm, mode, |i, p| {
            each(what, i, p)
        })
    });
    let curve = curve?;
    *run_model.coverage_mut() = coverage;
    let (pts, c) = (&curve.points, curve.corner);
    let triples: Vec<(f64, f64, f64)> = pts
        .iter()
        .map(|p| (p.weight, p.residual_norm, p.model_norm))
        .collect();
    let gmin = (0..pts.len())
        .filter(|&i| pts[i].gcv.is_finite())
        .min_by(|&a, &b| pts[a].gcv.total_cmp(&pts[b].gcv));
    let mut publ = crate::io::publish::Publication::new("lcurve");
    let csv = out.join("lcurve.csv");
    publ.write(&csv, |w| {
        writeln!(
            w,
            "{what},residual_norm,model_norm,curvature,iterations,istop,corner,trace,gcv,gcv_min,misfit_over_noise"
        )?;
        for (i, p) in pts.iter().enumerate() {
            let ratio = mode.noise_norm.map_or(f64::NAN, |t| p.residual_norm / t);
            writeln!(
                w,
                "{:e},{:e},{:e},{:e},{},{},{},{:e},{:e},{},{:e}",
                p.weight,
                p.residual_norm,
                p.model_norm,
                p.curvature,
                p.outcome.report.iterations,
                p.outcome.report.istop,
                u8::from(c == Some(i)),
                p.trace,
                p.gcv,
                u8::from(gmin == Some(i)),
                ratio
            )?;
        }
        Ok(())
    })?;
    let png = out.join("lcurve.png");
    let l_label = if sweep.weight_name() == "reg_weight" {
        "roughness ||R m||"
    } else {
        "model norm ||m||"
    };
    crate::model::plot::lcurve_png(&png, &triples, c, l_label)?;
    let mut model = None;
    if let Some(i) = c {
        let p = &pts[i];
        let path = out.join("model.h5");
        stage_model(
            &mut publ,
            &path,
            &ModelInputs {
                spec: &run_model.spec,
                outcome: &p.outcome,
                coverage: Some(&run_model.coverage),
                kernel_rows,
                config_text: &cfg.text,
                resolution: &[],
            },
        )?;
        let mut report = p.outcome.report.clone();
        report.run_id = publ.run_id().to_string();
        report.weight_choice = Some(curve.choice.clone());
        publ.write(&out.join("report.json"), |w| {
            crate::pipeline::publish::json_text(w, &report)
        })?;
        model = Some(path);
    }
    publ.commit()?;
    Ok((curve, LcurveFiles { csv, png, model }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::options::BackendChoice;
    use crate::solver::LsqrParams;

    fn opts(tol: f64) -> SolveOptions {
        let p = LsqrParams {
            atol: tol,
            btol: tol,
            conlim: 1e14,
            ..Default::default()
        };
        let mut o = SolveOptions::new(p, BackendChoice::Cpu);
        o.reorder = crate::grid::reorder::Reorder::Auto;
        o
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
    }

    /// The batched sweep against the separate one: the same points (norms within 1e-10, the
    /// same iterations and istop), corner and choices.
    fn same_curve(sweep: &Sweep, weights: &[f64], o: &SolveOptions, probes: usize) -> Curve {
        let mut mode = SweepMode {
            separate: false,
            gcv_probes: probes,
            noise_norm: Some(1.1 * norm(&sweep.d) * 0.1),
        };
        let batch = sweep.run(weights, o, &SerialComm, mode, |_, _| {}).unwrap();
        mode.separate = true;
        let sep = sweep.run(weights, o, &SerialComm, mode, |_, _| {}).unwrap();
        for (p, q) in batch.points.iter().zip(&sep.points) {
            let (rp, rq) = (&p.outcome.report, &q.outcome.report);
            assert_eq!(
                (rp.iterations, rp.istop),
                (rq.iterations, rq.istop),
                "w {}",
                p.weight
            );
            assert!(
                rel(p.residual_norm, q.residual_norm) <= 1e-10,
                "w {}",
                p.weight
            );
            assert!(rel(p.model_norm, q.model_norm) <= 1e-10, "w {}", p.weight);
            if probes > 0 {
                assert!(rel(p.gcv, q.gcv) <= 1e-10, "w {}", p.weight);
            }
        }
        assert_eq!(batch.corner, sep.corner);
        assert_eq!(batch.choice.gcv, sep.choice.gcv);
        assert_eq!(batch.choice.discrepancy, sep.choice.discrepancy);
        batch
    }

    #[test]
    fn australia_batched_curve_equals_the_separate_solves() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/australia");
        let g = mtx::read_matrix(dir.join("G.mtx.gz")).unwrap();
        let d = mtx::read_vector(dir.join("d.txt")).unwrap();
        let r = mtx::read_matrix(dir.join("R.mtx.gz")).unwrap();
        let mut sweep = Sweep {
            g,
            d,
            r: Some(r),
            grid: None,
            true_model: None,
            on_damp: false,
        };
        let iterations = |c: &Curve| -> std::collections::BTreeSet<usize> {
            c.points
                .iter()
                .map(|p| p.outcome.report.iterations)
                .collect()
        };
        // weights about the corner (1e-3), whose solves stop at different iterations
        let c = same_curve(&sweep, &[3e-4, 1e-3, 3e-3, 1e-2], &opts(1e-6), 1);
        assert!(iterations(&c).len() >= 3, "{:?}", iterations(&c));
        assert!(c.corner.is_some());
        // G alone, the weight LSQR's damping
        sweep.r = None;
        let c = same_curve(&sweep, &[0.03, 0.1, 0.3, 1.0], &opts(1e-6), 0);
        assert!(iterations(&c).len() >= 3, "{:?}", iterations(&c));
        // the dampings of one b in one bidiagonalisation (the separate solves' points above)
        assert!(c
            .points
            .iter()
            .all(|p| p.outcome.report.lsqr_loop == "shared"));
    }

    /// A synthetic with known noise: G random, x smooth, d = G x + sigma e.
    fn synthetic(with_r: bool) -> (Sweep, Vec<f64>, f64) {
        let (m, n) = (600usize, 120usize);
        let mut rng = crate::grid::Rng::new(42);
        let (mut ri, mut ci, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..m {
            for _ in 0..8 {
                ri.push(i as u64);
                ci.push(rng.below(n as u64));
                v.push(rng.uniform());
            }
        }
        let g = Csr::from_triplets(m, n, &ri, &ci, &v).unwrap();
        let x: Vec<f64> = (0..n).map(|j| (j as f64 / 15.0).sin()).collect();
        let sigma = 0.05;
        let d: Vec<f64> = g
            .matvec(&x)
            .iter()
            .map(|y| y + sigma * crate::grid::random::gaussian(&mut rng))
            .collect();
        let r = with_r.then(|| {
            // first differences
            let (mut ri, mut ci, mut v) = (Vec::new(), Vec::new(), Vec::new());
            for j in 0..n - 1 {
                ri.extend([j as u64, j as u64]);
                ci.extend([j as u64, j as u64 + 1]);
                v.extend([-1.0, 1.0]);
            }
            Csr::from_triplets(n - 1, n, &ri, &ci, &v).unwrap()
        });
        (
            Sweep {
                g,
                d,
                r,
                grid: None,
                true_model: None,
                on_damp: false,
            },
            x,
            sigma,
        )
    }

    #[test]
    fn discrepancy_weight_fits_the_noise_and_gcv_is_near_the_best_model() {
        for with_r in [true, false] {
            let (sweep, x_true, sigma) = synthetic(with_r);
            let m = sweep.g.nrows();
            let target = (m as f64).sqrt() * sigma;
            let weights = crate::model::lcurve::parse_log_range("1e-2:1e2:13").unwrap();
            let o = opts(1e-12);
            let mode = SweepMode {
                separate: false,
                gcv_probes: 4,
                noise_norm: Some(target),
            };
            let c = sweep
                .run(&weights, &o, &SerialComm, mode, |_, _| {})
                .unwrap();
            let solve_at = |w: f64| {
                let mem = match &sweep.r {
                    Some(_) => Member {
                        weight: w,
                        damp: 0.0,
                    },
                    None => Member {
                        weight: 1.0,
                        damp: w,
                    },
                };
                let b = sweep.full_rhs(&sweep.d);
                sweep.point(w, sweep.solve_one(mem, &b, &o, &SerialComm).unwrap())
            };
            let wd = c.choice.discrepancy.expect("a discrepancy weight");
            let p = solve_at(wd);
            assert!(
                rel(p.residual_norm, target) < 0.05,
                "r {}: ||r|| {} vs noise norm {target}",
                with_r,
                p.residual_norm
            );
            // GCV: an interior minimum whose model error is near the best of the tried weights
            let wg = c.choice.gcv.expect("a GCV minimum");
            assert!(wg > weights[0] && wg < weights[12], "{wg}");
            let err = |x: &[f64]| {
                x.iter()
                    .zip(&x_true)
                    .map(|(a, b)| (a - b).powi(2))
                    .sum::<f64>()
                    .sqrt()
            };
            let best = c
                .points
                .iter()
                .map(|p| err(&p.outcome.solution.x))
                .fold(f64::INFINITY, f64::min);
            let eg = err(&solve_at(wg).outcome.solution.x);
            assert!(
                eg <= 1.5 * best,
                "r {with_r}: GCV's error {eg}, best tried {best}"
            );
            // the trace estimate lies in (0, n]: the influence matrix's eigenvalues are in [0, 1]
            assert!(c
                .points
                .iter()
                .all(|p| p.trace > 0.0 && p.trace < 1.2 * 120.0));
        }
    }

    #[test]
    fn separate_and_batched_synthetic_curves_agree_with_damping() {
        let (sweep, _, _) = synthetic(false);
        same_curve(&sweep, &[0.01, 0.1, 1.0, 10.0], &opts(1e-10), 2);
    }
}
