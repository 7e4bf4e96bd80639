//! Distributed GMRES on square systems ([`solve_square`], what `solve --method gmres` runs):
//! every rank reads the matrix, the partition is agreed by all ranks, each rank solves with its
//! rows on the CPU or the GPU (the same preconditioner set-up and solver for both), rank 0
//! gathers x and writes the outputs.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::backend::precond::{HostPreconditioner, OnHost, Preconditioner};
use crate::backend::precond::{PivotPolicy, TriSolve};
use crate::backend::{Operator, ScalarSlots};
use crate::comm::halo::CommVolume;
use crate::comm::{partition_square_on, Comm};
use crate::error::{Error, Result};
use crate::io::mtx;
use crate::model::report::{ReportHeader, Seconds};
use crate::partition::graph::PartitionMethod;
use crate::pipeline::monitor::GmresProgress;
use crate::pipeline::operators::{
    choose_backend, Engine, SquareBuilt, SquareSystem, SquareVisitor,
};
use crate::pipeline::options::{BackendChoice, OperatorSpec};
use crate::solver::dist_square::{PrecondCounts, SquarePrecond, SquareSolve};
use crate::solver::gmres::{
    gmres, ConvergenceTest, GmresInfo, GmresMonitor, GmresParams, GmresRecord, GmresStop, Orthog,
    PrecondSide,
};
use crate::sparse::Csr;

/// Which preconditioner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrecondChoice {
    None,
    Jacobi,
    BlockIlu0,
}

choice_from_str!(PrecondChoice, "preconditioner", "none" => Self::None, "jacobi" => Self::Jacobi, "block-ilu0" | "ilu0" | "bjacobi-ilu0" => Self::BlockIlu0);

/// A GMRES run of `solve --method gmres`: the system's files, solver settings, outputs.
#[derive(Debug, Clone)]
pub struct GmresJob {
    pub matrix: PathBuf,
    pub rhs: Option<PathBuf>,
    pub x0: Option<PathBuf>,
    pub params: GmresParams,
    pub precond: PrecondChoice,
    pub ilu_pivot: PivotPolicy,
    /// None: exact triangular solves.
    pub ilu_sweeps: Option<usize>,
    /// How rows are split across ranks.
    pub partition: PartitionMethod,
    /// Backend; on the GPU the value precision (vectors stay f64) and the storage (csr,
    /// compact = row patterns, auto = row patterns where the rows qualify; the CPU stores
    /// CSR); on several GPU ranks how the halo crosses (peer memory, NCCL or through the host).
    pub operator: OperatorSpec,
    pub solution: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub history: Option<PathBuf>,
    pub progress: usize,
}

/// report.json of a GMRES solve.
#[derive(Debug, Clone, Serialize)]
pub struct GmresReport {
    #[serde(flatten)]
    pub header: ReportHeader,
    pub matrix: String,
    pub rhs: String,
    pub backend: String,
    pub backend_detail: String,
    /// How the matrix rows were stored: "csr", or the GPU's row patterns described.
    pub storage: String,
    /// How the halo and the reductions cross between GPU ranks (`[backend] allreduce`: peer,
    /// nccl or host), in words; absent on one rank and on the CPU.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub allreduce: String,
    /// The tuning knobs of the run (src/settings/tuning.rs; null: chosen automatically).
    pub tuning: crate::settings::tuning::Tuning,
    pub ranks: usize,
    pub threads: usize,
    pub n: usize,
    pub nnz: usize,
    pub restart: usize,
    pub rtol: f64,
    pub atol: f64,
    pub max_iter: usize,
    pub max_cycles: Option<usize>,
    pub precond: String,
    pub orthog: Orthog,
    pub side: PrecondSide,
    pub convergence_test: ConvergenceTest,
    pub jacobi_zero_diagonals: Option<usize>,
    pub ilu_replaced_pivots: Option<usize>,
    pub ilu_inserted_diagonals: Option<usize>,
    #[serde(flatten)]
    pub stop: GmresStop,
    pub seconds: Seconds,
    pub ms_per_iter: f64,
    /// Where the Arnoldi cycles kept their scalars: host or device.
    pub arnoldi_loop: crate::solver::gmres::ArnoldiLoop,
    /// How rows were split across ranks, and the halo exchange of one product.
    pub partition: PartitionMethod,
    pub halo: CommVolume,
}

