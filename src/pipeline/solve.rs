//! Stage 3, solve: LSQR (or LSMR) on a prepared system. The operator factory builds the
//! operator the spec asks for; LSQR runs on it (the host loop or the backend's device loop, with
//! checkpoints when asked), LSMR too (its device loop on one rank); the solution is mapped back
//! to the original columns and the report written down.

use crate::backend::storage::DeviceCsr;
use crate::backend::{Backend, Operator};
use crate::comm::Comm;
use crate::error::Result;
use crate::model::checkpoint::Checkpointing;
use crate::model::report::{Calibration, Fit, Outcome, Report, ReportHeader, Seconds};
use crate::pipeline::fit::{FitRows, Fitter};
use crate::pipeline::monitor::LsqrProgress;
use crate::pipeline::operators::{
    choose_backend, resolve_storage, use_device_loop, Built, Engine, LsqrVisitor,
};
use crate::pipeline::options::{OperatorSpec, SolveOptions};
use crate::pipeline::prepare::{prepare, Layout, Prepared};
use crate::solver::{
    self, IterRecord, LeastSquares, LsqMethod, LsqrMonitor, LsqrParams, LsqrSolution,
};
use crate::sparse::System;

/// LSQR's settings for one solve besides the system: the method (LSQR or LSMR), parameters,
/// operator, progress, checkpoints.
pub struct LsqrJob<'a> {
    pub method: LsqMethod,
    pub params: &'a LsqrParams,
    pub spec: &'a OperatorSpec,
    /// Checkpoints every N iterations and resume (src/model/checkpoint.rs).
    pub checkpoint: Option<&'a Checkpointing>,
    /// When the set-up began (after the load): the report's set-up seconds run from here to
    /// the first iteration.
    pub setup_started: std::time::Instant,
}

impl<'a> LsqrJob<'a> {
    /// `opts`' method, parameters and operator, without checkpoints; set-up from `started`.
    pub fn of(opts: &'a SolveOptions, started: std::time::Instant) -> LsqrJob<'a> {
        LsqrJob {
            method: opts.method,
            params: &opts.params,
            spec: &opts.operator,
            checkpoint: None,
            setup_started: started,
        }
    }
}

/// Where a solve's iteration records go when they do not go to a bar: Python's callback, a
/// test. Implemented by any `FnMut(&IterRecord) -> Result<()>`.
pub trait Recorder: Send {
    fn record(&mut self, rec: &IterRecord) -> Result<()>;
    /// Whether the solve should hand over its iterate now (after this iteration's record):
    /// the Python module's interrupted solve, which returns it with the exception.
    fn wants_iterate(&self) -> bool {
        false
    }
    /// The iterate after iteration `itn` (this rank's stored column order, on the host), when
    /// [`Recorder::wants_iterate`] said so; an error ends the solve.
    fn iterate(&mut self, _itn: usize, _x: &[f64]) -> Result<()> {
        Ok(())
    }
}

impl<F: FnMut(&IterRecord) -> Result<()> + Send> Recorder for F {
    fn record(&mut self, rec: &IterRecord) -> Result<()> {
        self(rec)
    }
}

/// A [`Recorder`] as LSQR's monitor (on any backend), keeping the history.
struct Recording<'a> {
    inner: &'a mut dyn Recorder,
    history: Vec<IterRecord>,
}

impl<B: Backend> LsqrMonitor<B> for Recording<'_> {
    fn record(&mut self, rec: &IterRecord) -> Result<()> {
        self.history.push(*rec);
        self.inner.record(rec)
    }
    fn state(
        &mut self,
        be: &B,
        s: &crate::solver::LsqrScalars,
        v: &crate::solver::LsqrVectors<B::Vector>,
    ) -> Result<()> {
        self.hand_over(be, s.itn, &v.x)
    }
    fn lsmr_iterate(&mut self, be: &B, itn: usize, x: &B::Vector) -> Result<()> {
        self.hand_over(be, itn, x)
    }
}

