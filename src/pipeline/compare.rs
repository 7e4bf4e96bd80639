//! `seistomo compare`: seistomo and its peers (SciPy's lsqr, PETSc's KSPLSQR through petsc4py)
//! on the same system on this machine; the CLI prints the table.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::comm::SerialComm;
use crate::error::{Error, Result};
use crate::io::mtx;
use crate::model::report::Outcome;
use crate::pipeline::config::RunConfig;
use crate::pipeline::load::load_mtx;
use crate::pipeline::options::{BackendChoice, SolveOptions};
use crate::pipeline::prepare::column_scaling;
use crate::pipeline::solve::solve_system;
use crate::solver::LsqrParams;
use crate::sparse::{Csr, System};

const PEER_SCRIPT: &str = include_str!("../../bench/peers/peer_lsqr.py");

/// What to compare.
pub struct CompareJob<'a> {
    /// A run config (.toml) or a matrix (.mtx / .mtx.gz).
    pub target: &'a Path,
    /// With a matrix: its right-hand side and regularisation rows.
    pub mtx: mtx::MtxParts<'a>,
    /// With a matrix: atol = btol = tol (PETSc's rtol). A config's atol is used otherwise.
    pub tol: f64,
    /// "scipy", "petsc"
    pub peers: &'a [String],
    pub backend: BackendChoice,
    /// seistomo's threads and PETSc's MPI ranks.
    pub threads: usize,
    /// Python with SciPy and petsc4py (None: /usr/bin/python3, else python3).
    pub python: Option<&'a Path>,
    /// seistomo's matrix storage (None: the config's, or auto).
    pub storage: Option<crate::backend::storage::Storage>,
}

/// The rows of a comparison and the size of the system.
pub struct Comparison {
    pub m: usize,
    pub n: usize,
    pub nnz: usize,
    pub rows: Vec<CompareRow>,
}

