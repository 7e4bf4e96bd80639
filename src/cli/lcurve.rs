//! `seistomo lcurve CONFIG --damping 0.001,0.01,0.1,1` (or `--log-range 1e-3:1:9`): one
//! inversion per damping / regularisation weight, the data loaded once; writes lcurve.csv,
//! lcurve.png, and the corner's model.h5 + report.json.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use crate::comm::SerialComm;
use crate::grid::Coverage;
use crate::io::mtx;
use crate::model::hdf5::{stage_model, ModelInputs};
use crate::model::lcurve::{corner, parse_list, parse_log_range};
use crate::pipeline::config::RunConfig;
use crate::pipeline::lcurve::Sweep;
use crate::pipeline::SystemSource;

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
    /// Output directory (default: the config's output dir + /lcurve).
    #[arg(short = 'o', long, alias = "output")]
    out: Option<PathBuf>,
}

pub fn run(a: LcurveArgs) -> anyhow::Result<()> {
    let cfg = RunConfig::load(&a.config)?;
    crate::pipeline::config::note_config(&cfg);
    super::init_threads(cfg.options.threads)?;
    let weights = match (&a.damping, &a.log_range) {
        (Some(d), None) => parse_list(d)?,
        (None, Some(r)) => parse_log_range(r)?,
        _ => bail!("give --damping W1,W2,... or --log-range FROM:TO:COUNT"),
    };
    if weights.len() < 3 {
        bail!(
            "an L-curve needs at least 3 weights (got {})",
            weights.len()
        );
    }
    let out = match &a.out {
        Some(o) => o.clone(),
        None => cfg
            .output
            .report
            .as_ref()
            .and_then(|p| p.parent())
            .map(|d| d.join("lcurve"))
            .unwrap_or_else(|| PathBuf::from("lcurve")),
    };
    // Before any work: no output is an input; this run alone writes `out`.
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
    #[allow(unreachable_patterns)] // other system sources are added by the dataset work
    let sweep = match &cfg.system {
        SystemSource::Mtx {
            matrix, rhs, reg, ..
        } => {
            let g = mtx::read_matrix(matrix)?;
            let d = match rhs {
                Some(p) => mtx::read_vector(p)?,
                None => g.matvec(&vec![1.0; g.ncols()]),
            };
            if d.len() != g.nrows() {
                bail!(
                    "{}: {} values for {} rows",
                    matrix.display(),
                    d.len(),
                    g.nrows()
                );
            }
            let r = reg.as_deref().map(mtx::read_matrix).transpose()?;
            if let Some(r) = &r {
                if r.ncols() != g.ncols() {
                    bail!(
                        "reg matrix has {} columns, the kernel {}",
                        r.ncols(),
                        g.ncols()
                    );
                }
            }
            Sweep { g, d, r }
        }
        _ => bail!("lcurve supports Matrix Market systems ([system] matrix/rhs/reg)"),
    };
    let what = if sweep.r.is_some() {
        "reg_weight"
    } else {
        "damp"
    };
    let l_label = if sweep.r.is_some() {
        "roughness ||R m||"
    } else {
        "model norm ||m||"
    };
    eprintln!("L-curve over {} values of {what}", weights.len());
    let pts = sweep.run(&weights, &cfg.options, &SerialComm, |i, p| {
        eprintln!(
            "  {what} {:.4e}: ||Gm-d|| {:.6e}  {} {:.6e}  ({} its, istop {})",
            weights[i],
            p.residual_norm,
            if sweep.r.is_some() { "||Rm||" } else { "||m||" },
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
    let unconverged = pts.iter().filter(|p| p.outcome.report.istop == 7).count();
    if unconverged > 0 {
        eprintln!(
            "warning: {unconverged} of {} weights stopped at the iteration limit (istop 7); the curve and its corner may be off",
            pts.len()
        );
    }
    let triples: Vec<(f64, f64, f64)> = pts
        .iter()
        .map(|p| (p.weight, p.residual_norm, p.model_norm))
        .collect();
    let (c, _) = corner(&triples);
    // lcurve.csv and the corner's model.h5 + report.json are published as one set.
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
    crate::model::plot::lcurve_png(&png, &triples, c, l_label)?;
    eprintln!(
        "wrote {} and {}",
        crate::io::tidy(&csv).display(),
        crate::io::tidy(&png).display()
    );
    match c {
        Some(i) => {
            let p = &pts[i];
            eprintln!("corner: {what} = {:.6e}", p.weight);
            let n = sweep.g.ncols();
            let spec = cfg.model.spec(n)?;
            let cov = Coverage::from_kernel_rows(&sweep.g, sweep.g.nrows());
            let model = out.join("model.h5");
            stage_model(
                &mut publ,
                &model,
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
                crate::pipeline::json_text(w, &report)
            })?;
            publ.commit()?;
            eprintln!(
                "corner model written to {}",
                crate::io::tidy(&model).display()
            );
        }
        None => {
            publ.commit()?;
            eprintln!("no corner found (the curve has no left turn): widen the range")
        }
    }
    Ok(())
}
