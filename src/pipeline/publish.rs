//! Stage 4, publish: a run's output files (solution, report.json, history.csv, var and the
//! model file), staged into one publication (src/io/publish.rs) after the solve succeeded and
//! committed as one set.

use std::path::Path;

use serde::Serialize;

use crate::error::Result;
use crate::io::publish::Publication;
use crate::io::{vector_text, write_atomic};
use crate::model::report::Outcome;
use crate::pipeline::config::RunConfig;
use crate::pipeline::model::RunModel;
use crate::pipeline::options::OutputPaths;
use crate::solver::IterRecord;

/// The history as CSV.
pub fn history_csv(w: &mut dyn std::io::Write, h: &[IterRecord]) -> std::io::Result<()> {
    writeln!(w, "itn,r1norm,r2norm,arnorm,anorm,acond,xnorm,seconds")?;
    for r in h {
        writeln!(
            w,
            "{},{:e},{:e},{:e},{:e},{:e},{:e},{:e}",
            r.itn, r.r1norm, r.r2norm, r.arnorm, r.anorm, r.acond, r.xnorm, r.seconds
        )?;
    }
    Ok(())
}

/// Any serialisable value as pretty JSON.
pub fn json_text<T: Serialize>(w: &mut dyn std::io::Write, value: &T) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *w, value).map_err(std::io::Error::other)?;
    writeln!(w)
}

/// Write the history as CSV (atomically, on its own).
pub fn write_history(path: &Path, h: &[IterRecord]) -> Result<()> {
    write_atomic(path, |w| history_csv(w, h))
}

/// Write any serialisable value as pretty JSON (atomically, on its own).
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    write_atomic(path, |w| json_text(w, value))
}

/// Stage the outputs that are asked for into a run's output set (rank 0 only), in a fixed
/// order: solution, variance, history, report.
pub fn stage_outputs(publ: &mut Publication, out: &OutputPaths, o: &Outcome) -> Result<()> {
    if let Some(p) = &out.solution {
        crate::ui::phases::time("solution", || {
            publ.write(p, |w| vector_text(w, &o.solution.x))
        })?;
    }
    if let (Some(p), Some(var)) = (&out.variance, &o.solution.var) {
        publ.write(p, |w| vector_text(w, var))?;
    }
    if let Some(p) = &out.history {
        publ.write(p, |w| history_csv(w, &o.history))?;
    }
    if let Some(p) = &out.report {
        publ.write(p, |w| json_text(w, &o.report))?;
    }
    Ok(())
}

/// Write the outputs that are asked for as one set (call on rank 0 only). Directories are
/// created.
pub fn write_outputs(out: &OutputPaths, o: &Outcome) -> Result<()> {
    let mut publ = Publication::new("solve");
    stage_outputs(&mut publ, out, o)?;
    publ.commit()
}

/// Rank 0: the solution, variance, history, report and model of one run, published as one set
/// (src/io/publish.rs) that carries the run id (report.json `run_id`, model.h5 /solver).
pub fn publish(
    out: &OutputPaths,
    outcome: &mut Outcome,
    model: Option<(&RunModel, &RunConfig)>,
) -> Result<()> {
    let t = std::time::Instant::now();
    crate::ui::phases::trace(format_args!("publishing"));
    crate::ui::phases::take();
    let mut publ = Publication::new(if model.is_some() { "invert" } else { "solve" });
    outcome.report.run_id = publ.run_id().to_string();
    // report.json last, with the seconds the others took (`seconds.write`)
    let report = out.report.clone();
    let rest = OutputPaths {
        report: None,
        ..out.clone()
    };
    stage_outputs(&mut publ, &rest, outcome)?;
    if let Some((m, cfg)) = model {
        m.stage(&mut publ, cfg, outcome)?;
    }
    if let Some(p) = &report {
        outcome.report.seconds.write = t.elapsed().as_secs_f64();
        outcome.report.seconds.elapsed = crate::ui::phases::since_process_start();
        outcome.report.write_phases = crate::ui::phases::take();
        publ.write(p, |w| json_text(w, &outcome.report))?;
    }
    // (`invert` says "model file written to ..." after its summary line.)
    publ.commit()
}
