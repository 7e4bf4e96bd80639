//! A whole LSQR run on every rank of a job, as `invert` and `solve` do it: the stages in order,
//! [`super::load`] -> [`super::prepare`] -> [`super::solve`] -> [`super::publish`], with the
//! model side of `invert` ([`RunModel`]: coverage, checkpoints, the model file) beside them.
//! With one rank this is the single-process run.

use std::path::Path;

use crate::comm::{agree, Comm, RankTiming, TimedComm};
use crate::error::Result;
use crate::model::report::Outcome;
use crate::pipeline::config::RunConfig;
use crate::pipeline::load::{load, Loaded};
use crate::pipeline::model::{Known, RunModel};
use crate::pipeline::operators::{
    likely_backend, resolve_storage, row_cost, same_backend_everywhere, BackendProbe, Engine,
};
use crate::pipeline::options::{BackendChoice, OutputPaths, SolveOptions, SystemSource};
use crate::pipeline::prepare::{finish, prepare};
use crate::pipeline::prepared::{reuse, Asked, Reused, UsePrepared};
use crate::pipeline::publish::publish;
use crate::pipeline::solve::{layout_for, solve, LsqrJob, Watch};

/// One LSQR run: where the system comes from, how to solve it, what to write.
pub struct LsqrRun<'a> {
    pub source: &'a SystemSource,
    pub options: &'a SolveOptions,
    pub outputs: &'a OutputPaths,
    /// Progress lines every N iterations (0: a bar, or nothing when quiet).
    pub progress_every: usize,
    /// `invert`'s model side: the config (model file, checkpoints) and whether to resume.
    pub model: Option<(&'a RunConfig, bool)>,
}

/// `seistomo invert CONFIG`: read and check the config on every rank (`tune`: KEY=VALUE
/// tuning knobs over its `[tuning]` table), lock the outputs, note the inputs for the model's
/// provenance, run. Returns the outcome and the output files on rank 0.
pub fn invert(
    config: &Path,
    tune: &[String],
    comm: &dyn Comm,
    progress_every: usize,
    resume: bool,
) -> Result<Option<(Outcome, OutputPaths)>> {
    invert_config(RunConfig::load(config), tune, comm, progress_every, resume)
}

/// [`invert`] on config text given directly (the Python module's `invert(dict)`): `path`
/// names it in messages and its directory resolves the config's relative paths; no file need
/// be there (the text goes into the model file's provenance as a file's would).
pub fn invert_text(
    path: &Path,
    text: &str,
    tune: &[String],
    comm: &dyn Comm,
    progress_every: usize,
    resume: bool,
) -> Result<Option<(Outcome, OutputPaths)>> {
    invert_config(
        RunConfig::parse(path, text),
        tune,
        comm,
        progress_every,
        resume,
    )
}

/// [`invert`] once the config is read (or failed to be).
fn invert_config(
    cfg: Result<RunConfig>,
    tune: &[String],
    comm: &dyn Comm,
    progress_every: usize,
    resume: bool,
) -> Result<Option<(Outcome, OutputPaths)>> {
    // Every rank reads and checks the config; an error on any rank ends the job on every rank.
    let cfg = agree(
        comm,
        cfg.and_then(|mut c| {
            c.options.operator.tuning.apply(tune)?;
            Ok(c)
        }),
    )?;
    // Before any work: no output is an input, and this run alone writes its output directory
    // (rank 0 holds the lock until the end).
    let _lock = agree(
        comm,
        if comm.is_root() {
            crate::io::outpaths::check_and_lock(&cfg.paths()).map(Some)
        } else {
            Ok(None)
        },
    )?;
    crate::backend::cpu::init_threads(
        cfg.options
            .threads
            .or_else(crate::comm::default_threads_per_rank),
    )?;
    log_job(comm);
    if comm.is_root() {
        crate::pipeline::config::note_config(&cfg);
    }
    let mut cfg = cfg;
    if cfg.weight.rule.is_some() {
        choose_weight(&mut cfg, comm)?;
    }
    let outcome = run_lsqr(
        &LsqrRun {
            source: &cfg.system,
            options: &cfg.options,
            outputs: &cfg.output,
            progress_every,
            model: Some((&cfg, resume)),
        },
        comm,
    )?;
    Ok(outcome.map(|o| (o, cfg.output)))
}