fn history_csv(w: &mut dyn std::io::Write, h: &[GmresRecord]) -> std::io::Result<()> {
    writeln!(w, "iteration,cycle,resnorm,relres,seconds")?;
    for r in h {
        writeln!(
            w,
            "{},{},{:e},{:e},{:e}",
            r.iteration, r.cycle, r.resnorm, r.relres, r.seconds
        )?;
    }
    Ok(())
}

/// A square system read from its files: the matrix, b (ones without an rhs file) and x0.
struct SquareFiles {
    a: Csr,
    b: Vec<f64>,
    x0: Option<Vec<f64>>,
}

/// Read the matrix (it must be square), b and x0 of a GMRES job. The matrix is a Matrix
/// Market file, or a dataset (a directory or its dataset.toml, as `seistomo square -o DIR`
/// writes): then its right-hand side is b unless the job names one.
fn read_square(c: &GmresJob) -> Result<SquareFiles> {
    let is_dataset = c.matrix.is_dir() || c.matrix.file_name().is_some_and(|n| n == "dataset.toml");
    let (a, dataset_b) = if is_dataset {
        let s = crate::io::dataset::load_dataset(&c.matrix, 0, 1)?;
        (s.a, Some(s.b))
    } else {
        (mtx::read_matrix(&c.matrix)?, None)
    };
    mtx::refuse_empty(&c.matrix, &a)?;
    if a.nrows() != a.ncols() {
        return Err(Error::format(
            &c.matrix,
            format!(
                "GMRES needs a square matrix; this one is {} x {} (use --method lsqr)",
                a.nrows(),
                a.ncols()
            ),
        ));
    }
    let n = a.nrows();
    crate::io::finite::check_matrix(&c.matrix, "matrix", &a, 0..n, false)?;
    let read_vec = |p: &Path, what: &str| -> Result<Vec<f64>> {
        let v = mtx::read_vector(p)?;
        if v.len() != n {
            return Err(Error::format(
                p,
                format!("{what} has {} values but the matrix has {n} rows", v.len()),
            ));
        }
        Ok(v)
    };
    let b = match (&c.rhs, dataset_b) {
        (Some(p), _) => read_vec(p, "right-hand side")?,
        (None, Some(b)) => b,
        (None, None) => vec![1.0; n],
    };
    let x0 = c.x0.as_deref().map(|p| read_vec(p, "x0")).transpose()?;
    Ok(SquareFiles { a, b, x0 })
}

impl PrecondChoice {
    /// The preconditioner of a square solve, with the block ILU(0)'s pivot policy and
    /// triangular solves (None: exact).
    pub fn with(self, pivot: PivotPolicy, sweeps: Option<usize>) -> SquarePrecond {
        match self {
            PrecondChoice::None => SquarePrecond::None,
            PrecondChoice::Jacobi => SquarePrecond::Jacobi,
            PrecondChoice::BlockIlu0 => SquarePrecond::BlockIlu0 {
                pivot,
                tri: match sweeps {
                    None => TriSolve::Exact,
                    Some(s) => TriSolve::Jacobi(s),
                },
            },
        }
    }
}

