//! `seistomo compare`: seistomo and its peers (SciPy's lsqr, PETSc's KSPLSQR through petsc4py)
//! on the same system on this machine, in one table.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use clap::Args;

use crate::backend::TransposeStrategy;
use crate::comm::SerialComm;
use crate::io::mtx;
use crate::pipeline::config::RunConfig;
use crate::pipeline::{self, BackendChoice, SolveOptions};
use crate::solver::LsqrParams;
use crate::sparse::Csr;
use crate::sparse::System;

/// The peer script, embedded so that an installed binary needs no checkout.
const PEER_SCRIPT: &str = include_str!("../../bench/peers/peer_lsqr.py");

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
}

struct Row {
    name: String,
    iterations: usize,
    stop: String,
    x: Vec<f64>,
    seconds: f64,
    ms_per_iter: f64,
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|a| a * a).sum::<f64>().sqrt()
}

/// ||b - A x|| and ||A^T (b - A x) - damp^2 x|| of the unscaled system, computed from x.
fn residuals(a: &Csr, at: &Csr, b: &[f64], x: &[f64], damp: f64) -> (f64, f64) {
    let r: Vec<f64> = a.matvec(x).iter().zip(b).map(|(ax, b)| b - ax).collect();
    let atr: Vec<f64> = at
        .matvec(&r)
        .iter()
        .zip(x)
        .map(|(g, x)| g - damp * damp * x)
        .collect();
    (norm(&r), norm(&atr))
}

pub fn run(a: CompareArgs) -> anyhow::Result<()> {
    if a.threads == 0 {
        anyhow::bail!("--threads must be >= 1");
    }
    super::init_threads(Some(a.threads))?;
    let is_config = a.target.extension().is_some_and(|e| e == "toml");
    let (sys, opts): (System, SolveOptions) = if is_config {
        let cfg = RunConfig::load(&a.target)?;
        let mut opts = cfg.options.clone();
        opts.backend = a.backend;
        (cfg.system.load()?, opts)
    } else {
        let sys = a.system.load(&a.target)?;
        let params = LsqrParams {
            atol: a.tol,
            btol: a.tol,
            conlim: 1e14,
            iter_lim: Some(100_000),
            ..Default::default()
        };
        let opts = SolveOptions {
            params,
            col_scale: false,
            x0: None,
            backend: a.backend,
            transpose: TransposeStrategy::Auto,
            threads: Some(a.threads),
            precision: Default::default(),
            allreduce: Default::default(),
            reorder: Default::default(),
            storage: Default::default(),
            lsqr_loop: Default::default(),
            grid: None,
        };
        (sys, opts)
    };
    if opts.x0.is_some() {
        anyhow::bail!("compare does not support x0 (the peers start from zero)");
    }
    let tol = opts.params.atol;
    if opts.params.btol != tol {
        eprintln!(
            "note: atol {} and btol {} differ; the peers get tol = atol",
            tol, opts.params.btol
        );
    }
    let damp = opts.params.damp;
    let a_orig = sys.a.clone();
    let at = a_orig.transpose();
    let b = sys.b.clone();
    // The exact system seistomo iterates on (scaled columns when asked), for the peers.
    let scale = if opts.col_scale {
        Some(pipeline::column_scaling(&sys.a, &SerialComm)?)
    } else {
        None
    };
    let mut exported = sys.a.clone();
    if let Some(d) = &scale {
        exported.scale_columns(d);
    }
    let dir = std::env::temp_dir().join(format!("seistomo-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let cleanup = TempDir(dir.clone());
    mtx::write_matrix(
        dir.join("A.mtx"),
        &exported,
        "system exported by seistomo compare",
    )?;
    mtx::write_vector_mtx(dir.join("b.mtx"), &b)?;
    std::fs::write(dir.join("peer_lsqr.py"), PEER_SCRIPT)
        .with_context(|| format!("writing {}", dir.display()))?;

    let mut rows = Vec::new();
    let o = pipeline::solve_system(sys, &opts, &SerialComm, 0.0, 0)?;
    rows.push(Row {
        name: format!(
            "seistomo {} ({})",
            o.report.backend, o.report.backend_detail
        ),
        iterations: o.report.iterations,
        stop: format!("istop {}", o.report.istop),
        x: o.solution.x.clone(),
        seconds: o.report.seconds.solve,
        ms_per_iter: o.report.ms_per_iter,
    });

    let python = a.python.clone().unwrap_or_else(|| {
        let deb = PathBuf::from("/usr/bin/python3");
        if deb.exists() {
            deb
        } else {
            PathBuf::from("python3")
        }
    });
    // SciPy in one process; PETSc on --threads ranks (under mpirun when more than one).
    let peer_cmd = |peers: &[String], ranks: usize| {
        let mut c = if ranks > 1 {
            let mut c = Command::new("mpirun");
            c.args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "none",
            ])
            .args(["-np", &ranks.to_string()])
            .arg(&python);
            c
        } else {
            Command::new(&python)
        };
        c.arg(dir.join("peer_lsqr.py"))
            .arg(dir.join("A.mtx"))
            .arg("--rhs")
            .arg(dir.join("b.mtx"))
            .args([
                "--tol",
                &tol.to_string(),
                "--damp",
                &damp.to_string(),
                "--conlim",
                &opts.params.conlim.to_string(),
            ])
            .args([
                "--maxit",
                &opts.params.iter_lim.unwrap_or(100_000).to_string(),
            ])
            .args(["--peers", &peers.join(",")])
            .arg("--solution-dir")
            .arg(&dir)
            .env("OPENBLAS_NUM_THREADS", "1")
            .env("OMP_NUM_THREADS", "1");
        c
    };
    let (petsc, others): (Vec<String>, Vec<String>) =
        a.peers.iter().cloned().partition(|p| p == "petsc");
    let mut runs = Vec::new();
    if !others.is_empty() {
        runs.push(peer_cmd(&others, 1));
    }
    if !petsc.is_empty() {
        runs.push(peer_cmd(&petsc, a.threads));
    }
    for mut cmd in runs {
        let out = cmd.output();
        peer_rows(out, &python, &dir, scale.as_deref(), a.threads, &mut rows)?;
    }
    drop(cleanup);
    print_table(&rows, &a_orig, &at, &b, damp, &a.target);
    Ok(())
}

