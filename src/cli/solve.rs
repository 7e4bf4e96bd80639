//! `seistomo solve`: one system from Matrix Market files.

use clap::Args;
use std::path::PathBuf;

use crate::backend::{Precision, TransposeStrategy};
use crate::comm::Comm;
use crate::pipeline::invert::{log_job, run_lsqr, LsqrRun};
use crate::pipeline::options::{
    BackendChoice, OperatorSpec, OutputPaths, SolveOptions, SystemSource,
};
use crate::solver::LsqrParams;

#[derive(Debug, Args)]
pub struct SolveArgs {
    /// Solver: lsqr (any shape, least squares), lsmr (any shape, least squares: ||A^T r||
    /// falls monotonically; SciPy's lsmr), or gmres (square systems).
    #[arg(long, default_value = "lsqr", value_parser = super::args::words(&["lsqr", "lsmr", "gmres"]))]
    method: String,
    /// System matrix A (Matrix Market, .gz allowed). With --method gmres also a dataset
    /// directory (`seistomo square -o DIR`): its b is the right-hand side unless --rhs is given.
    #[arg(long)]
    matrix: PathBuf,
    #[command(flatten)]
    system: super::args::MtxSystemArgs,
    /// Starting guess x0 (damping then applies to x - x0).
    #[arg(long)]
    x0: Option<PathBuf>,
    /// LSQR/LSMR damping (Tikhonov weight on ||x - x0||).
    #[arg(long, default_value_t = 0.0)]
    damp: f64,
    /// LSQR/LSMR stopping tolerance on the relative error in A (stop when ||A^T r|| / (||A|| ||r||)
    /// <= atol).
    #[arg(long, default_value_t = 1e-6)]
    atol: f64,
    /// LSQR/LSMR stopping tolerance on the relative error in b (stop when ||r|| <= btol ||b|| + atol
    /// ||A|| ||x||).
    #[arg(long, default_value_t = 1e-6)]
    btol: f64,
    /// LSQR/LSMR stop when the estimate of cond(A) exceeds this (istop 3).
    #[arg(long, default_value_t = 1e8)]
    conlim: f64,
    /// Iteration limit (default 2 n for LSQR, min(m, n) for LSMR, as SciPy's).
    #[arg(long)]
    iter_lim: Option<usize>,
    /// Scale columns to unit norm (right diagonal preconditioning).
    #[arg(long)]
    col_scale: bool,
    /// Compute the var estimate (a lower bound on diag((A^T A + damp^2 I)^-1)) into this file
    /// (LSQR only).
    #[arg(long)]
    variance: Option<PathBuf>,
    /// Compute backend (auto: CUDA when a usable GPU is present, else the CPU).
    #[arg(long, default_value = "auto", value_parser = super::args::pick::backend())]
    backend: BackendChoice,
    /// How A^T y is computed: an explicit transpose (csc), a scatter from the rows, or the
    /// vendor library's transposed SpMV.
    #[arg(long, default_value = "auto", value_parser = super::args::pick::transpose())]
    transpose: TransposeStrategy,
    /// CPU threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Matrix value precision: f64 or f32 (GPU; CPU with compact storage). Vectors and sums stay f64.
    #[arg(long, default_value = "f64", value_parser = super::args::pick::precision())]
    precision: Precision,
    /// GPU runs on several ranks: how sums (LSQR's A^T u; GMRES's halo and reductions) cross
    /// between the GPUs (auto: through each other's memory where LSQR's device loop or GMRES
    /// runs on one node, else NCCL if loadable, else host).
    #[arg(long, default_value = "auto", value_parser = super::args::pick::allreduce())]
    allreduce: crate::backend::AllreducePath,
    /// Reorder for cache locality: none, rows (sorted by their end columns) or auto (rows; Morton
    /// cells when the unknowns are a grid). The solution comes back in the original order.
    #[arg(long, default_value = "auto", value_parser = super::args::pick::reorder())]
    reorder: crate::grid::reorder::Reorder,
    /// Matrix storage: auto (compact on the GPU from 1M nonzeros on one rank, else csr), csr, or
    /// compact (16-bit column deltas; damping rows generated from a grid applied as stencils).
    /// GMRES on the GPU: compact = row patterns (a table of column-offset lists, 16-bit pattern
    /// numbers; stencil matrices), auto = row patterns where the rows qualify.
    #[arg(long, default_value = "auto", value_parser = super::args::pick::storage())]
    storage: crate::backend::storage::Storage,
    /// GPU: drive LSQR's iterations from the host (three synchronisations per iteration) or as
    /// CUDA graphs with the scalars on the device (one per block of iterations); auto: device
    /// on one rank (CSR with the explicit transpose, or compact storage), host under MPI.
    /// LSMR the same on one rank (its own device loop); under MPI always the host loop.
    #[arg(long, default_value = "auto", value_parser = super::args::pick::lsqr_loop())]
    lsqr_loop: crate::backend::LsqrLoop,
    /// Solution file: one value per line.
    #[arg(long)]
    solution: Option<PathBuf>,
    /// Report file (JSON).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Convergence history (CSV, iteration 0 onwards).
    #[arg(long)]
    history: Option<PathBuf>,
    /// Print progress every N iterations (0: never).
    #[arg(long, default_value_t = 0)]
    progress: usize,
    #[command(flatten)]
    gmres: GmresArgs,
    #[command(flatten)]
    tune: super::args::TuneArgs,
}