/// `[solver] weight = "lcurve" | "gcv" | "discrepancy"`: every weight of `[solver] weights`
/// solved as one batch (src/pipeline/lcurve.rs), the rule's weight put into the config (the
/// reg rows' weight, or LSQR's damping without them) and the choice kept for report.json.
/// Matrix Market systems on one rank.
fn choose_weight(cfg: &mut RunConfig, comm: &dyn Comm) -> Result<()> {
    use crate::model::lcurve::WeightRule;
    use crate::pipeline::lcurve::{Sweep, SweepMode};
    let Some(rule) = cfg.weight.rule else {
        return Ok(());
    };
    if comm.size() > 1 {
        return Err(crate::Error::Invalid(
            "[solver] weight: the weight is chosen on one rank (run without MPI)".into(),
        ));
    }
    let (sweep, _probe) = Sweep::load_beside_backend(cfg)?;
    let mode = SweepMode {
        separate: false,
        gcv_probes: cfg.weight.gcv_probes,
        noise_norm: cfg.weight.noise_norm(sweep.g.nrows()),
    };
    let what = sweep.weight_name();
    eprintln!(
        "choosing {what} by {}: {} weights in one batch",
        rule.name(),
        cfg.weight.weights.len()
    );
    let curve = sweep.run(
        &cfg.weight.weights,
        &cfg.options,
        &crate::comm::SerialComm,
        mode,
        |_, _| {},
    )?;
    let mut ch = curve.choice;
    let w = match rule {
        WeightRule::Lcurve => ch.corner,
        WeightRule::Gcv => ch.gcv,
        WeightRule::Discrepancy => ch.discrepancy,
    }
    .ok_or_else(|| {
        crate::Error::Invalid(format!(
            "[solver] weight = \"{}\": no weight found among [solver] weights {:?} (corner {:?}, gcv {:?}, discrepancy {:?}); widen the range",
            rule.name(),
            cfg.weight.weights,
            ch.corner,
            ch.gcv,
            ch.discrepancy
        ))
    })?;
    eprintln!(
        "{what} = {w:.6e} by {} (corner {}, gcv {}, discrepancy {})",
        rule.name(),
        opt_e(ch.corner),
        opt_e(ch.gcv),
        opt_e(ch.discrepancy)
    );
    // The weight goes where the sweep put it: LSQR's damping, or a factor on every
    // regularisation row (a Matrix Market reg matrix's weight; a dataset's damping rows, stored
    // and generated from the grid, as `Sweep::from_config` loaded them).
    match &mut cfg.system {
        _ if what == "damp" => cfg.options.params.damp = w,
        SystemSource::Mtx { reg_weight, .. } => *reg_weight = w,
        SystemSource::Dataset { path, options, .. } => {
            let stored = match options.damping_weight {
                Some(l) => l,
                None => crate::io::dataset::manifest::DatasetManifest::load(path)?
                    .m
                    .damping
                    .as_ref()
                    .map_or(1.0, |d| d.weight),
            };
            options.damping_weight = Some(stored * w);
            if let Some(r) = options.regularisation.as_mut() {
                r.norm *= w;
                r.first = r.first.map(|f| f * w);
                r.second = r.second.map(|f| f * w);
            }
        }
    }
    ch.rule = Some(rule);
    ch.weight = Some(w);
    cfg.weight.chosen = Some(ch);
    Ok(())
}

fn opt_e(v: Option<f64>) -> String {
    v.map_or_else(|| "none".into(), |v| format!("{v:.4e}"))
}

/// On rank 0 of a multi-rank job, say how the job is laid out (stderr).
pub fn log_job(comm: &dyn Comm) {
    if comm.size() > 1 && comm.is_root() {
        eprintln!(
            "{}; {} thread(s) per rank",
            comm.describe(),
            rayon::current_num_threads()
        );
    }
}

/// `auto` without a usable GPU: one line on stderr saying why the CPU ran (rank 0, not with
/// --quiet; `--backend cuda` is an error instead), once the run has succeeded, before its
/// summary (a failed run's error stays its only line).
pub(crate) fn say_backend_fallback(asked: BackendChoice, kind: BackendChoice, why: &str) {
    if asked == BackendChoice::Auto
        && kind == BackendChoice::Cpu
        && crate::ui::progress::mode() != crate::ui::progress::Mode::Quiet
    {
        eprintln!("{why}");
    }
}