impl Recording<'_> {
    /// x to the recorder when it asks for it.
    fn hand_over<B: Backend>(&mut self, be: &B, itn: usize, x: &B::Vector) -> Result<()> {
        if !self.inner.wants_iterate() {
            return Ok(());
        }
        let x = be.to_host(x)?;
        self.inner.iterate(itn, &x)
    }
}

/// Who watches the iterations.
pub enum Watch<'a> {
    /// The CLI's progress: lines every N iterations (0: a bar, or nothing when quiet).
    Progress(usize),
    /// A caller's recorder (the Python module's callback).
    Recorder(&'a mut dyn Recorder),
}

/// The solve on whatever operator the factory built.
struct Run<'a, 'w> {
    lsqr: Lsqr<'a>,
    watch: Watch<'w>,
}

/// A solve's system side and settings.
struct Lsqr<'a> {
    method: LsqMethod,
    comm: &'a dyn Comm,
    b: &'a [f64],
    x0: Option<&'a [f64]>,
    params: &'a LsqrParams,
    ckpt: Option<(&'a Checkpointing, &'a str)>,
}

/// Time one rank's products and its share of the allreduce (collective on several ranks).
fn calibrate<B: Backend, O: Operator<B>>(be: &B, op: &O, comm: &dyn Comm) -> Result<Calibration> {
    let (mut x, mut y) = (be.zeros(op.ncols())?, be.zeros(op.nrows())?);
    be.fill(&mut x, 1.0)?;
    use crate::pipeline::timing::median;
    let (mut prod, mut sum) = (Vec::new(), Vec::new());
    // One rank has no balance to judge: one pair gives its product time for the report (five
    // cost 0.06-0.14 s of a CPU set-up of 0.4-0.7 s on the 150k-ray system, 2 cores).
    let reps = if comm.size() > 1 { 5 } else { 1 };
    for _ in 0..reps {
        comm.barrier()?;
        let t = std::time::Instant::now();
        op.apply(be, crate::backend::Scale::SET, &x, &mut y)?;
        op.apply_t(be, crate::backend::Scale::SET, &y, &mut x)?;
        be.dot(&x, &x)?; // waits for the device
        prod.push(t.elapsed().as_secs_f64() * 1e3);
        if comm.size() > 1 {
            comm.barrier()?;
            let t = std::time::Instant::now();
            be.allreduce_sum(comm, &mut x)?;
            be.dot(&x, &x)?;
            sum.push(t.elapsed().as_secs_f64() * 1e3);
        }
        be.fill(&mut x, 1.0)?;
    }
    Ok(Calibration {
        product_ms: median(prod),
        allreduce_ms: if sum.is_empty() { 0.0 } else { median(sum) },
        stencil_rows: 0,
    })
}

impl LsqrVisitor for Run<'_, '_> {
    type Output = (
        LsqrSolution,
        Vec<IterRecord>,
        std::time::Instant,
        Calibration,
    );
    fn visit<B: Backend, O: Operator<B>>(self, be: &B, op: &O) -> Result<Self::Output> {
        let l = &self.lsqr;
        let cal = crate::ui::phases::time("calibrate", || calibrate(be, op, l.comm))?;
        let started = std::time::Instant::now();
        crate::ui::phases::trace(format_args!("iterations start"));
        // the model file's input checksums taken while the iterations run
        if l.comm.is_root() {
            crate::model::provenance::checksum_inputs_ahead();
        }
        // where the set-up went, on a terminal (batch logs have it in report.json)
        if l.comm.is_root()
            && matches!(self.watch, Watch::Progress(_))
            && crate::ui::progress::mode() == crate::ui::progress::Mode::Bars
        {
            eprintln!("{}", crate::ui::phases::snapshot().line());
        }
        match self.watch {
            Watch::Progress(every) => {
                let name = l.method.name();
                let mut mon =
                    LsqrProgress::new(name, l.params, op.ncols(), l.comm.is_root(), every);
                let (sol, h) = l.run(be, op, &mut mon)?;
                Ok((sol, h.unwrap_or(mon.history), started, cal))
            }
            Watch::Recorder(inner) => {
                let mut mon = Recording {
                    inner,
                    history: Vec::new(),
                };
                let (sol, h) = l.run(be, op, &mut mon)?;
                Ok((sol, h.unwrap_or(mon.history), started, cal))
            }
        }
    }
}

