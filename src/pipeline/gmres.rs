//! Distributed GMRES on square systems ([`solve_square`], what `solve --method gmres` runs):
//! every rank reads the matrix, the partition is agreed by all ranks, each rank solves with its
//! rows on the CPU or the GPU (the same preconditioner set-up and solver for both), rank 0
//! gathers x and writes the outputs.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::backend::cpu::square::DistSquareOperator;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaIluSweeps, CudaSquareOperator};
use crate::backend::precond::Preconditioner;
use crate::backend::precond::{PivotPolicy, TriSolve};
use crate::backend::storage::Storage;
use crate::backend::{Backend, Operator, Precision};
use crate::comm::halo::CommVolume;
use crate::comm::{partition_square_on, Comm};
use crate::error::{Error, Result};
use crate::io::mtx;
use crate::model::report::{ReportHeader, Seconds};
use crate::partition::graph::{PartitionMethod, RowPartition};
use crate::pipeline::{choose_backend, BackendChoice};
use crate::solver::dist_square::{square_precond, PrecondCounts, SquarePrecond, SquareSolve};
use crate::solver::gmres::{
    gmres, ConvergenceTest, GmresHistory, GmresInfo, GmresMonitor, GmresParams, GmresRecord,
    GmresStop, Orthog, PrecondSide,
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
    pub backend: BackendChoice,
    /// Matrix value precision on the GPU (vectors stay f64).
    pub precision: Precision,
    /// Matrix storage on the GPU: csr, compact (row patterns) or auto (row patterns where the
    /// rows qualify). The CPU stores CSR.
    pub storage: Storage,
    /// GPU runs on several ranks: the halo exchange GPU to GPU (NCCL) or through the host.
    pub allreduce: crate::backend::AllreducePath,
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

struct CliMonitor {
    history: GmresHistory,
    every: usize,
    /// Progress by default (src/progress.rs) when no --progress N lines were asked for.
    bar: Option<GmresBar>,
}

/// GMRES's progress: iteration, cycle, the relative residual against rtol, the rate, and an
/// ETA only from a steady fall of the relative residual.
struct GmresBar {
    pb: indicatif::ProgressBar,
    rtol: f64,
    max_iter: usize,
    relres: Vec<f64>,
    shown: Option<Instant>,
}

impl GmresBar {
    fn record(&mut self, r: &GmresRecord) {
        self.relres.push(r.relres);
        if self
            .shown
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_millis(100))
        {
            return;
        }
        self.shown = Some(Instant::now());
        let per_iter = if r.iteration > 0 {
            r.seconds / r.iteration as f64
        } else {
            0.0
        };
        let eta = crate::progress::eta_from_trend(
            &self.relres,
            self.rtol,
            per_iter,
            self.max_iter.saturating_sub(r.iteration),
        );
        let eta = crate::progress::eta_text(eta);
        self.pb.set_position(r.iteration as u64);
        self.pb.set_message(format!(
            "it {}  cycle {}  relres {:.2e}/{:.0e}  {:.0} it/s  {eta}",
            r.iteration,
            r.cycle,
            r.relres,
            self.rtol,
            if per_iter > 0.0 { 1.0 / per_iter } else { 0.0 },
        ));
    }
}

impl Drop for GmresBar {
    fn drop(&mut self) {
        self.pb.finish_and_clear();
    }
}