/// GMRES options (with --method gmres).
#[derive(Debug, Args)]
pub struct GmresArgs {
    /// GMRES: Krylov dimension m of GMRES(m).
    #[arg(long, default_value_t = 16)]
    restart: usize,
    /// GMRES: relative tolerance.
    #[arg(long, default_value_t = 1e-10)]
    rtol: f64,
    /// GMRES: limit on total inner iterations (default 10000).
    #[arg(long)]
    max_iter: Option<usize>,
    /// GMRES: limit on cycles (SciPy 1.10's maxiter counts cycles).
    #[arg(long)]
    max_cycles: Option<usize>,
    /// GMRES preconditioner: none, jacobi (diagonal) or block-ilu0 (ILU(0) of each rank's
    /// diagonal block).
    #[arg(long, default_value = "jacobi", value_parser = super::args::pick::precond())]
    precond: crate::pipeline::square::PrecondChoice,
    /// GMRES Arnoldi orthogonalisation: auto (cgs on a GPU, in the device Arnoldi loop; dcgs2
    /// from 8 ranks; mgs on the CPU), mgs, cgs2 (classical twice), cgs (classical once) or
    /// dcgs2 (CGS2 with delayed reorthogonalisation: one reduction per step).
    #[arg(long, default_value = "auto", value_parser = super::args::pick::orthog())]
    orthog: crate::solver::gmres::Orthog,
    /// GMRES Arnoldi loop: device (a cycle's inner products and norms stay on the GPU, read
    /// once per cycle; cgs and cgs2), host (each read as it is computed) or auto (device on a
    /// GPU with cgs/cgs2). Same iterations and x either way.
    #[arg(long, default_value = "auto", value_parser = super::args::pick::arnoldi_loop())]
    arnoldi_loop: crate::solver::gmres::ArnoldiLoop,
    /// GMRES preconditioning side.
    #[arg(long, default_value = "left", value_parser = super::args::pick::side())]
    side: crate::solver::gmres::PrecondSide,
    /// GMRES stopping rule: preconditioned (the preconditioned residual decides when to check,
    /// the true residual whether it converged; the target tightens when they disagree), scipy
    /// (SciPy 1.10's true-residual rule) or petsc (the preconditioned residual alone, PETSc's
    /// default: the report says the true residual was not checked).
    #[arg(long, default_value = "preconditioned", value_parser = super::args::pick::stop())]
    stop: crate::solver::gmres::ConvergenceTest,
    /// Block ILU(0): on a missing diagonal or zero pivot, stop with an error or shift the
    /// pivot.
    #[arg(long, default_value = "error", value_parser = super::args::pick::pivot())]
    ilu_pivot: crate::backend::precond::PivotPolicy,
    /// Block ILU(0): Jacobi sweeps per triangular solve instead of exact solves.
    #[arg(long)]
    ilu_sweeps: Option<usize>,
    /// GMRES on several ranks: rows split by contiguous, nnz or metis (graph partition).
    #[arg(long, default_value = "nnz", value_parser = super::args::pick::partition())]
    partition: crate::partition::graph::PartitionMethod,
}