impl Lsqr<'_> {
    /// LSQR, checkpointed when asked (then the history comes from the checkpointed driver: it
    /// includes the iterations before a resume); or LSMR.
    fn run<B: Backend, O: Operator<B>>(
        &self,
        be: &B,
        op: &O,
        mon: &mut dyn LsqrMonitor<B>,
    ) -> Result<(LsqrSolution, Option<Vec<IterRecord>>)> {
        if self.method == LsqMethod::Lsmr {
            let sol = solver::lsmr(
                &LeastSquares::new(be, op, self.comm, self.b).x0(self.x0),
                self.params,
                mon,
            )?;
            return Ok((sol.into_lsqr(), None));
        }
        if let Some(ckpt) = self.ckpt {
            // The resume message is printed there, once, before the solve.
            let (sol, h) = crate::pipeline::checkpoint::lsqr_checkpointed(
                be,
                op,
                self.comm,
                ckpt,
                self.b,
                self.x0,
                self.params,
                mon,
            )?;
            return Ok((sol, Some(h.history)));
        }
        let sol = solver::lsqr(
            &LeastSquares::new(be, op, self.comm, self.b).x0(self.x0),
            self.params,
            mon,
        )?;
        Ok((sol, None))
    }
}

/// The prepared storage in words, in the precision its values will have: the job's on the GPU
/// and in compact storage, f64 in the CPU's CSR.
fn stored_words(engine: &Engine, p: &Prepared, job: &LsqrJob) -> String {
    use crate::pipeline::options::BackendChoice;
    match (engine.kind(), p.matrix.storage) {
        (BackendChoice::Cuda, _) => p.matrix.describe_for_gpu(job.spec.precision),
        (_, crate::backend::storage::Storage::Compact) => p.matrix.describe(job.spec.precision),
        _ => p.matrix.describe(crate::backend::Precision::F64),
    }
}

/// Many right-hand sides on one operator: the visitor of [`solve_many`]. Each solve is the
/// single solve of its right-hand side and parameters on that operator (the same numbers as a
/// [`solve`] of that system); the calibration and the set-up are shared.
struct Many<'a> {
    method: LsqMethod,
    comm: &'a dyn Comm,
    /// The distinct right-hand sides; member j's is `rhs[of[j]]`.
    rhs: &'a [Vec<f64>],
    of: &'a [usize],
    params: &'a [LsqrParams],
    /// The members in groups: a group of several (one right-hand side, LSQR) shares one
    /// bidiagonalisation ([`solver::lsqr_damps`]); one alone is solved on its own.
    groups: Vec<Vec<usize>>,
    /// Where the kernel rows are: each solution's fit is made on the operator (None: no fits).
    fit: Option<&'a FitRows>,
}

/// Whether two right-hand sides are the same values (the same slice, or equal bit for bit).
pub fn same_values(a: &[f64], b: &[f64]) -> bool {
    std::ptr::eq(a, b)
        || (a.len() == b.len() && a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()))
}

/// The members in groups by right-hand side (`of[j]`: member j's), each group in the
/// members' order, the groups in the order of their first member.
fn same_rhs_groups(of: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (j, &r) in of.iter().enumerate() {
        match groups.iter_mut().find(|g| of[g[0]] == r) {
            Some(g) => g.push(j),
            None => groups.push(vec![j]),
        }
    }
    groups
}