impl GmresMonitor for CliMonitor {
    fn record(&mut self, rec: &GmresRecord) -> Result<()> {
        if self.every > 0 && rec.iteration % self.every == 0 {
            eprintln!(
                "  it {:>7}  cycle {:>5}  resnorm {:.6e}  relres {:.3e}",
                rec.iteration, rec.cycle, rec.resnorm, rec.relres
            );
        }
        if let Some(b) = &mut self.bar {
            b.record(rec);
        }
        self.history.record(rec)
    }
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

/// Solve and write the outputs; returns the report on rank 0 (None elsewhere).
/// Every rank reads the matrix, keeps its nonzero-balanced block of rows and the matching
/// entries of b and x0; rank 0 gathers x and alone writes the outputs (and returns the report).
pub fn solve_square(c: &GmresJob, comm: &dyn Comm) -> Result<Option<GmresReport>> {
    let t = Instant::now();
    let a = mtx::read_matrix(&c.matrix)?;
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
    let b = match &c.rhs {
        Some(p) => read_vec(p, "right-hand side")?,
        None => vec![1.0; n],
    };
    let x0 = c.x0.as_deref().map(|p| read_vec(p, "x0")).transpose()?;
    let load = t.elapsed().as_secs_f64();
    let (backend, backend_note) = choose_backend(c.backend)?;
    if backend == BackendChoice::Cpu && c.precision != Precision::F64 {
        return Err(Error::Invalid(format!(
            "--precision {}: the CPU backend stores f64 values only",
            c.precision
        )));
    }
    if backend == BackendChoice::Cpu && c.storage == Storage::Compact {
        return Err(Error::Invalid(
            "--storage compact: GMRES's compact storage (row patterns) is for the GPU; the CPU backend stores CSR".into(),
        ));
    }
    let t_setup = Instant::now();
    let nnz = a.nnz();
    let precond = match c.precond {
        PrecondChoice::None => SquarePrecond::None,
        PrecondChoice::Jacobi => SquarePrecond::Jacobi,
        PrecondChoice::BlockIlu0 => SquarePrecond::BlockIlu0 {
            pivot: c.ilu_pivot,
            tri: match c.ilu_sweeps {
                None => TriSolve::Exact,
                Some(s) => TriSolve::Jacobi(s),
            },
        },
    };
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
    let mut mon = CliMonitor {
        history: GmresHistory(Vec::with_capacity(c.params.max_iter.min(1 << 20) + 1)),
        every: if comm.is_root() { c.progress } else { 0 },
        bar: (comm.is_root()
            && c.progress == 0
            && crate::progress::mode() != crate::progress::Mode::Quiet)
            .then(|| GmresBar {
                pb: crate::progress::open_ended("gmres"),
                rtol: c.params.rtol,
                max_iter: c.params.max_iter,
                relres: Vec::new(),
                shown: None,
            }),
    };
    let sys = SquareSystem {
        rows: &a,
        part: &part,
        b: &b,
        x0: x0.as_deref(),
    };
    let (sol, backend_name, backend_describe) = if backend == BackendChoice::Cuda {
        let be = CudaBackend::for_rank(comm)?;
        // The halo of a square system is small: measured on 2 x H200 (docs/gmres.md), NCCL's
        // grouped send/recv costs more per product than page-locked copies + MPI, so `auto`
        // takes the host path here; `--allreduce nccl` asks for NCCL.
        let halo_path = match c.allreduce {
            crate::backend::AllreducePath::Auto => crate::backend::AllreducePath::Host,
            p => p,
        };
        let path = be.setup_allreduce(comm, halo_path)?;
        if comm.size() > 1 && comm.is_root() {
            let how = if path.starts_with("nccl") {
                "nccl (GPU to GPU send/recv)"
            } else {
                "host (device gather, copy to host, MPI all-to-all, copy back)"
            };
            eprintln!("halo exchange between GPUs: {how}; reductions over MPI");
        }
        let sol = gmres_square_cuda(
            &be,
            comm,
            sys,
            precond,
            SquareStorage {
                precision: c.precision,
                storage: c.storage,
            },
            &c.params,
            &mut mon,
        )?;
        (sol, be.name(), be.describe())
    } else {
        let be = CpuBackend::new();
        let sol = crate::backend::cpu::on_pool(comm, || {
            gmres_square_cpu(comm, sys, precond, &c.params, &mut mon)
        })?;
        (sol, be.name(), be.describe())
    };
    mon.bar = None; // clears the bar before anything else is printed
    if let Some(z) = sol
        .jacobi_zero_diagonals
        .filter(|&z| z > 0 && comm.is_root())
    {
        eprintln!(
            "seistomo: note: {z} rows have a zero or missing diagonal; Jacobi leaves them unscaled"
        );
    }
    if let (Some(r), Some(i)) = (sol.ilu_replaced_pivots, sol.ilu_inserted_diagonals) {
        if r + i > 0 && comm.is_root() {
            eprintln!(
                "seistomo: note: ILU(0) inserted {i} missing diagonal entries and replaced {r} zero pivots"
            );
        }
    }
    let setup = t_setup.elapsed().as_secs_f64() - sol.info.seconds;
    let x = comm.gather_to_root(&sol.x_local)?;
    let Some(x) = x else {
        return Ok(None);
    };
    let x = sp.perm.unpermute(&x);
    let (zero_diag, replaced, inserted) = (
        sol.jacobi_zero_diagonals,
        sol.ilu_replaced_pivots,
        sol.ilu_inserted_diagonals,
    );
    let info: &GmresInfo = &sol.info;
    let p = &c.params;
    let report = GmresReport {
        header: ReportHeader::new("gmres"),
        matrix: c.matrix.display().to_string(),
        rhs: c
            .rhs
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "ones".into()),
        backend: backend_name.into(),
        backend_detail: format!("{backend_describe} ({backend_note})"),
        storage: sol.storage.clone(),
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
        orthog: p.orthog,
        side: p.side,
        convergence_test: p.test,
        jacobi_zero_diagonals: zero_diag,
        ilu_replaced_pivots: replaced,
        ilu_inserted_diagonals: inserted,
        stop: info.stop.clone(),
        seconds: Seconds {
            load,
            setup,
            solve: info.seconds,
            total: load + setup + info.seconds,
        },
        ms_per_iter: info.ms_per_iter,
        arnoldi_loop: info.arnoldi_loop,
        partition: c.partition,
        halo: sol.halo.clone(),
    };
    // One output set (src/io/publish.rs): solution, history, report.
    let mut publ = crate::io::publish::Publication::new("solve");
    if let Some(p) = &c.solution {
        publ.write(p, |w| crate::io::vector_text(w, &x))?;
    }
    if let Some(p) = &c.history {
        publ.write(p, |w| history_csv(w, &mon.history.0))?;
    }
    if let Some(p) = &c.report {
        publ.write(p, |w| crate::pipeline::json_text(w, &report))?;
    }
    publ.commit()?;
    Ok(Some(report))
}