/// Solve and write the outputs; returns the report on rank 0 (None elsewhere).
/// Every rank reads the matrix, keeps its nonzero-balanced block of rows and the matching
/// entries of b and x0; rank 0 gathers x and alone writes the outputs (and returns the report).
pub fn solve_square(c: &GmresJob, comm: &dyn Comm) -> Result<Option<GmresReport>> {
    check_job(c)?;
    let t = Instant::now();
    let SquareFiles { a, b, x0 } = read_square(c)?;
    let (n, nnz) = (a.nrows(), a.nnz());
    let load = t.elapsed().as_secs_f64();
    let (kind, why) = choose_backend(c.operator.backend)?;
    let t_setup = Instant::now();
    // --partition metis: rows reordered so that each rank's METIS part is a contiguous block;
    // b and x0 follow, and x is put back in the original order after the gather.
    let sp = partition_square_on(comm, &a, c.partition)?;
    let part = sp.part.clone();
    let mine = part.range(comm.rank());
    let a = if comm.size() > 1 {
        sp.rank_rows(&a, comm.rank())?
    } else {
        a
    };
    let b = sp.perm.permute_range(&b, mine.clone());
    let x0 = x0.map(|x| sp.perm.permute_range(&x, mine.clone()));
    let sys = SquareSystem {
        rows: &a,
        part: &part,
        b: &b,
        x0: x0.as_deref(),
    };
    let engine = start_square_engine(kind, &c.operator, comm)?;
    let mut mon = GmresProgress::new(c.params.rtol, c.params.max_iter, comm.is_root(), c.progress);
    let precond = c.precond.with(c.ilu_pivot, c.ilu_sweeps);
    let sol = gmres_square(
        &engine,
        comm,
        sys,
        precond,
        &c.operator,
        &c.params,
        &mut mon,
    )?;
    mon.shown.clear(); // clears the bar before anything else is printed
    note_precond_fixes(&sol, comm);
    let setup = t_setup.elapsed().as_secs_f64() - sol.info.seconds;
    let Some(x) = comm.gather_to_root(&sol.x_local)? else {
        return Ok(None);
    };
    let x = sp.perm.unpermute(&x);
    let report = square_report(c, &engine, &why, &sol, (n, nnz), comm, (load, setup));
    // One output set (src/io/publish.rs): solution, history, report.
    let mut publ = crate::io::publish::Publication::new("solve");
    if let Some(p) = &c.solution {
        publ.write(p, |w| crate::io::vector_text(w, &x))?;
    }
    if let Some(p) = &c.history {
        publ.write(p, |w| history_csv(w, &mon.history.0))?;
    }
    if let Some(p) = &c.report {
        publ.write(p, |w| crate::pipeline::publish::json_text(w, &report))?;
    }
    publ.commit()?;
    crate::pipeline::invert::say_backend_fallback(c.operator.backend, kind, &why);
    Ok(Some(report))
}

/// The most Jacobi sweeps per triangular solve of the block ILU(0) (`--ilu-sweeps`).
pub const MAX_ILU_SWEEPS: usize = 1000;

/// The options of a GMRES job that do not depend on the system (before any file is read).
fn check_job(c: &GmresJob) -> Result<()> {
    if let Some(s) = c.ilu_sweeps {
        if !(1..=MAX_ILU_SWEEPS).contains(&s) {
            return Err(Error::Invalid(format!(
                "--ilu-sweeps must be in 1..={MAX_ILU_SWEEPS} (got {s}); leave it out for exact triangular solves"
            )));
        }
    }
    let p = &c.params;
    if !(p.rtol.is_finite() && p.rtol >= 0.0) {
        return Err(Error::Invalid(format!(
            "--rtol must be finite and >= 0 (got {})",
            p.rtol
        )));
    }
    if p.max_iter == 0 || p.max_cycles == Some(0) {
        return Err(Error::Invalid(
            "--max-iter and --max-cycles must be >= 1".into(),
        ));
    }
    Ok(())
}

/// Error unless GMRES(`restart`) fits a system of `n` unknowns (`1 <= restart <= n`: a longer
/// Krylov basis than n vectors holds nothing more) and the basis of `restart + 1` vectors of
/// this rank's `n_local` values fits the machine's memory.
pub fn check_restart(restart: usize, n: usize, n_local: usize) -> Result<()> {
    if restart == 0 || restart > n {
        return Err(Error::Invalid(format!(
            "GMRES restart {restart} must be in 1..={n} (the system has {n} unknowns; a basis longer than n holds nothing more)"
        )));
    }
    let m = restart as u128 + 1;
    crate::io::limits::check_alloc(
        Path::new("GMRES"),
        &format!("the Krylov basis of restart {restart} ({m} vectors of {n_local} values)"),
        8 * m * (n_local as u128 + m),
    )
}