impl LsqrVisitor for Many<'_> {
    type Output = Vec<(<Run<'static, 'static> as LsqrVisitor>::Output, Option<Fit>)>;
    fn visit<B: Backend, O: Operator<B>>(self, be: &B, op: &O) -> Result<Self::Output> {
        let cal = crate::ui::phases::time("calibrate", || calibrate(be, op, self.comm))?;
        // the set-up ends here for every solve: its seconds are the shared set-up's
        let started = std::time::Instant::now();
        let mut out: Vec<Option<_>> = (0..self.of.len()).map(|_| None).collect();
        for g in self.groups {
            if g.len() > 1 {
                let ps: Vec<LsqrParams> = g.iter().map(|&j| self.params[j].clone()).collect();
                let p = LeastSquares::new(be, op, self.comm, &self.rhs[self.of[g[0]]]);
                for (&j, (sol, h)) in g.iter().zip(solver::lsqr_damps(&p, &ps)?) {
                    out[j] = Some((sol, h, started, cal));
                }
                continue;
            }
            let j = g[0];
            let l = Lsqr {
                method: self.method,
                comm: self.comm,
                b: &self.rhs[self.of[j]],
                x0: None,
                params: &self.params[j],
                ckpt: None,
            };
            let mut mon = solver::History::default();
            let (sol, h) = l.run(be, op, &mut mon)?;
            out[j] = Some((sol, h.unwrap_or(mon.0), started, cal));
        }
        // each solution's products while the operator is still there (the prepared columns:
        // x is mapped back afterwards)
        let t = std::time::Instant::now();
        let mut fitter = self.fit.map(Fitter::new);
        let out = out
            .into_iter()
            .map(|o| {
                let o = o.ok_or_else(|| {
                    crate::Error::Invalid("a member of the solves has no group".into())
                })?;
                let fit = match &mut fitter {
                    Some(f) => Some(f.fit(be, op, &o.0.x)?),
                    None => None,
                };
                Ok((o, fit))
            })
            .collect();
        if fitter.is_some() {
            crate::ui::phases::trace(format_args!(
                "fits of {} members in {:.3} s",
                self.of.len(),
                t.elapsed().as_secs_f64()
            ));
        }
        out
    }
}

/// The members of [`solve_many`]: member j solves right-hand side `rhs[of[j]]` (its rows in
/// the prepared order) with damping `damps[j]`.
pub struct ManySolves<'a> {
    pub rhs: &'a [Vec<f64>],
    pub of: &'a [usize],
    pub damps: &'a [f64],
    /// LSQR's members of one right-hand side share one bidiagonalisation.
    pub share: bool,
    /// Where the kernel rows went: each outcome gets its fit ([`Outcome::fit`]).
    pub fit: Option<&'a FitRows>,
}