/// The part of a square solve every backend shares: GMRES with the preconditioner set up on
/// `be`, and the report of the set-up (started at `t0`).
#[allow(clippy::too_many_arguments)]
fn solve_prepared<B: Backend + 'static, O: Operator<B>>(
    be: &B,
    op: &O,
    comm: &dyn Comm,
    prepared: (Box<dyn Preconditioner<B>>, PrecondCounts),
    halo: CommVolume,
    t0: Instant,
    (b, x0): (&[f64], Option<&[f64]>),
    params: &GmresParams,
    monitor: &mut dyn GmresMonitor,
) -> Result<SquareSolve>
where
    B::Vector: 'static,
{
    let (mut pc, counts) = prepared;
    let setup_seconds = t0.elapsed().as_secs_f64();
    let sol = gmres(be, op, pc.as_mut(), comm, b, x0, params, monitor)?;
    Ok(SquareSolve {
        x_local: sol.x,
        info: sol.info,
        precond: pc.name(),
        jacobi_zero_diagonals: counts.zero_diagonals,
        ilu_replaced_pivots: counts.replaced_pivots,
        ilu_inserted_diagonals: counts.inserted_diagonals,
        setup_seconds,
        halo,
        storage: "csr".into(),
    })
}

/// One rank's share of a square system: `rows` are this rank's rows of the matrix (global
/// column indices, rows `part.range(comm.rank())`), `b` and `x0` this rank's entries.
#[derive(Clone, Copy)]
pub struct SquareSystem<'a> {
    pub rows: &'a Csr,
    pub part: &'a RowPartition,
    pub b: &'a [f64],
    pub x0: Option<&'a [f64]>,
}

/// GMRES on the CPU for one rank of a job. Every rank calls it; the same code runs on one rank with
/// [`crate::comm::SerialComm`].
pub fn gmres_square_cpu(
    comm: &dyn Comm,
    sys: SquareSystem,
    precond: SquarePrecond,
    params: &GmresParams,
    monitor: &mut dyn GmresMonitor,
) -> Result<SquareSolve> {
    let t0 = Instant::now();
    let be = CpuBackend::new();
    let SquareSystem { rows, part, b, x0 } = sys;
    let op = DistSquareOperator::distributed(rows, part, comm)?;
    let halo = op.comm_volume()?;
    let row0 = part.range(comm.rank()).start;
    let prepared = square_precond(&be, comm, &op, row0, precond, |f| Ok(Box::new(f)))?;
    solve_prepared(&be, &op, comm, prepared, halo, t0, (b, x0), params, monitor)
}

/// How a square system's rows are stored on the GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SquareStorage {
    /// Matrix values (vectors are f64).
    pub precision: Precision,
    /// csr, compact (row patterns; an error where the rows do not qualify) or auto.
    pub storage: Storage,
}

/// GMRES on the GPU for one rank of a job (see [`gmres_square_cpu`]), the rows stored as
/// `storage` says.
pub fn gmres_square_cuda(
    be: &CudaBackend,
    comm: &dyn Comm,
    sys: SquareSystem,
    precond: SquarePrecond,
    storage: SquareStorage,
    params: &GmresParams,
    monitor: &mut dyn GmresMonitor,
) -> Result<SquareSolve> {
    let t0 = Instant::now();
    let SquareSystem { rows, part, b, x0 } = sys;
    let cpu = DistSquareOperator::distributed(rows, part, comm)?;
    let halo = cpu.comm_volume()?;
    let row0 = part.range(comm.rank()).start;
    let prepared = square_precond(be, comm, &cpu, row0, precond, |f| {
        Ok(Box::new(CudaIluSweeps::new(be, &f)?))
    })?;
    let op = CudaSquareOperator::new(be, &cpu, comm, storage.precision, storage.storage)?;
    drop(cpu);
    be.synchronize()?;
    let mut sol = solve_prepared(be, &op, comm, prepared, halo, t0, (b, x0), params, monitor)?;
    sol.storage = op.storage().to_string();
    Ok(sol)
}