/// NCCL thread blocks per operation for GMRES unless `nccl_max_ctas` says otherwise: its halo
/// and reductions are small, and NCCL's own choice (24-32 channels on two NVLink H200s) made a
/// GMRES(16) step on 2.1M rows 0.71 ms against 0.21 with one (docs/gmres.md).
pub const SQUARE_NCCL_CTAS: u32 = 1;

/// The engine of a square solve: the other GPUs' memory (CUDA IPC) for the halo and the
/// reductions where the ranks are on one node and their GPUs map each other's buffers; else NCCL
/// (GPU to GPU) where every rank can load it, with at most [`SQUARE_NCCL_CTAS`] thread blocks an
/// operation by default; else the host path.
fn start_square_engine(
    kind: BackendChoice,
    spec: &OperatorSpec,
    comm: &dyn Comm,
) -> Result<Engine> {
    let mut tuning = spec.tuning.clone();
    tuning.nccl_max_ctas.get_or_insert(SQUARE_NCCL_CTAS);
    let engine = Engine::start(kind, comm, (spec.allreduce, true), &tuning)?;
    if let (Some(path), true) = (engine.path(), comm.size() > 1 && comm.is_root()) {
        let how = if path.starts_with("nccl") {
            format!("{path}: halo by send/recv, reductions by all-reduce")
        } else if path.starts_with("peer") {
            "peer (halo and reductions read from the other GPUs' memory, CUDA IPC)".into()
        } else {
            "host (device gather, copy to host, MPI all-to-all and all-reduce, copy back)".into()
        };
        eprintln!("halo exchange and reductions between GPUs: {how}");
    }
    Ok(engine)
}

/// Notes on rank 0 about what the preconditioner's set-up had to fix.
fn note_precond_fixes(sol: &SquareSolve, comm: &dyn Comm) {
    if !comm.is_root() {
        return;
    }
    if let Some(z) = sol.jacobi_zero_diagonals.filter(|&z| z > 0) {
        eprintln!(
            "seistomo: note: {z} rows have a zero or missing diagonal; Jacobi leaves them unscaled"
        );
    }
    if let (Some(r), Some(i)) = (sol.ilu_replaced_pivots, sol.ilu_inserted_diagonals) {
        if r + i > 0 {
            eprintln!(
                "seistomo: note: ILU(0) inserted {i} missing diagonal entries and replaced {r} zero pivots"
            );
        }
    }
}

/// report.json of a square solve.
fn square_report(
    c: &GmresJob,
    engine: &Engine,
    why: &str,
    sol: &SquareSolve,
    (n, nnz): (usize, usize),
    comm: &dyn Comm,
    (load, setup): (f64, f64),
) -> GmresReport {
    let info: &GmresInfo = &sol.info;
    let p = &c.params;
    GmresReport {
        header: ReportHeader::new("gmres"),
        matrix: c.matrix.display().to_string(),
        rhs: c
            .rhs
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "ones".into()),
        backend: engine.name().into(),
        backend_detail: format!("{} ({why})", engine.describe()),
        storage: sol.storage.clone(),
        allreduce: match engine.path() {
            Some(p) if comm.size() > 1 => p.to_string(),
            _ => String::new(),
        },
        tuning: c.operator.tuning.clone(),
        ranks: comm.size(),
        threads: rayon::current_num_threads(),
        n,
        nnz,
        restart: p.restart,
        rtol: p.rtol,
        atol: p.atol,
        max_iter: p.max_iter,
        max_cycles: p.max_cycles,
        precond: sol.precond.clone(),
        orthog: info.orthog,
        side: p.side,
        convergence_test: p.test,
        jacobi_zero_diagonals: sol.jacobi_zero_diagonals,
        ilu_replaced_pivots: sol.ilu_replaced_pivots,
        ilu_inserted_diagonals: sol.ilu_inserted_diagonals,
        stop: info.stop.clone(),
        seconds: Seconds::new(load, setup, info.seconds),
        ms_per_iter: info.ms_per_iter,
        arnoldi_loop: info.arnoldi_loop,
        partition: c.partition,
        halo: sol.halo.clone(),
    }
}