/// Load, lay out, solve and write. Returns the outcome on rank 0 and `None` on the other
/// ranks. Errors while loading or writing reach every rank as the same
/// [`crate::Error::Rank`]; other errors are this rank's own (the caller must end the job, e.g.
/// with [`Comm::abort`], since other ranks may be waiting in a collective).
pub fn run_lsqr(job: &LsqrRun, comm: &dyn Comm) -> Result<Option<Outcome>> {
    let opts = job.options;
    // Problems every rank would hit alike are found before any rank waits for another.
    agree(
        comm,
        match opts.method {
            crate::solver::LsqMethod::Lsqr => crate::solver::lsqr::check_params(&opts.params),
            crate::solver::LsqMethod::Lsmr => crate::solver::lsmr::check_lsmr_params(&opts.params),
        },
    )?;
    crate::ui::phases::take();
    // The backend chosen, and the GPU's context and kernels made, on another thread while the
    // system is read.
    let mut probe = BackendProbe::start(opts.operator.backend, comm, &opts.operator.tuning);
    let start_s = crate::ui::phases::since_process_start();
    let (start, mut run_model, opts, prepared_note) = begin(job, &mut probe, comm)?;
    let (kind, why) = probe.kind()?;
    let setup_started = std::time::Instant::now();
    let (rows, nnz) = start.size();
    let timed = TimedComm::new(comm);
    let (io, load_s, cost) = start.load_facts();
    let engine = Engine::start(
        kind,
        &timed,
        (
            opts.operator.allreduce,
            crate::pipeline::operators::lsqr_device_loop(&opts),
        ),
        &opts.operator.tuning,
    )?;
    if kind == BackendChoice::Cuda && timed.size() > 1 && timed.is_root() {
        if let Some(path) = engine.path() {
            eprintln!("allreduce of A^T u over ranks: {path}");
        }
    }
    let mut layout = layout_for(&opts, &engine, nnz);
    // A GPU run's ray coverage: computed from the rows as read while the GPU solves where they
    // reach the operator as read, else now; summed over the ranks after the solve.
    let mut coverage_now = None;
    if let (Some(m), Start::Fresh(loaded)) = (&run_model, &start) {
        if m.coverage_later {
            if layout.deferred.leaves_rows(layout.storage, layout.reorder) {
                layout.deferred.coverage = true;
            } else {
                let sys = &loaded.system;
                coverage_now = Some(crate::ui::phases::time("model", || {
                    crate::grid::Coverage::from_kernel_rows(&sys.a, sys.kernel_rows)
                }));
            }
        }
    }
    let prepared = match start {
        Start::Fresh(loaded) => prepare(loaded.system, &layout, &timed)?,
        Start::Reused(r) => finish(r.prepared, &layout, &timed, std::time::Instant::now())?,
    };
    let lsqr = LsqrJob {
        method: opts.method,
        params: &opts.params,
        spec: &opts.operator,
        checkpoint: run_model.as_ref().and_then(|m| m.checkpointing()),
        setup_started,
    };
    let watch = Watch::Progress(job.progress_every);
    let mut outcome = solve(&engine, &why, prepared, &lsqr, &timed, load_s, watch)?;
    crate::ui::phases::trace(format_args!("solved"));
    if let Some(m) = run_model.as_mut().filter(|m| m.coverage_later) {
        let pending = outcome.coverage.take();
        let got = coverage_now
            .or_else(|| pending.and_then(|p| p.take()))
            .ok_or_else(|| {
                crate::error::Error::Invalid(
                    "the ray coverage of the kernel rows was not computed".into(),
                )
            });
        crate::ui::phases::trace(format_args!("coverage in"));
        m.coverage = agree(comm, got)?;
        m.coverage_later = false;
        sum_coverage(m, comm)?;
        crate::ui::phases::trace(format_args!("coverage summed"));
    }
    outcome.report.load_io = io;
    outcome.report.seconds.start = start_s;
    outcome.report.prepared = prepared_note.unwrap_or_default();
    let red = timed.totals();
    let (its, cal) = (outcome.solution.info.itn, outcome.calibration);
    let (compute_s, allreduce_s) = (
        cal.product_ms * its as f64 * 1e-3,
        cal.allreduce_ms * its as f64 * 1e-3,
    );
    let mine = RankTiming {
        rank: comm.rank(),
        rows,
        nnz,
        cost: cost as f64,
        load_s,
        product_ms: cal.product_ms,
        allreduce_ms: cal.allreduce_ms,
        compute_s,
        allreduce_s,
        wait_s: (outcome.solution.info.seconds - compute_s - allreduce_s).max(0.0),
        allreduce_calls: red.vector_calls + red.scalar_calls,
        stencil_rows: cal.stencil_rows,
    };
    if let Some((cfg, _)) = job.model {
        outcome.report.weight_choice = cfg.weight.chosen.clone();
    }
    let written = match mine.gather(comm)? {
        Some(all) => {
            outcome.report.rank_timing = all;
            publish(
                job.outputs,
                &mut outcome,
                run_model.as_ref().zip(job.model.map(|m| m.0)),
            )
        }
        None => Ok(()),
    };
    agree(comm, written)?;
    crate::ui::phases::trace(format_args!("outputs published"));
    // Each rank removes the checkpoint it wrote, once the outputs are published.
    if let Some(m) = &run_model {
        agree(comm, m.remove_checkpoint(comm))?;
    }
    if comm.is_root() {
        say_backend_fallback(opts.operator.backend, kind, &why);
    }
    Ok(comm.is_root().then_some(outcome))
}