/// Solve the prepared system for each member j: right-hand side `rhs[of[j]]` (its rows in the
/// prepared order, as `p.b`; one process) and damping `damps[j]`, on one operator: the
/// set-up paid once. Each outcome is that of [`solve`] with that b and damping; with `share`,
/// LSQR's members with the same b share one bidiagonalisation ([`solver::lsqr_damps()`]: each
/// its host-loop solve's numbers bit for bit, for about the cost of one solve). With `fit`
/// (where the kernel rows went), each outcome has its fit ([`Outcome::fit`]).
pub fn solve_many(
    engine: &Engine,
    why: &str,
    p: Prepared,
    job: &LsqrJob,
    comm: &dyn Comm,
    solves: ManySolves,
) -> Result<Vec<Outcome>> {
    let ManySolves {
        rhs,
        of,
        damps,
        share,
        fit,
    } = solves;
    if of.len() != damps.len()
        || of.iter().any(|&r| r >= rhs.len())
        || rhs.iter().any(|b| b.len() != p.b.len())
    {
        return Err(crate::Error::Invalid(format!(
            "{} members of {} right-hand sides of {} rows and {} dampings",
            of.len(),
            rhs.len(),
            p.b.len(),
            damps.len()
        )));
    }
    let (laid_out, described) = (p.matrix.storage, stored_words(engine, &p, job));
    let Prepared {
        matrix,
        unmap,
        m,
        nnz,
        ..
    } = p;
    let n = matrix.ncols();
    let stencil_rows = matrix.stencil.as_ref().map_or(0, |s| s.nrows());
    let base = method_params(job, m, n)?;
    let params: Vec<LsqrParams> = damps
        .iter()
        .map(|&damp| LsqrParams {
            damp,
            ..base.clone()
        })
        .collect();
    let many = Many {
        method: job.method,
        comm,
        rhs,
        params: &params,
        of,
        groups: if share && job.method == LsqMethod::Lsqr {
            same_rhs_groups(of)
        } else {
            (0..of.len()).map(|j| vec![j]).collect()
        },
        fit,
    };
    let mut in_pass = vec![false; of.len()];
    for g in many.groups.iter().filter(|g| g.len() > 1) {
        g.iter().for_each(|&j| in_pass[j] = true);
    }
    let device_loop =
        use_device_loop(job.spec.lsqr_loop) && (job.method == LsqMethod::Lsqr || comm.size() == 1);
    let (runs, built) = engine.lsqr(job.spec, comm, matrix, device_loop, many)?;
    let storage = storage_words(&built, laid_out, described);
    Ok(runs
        .into_iter()
        .zip(&params)
        .map(|((mut ran, fit), params)| {
            unmap.restore(&mut ran.0.x, ran.0.var.as_mut());
            let facts = RunFacts {
                storage: storage.clone(),
                ordering: unmap.ordering.what.clone(),
                col_scale: unmap.scale.is_some(),
                stencil_rows,
                shape: (m, n, nnz),
                load_seconds: 0.0,
            };
            Outcome {
                fit,
                ..outcome((engine, why, job, comm), params, ran, &built, facts)
            }
        })
        .zip(in_pass)
        .map(|(mut o, shared)| {
            if shared {
                // one bidiagonalisation for the dampings of this b, its steps on the host
                o.report.lsqr_loop = "shared".into();
            }
            o
        })
        .collect())
}

/// [`solve_system`] for many right-hand sides of one matrix (all rows, the system's order;
/// `sys.b` is the first), member j with damping `damps[j]`: laid out and set up once, solved
/// one after another on one operator (with `share`, those of one right-hand side in one
/// bidiagonalisation: [`solve_many`]). None where the layout moved rows in a way the
/// right-hand sides cannot follow (then solve them one by one).
pub fn solve_system_many(
    sys: System,
    (rhs, damps, share): (&[&[f64]], &[f64], bool),
    opts: &SolveOptions,
    comm: &dyn Comm,
) -> Result<Option<Vec<Outcome>>> {
    let setup_started = std::time::Instant::now();
    crate::ui::phases::take();
    if comm.size() > 1 {
        return Ok(None);
    }
    let (first, kernel_rows) = (sys.b.clone(), sys.kernel_rows);
    let (engine, why, prepared) = start_and_prepare(sys, opts, comm)?;
    // The stored rows are permuted (new row i is old row rows[i]); rows split off as a
    // stencil after them keep their places (backend::storage::prepare).
    let old = |i: usize| match prepared.unmap.ordering.rows.as_ref() {
        Some(r) if i < r.len() => r[i],
        _ => i,
    };
    let m = prepared.b.len();
    let mapped = |b: &[f64]| -> Vec<f64> { (0..m).map(|i| b[old(i)]).collect() };
    // The rows must be a permutation the right-hand sides can follow: the first one mapped is
    // the prepared b, bit for bit.
    let same = first.len() == m
        && mapped(&first)
            .iter()
            .zip(&prepared.b)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    if !same || rhs.iter().any(|b| b.len() != m) {
        return Ok(None);
    }
    // each distinct right-hand side mapped once (an L-curve's members share one)
    let mut of = Vec::with_capacity(rhs.len());
    let mut distinct: Vec<&[f64]> = Vec::new();
    for b in rhs {
        match distinct.iter().position(|d| same_values(d, b)) {
            Some(i) => of.push(i),
            None => {
                of.push(distinct.len());
                distinct.push(b);
            }
        }
    }
    let distinct: Vec<Vec<f64>> = distinct.iter().map(|b| mapped(b)).collect();
    let job = LsqrJob::of(opts, setup_started);
    let fit = if opts.fit {
        FitRows::new(m, kernel_rows, old)
    } else {
        None
    };
    solve_many(
        &engine,
        &why,
        prepared,
        &job,
        comm,
        ManySolves {
            rhs: &distinct,
            of: &of,
            damps,
            share,
            fit: fit.as_ref(),
        },
    )
    .map(Some)
}

