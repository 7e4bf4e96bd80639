//! The model side of an `invert` run: validated before the solve, written after it.

use crate::error::Result;
use crate::model::report::{Outcome, Report};
use crate::model::spec::ModelSpec;
use crate::pipeline::config::RunConfig;
use crate::pipeline::load::Loaded;
use crate::solver::{LsqrInfo, LsqrSolution};

/// What the loaded system says about the model: its columns, the dataset's grid and true
/// model, the kernel rows.
pub struct Known<'a> {
    pub ncols: usize,
    pub grid: Option<&'a crate::grid::Grid>,
    pub true_model: Option<&'a Vec<f64>>,
    pub kernel_rows: usize,
}

/// The model side of an `invert` run: validated before the solve (so a bad `[model]` table fails
/// fast), written after it.
/// With several ranks, sum `coverage` over ranks.
pub struct RunModel {
    pub spec: crate::model::spec::ModelSpec,
    pub coverage: crate::grid::Coverage,
    pub kernel_rows: usize,
    pub ckpt: Option<crate::model::checkpoint::Checkpointing>,
    /// The coverage is not computed yet: the run fills it in after the solve
    /// ([`RunModel::prepare_later`]).
    pub coverage_later: bool,
}

impl RunModel {
    /// Read the `[model]` files, compute the ray coverage of the kernel rows and set up
    /// checkpointing (`resume`: continue from the checkpoint when there is one). A dataset that
    /// carries a grid (and, when synthetic, its true model) describes the model when the
    /// `[model]` table does not.
    pub fn prepare(cfg: &RunConfig, loaded: &Loaded, resume: bool) -> Result<RunModel> {
        let sys = &loaded.system;
        let coverage = crate::grid::Coverage::from_kernel_rows(&sys.a, sys.kernel_rows);
        let known = Known {
            ncols: sys.a.ncols(),
            grid: loaded.grid.as_ref(),
            true_model: loaded.true_model.as_ref(),
            kernel_rows: sys.kernel_rows,
        };
        RunModel::with_coverage(cfg, known, coverage, resume)
    }

    /// [`RunModel::prepare`] without the coverage, which the run computes later (a GPU run: while
    /// the GPU solves) and puts in [`RunModel::coverage`] before the outputs.
    pub fn prepare_later(cfg: &RunConfig, loaded: &Loaded, resume: bool) -> Result<RunModel> {
        let sys = &loaded.system;
        let known = Known {
            ncols: sys.a.ncols(),
            grid: loaded.grid.as_ref(),
            true_model: loaded.true_model.as_ref(),
            kernel_rows: sys.kernel_rows,
        };
        let mut m = RunModel::with_coverage(cfg, known, crate::grid::Coverage::default(), resume)?;
        m.coverage_later = true;
        Ok(m)
    }

    /// [`RunModel::prepare`] with the coverage already computed (prepared storage keeps it).
    pub fn with_coverage(
        cfg: &RunConfig,
        known: Known,
        coverage: crate::grid::Coverage,
        resume: bool,
    ) -> Result<RunModel> {
        let n = known.ncols;
        let mut spec = cfg.model.spec(n)?;
        if let crate::pipeline::options::SystemSource::Dataset { path, .. } = &cfg.system {
            // The parts the dataset gives are named by its manifest in errors.
            let mut src = cfg.model.sources();
            if matches!(spec.param, crate::model::spec::Parameterisation::Vector) {
                if let Some(g) = known.grid {
                    spec.param = crate::model::spec::Parameterisation::Grid(g.clone());
                    src.grid = Some(path);
                }
            }
            if spec.true_model.is_none() {
                spec.true_model = known.true_model.cloned();
                src.true_model = Some(path);
            }
            spec.check_from(n, &src)?;
        }
        let ckpt = (cfg.model.checkpoint_every > 0 || resume).then(|| {
            crate::model::checkpoint::Checkpointing::new(
                cfg.model.checkpoint.clone(),
                cfg.model.checkpoint_every,
                resume,
            )
        });
        Ok(RunModel {
            spec,
            coverage,
            kernel_rows: known.kernel_rows,
            ckpt,
            coverage_later: false,
        })
    }

    /// The cells along x, y, z when the unknowns are a grid's (reorder = "auto" then renumbers
    /// them, and compact storage splits the grid's damping rows off as stencils).
    pub fn grid(&self) -> Option<[usize; 3]> {
        match &self.spec.param {
            crate::model::spec::Parameterisation::Grid(g) => Some(g.n),
            _ => None,
        }
    }

    /// The coverage, to be summed over ranks.
    pub fn coverage_mut(&mut self) -> &mut crate::grid::Coverage {
        &mut self.coverage
    }