/// The backend, the same on every rank (collective: where it is not, the same one-line error
/// on every rank before any step that differs by backend; this rank's GPU thread, which may be
/// waiting in NCCL's start for the CPU ranks, is then not waited for).
fn agreed_kind(probe: &mut BackendProbe, comm: &dyn Comm) -> Result<BackendChoice> {
    let (kind, why) = probe.kind()?;
    if let Err(e) = same_backend_everywhere(comm, kind, &why) {
        probe.detach();
        return Err(e);
    }
    Ok(kind)
}

/// The system of a run and its model side: this rank's prepared storage when it fits the run,
/// else its rows loaded; the model checked (the grid it gives lets reorder = "auto" renumber
/// the cells). Returns them with the options (the grid set) and what became of prepared
/// storage (report.json `prepared`).
///
/// The backend (`probe`) is waited for before the read only where prepared storage is there
/// to check (its file records the backend). Several ranks balance their rows by their cost on
/// the backend they are likely to get ([`likely_backend`]) and exchange NCCL's id, so that
/// the communicator is made beside the read.
fn begin(
    job: &LsqrRun,
    probe: &mut BackendProbe,
    comm: &dyn Comm,
) -> Result<(Start, Option<RunModel>, SolveOptions, Option<String>)> {
    let storage = job.options.operator.storage;
    let several = comm.size() > 1;
    let prepared_here = |path: &Path| -> Result<bool> {
        let mine = crate::pipeline::prepared::file_of(path, comm.rank(), comm.size()).exists();
        crate::comm::on_any_rank(comm, mine)
    };
    let (mut start, mut prepared_note) = match job.source {
        SystemSource::Dataset {
            path,
            options,
            prepared: UsePrepared::Auto,
        } if prepared_here(path)? => {
            let kind = agreed_kind(probe, comm)?;
            let asked = Asked {
                kind,
                opts: job.options,
                load: options,
                row_cost: row_cost(kind, storage),
            };
            let (r, why) = reuse(path, &asked, comm)?;
            (r.map(Start::Reused), why.map(|w| format!("not used: {w}")))
        }
        _ => (None, None),
    };
    if several {
        probe.start_nccl(
            comm,
            &job.options.operator.tuning,
            (
                job.options.operator.allreduce,
                crate::pipeline::operators::lsqr_device_loop(job.options),
            ),
        )?;
    }
    // The cost the rows are balanced by (one rank's rows are all of them whatever it is); the
    // rank's cost is counted again once the backend is known.
    let guess = row_cost(likely_backend(job.options.operator.backend), storage);
    // The model side (checked before the solve; the grid it gives lets reorder = "auto"
    // renumber the cells), and the layout. Prepared storage made for another grid or storage
    // than this run resolves to is not used.
    let mut run_model;
    let mut opts = job.options.clone();
    loop {
        let mut s = match start.take() {
            Some(s) => s,
            None => {
                let mut loaded = load(job.source, comm, &opts.operator.tuning, guess)?;
                let kind = agreed_kind(probe, comm)?;
                // (0: Matrix Market rows, split by nonzeros, are left at 0.)
                if loaded.cost > 0 && row_cost(kind, storage) != guess {
                    loaded.cost = row_cost(kind, storage).of_system(&loaded.system);
                }
                Start::Fresh(loaded)
            }
        };
        crate::ui::phases::record("read", s.seconds());
        let kind = probe.kind()?.0;
        run_model = match job.model {
            None => None,
            Some((cfg, resume)) => Some(crate::ui::phases::time("model", || {
                run_model_of(&mut s, cfg, resume, kind == BackendChoice::Cuda, comm)
            })?),
        };
        if let Some(g) = run_model.as_ref().and_then(RunModel::grid) {
            opts.grid = Some(g);
        }
        if let Start::Reused(r) = &s {
            let storage = resolve_storage(
                kind,
                opts.operator.storage,
                opts.operator.transpose,
                r.loaded_nnz,
            );
            let fits = comm.allreduce_scalar(f64::from(u8::from(
                r.grid != opts.grid || r.storage != storage,
            )))? == 0.0;
            if !fits {
                prepared_note = Some(format!(
                    "not used: {}: made for another grid or storage than this run's",
                    crate::io::tidy(&r.path).display()
                ));
                crate::ui::phases::take();
                continue;
            }
            prepared_note = Some(format!(
                "used {} (read in {:.3} s)",
                crate::io::tidy(&r.path).display(),
                r.seconds
            ));
        }
        start = Some(s);
        break;
    }
    let start = start.expect("the loop leaves a start");
    if let Some(note) = prepared_note.as_ref().filter(|n| n.starts_with("not used")) {
        if comm.is_root() && crate::ui::progress::mode() != crate::ui::progress::Mode::Quiet {
            eprintln!("prepared storage {note}; setting up from the rows (`seistomo prepare` rewrites it)");
        }
    }
    Ok((start, run_model, opts, prepared_note))
}