/// Solve a prepared system with LSQR on `engine` (chosen for `why`), the iterations watched as
/// `watch` says (the CLI's progress, or a caller's recorder). `load_seconds` goes into the
/// report.
pub fn solve(
    engine: &Engine,
    why: &str,
    p: Prepared,
    job: &LsqrJob,
    comm: &dyn Comm,
    load_seconds: f64,
    watch: Watch,
) -> Result<Outcome> {
    let (laid_out, described) = (p.matrix.storage, stored_words(engine, &p, job));
    let fp = job
        .checkpoint
        .map(|_| -> Result<String> {
            let rows = p
                .matrix
                .rows
                .with_csr(|a| crate::model::checkpoint::fingerprint(a, &p.b))?;
            Ok(format!("{rows}:{}", p.matrix.stencil_tag()))
        })
        .transpose()?;
    let Prepared {
        matrix,
        b,
        x0,
        unmap,
        m,
        nnz,
        seconds: _,
    } = p;
    let n = matrix.ncols();
    let stencil_rows = matrix.stencil.as_ref().map_or(0, |s| s.nrows());
    let params = method_params(job, m, n)?;
    let run = Run {
        lsqr: Lsqr {
            method: job.method,
            comm,
            b: &b,
            x0: x0.as_deref(),
            params: &params,
            ckpt: job.checkpoint.zip(fp.as_deref()),
        },
        watch,
    };
    // LSMR's device loop runs on one rank (several: the host loop)
    let device_loop =
        use_device_loop(job.spec.lsqr_loop) && (job.method == LsqMethod::Lsqr || comm.size() == 1);
    let (mut ran, built) = engine.lsqr(job.spec, comm, matrix, device_loop, run)?;
    unmap.restore(&mut ran.0.x, ran.0.var.as_mut());
    let facts = RunFacts {
        storage: storage_words(&built, laid_out, described),
        ordering: unmap.ordering.what.clone(),
        col_scale: unmap.scale.is_some(),
        stencil_rows,
        shape: (m, n, nnz),
        load_seconds,
    };
    Ok(outcome(
        (engine, why, job, comm),
        &params,
        ran,
        &built,
        facts,
    ))
}

/// A solve's outcome besides the operator's: the storage and ordering in words, column
/// scaling, stencil rows, (m, n, nnz) and the load's seconds.
struct RunFacts {
    storage: String,
    ordering: String,
    col_scale: bool,
    stencil_rows: usize,
    shape: (usize, usize, usize),
    load_seconds: f64,
}

/// The outcome of a finished run: its solution (in the original columns), history and
/// calibration, and the report.
fn outcome(
    (engine, why, job, comm): (&Engine, &str, &LsqrJob, &dyn Comm),
    params: &LsqrParams,
    (solution, history, started, calibration): <Run as LsqrVisitor>::Output,
    built: &Built,
    f: RunFacts,
) -> Outcome {
    let (m, n, nnz) = f.shape;
    let report = report(&ReportParts {
        engine,
        tuning: &job.spec.tuning,
        why,
        built,
        storage: f.storage,
        ordering: f.ordering,
        comm,
        m,
        n,
        nnz,
        method: job.method,
        params,
        col_scale: f.col_scale,
        info: &solution.info,
        seconds: (
            f.load_seconds,
            started.duration_since(job.setup_started).as_secs_f64(),
        ),
    });
    Outcome {
        solution,
        history,
        report,
        calibration: Calibration {
            stencil_rows: f.stencil_rows,
            ..calibration
        },
        coverage: built.coverage.clone(),
        fit: None,
    }
}