    pub fn checkpointing(&self) -> Option<&crate::model::checkpoint::Checkpointing> {
        self.ckpt.as_ref()
    }

    /// Stage the model file (when configured) into the run's output set.
    pub fn stage(
        &self,
        publ: &mut crate::io::publish::Publication,
        cfg: &RunConfig,
        o: &Outcome,
    ) -> Result<()> {
        let Some(p) = &cfg.model.path else {
            return Ok(());
        };
        let pb = crate::ui::progress::open_ended("writing");
        pb.set_message(crate::io::tidy(p).display().to_string());
        let staged = crate::model::hdf5::stage_model(
            publ,
            p,
            &crate::model::hdf5::ModelInputs {
                spec: &self.spec,
                outcome: o,
                coverage: Some(&self.coverage),
                kernel_rows: self.kernel_rows,
                config_text: &cfg.text,
                resolution: &[],
            },
        );
        pb.finish_and_clear();
        staged
    }

    /// Remove this rank's checkpoint of the finished run (every rank, after the outputs were
    /// published) when this run wrote it or resumed from it (a file it never wrote is left
    /// alone, whatever its name), and the temporary file of a checkpoint write that was
    /// killed. Checkpoints of a job with another number of ranks (`NAME.rank<r>` after a killed
    /// MPI job, `NAME` after a one-process run) are not this run's: rank 0 reports them.
    pub fn remove_checkpoint(&self, comm: &dyn crate::comm::Comm) -> Result<()> {
        if let Some(ck) = &self.ckpt {
            let p = ck.path_for(comm);
            ck.remove_ours(&p)?;
            crate::io::remove_stale_temps(&p);
            if comm.is_root() {
                report_other_checkpoints(&ck.path, comm.size());
            }
        }
        Ok(())
    }
}

/// A solution computed elsewhere (Python's `seistomo.write_model`): x, the variance estimate
/// and what its solver reported (None: not known; the file says so in `stop_reason`).
pub struct Solved {
    pub x: Vec<f64>,
    pub var: Option<Vec<f64>>,
    pub info: Option<LsqrInfo>,
    /// The solver's name ("lsqr", "lsmr").
    pub method: &'static str,
}

/// Write `s` as the model file `path` (and, for a grid, its XDMF sidecar) as `invert` writes
/// one, without the ray coverage (no kernel rows are known) and with an empty history. The spec
/// is checked against x first.
pub fn write_solution(path: &std::path::Path, spec: &ModelSpec, s: Solved) -> Result<()> {
    spec.check(s.x.len())?;
    if let Some(v) = &s.var {
        if v.len() != s.x.len() {
            return Err(crate::error::Error::Invalid(format!(
                "var has {} values but x has {}",
                v.len(),
                s.x.len()
            )));
        }
    }
    let info = s.info.unwrap_or_else(|| LsqrInfo {
        istop: 0,
        stop_reason: "not known (a solution written from Python without its solver's report)"
            .into(),
        itn: 0,
        norms: Default::default(),
        seconds: 0.0,
        start_itn: 0,
    });
    let report = Report::of_solution(s.method, s.x.len(), &info);
    let outcome = Outcome {
        solution: LsqrSolution {
            x: s.x,
            var: s.var,
            info,
        },
        history: Vec::new(),
        report,
        calibration: Default::default(),
        coverage: None,
        fit: None,
    };
    crate::model::hdf5::write_model(
        path,
        &crate::model::hdf5::ModelInputs {
            spec,
            outcome: &outcome,
            coverage: None,
            kernel_rows: 0,
            config_text: "",
            resolution: &[],
        },
    )
}

/// Say which checkpoints of other jobs (another number of ranks) lie beside this job's (`base`
/// for one rank, `base.rank<r>`, r < `ranks`, for several): left in place, they would be
/// resumed by a run with that number of ranks, or are to be deleted by hand.
fn report_other_checkpoints(base: &std::path::Path, ranks: usize) {
    let (Some(dir), Some(name)) = (base.parent(), base.file_name()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        dir
    };
    let name = name.to_string_lossy();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut others: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            let rank = n
                .strip_prefix(&*name)
                .and_then(|r| r.strip_prefix(".rank"))
                .filter(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
                .map(|r| r.parse::<usize>().unwrap_or(usize::MAX));
            match rank {
                Some(r) => ranks == 1 || r >= ranks,
                None => *n == *name && ranks > 1,
            }
        })
        .collect();
    if others.is_empty() {
        return;
    }
    others.sort();
    eprintln!(
        "seistomo: note: {} in {} {} from a run with another number of ranks (not this run's: left in place; resume that run with its rank count, or delete them)",
        others.join(", "),
        crate::io::tidy(dir).display(),
        if others.len() == 1 { "is a checkpoint" } else { "are checkpoints" }
    );
}
