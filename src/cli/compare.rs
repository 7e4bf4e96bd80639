//! `seistomo compare`: seistomo and its peers (SciPy's lsqr, PETSc's KSPLSQR through petsc4py)
//! on the same system on this machine, in one table.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::pipeline::compare::{compare, CompareJob, Comparison};
use crate::pipeline::options::BackendChoice;

/// The peer script, embedded so that an installed binary needs no checkout.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// A run config (.toml) or a matrix (.mtx / .mtx.gz).
    target: PathBuf,
    #[command(flatten)]
    system: super::args::MtxSystemArgs,
    /// With a matrix: atol = btol = tol (PETSc's rtol). A config's atol is used otherwise.
    #[arg(long, default_value_t = 1e-8)]
    tol: f64,
    /// Peers to run (comma-separated).
    #[arg(long, default_value = "scipy,petsc", value_delimiter = ',', value_parser = super::args::words(&["scipy", "petsc"]))]
    peers: Vec<String>,
    /// seistomo's backend.
    #[arg(long, default_value = "auto", value_parser = super::args::pick::backend())]
    backend: BackendChoice,
    /// Cores per solver, like with like: seistomo uses this many threads and PETSc runs on this
    /// many MPI ranks (`mpirun -np N`); SciPy's lsqr has no parallel mode and runs on one.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Python interpreter with SciPy and petsc4py (default /usr/bin/python3, else python3).
    #[arg(long)]
    python: Option<PathBuf>,
    /// seistomo's matrix storage: auto, csr, or compact (16-bit column deltas; also on the CPU).
    /// Default: the config's, else auto.
    #[arg(long, value_parser = super::args::pick::storage())]
    storage: Option<crate::backend::storage::Storage>,
}

pub fn run(a: CompareArgs) -> anyhow::Result<()> {
    if a.threads == 0 {
        anyhow::bail!("--threads must be >= 1");
    }
    super::init_threads(Some(a.threads))?;
    let job = CompareJob {
        target: &a.target,
        mtx: a.system.parts(),
        tol: a.tol,
        peers: &a.peers,
        backend: a.backend,
        threads: a.threads,
        python: a.python.as_deref(),
        storage: a.storage,
    };
    let c = compare(&job)?;
    print_table(&c, &a.target);
    Ok(())
}

fn print_table(c: &Comparison, target: &Path) {
    let rows = &c.rows;
    let ours = &rows[0];
    println!(
        "system: {} ({} x {}, {} nonzeros)",
        target.display(),
        c.m,
        c.n,
        c.nnz
    );
    println!("| solver | iterations | stop | ‖r‖ | ‖Aᵀr − damp²x‖ | ‖x‖ | ‖x − x_peer‖/‖x_peer‖ | seconds | ms/iter | seistomo speed-up |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (k, r) in rows.iter().enumerate() {
        let rel = r
            .rel_diff
            .map_or_else(|| "-".to_string(), |d| format!("{d:.2e}"));
        let speed = if k == 0 {
            "1.00".to_string()
        } else {
            format!("{:.2}", r.ms_per_iter / ours.ms_per_iter)
        };
        println!(
            "| {} | {} | {} | {:.10e} | {:.3e} | {:.10e} | {} | {:.4} | {:.4} | {} |",
            r.name,
            r.iterations,
            r.stop,
            r.rnorm,
            r.arnorm,
            r.xnorm,
            rel,
            r.seconds,
            r.ms_per_iter,
            speed
        );
    }
    for r in &rows[1..] {
        if r.ms_per_iter < ours.ms_per_iter {
            println!(
                "seistomo is slower than {} here: {:.2}x its time per iteration",
                r.name,
                ours.ms_per_iter / r.ms_per_iter
            );
        }
    }
}
