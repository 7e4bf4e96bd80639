//! The `solve` / `invert` pipeline over ranks: rank 0 loads the system and sends each rank its
//! rows (nonzero-balanced), every rank runs LSQR on its rows (one vector reduction per
//! iteration), rank 0 collects the per-rank timing and alone writes the outputs. With one rank
//! this is exactly the single-process pipeline of [`crate::pipeline`].

use std::time::Instant;

use crate::comm::{agree, distribute_system, Comm, RankTiming, TimedComm};
use crate::error::Result;
use crate::model::report::Outcome;
use crate::partition::blocks::RowPartition;
use crate::pipeline::config::RunConfig;
use crate::pipeline::model::RunModel;
use crate::pipeline::{self, OutputPaths, SolveOptions};
use crate::sparse::System;

/// Where each rank's rows come from.
pub enum Loading {
    /// Rank 0 loads the whole system and sends each rank a nonzero-balanced block of rows
    /// (Matrix Market input).
    Root,
    /// Every rank loads its own rows itself (datasets: the loader's greedy LPT partition, each
    /// rank reading only its row files / pack ranges).
    PerRank,
    /// [`Loading::PerRank`], the rows read this way (recorded in report.json as `load_io`).
    PerRankVia(crate::io::rowio::IoPath),
}

/// Load (on rank 0, or on every rank), distribute, solve and write. Returns the outcome on rank 0 and `None` on the
/// other ranks. Errors while loading or writing reach every rank as the same
/// [`crate::Error::Rank`]; other errors are this rank's own (the caller must end the job, e.g.
/// with [`Comm::abort`], since other ranks may be waiting in a collective).
pub fn run_lsqr(
    comm: &dyn Comm,
    load: impl FnOnce() -> Result<System>,
    loading: Loading,
    opts: &SolveOptions,
    out: &OutputPaths,
    progress_every: usize,
    model: Option<(&RunConfig, bool)>,
) -> Result<Option<Outcome>> {
    // Problems every rank would hit alike are found before any rank waits for another.
    agree(comm, crate::solver::lsqr::check_params(&opts.params))?;
    let t = Instant::now();
    let load_io = match &loading {
        Loading::PerRankVia(io) => io.to_string(),
        _ => String::new(),
    };
    let sys = match loading {
        Loading::Root => distribute_system(comm, load, RowPartition::by_nnz_midpoints)?,
        Loading::PerRank | Loading::PerRankVia(_) => agree(comm, load())?,
    };
    let load_s = t.elapsed().as_secs_f64();
    let (rows, nnz) = (sys.a.nrows(), sys.a.nnz());
    // The model file's coverage (hit count, DWS) is summed over every rank's kernel rows;
    // checkpoints are per rank (u is distributed).
    let run_model = match model {
        None => None,
        Some((cfg, resume)) => {
            let mut m = agree(comm, RunModel::prepare(cfg, &sys, resume))?;
            if comm.size() > 1 {
                let cov = m.coverage_mut();
                let mut hits: Vec<f64> = cov.hit_count.iter().map(|&h| h as f64).collect();
                comm.allreduce_sum(&mut hits)?;
                comm.allreduce_sum(&mut cov.dws)?;
                cov.hit_count = hits.iter().map(|&h| h as u32).collect();
            }
            Some(m)
        }
    };
    // The grid (when the unknowns are its cells) lets reorder = "auto" renumber the cells.
    let mut opts = opts.clone();
    if let Some(m) = &run_model {
        if let crate::model::spec::Parameterisation::Grid(g) = &m.spec.param {
            opts.grid = Some(g.n);
        }
    }
    let opts = &opts;
    let timed = TimedComm::new(comm);
    let mut outcome = pipeline::solve_system_checkpointed(
        sys,
        opts,
        &timed,
        load_s,
        progress_every,
        run_model.as_ref().and_then(|m| m.checkpointing()),
    )?;
    outcome.report.load_io = load_io;
    let red = timed.totals();
    let allreduce_s = red.vector_s + red.scalar_s;
    let mine = RankTiming {
        rank: comm.rank(),
        rows,
        nnz,
        load_s,
        compute_s: (outcome.solution.info.seconds - allreduce_s).max(0.0),
        allreduce_s,
        allreduce_vector_s: red.vector_s,
        allreduce_calls: red.vector_calls + red.scalar_calls,
    };
    let all = mine.gather(comm)?;
    let written = match all {
        Some(all) => {
            outcome.report.rank_timing = all;
            publish(
                out,
                &mut outcome,
                run_model.as_ref().zip(model.map(|m| m.0)),
            )
        }
        None => Ok(()),
    };
    agree(comm, written)?;
    // Each rank removes the checkpoint it wrote, once the outputs are published.
    if let Some(m) = &run_model {
        agree(comm, m.remove_checkpoint(comm))?;
    }
    Ok(comm.is_root().then_some(outcome))
}

/// Rank 0: the solution, variance, history, report and model of one run, published as one set
/// (src/io/publish.rs) that carries the run id (report.json `run_id`, model.h5 /solver).
fn publish(
    out: &OutputPaths,
    outcome: &mut Outcome,
    model: Option<(&RunModel, &RunConfig)>,
) -> Result<()> {
    let mut publ =
        crate::io::publish::Publication::new(if model.is_some() { "invert" } else { "solve" });
    outcome.report.run_id = publ.run_id().to_string();
    pipeline::stage_outputs(&mut publ, out, outcome)?;
    if let Some((m, cfg)) = model {
        m.stage(&mut publ, cfg, outcome)?;
    }
    publ.commit()?;
    if let Some((_, cfg)) = model {
        if let Some(p) = &cfg.model.path {
            eprintln!("model file written to {}", p.display());
        }
    }
    Ok(())
}
