//! `seistomo resolution`: the `[resolution]` tests (src/model/resolution.rs) and the real data
//! inverted together as one batch of LSQR solves that differ only by the right-hand side (the
//! data, or a test model's synthetic data through the kernel rows, with optional noise): the
//! same matrix, weight and damping as `invert` uses, each pass over the matrix shared. Writes
//! model.h5 (the data's model, with a /resolution/NAME group per test), resolution.csv, one
//! figure per test (true and recovered side by side) and report.json, as one output set.

use std::path::{Path, PathBuf};

use crate::comm::SerialComm;
use crate::error::{Error, Result};
use crate::grid::synthetic::travel_times;
use crate::model::hdf5::{stage_model, ModelInputs};
use crate::model::report::Outcome;
use crate::model::resolution::{display_layer, TestResult};
use crate::model::spec::Parameterisation;
use crate::pipeline::batch::Member;
use crate::pipeline::config::RunConfig;
use crate::pipeline::lcurve::Sweep;
use crate::pipeline::model::{Known, RunModel};
use crate::pipeline::options::{SolveOptions, SystemSource};

/// The files a resolution run wrote.
pub struct ResolutionFiles {
    pub model: PathBuf,
    pub csv: PathBuf,
    pub figures: Vec<PathBuf>,
}

/// A finished resolution run: the data's outcome and every test's.
pub struct Resolution {
    pub data: Outcome,
    pub tests: Vec<TestResult>,
    /// Seconds of the solves (set-up included, the load not).
    pub seconds: f64,
}

/// The figure of test `name` in `out`.
fn figure(out: &Path, name: &str) -> PathBuf {
    out.join(format!("resolution_{name}.png"))
}