/// Solve with LSQR (or LSMR) on a CSR matrix that lies on the GPU already, `a` with its
/// transpose `at` (CuPy's arrays: [`DeviceCsr`]), on the CUDA `engine`: the matrix is copied
/// device to device, never to the host; b and x0 (host vectors, a's rows and columns) and the
/// solution go through the host as in every solve. One process; no reordering, no checkpoints.
#[allow(clippy::too_many_arguments)]
pub fn solve_device(
    engine: &Engine,
    why: &str,
    (a, at): (&DeviceCsr, &DeviceCsr),
    b: &[f64],
    x0: Option<&[f64]>,
    job: &LsqrJob,
    watch: Watch,
) -> Result<Outcome> {
    let (m, n, nnz) = (a.nrows(), a.ncols(), a.nnz());
    let comm = &crate::comm::SerialComm;
    if job.checkpoint.is_some() {
        return Err(crate::Error::Invalid(
            "a matrix on the GPU is solved without checkpoints".into(),
        ));
    }
    if b.len() != m || x0.is_some_and(|x| x.len() != n) {
        return Err(crate::Error::Invalid(format!(
            "b needs the matrix's {m} rows and x0 its {n} columns"
        )));
    }
    let params = method_params(job, m, n)?;
    let run = Run {
        lsqr: Lsqr {
            method: job.method,
            comm,
            b,
            x0,
            params: &params,
            ckpt: None,
        },
        watch,
    };
    let device_loop = use_device_loop(job.spec.lsqr_loop);
    let (ran, built) = engine.lsqr_device(job.spec, (a, at), device_loop, run)?;
    let facts = RunFacts {
        storage: crate::backend::storage::describe_csr(a.precision()),
        ordering: "none (the matrix given on the GPU)".into(),
        col_scale: false,
        stencil_rows: 0,
        shape: (m, n, nnz),
        load_seconds: 0.0,
    };
    Ok(outcome(
        (engine, why, job, comm),
        &params,
        ran,
        &built,
        facts,
    ))
}

/// The job's parameters for its method: LSMR checks its own (no variance, no checkpoints) and
/// resolves its iteration limit, min(m, n) as SciPy's `maxiter` (LSQR's stays 2 n).
fn method_params(job: &LsqrJob, m: usize, n: usize) -> Result<LsqrParams> {
    let mut p = job.params.clone();
    if job.method == LsqMethod::Lsmr {
        solver::lsmr::check_lsmr_params(&p)?;
        if job.checkpoint.is_some() {
            return Err(crate::Error::Invalid(
                "checkpoints are LSQR's: LSMR runs without them".into(),
            ));
        }
        p.iter_lim = Some(p.iter_lim.unwrap_or(m.min(n)));
    }
    Ok(p)
}

/// The storage the operator uses in words: as laid out, or CSR where the GPU's compact storage
/// did not fit or lost `auto`'s probe; with the probe's numbers.
fn storage_words(
    built: &Built,
    laid_out: crate::backend::storage::Storage,
    described: String,
) -> String {
    let mut s = if built.storage == laid_out {
        described
    } else {
        crate::backend::storage::describe_csr(built.precision)
    };
    if !built.storage_reason.is_empty() {
        s.push_str(&format!("; {}", built.storage_reason));
    }
    s
}

/// What a report is made of.
struct ReportParts<'a> {
    engine: &'a Engine,
    tuning: &'a crate::settings::tuning::Tuning,
    why: &'a str,
    built: &'a Built,
    storage: String,
    ordering: String,
    comm: &'a dyn Comm,
    m: usize,
    n: usize,
    nnz: usize,
    method: LsqMethod,
    params: &'a LsqrParams,
    col_scale: bool,
    info: &'a solver::LsqrInfo,
    /// Load and set-up seconds.
    seconds: (f64, f64),
}

