//! Command-line interface: one file per subcommand. `main.rs` turns any error into one line
//! on stderr and a non-zero exit.

mod args;
pub mod bench;
mod compare;
mod export;
mod import;
mod inspect;
mod invert;
mod lcurve;
mod plot;
mod prepare;
mod resolution;
mod solve;
mod solve_gmres;
mod square;
mod synth;
mod verify;

use clap::{Parser, Subcommand};

/// seistomo: seismic tomography inversions with LSQR (and GMRES) on CPUs and GPUs.
#[derive(Debug, Parser)]
#[command(name = "seistomo", version, about, long_about = None)]
pub struct Cli {
    /// No progress (by default: bars on a terminal, one line every 10 s otherwise; rank 0).
    #[arg(long, short = 'q', global = true)]
    pub quiet: bool,
    /// Print each set-up and output phase as it ends, stamped with the seconds since the
    /// process started (stderr; for finding where a run's time goes).
    #[arg(long, global = true)]
    pub trace_phases: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
pub enum Command {
    /// Solve one system given as Matrix Market files.
    Solve(solve::SolveArgs),
    /// Run an inversion described by a TOML config file.
    Invert(invert::InvertArgs),
    /// PNG quicklooks of a model file: map slices, sections, convergence.
    Plot(plot::PlotArgs),
    /// L-curve: one inversion per damping/regularisation weight; finds the corner.
    Lcurve(lcurve::LcurveArgs),
    /// Resolution tests of a config's `[resolution]` table (checkerboards, spikes) inverted
    /// with its data as one batch.
    Resolution(resolution::ResolutionArgs),
    /// Run seistomo and its peers (SciPy, PETSc) on the same system and print one table.
    Compare(compare::CompareArgs),
    /// Generate a synthetic straight-ray travel-time dataset and its true model.
    Synth(synth::SynthArgs),
    /// Build a dataset from Matrix Market kernel, damping matrix, data and weights.
    Import(import::ImportArgs),
    /// Write a dataset's assembled system as Matrix Market or NumPy files.
    Export(export::ExportArgs),
    /// Print a dataset's sizes, nnz histogram, memory per backend and partition imbalance.
    Inspect(inspect::InspectArgs),
    /// Time LSQR iterations per backend / transpose / precision on a synthetic or given system.
    Bench(bench::BenchArgs),
    /// Write a generated square system (3-D Poisson or convection-diffusion) as Matrix Market.
    Square(square::SquareArgs),
    /// Check a whole dataset (structure, values, checksums) without solving.
    Verify(verify::VerifyArgs),
    /// Lay a config's dataset out as `invert` would and keep it in the dataset: later runs
    /// skip the set-up.
    Prepare(prepare::PrepareArgs),
}

/// Run the parsed command line (on every rank of an MPI job).
pub fn run(cli: Cli) -> anyhow::Result<()> {
    crate::ui::phases::mark_process_start();
    crate::ui::phases::set_trace(cli.trace_phases);
    // SAFETY: the seistomo binary declares no global allocator: Rust's is the system malloc.
    unsafe { crate::sparse::par::assume_system_allocator() };
    // Before rayon's pool exists: it would read RAYON_NUM_THREADS unchecked.
    crate::backend::cpu::env_threads()?;
    // A rank of a job of several that may use a GPU: CUDA's start and its context beside MPI's.
    let ranks = crate::settings::launch::world_size().unwrap_or(1);
    if crate::comm::launched_by_mpi() && ranks > 1 && one_process(&cli.command).is_none() {
        crate::pipeline::operators::gpu_head_start(crate::comm::local_rank());
    }
    let comm = crate::comm::init()?;
    crate::ui::progress::configure(cli.quiet, comm.is_root());
    if let (Some(name), true) = (one_process(&cli.command), comm.size() > 1) {
        // Every rank would run the whole command and write the same outputs.
        let msg = format!(
            "`seistomo {name}` runs in one process, not on {} MPI ranks: run it without mpirun (invert, solve, prepare and bench --sums are the commands that run on several ranks)",
            comm.size()
        );
        return end_job(comm, Err(crate::Error::Rank { rank: 0, msg }.into()));
    }
    let result = match cli.command {
        Command::Solve(a) => solve::run(a, &*comm),
        Command::Invert(a) => invert::run(a, &*comm),
        Command::Plot(a) => plot::run(a),
        Command::Lcurve(a) => lcurve::run(a),
        Command::Resolution(a) => resolution::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Import(a) => import::run(a),
        Command::Export(a) => export::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Bench(a) => match a.sums {
            Some(values) => bench::run_sums(&a, values, &*comm),
            None => bench::run(a),
        },
        Command::Square(a) => square::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Prepare(a) => prepare::run(a, &*comm),
    };
    crate::ui::phases::trace(format_args!("command done"));
    end_job(comm, result)
}

/// The name of a command that runs in one process (None: it runs on every rank of a job).
fn one_process(c: &Command) -> Option<&'static str> {
    match c {
        Command::Solve(_) | Command::Invert(_) | Command::Prepare(_) => None,
        Command::Bench(a) if a.sums.is_some() => None,
        Command::Plot(_) => Some("plot"),
        Command::Lcurve(_) => Some("lcurve"),
        Command::Resolution(_) => Some("resolution"),
        Command::Compare(_) => Some("compare"),
        Command::Synth(_) => Some("synth"),
        Command::Import(_) => Some("import"),
        Command::Export(_) => Some("export"),
        Command::Inspect(_) => Some("inspect"),
        Command::Bench(_) => Some("bench"),
        Command::Square(_) => Some("square"),
        Command::Verify(_) => Some("verify"),
    }
}