/// The rows of one peer run's JSON lines (a failed run is reported and skipped).
fn peer_rows(
    out: std::io::Result<std::process::Output>,
    python: &Path,
    dir: &Path,
    scale: Option<&[f64]>,
    threads: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    match out {
        Err(e) => eprintln!("peers skipped: cannot run the peer script: {e}"),
        Ok(out) if !out.status.success() => {
            let err = String::from_utf8_lossy(&out.stderr);
            eprintln!(
                "peers skipped: {} failed: {}",
                python.display(),
                err.lines().last().unwrap_or("")
            );
        }
        Ok(out) => {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let j: serde_json::Value =
                    serde_json::from_str(line).context("peer output is not JSON")?;
                let peer = j["peer"].as_str().unwrap_or("?").to_string();
                if let Some(why) = j["skipped"].as_str() {
                    eprintln!("{peer} skipped: {why}");
                    continue;
                }
                let mut x = mtx::read_vector(dir.join(format!("x_{peer}.txt")))?;
                if let Some(d) = scale {
                    x.iter_mut().zip(d).for_each(|(x, d)| *x *= d);
                }
                let stop = match (j.get("istop"), j.get("reason")) {
                    (Some(i), _) if !i.is_null() => format!("istop {i}"),
                    (_, Some(r)) => format!("reason {r}"),
                    _ => "?".into(),
                };
                let cores = match j["ranks"].as_u64() {
                    Some(1) => "1 rank".to_string(),
                    Some(r) => format!("{r} ranks"),
                    None if threads > 1 => "1 thread: no parallel mode".to_string(),
                    None => "1 thread".to_string(),
                };
                rows.push(Row {
                    name: format!("{peer} {} ({cores})", j["version"].as_str().unwrap_or("")),
                    iterations: j["iterations"].as_u64().unwrap_or(0) as usize,
                    stop,
                    x,
                    seconds: j["seconds"].as_f64().unwrap_or(f64::NAN),
                    ms_per_iter: j["ms_per_iter"].as_f64().unwrap_or(f64::NAN),
                });
            }
        }
    }
    Ok(())
}

fn print_table(rows: &[Row], a: &Csr, at: &Csr, b: &[f64], damp: f64, target: &Path) {
    let ours = &rows[0];
    println!(
        "system: {} ({} x {}, {} nonzeros)",
        target.display(),
        a.nrows(),
        a.ncols(),
        a.nnz()
    );
    println!("| solver | iterations | stop | ‖r‖ | ‖Aᵀr − damp²x‖ | ‖x‖ | ‖x − x_peer‖/‖x_peer‖ | seconds | ms/iter | seistomo speed-up |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (k, r) in rows.iter().enumerate() {
        let (rn, arn) = residuals(a, at, b, &r.x, damp);
        let rel = if k == 0 {
            "-".to_string()
        } else {
            let d: Vec<f64> = ours.x.iter().zip(&r.x).map(|(p, q)| p - q).collect();
            format!("{:.2e}", norm(&d) / norm(&r.x))
        };
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
            rn,
            arn,
            norm(&r.x),
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

/// Removes the scratch directory when dropped.
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