/// GMRES on the operator and preconditioner the factory built.
struct GmresRun<'a> {
    comm: &'a dyn Comm,
    b: &'a [f64],
    x0: Option<&'a [f64]>,
    params: &'a GmresParams,
    monitor: &'a mut (dyn GmresMonitor + Send),
    /// A caller's M, used instead of the factory's preconditioner.
    external: Option<Box<dyn HostPreconditioner>>,
}

impl SquareVisitor for GmresRun<'_> {
    type Output = SquareSolve;
    fn visit<B: ScalarSlots + 'static, O: Operator<B>>(
        self,
        be: &B,
        op: &O,
        (mut pc, counts): (Box<dyn Preconditioner<B>>, PrecondCounts),
        built: SquareBuilt,
    ) -> Result<SquareSolve>
    where
        B::Vector: 'static,
    {
        let setup_seconds = built.t0.elapsed().as_secs_f64();
        if let Some(m) = self.external {
            pc = Box::new(OnHost::new(m, op.nrows()));
        }
        let sol = gmres(
            be,
            op,
            pc.as_mut(),
            self.comm,
            self.b,
            self.x0,
            self.params,
            self.monitor,
        )?;
        Ok(SquareSolve {
            x_local: sol.x,
            info: sol.info,
            precond: pc.name(),
            jacobi_zero_diagonals: counts.zero_diagonals,
            ilu_replaced_pivots: counts.replaced_pivots,
            ilu_inserted_diagonals: counts.inserted_diagonals,
            setup_seconds,
            halo: built.halo,
            storage: built.storage,
        })
    }
}

/// GMRES for one rank of a job on `engine`, the rows stored as `spec` says (precision and
/// storage on the GPU). Every rank calls it; the same code runs on one rank with
/// [`crate::comm::SerialComm`].
pub fn gmres_square(
    engine: &Engine,
    comm: &dyn Comm,
    sys: SquareSystem,
    precond: SquarePrecond,
    spec: &OperatorSpec,
    params: &GmresParams,
    monitor: &mut (dyn GmresMonitor + Send),
) -> Result<SquareSolve> {
    square_run(engine, comm, sys, (precond, None), spec, params, monitor)
}

/// One GMRES solve through the factory: `precond` or, when given, a caller's own M.
fn square_run(
    engine: &Engine,
    comm: &dyn Comm,
    sys: SquareSystem,
    (precond, external): (SquarePrecond, Option<Box<dyn HostPreconditioner>>),
    spec: &OperatorSpec,
    params: &GmresParams,
    monitor: &mut (dyn GmresMonitor + Send),
) -> Result<SquareSolve> {
    let n = *sys.part.bounds.last().unwrap_or(&0);
    check_restart(params.restart, n, sys.rows.nrows())?;
    let run = GmresRun {
        comm,
        b: sys.b,
        x0: sys.x0,
        params,
        monitor,
        external,
    };
    engine.square(spec, comm, &sys, precond, run)
}

/// [`gmres_square`] preconditioned by a caller's own M, applied on the host (the Python
/// module's LinearOperator or callable `M`): the factory's operator with `m` in place of a
/// preconditioner of its own.
pub fn gmres_square_host_precond(
    engine: &Engine,
    comm: &dyn Comm,
    sys: SquareSystem,
    m: Box<dyn HostPreconditioner>,
    spec: &OperatorSpec,
    params: &GmresParams,
    monitor: &mut (dyn GmresMonitor + Send),
) -> Result<SquareSolve> {
    let pc = (SquarePrecond::None, Some(m));
    square_run(engine, comm, sys, pc, spec, params, monitor)
}

/// [`gmres_square`] on the CPU (f64 CSR), driven from the calling thread (tests, tools).
pub fn gmres_square_cpu(
    comm: &dyn Comm,
    sys: SquareSystem,
    precond: SquarePrecond,
    params: &GmresParams,
    monitor: &mut (dyn GmresMonitor + Send),
) -> Result<SquareSolve> {
    let engine = Engine::cpu_on_calling_thread();
    gmres_square(
        &engine,
        comm,
        sys,
        precond,
        &OperatorSpec::default(),
        params,
        monitor,
    )
}