/// One solver's result; residuals are those of the unscaled system, computed from x.
pub struct CompareRow {
    pub name: String,
    pub iterations: usize,
    pub stop: String,
    pub x: Vec<f64>,
    pub seconds: f64,
    pub ms_per_iter: f64,
    /// ||b - A x||, ||A^T r - damp^2 x||, ||x|| (filled by [`compare`]).
    pub rnorm: f64,
    pub arnorm: f64,
    pub xnorm: f64,
    /// ||x_seistomo - x|| / ||x|| (None for seistomo's own row).
    pub rel_diff: Option<f64>,
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

/// Solve `job.target` with seistomo, then with the peers on the exact system seistomo iterates
/// on (scaled columns when asked), and compute every row's residuals on the unscaled system.
/// The first row is seistomo's. A peer that cannot run is skipped with a note on stderr.
pub fn compare(job: &CompareJob) -> Result<Comparison> {
    let (sys, opts) = compared_system(job)?;
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
        Some(column_scaling(&sys.a, &SerialComm)?)
    } else {
        None
    };
    let dir = std::env::temp_dir().join(format!("seistomo-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let cleanup = TempDir(dir.clone());
    export_for_peers(&dir, &sys.a, scale.as_deref(), &b)?;

    let mut rows = Vec::new();
    let o = solve_system(sys, &opts, &SerialComm, 0.0, 0)?;
    rows.push(own_row(&o, &opts));

    let python = peer_python(job.python);
    let peers = PeerRun {
        python: &python,
        dir: &dir,
        tol,
        params: &opts.params,
    };
    // SciPy in one process; PETSc on --threads ranks (under mpirun when more than one).
    let (petsc, others): (Vec<String>, Vec<String>) =
        job.peers.iter().cloned().partition(|p| p == "petsc");
    let mut runs = Vec::new();
    if !others.is_empty() {
        runs.push(peers.command(&others, 1));
    }
    if !petsc.is_empty() {
        runs.push(peers.command(&petsc, job.threads));
    }
    for mut cmd in runs {
        let out = cmd.output();
        peer_rows(out, &python, &dir, scale.as_deref(), job.threads, &mut rows)?;
    }
    drop(cleanup);
    fill_norms(&mut rows, &a_orig, &at, &b, damp);
    Ok(Comparison {
        m: a_orig.nrows(),
        n: a_orig.ncols(),
        nnz: a_orig.nnz(),
        rows,
    })
}

/// seistomo's row of the table (its norms are filled in later).
fn own_row(o: &Outcome, opts: &SolveOptions) -> CompareRow {
    CompareRow {
        name: format!(
            "seistomo {}{} ({})",
            o.report.backend,
            match opts.operator.storage {
                crate::backend::storage::Storage::Compact => " compact storage",
                _ => "",
            },
            o.report.backend_detail
        ),
        iterations: o.report.iterations,
        stop: format!("istop {}", o.report.istop),
        x: o.solution.x.clone(),
        seconds: o.report.seconds.solve,
        ms_per_iter: o.report.ms_per_iter,
        rnorm: 0.0,
        arnorm: 0.0,
        xnorm: 0.0,
        rel_diff: None,
    }
}

/// The Python that runs the peers: the one asked for, else /usr/bin/python3, else python3.
fn peer_python(asked: Option<&Path>) -> PathBuf {
    asked.map(PathBuf::from).unwrap_or_else(|| {
        let deb = PathBuf::from("/usr/bin/python3");
        if deb.exists() {
            deb
        } else {
            PathBuf::from("python3")
        }
    })
}

/// Every row's residuals on the unscaled system, ||x||, and (peers) the distance from
/// seistomo's x (the first row's).
fn fill_norms(rows: &mut [CompareRow], a: &Csr, at: &Csr, b: &[f64], damp: f64) {
    let ours = rows[0].x.clone();
    for (k, r) in rows.iter_mut().enumerate() {
        (r.rnorm, r.arnorm) = residuals(a, at, b, &r.x, damp);
        r.xnorm = norm(&r.x);
        if k > 0 {
            let d: Vec<f64> = ours.iter().zip(&r.x).map(|(p, q)| p - q).collect();
            r.rel_diff = Some(norm(&d) / r.xnorm);
        }
    }
}

/// The system and the options to compare on: a config's (on `job.backend`), or a matrix with
/// atol = btol = `job.tol`; `job.storage` overrides the storage. x0 is refused.
fn compared_system(job: &CompareJob) -> Result<(System, SolveOptions)> {
    let is_config = job.target.extension().is_some_and(|e| e == "toml");
    let (sys, mut opts): (System, SolveOptions) = if is_config {
        let cfg = RunConfig::load(job.target)?;
        let mut opts = cfg.options.clone();
        opts.operator.backend = job.backend;
        (load_mtx(&cfg.system)?, opts)
    } else {
        let sys = job.mtx.load(job.target)?;
        let params = LsqrParams {
            atol: job.tol,
            btol: job.tol,
            conlim: 1e14,
            iter_lim: Some(100_000),
            ..Default::default()
        };
        let opts = SolveOptions {
            threads: Some(job.threads),
            ..SolveOptions::new(params, job.backend)
        };
        (sys, opts)
    };
    if let Some(st) = job.storage {
        opts.operator.storage = st;
    }
    if opts.x0.is_some() {
        return Err(Error::Invalid(
            "compare does not support x0 (the peers start from zero)".into(),
        ));
    }
    Ok((sys, opts))
}

/// Write what the peer script reads into `dir`: A (its columns scaled by `scale`), b and the
/// script itself.
fn export_for_peers(dir: &Path, a: &Csr, scale: Option<&[f64]>, b: &[f64]) -> Result<()> {
    let mut exported = a.clone();
    if let Some(d) = scale {
        exported.scale_columns(d);
    }
    mtx::write_matrix(
        dir.join("A.mtx"),
        &exported,
        "system exported by seistomo compare",
    )?;
    mtx::write_vector_mtx(dir.join("b.mtx"), b)?;
    let script = dir.join("peer_lsqr.py");
    std::fs::write(&script, PEER_SCRIPT).map_err(|e| Error::io(&script, e))
}

/// How the peer script is run: which Python, where the exported system is, the tolerances.
struct PeerRun<'a> {
    python: &'a Path,
    dir: &'a Path,
    tol: f64,
    params: &'a LsqrParams,
}

impl PeerRun<'_> {
    /// The script on `peers`, in one process or under mpirun on `ranks` ranks.
    fn command(&self, peers: &[String], ranks: usize) -> Command {
        let mut c = if ranks > 1 {
            let mut c = Command::new("mpirun");
            c.args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "none",
            ])
            .args(["-np", &ranks.to_string()])
            .arg(self.python);
            c
        } else {
            Command::new(self.python)
        };
        c.arg(self.dir.join("peer_lsqr.py"))
            .arg(self.dir.join("A.mtx"))
            .arg("--rhs")
            .arg(self.dir.join("b.mtx"))
            .args([
                "--tol",
                &self.tol.to_string(),
                "--damp",
                &self.params.damp.to_string(),
                "--conlim",
                &self.params.conlim.to_string(),
            ])
            .args([
                "--maxit",
                &self.params.iter_lim.unwrap_or(100_000).to_string(),
            ])
            .args(["--peers", &peers.join(",")])
            .arg("--solution-dir")
            .arg(self.dir)
            .env("OPENBLAS_NUM_THREADS", "1")
            .env("OMP_NUM_THREADS", "1");
        c
    }
}

/// The rows of one peer run's JSON lines (a failed run is reported and skipped).
fn peer_rows(
    out: std::io::Result<std::process::Output>,
    python: &Path,
    dir: &Path,
    scale: Option<&[f64]>,
    threads: usize,
    rows: &mut Vec<CompareRow>,
) -> Result<()> {
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
                let j: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                    Error::Invalid(format!("peer output is not JSON ({e}): {line}"))
                })?;
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
                rows.push(CompareRow {
                    name: format!("{peer} {} ({cores})", j["version"].as_str().unwrap_or("")),
                    iterations: j["iterations"].as_u64().unwrap_or(0) as usize,
                    stop,
                    x,
                    seconds: j["seconds"].as_f64().unwrap_or(f64::NAN),
                    ms_per_iter: j["ms_per_iter"].as_f64().unwrap_or(f64::NAN),
                    rnorm: 0.0,
                    arnorm: 0.0,
                    xnorm: 0.0,
                    rel_diff: None,
                });
            }
        }
    }
    Ok(())
}

/// Removes the scratch directory when dropped.
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
