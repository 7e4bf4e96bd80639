//! Command-line interface: one file per subcommand. `main.rs` turns any error into one line
//! on stderr and a non-zero exit.

mod invert;
mod solve;
mod solve_gmres;
mod square;

use clap::{Parser, Subcommand};

/// seistomo: seismic tomography inversions with LSQR (and GMRES) on CPUs and GPUs.
#[derive(Debug, Parser)]
#[command(name = "seistomo", version, about, long_about = None)]
pub struct Cli {
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
    /// Write a generated square system (3-D Poisson or convection-diffusion) as Matrix Market.
    Square(square::SquareArgs),
}

/// Run the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Solve(a) => solve::run(a),
        Command::Invert(a) => invert::run(a),
        Command::Square(a) => square::run(a),
    }
}

/// Use `threads` rayon workers for the rest of the process (when given).
pub(crate) fn init_threads(threads: Option<usize>) -> anyhow::Result<()> {
    if let Some(t) = threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()?;
    }
    Ok(())
}

/// One line summarising an outcome, for stderr.
pub(crate) fn summary(o: &crate::run::Outcome) -> String {
    let r = &o.report;
    format!(
        "lsqr on {} ({}): istop {} ({}) after {} iterations; r1norm {:.8e}, arnorm {:.3e}, xnorm {:.8e}; solve {:.3} s ({:.4} ms/iter)",
        r.backend, r.backend_detail, r.istop, r.stop_reason, r.iterations, r.r1norm, r.arnorm, r.xnorm, r.seconds.solve, r.ms_per_iter
    )
}