pub fn run(a: SolveArgs, comm: &dyn Comm) -> anyhow::Result<()> {
    a.check()?;
    // Before any work: no output is an input (nor two outputs one file), and this run alone
    // writes its output directories (rank 0 holds the lock until the end).
    let mut paths = crate::io::outpaths::PathCheck::new();
    // A dataset directory (GMRES) stands for its manifest: the input the reader policy checks.
    let matrix = if a.matrix.is_dir() {
        a.matrix.join("dataset.toml")
    } else {
        a.matrix.clone()
    };
    paths
        .input("--matrix", &matrix)
        .input_opt("--rhs", a.system.rhs.as_deref())
        .input_opt("--reg", a.system.reg.as_deref())
        .input_opt("--x0", a.x0.as_deref())
        .output_opt("--solution", a.solution.as_deref())
        .output_opt("--report", a.report.as_deref())
        .output_opt("--history", a.history.as_deref())
        .output_opt("--variance", a.variance.as_deref());
    let _lock = crate::comm::agree(
        comm,
        if comm.is_root() {
            crate::io::outpaths::check_and_lock(&paths).map(Some)
        } else {
            Ok(None)
        },
    )?;
    if a.method == "gmres" {
        return run_gmres(a, comm);
    }
    super::init_threads(a.threads.or_else(crate::comm::default_threads_per_rank))?;
    let operator = a.operator_spec()?;
    let method = a
        .method
        .parse::<crate::solver::LsqMethod>()
        .map_err(anyhow::Error::msg)?;
    let opts = SolveOptions {
        method,
        params: LsqrParams {
            damp: a.damp,
            atol: a.atol,
            btol: a.btol,
            conlim: a.conlim,
            iter_lim: a.iter_lim,
            calc_var: a.variance.is_some(),
        },
        col_scale: a.col_scale,
        x0: a.x0,
        operator,
        threads: a.threads,
        reorder: a.reorder,
        grid: None,
        fit: false,
    };
    let out = OutputPaths {
        solution: a.solution,
        report: a.report,
        history: a.history,
        variance: a.variance,
    };
    log_job(comm);
    let source = SystemSource::Mtx {
        matrix: a.matrix,
        rhs: a.system.rhs,
        reg: a.system.reg,
        reg_weight: a.system.reg_weight,
    };
    let run = LsqrRun {
        source: &source,
        options: &opts,
        outputs: &out,
        progress_every: a.progress,
        model: None,
    };
    if let Some(o) = run_lsqr(&run, comm)? {
        eprintln!("{}", super::summary(&o));
    }
    Ok(())
}

impl SolveArgs {
    /// The options no file is needed for, before any work (one line naming the option).
    fn check(&self) -> anyhow::Result<()> {
        if self.iter_lim == Some(0) {
            anyhow::bail!("--iter-lim: iter_lim must be >= 1 (got 0)");
        }
        let lsqr = [
            ("--damp", self.damp),
            ("--atol", self.atol),
            ("--btol", self.btol),
            ("--conlim", self.conlim),
        ];
        for (what, v) in lsqr {
            if !(v.is_finite() && v >= 0.0) {
                anyhow::bail!("{what} must be finite and >= 0 (got {v})");
            }
        }
        Ok(())
    }

    /// Backend, storage, precision, transpose, loop, allreduce path and tuning of the options.
    fn operator_spec(&self) -> crate::Result<OperatorSpec> {
        Ok(OperatorSpec {
            backend: self.backend,
            storage: self.storage,
            precision: self.precision,
            transpose: self.transpose,
            lsqr_loop: self.lsqr_loop,
            allreduce: self.allreduce,
            tuning: self.tune.over(&Default::default())?,
        })
    }
}

fn run_gmres(a: SolveArgs, comm: &dyn Comm) -> anyhow::Result<()> {
    super::init_threads(a.threads)?;
    let operator = a.operator_spec()?;
    let g = a.gmres;
    let c = crate::pipeline::square::GmresJob {
        matrix: a.matrix,
        rhs: a.system.rhs,
        x0: a.x0,
        params: crate::solver::gmres::GmresParams {
            restart: g.restart,
            rtol: g.rtol,
            atol: 0.0,
            max_iter: g.max_iter.unwrap_or(10_000),
            max_cycles: g.max_cycles,
            orthog: g.orthog,
            side: g.side,
            test: g.stop,
            arnoldi_loop: g.arnoldi_loop,
        },
        precond: g.precond,
        ilu_pivot: g.ilu_pivot,
        ilu_sweeps: g.ilu_sweeps,
        partition: g.partition,
        operator,
        solution: a.solution,
        report: a.report,
        history: a.history,
        progress: a.progress,
    };
    super::solve_gmres::run(c, comm)?;
    Ok(())
}
