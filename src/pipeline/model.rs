//! The model side of an `invert` run: validated before the solve, written after it.

use crate::error::{Error, Result};
use crate::model::report::Outcome;
use crate::pipeline::config::RunConfig;
use crate::sparse::System;

/// The model side of an `invert` run: validated before the solve (so a bad `[model]` table fails
/// fast), written after it.
/// A dataset reader that knows its grid, reference and true model replaces `spec` after
/// [`RunModel::prepare`]; with several ranks, sum `coverage` over ranks (`Coverage::merge`).
pub struct RunModel {
    pub spec: crate::model::spec::ModelSpec,
    pub coverage: crate::grid::Coverage,
    pub kernel_rows: usize,
    pub ckpt: Option<crate::model::checkpoint::Checkpointing>,
}

impl RunModel {
    /// Read the `[model]` files, compute the ray coverage of the kernel rows and set up
    /// checkpointing (`resume`: continue from the checkpoint when there is one).
    pub fn prepare(cfg: &RunConfig, sys: &System, resume: bool) -> Result<RunModel> {
        let n = sys.a.ncols();
        let mut spec = cfg.model.spec(n)?;
        // A dataset that carries a grid (and, when synthetic, its true model) describes the
        // model when the [model] table does not.
        if let crate::pipeline::SystemSource::Dataset { path, .. } = &cfg.system {
            if matches!(spec.param, crate::model::spec::Parameterisation::Vector) {
                if let Some(g) = crate::io::dataset::manifest::DatasetManifest::load(path)?
                    .m
                    .grid
                {
                    spec.param = crate::model::spec::Parameterisation::Grid(g);
                }
            }
            if spec.true_model.is_none() {
                spec.true_model = crate::io::dataset::read_true_model(path)?;
            }
            spec.check(n)?;
        }
        let coverage = crate::grid::Coverage::from_kernel_rows(&sys.a, sys.kernel_rows);
        let ckpt = (cfg.model.checkpoint_every > 0 || resume).then(|| {
            crate::model::checkpoint::Checkpointing {
                path: cfg.model.checkpoint.clone(),
                every: cfg.model.checkpoint_every,
                resume,
            }
        });
        Ok(RunModel {
            spec,
            coverage,
            kernel_rows: sys.kernel_rows,
            ckpt,
        })
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
        if let Some(p) = &cfg.model.path {
            let pb = crate::progress::open_ended("writing");
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
                },
            );
            pb.finish_and_clear();
            staged?;
        }
        Ok(())
    }

    /// Remove this rank's checkpoint of the finished run (every rank, after the outputs were
    /// published), and the temporary file of a checkpoint write that was killed.
    pub fn remove_checkpoint(&self, comm: &dyn crate::comm::Comm) -> Result<()> {
        if let Some(ck) = &self.ckpt {
            let p = ck.path_for(comm);
            if p.is_file() {
                std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
            }
            crate::io::remove_stale_temps(&p);
        }
        Ok(())
    }
}
