//! `seistomo lcurve CONFIG --damping 0.001,0.01,0.1,1` (or `--log-range 1e-3:1:9`): every
//! damping / regularisation weight solved in one batch (LSQR's dampings of one system in one
//! bidiagonalisation; `--separate`: one inversion after another), the data loaded once; writes lcurve.csv, lcurve.png, and the corner's model.h5 +
//! report.json; prints the corner, GCV's and the discrepancy principle's weights.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use crate::model::lcurve::{parse_list, parse_log_range};
use crate::pipeline::config::RunConfig;
use crate::pipeline::lcurve::lcurve;

#[derive(Debug, Args)]
pub struct LcurveArgs {
    /// Run configuration (TOML).
    config: PathBuf,
    /// Weights, comma-separated: the weight of the reg rows ([system] reg) or, without a reg
    /// matrix, LSQR's damping.
    #[arg(long, conflicts_with = "log_range")]
    damping: Option<String>,
    /// FROM:TO:COUNT weights evenly spaced in log, e.g. 1e-3:1:9.
    #[arg(long)]
    log_range: Option<String>,
    /// Solve the weights one after another instead of as one batch (the same curve; slower).
    #[arg(long)]
    separate: bool,
    /// What the weights weigh: `reg` (the regularisation / damping rows; the default where
    /// the system has them) or `damp` (LSQR's damping, the rows as configured; every weight
    /// then shares one bidiagonalisation). Overrides `[solver] weight_on`.
    #[arg(long, value_parser = ["reg", "damp"])]
    weight_on: Option<String>,
    /// Output directory (default: the config's output dir + /lcurve).
    #[arg(short = 'o', long, alias = "output")]
    out: Option<PathBuf>,
}

pub fn run(a: LcurveArgs) -> anyhow::Result<()> {
    let mut cfg = RunConfig::load(&a.config)?;
    if let Some(on) = &a.weight_on {
        cfg.weight.on_damp = on == "damp";
    }
    crate::pipeline::config::note_config(&cfg);
    super::init_threads(cfg.options.threads)?;
    let weights = match (&a.damping, &a.log_range) {
        (Some(d), None) => parse_list(d)?,
        (None, Some(r)) => parse_log_range(r)?,
        (None, None) if !cfg.weight.weights.is_empty() => cfg.weight.weights.clone(),
        _ => bail!("give --damping W1,W2,... or --log-range FROM:TO:COUNT (or [solver] weights)"),
    };
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| super::output_subdir(&cfg, "lcurve"));
    eprintln!(
        "L-curve over {} weights{}",
        weights.len(),
        if a.separate {
            ", one solve after another"
        } else {
            ", one batch"
        }
    );
    let mut what = "damp";
    let (curve, files) = lcurve(&cfg, &weights, &out, a.separate, |name, i, p| {
        what = name;
        eprintln!(
            "  {what} {:.4e}: ||Gm-d|| {:.6e}  {} {:.6e}  ({} its, istop {})",
            weights[i],
            p.residual_norm,
            if what == "reg_weight" {
                "||Rm||"
            } else {
                "||m||"
            },
            p.model_norm,
            p.outcome.report.iterations,
            p.outcome.report.istop
        );
        if p.outcome.report.istop == 7 {
            eprintln!(
                "  warning: {what} {:.4e} stopped at the iteration limit ({} iterations, istop 7): this point is not converged; raise [solver] iter_lim",
                weights[i], p.outcome.report.iterations
            );
        }
    })?;
    eprintln!("solved in {:.2} s", curve.seconds);
    let (pts, c, ch) = (&curve.points, curve.corner, &curve.choice);
    // The longest solve: with one batch its seconds are the batch's until it stopped.
    if let Some(p) = pts.iter().max_by_key(|p| p.outcome.report.iterations) {
        let r = &p.outcome.report;
        eprintln!(
            "{}: set-up {:.3} s; {} iterations in {:.3} s ({:.4} ms each; {}; {})",
            if r.lsqr_loop.contains("batched") {
                "batch"
            } else if r.lsqr_loop == "shared" {
                "one bidiagonalisation"
            } else {
                "longest solve"
            },
            r.seconds.setup,
            r.iterations,
            r.seconds.solve,
            r.ms_per_iter,
            r.backend,
            r.storage
        );
    }
    let unconverged = pts.iter().filter(|p| p.outcome.report.istop == 7).count();
    if unconverged > 0 {
        eprintln!(
            "warning: {unconverged} of {} weights stopped at the iteration limit (istop 7); the curve and its corner may be off",
            pts.len()
        );
    }
    eprintln!(
        "wrote {} and {}",
        crate::io::tidy(&files.csv).display(),
        crate::io::tidy(&files.png).display()
    );
    match (c, &files.model) {
        (Some(i), Some(model)) => {
            eprintln!("corner: {what} = {:.6e}", pts[i].weight);
            eprintln!(
                "corner model written to {}",
                crate::io::tidy(model).display()
            );
        }
        _ => eprintln!("no corner found (the curve has no left turn): widen the range"),
    }
    match ch.gcv {
        Some(g) => eprintln!(
            "gcv: {what} = {g:.6e} (minimum of GCV; trace by {} random probe(s) per weight)",
            ch.gcv_probes
        ),
        None if ch.gcv_probes == 0 => eprintln!("gcv: off ([solver] gcv_probes = 0)"),
        None => eprintln!("gcv: no minimum (no finite GCV value)"),
    }
    match (ch.discrepancy, ch.noise_norm) {
        (Some(d), Some(t)) => {
            eprintln!("discrepancy: {what} = {d:.6e} (||Gm-d|| = noise norm {t:.6e})")
        }
        (None, Some(t)) => eprintln!(
            "discrepancy: no two tried weights bracket ||Gm-d|| = {t:.6e}: widen the range"
        ),
        _ => eprintln!("discrepancy: no noise level ([solver] noise = SIGMA)"),
    }
    Ok(())
}