/// End a command on every rank. One process: errors go back to `main`. Several ranks: an error
/// that all ranks agreed on (`Error::Rank`) is printed by rank 0 alone, then every rank
/// finalises MPI and exits 1; an error only this rank has seen is printed with the rank and the
/// whole job is aborted (the other ranks may be waiting for it in a collective). Each message is
/// one line, written with one call so that ranks' output does not interleave.
fn end_job(comm: Box<dyn crate::comm::Comm>, result: anyhow::Result<()>) -> anyhow::Result<()> {
    let e = match result {
        Ok(()) => return Ok(()),
        Err(e) if comm.size() == 1 => return Err(e),
        Err(e) => e,
    };
    let say = |line: String| {
        use std::io::Write;
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(line.replace('\n', " ").as_bytes());
        let _ = err.write_all(b"\n");
        let _ = err.flush();
    };
    let agreed = e
        .chain()
        .any(|c| matches!(c.downcast_ref(), Some(crate::Error::Rank { .. })));
    if !agreed {
        say(format!("seistomo: error: rank {}: {e:#}", comm.rank()));
        comm.abort(1);
    }
    if comm.is_root() {
        say(format!("seistomo: error: {e:#}"));
    }
    // Nobody exits before rank 0 has printed (the launcher ends the job at the first non-zero
    // exit).
    let _ = comm.barrier();
    drop(comm); // finalises MPI
    std::process::exit(1);
}

/// A command's default output directory: `name` in the config's output directory (in the
/// working directory where the config names none).
pub(crate) fn output_subdir(
    cfg: &crate::pipeline::config::RunConfig,
    name: &str,
) -> std::path::PathBuf {
    cfg.output
        .report
        .as_ref()
        .and_then(|p| p.parent())
        .map(|d| d.join(name))
        .unwrap_or_else(|| std::path::PathBuf::from(name))
}

/// Use `threads` rayon workers for the rest of the process (when given).
pub(crate) fn init_threads(threads: Option<usize>) -> anyhow::Result<()> {
    Ok(crate::backend::cpu::init_threads(threads)?)
}

/// One line summarising an outcome, for stderr.
pub(crate) fn summary(o: &crate::model::report::Outcome) -> String {
    let r = &o.report;
    format!(
        "{} on {} ({}): istop {} ({}) after {} iterations; r1norm {:.8e}, arnorm {:.3e}, xnorm {:.8e}; solve {:.3} s ({:.4} ms/iter)",
        r.header.method, r.backend, r.backend_detail, r.istop, r.stop_reason, r.iterations, r.norms.r1norm, r.norms.arnorm, r.norms.xnorm, r.seconds.solve, r.ms_per_iter
    )
}