/// Run the config's `[resolution]` tests with its data into `out` (one batch, or one solve
/// after another with `separate`; `each(name, outcome)` as each solve finishes). Outputs are
/// checked against the inputs before any work.
pub fn resolution(
    cfg: &RunConfig,
    out: &Path,
    separate: bool,
    mut each: impl FnMut(&str, &Outcome) + Send,
) -> Result<(Resolution, ResolutionFiles)> {
    let spec = cfg.resolution.as_ref().ok_or_else(|| {
        Error::config(
            &cfg.path,
            "no [resolution] table: give checkerboard = [[NX, NY, NZ], ...] and/or spikes = [[I, J, K], ...]",
        )
    })?;
    let mut paths = cfg.input_paths();
    for f in ["model.h5", "model.xdmf", "resolution.csv", "report.json"] {
        paths.output("-o", &out.join(f));
    }
    for name in spec.names() {
        paths.output("-o", &figure(out, &name));
    }
    let _lock = crate::io::outpaths::check_and_lock(&paths)?;
    let (sweep, _probe) = Sweep::load_beside_backend(cfg)?;
    let (g, kernel_rows) = (&sweep.g, sweep.g.nrows());
    // The ray coverage is computed beside the solves (below); the model side is checked first.
    let later = crate::grid::Coverage::default();
    let known = Known {
        ncols: g.ncols(),
        grid: sweep.grid.as_ref(),
        true_model: sweep.true_model.as_ref(),
        kernel_rows,
    };
    let mut model = RunModel::with_coverage(cfg, known, later, false)?;
    let Parameterisation::Grid(grid) = &model.spec.param else {
        return Err(Error::config(
            &cfg.path,
            "resolution tests are made on a grid: use a dataset with a grid, or give [model] grid",
        ));
    };
    let grid = &grid.clone(); // (the model takes its coverage after the solves)
    let tests = spec.tests(grid)?;
    let started = std::time::Instant::now();
    // member 0: the data; then each test's synthetic data (noise seeded per test)
    let mut rhs = vec![sweep.full_rhs(&sweep.d)];
    for (j, (_, _, m)) in tests.iter().enumerate() {
        let d = travel_times(g, m, spec.noise, spec.seed.wrapping_add(j as u64));
        rhs.push(sweep.full_rhs(&d));
    }
    let damp = cfg.options.params.damp;
    let member = match (&sweep.r, &cfg.system) {
        (Some(_), SystemSource::Mtx { reg_weight, .. }) => Member {
            weight: *reg_weight,
            damp,
        },
        _ => Member { weight: 1.0, damp },
    };
    let members = vec![member; rhs.len()];
    let opts = SolveOptions {
        grid: Some(grid.n),
        ..cfg.options.clone()
    };
    let names: Vec<String> = std::iter::once("data".to_string())
        .chain(tests.iter().map(|t| t.0.clone()))
        .collect();
    let mut outcomes: Vec<Option<Outcome>> = (0..rhs.len()).map(|_| None).collect();
    let refs: Vec<&[f64]> = rhs.iter().map(|b| b.as_slice()).collect();
    let (solved, coverage) = crate::grid::Coverage::beside(g, kernel_rows, || {
        sweep.solve_members(
            &members,
            &refs,
            &opts,
            &SerialComm,
            separate,
            &mut |group| {
                for (j, o) in group {
                    each(&names[j], &o);
                    outcomes[j] = Some(o);
                }
            },
        )
    });
    solved?;
    *model.coverage_mut() = coverage;
    let seconds = started.elapsed().as_secs_f64();
    let mut outcomes = outcomes
        .into_iter()
        .map(|o| o.ok_or_else(|| Error::Invalid("resolution: a solve gave no result".into())));
    let data = outcomes
        .next()
        .ok_or_else(|| Error::Invalid("resolution: no data solve".into()))??;
    let results: Vec<TestResult> = tests
        .into_iter()
        .zip(outcomes)
        .map(|(t, o)| {
            let o = o?;
            let its = (o.report.iterations, o.report.istop);
            Ok(TestResult::new(
                grid,
                t,
                o.solution.x,
                its,
                spec.spike_amplitude,
            ))
        })
        .collect::<Result<_>>()?;

    let mut publ = crate::io::publish::Publication::new("resolution");
    let csv = out.join("resolution.csv");
    publ.write(&csv, |w| {
        writeln!(
            w,
            "test,kind,correlation,depth_correlation_min,depth_correlation_mean,peak_recovery,spread_cells,true_spread_cells,leakage,iterations,istop"
        )?;
        for t in &results {
            let (min, mean) = crate::model::resolution::min_mean(&t.depth_correlation);
            let kind = match t.kind {
                crate::model::resolution::TestKind::Checkerboard(_) => "checkerboard",
                crate::model::resolution::TestKind::Spike { .. } => "spike",
            };
            let nan = f64::NAN;
            let (p, s, ts, l) = t.spike.map_or((nan, nan, nan, nan), |s| {
                (s.peak, s.spread, s.true_spread, s.leakage)
            });
            writeln!(
                w,
                "{},{kind},{:e},{:e},{:e},{:e},{:e},{:e},{:e},{},{}",
                t.name, t.correlation, min, mean, p, s, ts, l, t.iterations, t.istop
            )?;
        }
        Ok(())
    })?;
    let mut figures = Vec::new();
    for t in &results {
        let path = figure(out, &t.name);
        let k = display_layer(grid, &t.true_model);
        crate::model::plot::resolution_png(&path, grid, &t.name, (&t.true_model, &t.recovered), k)?;
        figures.push(path);
    }
    let model_path = out.join("model.h5");
    stage_model(
        &mut publ,
        &model_path,
        &ModelInputs {
            spec: &model.spec,
            outcome: &data,
            coverage: Some(&model.coverage),
            kernel_rows,
            config_text: &cfg.text,
            resolution: &results,
        },
    )?;
    let mut report = data.report.clone();
    report.run_id = publ.run_id().to_string();
    publ.write(&out.join("report.json"), |w| {
        crate::pipeline::publish::json_text(w, &report)
    })?;
    publ.commit()?;
    Ok((
        Resolution {
            data,
            tests: results,
            seconds,
        },
        ResolutionFiles {
            model: model_path,
            csv,
            figures,
        },
    ))
}