/// Where a run's system comes from: this rank's rows, loaded, or its prepared storage (one
/// value a run, moved once: the sizes need no box).
#[allow(clippy::large_enum_variant)]
enum Start {
    Fresh(Loaded),
    Reused(Reused),
}

impl Start {
    /// Seconds it took to get.
    fn seconds(&self) -> f64 {
        match self {
            Start::Fresh(l) => l.seconds,
            Start::Reused(r) => r.seconds,
        }
    }
    /// This rank's rows and nonzeros as loaded.
    fn size(&self) -> (usize, usize) {
        match self {
            Start::Fresh(l) => (l.system.a.nrows(), l.system.a.nnz()),
            Start::Reused(r) => (r.prepared.matrix.nrows(), r.loaded_nnz),
        }
    }
    /// How the rows were read, the seconds, and this rank's cost in the load plan.
    fn load_facts(&self) -> (String, f64, u64) {
        match self {
            Start::Fresh(l) => (l.io.clone(), l.seconds, l.cost),
            Start::Reused(r) => ("prepared".into(), r.seconds, 0),
        }
    }
}

/// The model side of an `invert` run on every rank: checked before the solve; the coverage
/// (hit count, DWS) summed over every rank's kernel rows.
/// A reused start hands its coverage over (the run needs it once).
/// On the GPU (`gpu`) a fresh start's coverage is left for later ([`RunModel::prepare_later`]:
/// run_lsqr computes it while the GPU solves where it can) and summed over the ranks there.
fn run_model_of(
    s: &mut Start,
    cfg: &RunConfig,
    resume: bool,
    gpu: bool,
    comm: &dyn Comm,
) -> Result<RunModel> {
    let made = match s {
        Start::Fresh(loaded) if gpu => RunModel::prepare_later(cfg, loaded, resume),
        Start::Fresh(loaded) => RunModel::prepare(cfg, loaded, resume),
        Start::Reused(r) => RunModel::with_coverage(
            cfg,
            Known {
                ncols: r.prepared.matrix.ncols(),
                grid: r.dataset_grid.as_ref(),
                true_model: r.true_model.as_ref(),
                kernel_rows: r.kernel_rows,
            },
            std::mem::take(&mut r.coverage),
            resume,
        ),
    };
    let mut m = agree(comm, made)?;
    if !m.coverage_later {
        sum_coverage(&mut m, comm)?;
    }
    Ok(m)
}

/// The coverage of `m` summed over the ranks (collective; nothing on one rank).
fn sum_coverage(m: &mut RunModel, comm: &dyn Comm) -> Result<()> {
    if comm.size() > 1 {
        let cov = m.coverage_mut();
        let mut hits: Vec<f64> = cov.hit_count.iter().map(|&h| h as f64).collect();
        comm.allreduce_sum(&mut hits)?;
        comm.allreduce_sum(&mut cov.dws)?;
        cov.hit_count = hits.iter().map(|&h| h as u32).collect();
    }
    Ok(())
}