fn report(r: &ReportParts) -> Report {
    let (info, p) = (r.info, r.params);
    let (load, setup) = r.seconds;
    Report {
        header: ReportHeader::new(r.method.name()),
        backend: r.engine.name().into(),
        backend_detail: r.built.backend_detail.clone(),
        backend_reason: r.why.to_string(),
        transpose: r.built.transpose.clone(),
        lsqr_loop: if r.built.device_loop {
            "device"
        } else {
            "host"
        }
        .into(),
        allreduce: match r.engine.path() {
            Some(path) if r.comm.size() > 1 => path.into(),
            _ => String::new(),
        },
        reorder: r.ordering.clone(),
        storage: r.storage.clone(),
        tuning: r.tuning.clone(),
        ranks: r.comm.size(),
        threads: rayon::current_num_threads(),
        m: r.m,
        n: r.n,
        nnz: r.nnz,
        damp: p.damp,
        atol: p.atol,
        btol: p.btol,
        conlim: p.conlim,
        iter_lim: p.iter_lim.unwrap_or(2 * r.n),
        col_scale: r.col_scale,
        istop: info.istop,
        stop_reason: info.stop_reason.clone(),
        iterations: info.itn,
        norms: info.norms,
        seconds: Seconds::new(load, setup, info.seconds),
        // Over the iterations run in this process (a resumed run started at start_itn).
        ms_per_iter: if info.itn > info.start_itn {
            1e3 * info.seconds / (info.itn - info.start_itn) as f64
        } else {
            0.0
        },
        setup_phases: crate::ui::phases::take(),
        write_phases: Default::default(),
        rank_timing: Vec::new(),
        load_io: String::new(),
        prepared: String::new(),
        run_id: String::new(),
        weight_choice: None,
    }
}

/// Choose the backend, lay out and solve a loaded system with LSQR in one call (tools, tests,
/// the L-curve): the stages [`prepare`] and [`solve`] with `opts`.
pub fn solve_system(
    sys: System,
    opts: &SolveOptions,
    comm: &dyn Comm,
    load_seconds: f64,
    progress_every: usize,
) -> Result<Outcome> {
    let setup_started = std::time::Instant::now();
    crate::ui::phases::take();
    let (engine, why, prepared) = start_and_prepare(sys, opts, comm)?;
    let job = LsqrJob::of(opts, setup_started);
    let watch = Watch::Progress(progress_every);
    solve(&engine, &why, prepared, &job, comm, load_seconds, watch)
}

/// The backend `opts` asks for started (and why it was chosen), and `sys` laid out for it.
fn start_and_prepare(
    sys: System,
    opts: &SolveOptions,
    comm: &dyn Comm,
) -> Result<(Engine, String, Prepared)> {
    let (kind, why) = choose_backend(opts.operator.backend)?;
    let engine = Engine::start(
        kind,
        comm,
        (
            opts.operator.allreduce,
            crate::pipeline::operators::lsqr_device_loop(opts),
        ),
        &opts.operator.tuning,
    )?;
    if kind == crate::pipeline::options::BackendChoice::Cuda && comm.size() > 1 && comm.is_root() {
        if let Some(path) = engine.path() {
            eprintln!("allreduce of A^T u over ranks: {path}");
        }
    }
    let layout = layout_for(opts, &engine, sys.a.nnz());
    let prepared = prepare(sys, &layout, comm)?;
    Ok((engine, why, prepared))
}

/// The layout `opts` asks for on `engine`: the storage resolved for its backend and size; on
/// the GPU the rows reordered there (unless `[tuning] gpu_encode = false`, or `col_scale`,
/// whose scaling of the columns reorders the rows on the host first: rows left as read would
/// only be converted there, and the ray coverage left to them lost).
pub fn layout_for(opts: &SolveOptions, engine: &Engine, nnz: usize) -> Layout {
    let gpu = engine.kind() == crate::pipeline::options::BackendChoice::Cuda;
    Layout {
        deferred: crate::backend::storage::Deferred {
            permute: gpu && opts.operator.tuning.gpu_encode != Some(false) && !opts.col_scale,
            coverage: false,
        },
        storage: resolve_storage(
            engine.kind(),
            opts.operator.storage,
            opts.operator.transpose,
            nnz,
        ),
        reorder: opts.reorder,
        grid: opts.grid,
        col_scale: opts.col_scale,
        x0: opts.x0.clone(),
    }
}
