//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod gpu;
pub mod mpi;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use seistomo::backend::cpu::CpuBackend;
use seistomo::backend::{Backend, Operator, TransposeStrategy};
use seistomo::comm::SerialComm;
use seistomo::pipeline::options::{BackendChoice, SolveOptions};
use seistomo::solver::{lsqr, LeastSquares, LsqrParams, LsqrSolution, NoMonitor};
use seistomo::sparse::Csr;

use seistomo::comm::ThreadComm;
use seistomo::io::mtx::load_system as load_mtx_system;
use seistomo::sparse::System;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// ||a - b|| / ||b||.
pub fn rel(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt();
    num / b.iter().map(|y| y * y).sum::<f64>().sqrt()
}

/// A vector from tests/reference/NAME (.txt.gz, one value per line).
pub fn reference_vector(name: &str) -> Vec<f64> {
    let r = seistomo::io::open_text(&root().join("tests/reference").join(name)).unwrap();
    r.lines()
        .map(|l| l.unwrap().trim().parse().unwrap())
        .collect()
}

/// tests/reference/NAME parsed as JSON.
pub fn reference_json(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("tests/reference").join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A bundled real system: "australia" ([G; 0.015 R], [d; 0]) or a Harwell-Boeing problem
/// of datasets/lsq with its right-hand side.
pub fn system(name: &str) -> System {
    let d = root().join("datasets");
    if name == "australia" {
        let a = d.join("australia");
        load_mtx_system(
            &a.join("G.mtx.gz"),
            Some(&a.join("d.txt")),
            Some(&a.join("R.mtx.gz")),
            0.015,
        )
        .unwrap()
    } else {
        let l = d.join("lsq");
        load_mtx_system(
            &l.join(format!("{name}.mtx.gz")),
            Some(&l.join(format!("{name}_rhs1.mtx.gz"))),
            None,
            0.0,
        )
        .unwrap()
    }
}

/// An empty scratch directory under the system temp dir, unique to this process and `name`;
/// removed when the test that made it is done with it, unless it failed (a panicking thread
/// leaves it for a look).
pub fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("seistomo-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// A test's scratch directory ([`scratch`]): a path, removed on drop unless the thread is
/// panicking.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `f` on each of `p` simulated ranks (one thread a rank, joined by a ThreadComm); the results
/// in rank order.
pub fn on_thread_ranks<T: Send>(p: usize, f: impl Fn(&ThreadComm) -> T + Sync) -> Vec<T> {
    let comms = ThreadComm::create(p);
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `run_lsqr` of `source` with `options` (no outputs) on `ranks` simulated ranks: rank 0's
/// outcome.
pub fn pipeline_on_thread_ranks(
    source: &seistomo::pipeline::options::SystemSource,
    options: &SolveOptions,
    ranks: usize,
) -> seistomo::model::report::Outcome {
    let run = seistomo::pipeline::invert::LsqrRun {
        source,
        options,
        outputs: &seistomo::pipeline::options::OutputPaths::default(),
        progress_every: 0,
        model: None,
    };
    let mut out = on_thread_ranks(ranks, |c| {
        seistomo::pipeline::invert::run_lsqr(&run, c).unwrap()
    });
    out.remove(0).expect("rank 0 has the outcome")
}

/// ||b - A x||, the true residual of `x`.
pub fn true_rnorm(a: &Csr, b: &[f64], x: &[f64]) -> f64 {
    let ax = a.matvec(x);
    ax.iter()
        .zip(b)
        .map(|(p, q)| (p - q) * (p - q))
        .sum::<f64>()
        .sqrt()
}

/// The names in `dir`, sorted.
pub fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The value every rank reports (fails the test when two ranks disagree on `what`).
pub fn agreed<T: PartialEq + Clone>(per_rank: impl IntoIterator<Item = T>, what: &str) -> T {
    let v: Vec<T> = per_rank.into_iter().collect();
    assert!(v.iter().all(|x| *x == v[0]), "ranks disagree on {what}");
    v[0].clone()
}

/// The seistomo binary (SEISTOMO_BIN overrides, for a test binary copied to another machine).
pub fn seistomo_path() -> PathBuf {
    std::env::var_os("SEISTOMO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_seistomo")))
}

/// The seistomo binary ([`seistomo_path`]), as a command to add arguments to.
pub fn seistomo() -> Command {
    Command::new(seistomo_path())
}

/// `seistomo ARGS` run to the end.
pub fn run_seistomo(args: &[&str]) -> Output {
    seistomo().args(args).output().unwrap()
}

/// A process's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run `c` to the end; fails the test, showing stderr, unless it exits 0.
pub fn run_ok(c: &mut Command) -> Output {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

/// A JSON file (a report.json) parsed.
pub fn read_json(p: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The fields of an LSQR run's summary, in report.json and as /solver attributes of a model.
pub const LSQR_SUMMARY: [&str; 9] = [
    "istop",
    "stop_reason",
    "iterations",
    "r1norm",
    "r2norm",
    "anorm",
    "acond",
    "arnorm",
    "xnorm",
];

/// LSQR of `b` from zero on one process, any backend and operator, no monitor.
pub fn serial_lsqr<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    b: &[f64],
    params: &LsqrParams,
) -> LsqrSolution {
    lsqr(
        &LeastSquares::new(be, op, &SerialComm, b),
        params,
        &mut NoMonitor,
    )
    .unwrap()
}

/// LSQR with `params` on the CPU backend, one process, no monitor.
pub fn cpu_lsqr<O: Operator<CpuBackend>>(
    op: &O,
    b: &[f64],
    x0: Option<&[f64]>,
    params: &LsqrParams,
) -> LsqrSolution {
    let be = CpuBackend::new();
    lsqr(
        &LeastSquares::new(&be, op, &SerialComm, b).x0(x0),
        params,
        &mut NoMonitor,
    )
    .unwrap()
}

/// The options of a plain solve on the CPU backend: `params`, `transpose`, no column scaling,
/// no x0 and every other choice at its default.
pub fn cpu_opts(params: LsqrParams, transpose: TransposeStrategy) -> SolveOptions {
    let mut o = SolveOptions::new(params, BackendChoice::Cpu);
    o.operator.transpose = transpose;
    o
}

/// I x = b as a system: n x n identity, every row a kernel row.
pub fn identity_system(b: &[f64]) -> System {
    let n = b.len();
    let idx: Vec<u64> = (0..n as u64).collect();
    let a = Csr::from_triplets(n, n, &idx, &idx, &vec![1.0; n]).unwrap();
    System {
        a,
        b: b.to_vec(),
        kernel_rows: n,
    }
}

/// datasets/demo/invert.toml with its outputs sent to `out`, written beside it as
/// datasets/demo/.test-TAG.toml (relative paths in it still resolve); the caller removes it.
pub fn demo_config(tag: &str, out: &std::path::Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join("datasets/demo/invert.toml"))
        .unwrap()
        .replace(
            "\"../../out/demo\"",
            &format!("{:?}", out.display().to_string()),
        );
    let cfg = root().join(format!("datasets/demo/.test-{tag}.toml"));
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// A string attribute of an HDF5 object.
pub fn str_attr(loc: &hdf5::Location, name: &str) -> String {
    loc.attr(name)
        .unwrap()
        .read_scalar::<hdf5::types::VarLenUnicode>()
        .unwrap()
        .as_str()
        .to_string()
}

/// `seistomo solve` with GMRES(16) to 1e-10 and Jacobi preconditioning (add the matrix and the
/// rest).
pub const GMRES_JACOBI_CLI: [&str; 9] = [
    "solve",
    "--method",
    "gmres",
    "--restart",
    "16",
    "--rtol",
    "1e-10",
    "--precond",
    "jacobi",
];

/// Two iteration counts at most `band` apart (`what` names the comparison in the message).
pub fn iterations_within(got: usize, want: usize, band: usize, what: &str) {
    assert!(
        got.abs_diff(want) <= band,
        "{what}: {got} vs {want} iterations"
    );
}

/// A synthetic dataset (seed 5) with norm damping and flattening (4 stencil blocks) in a fresh
/// folder `seistomo-{tag}-{name}-{pid}` of the temporary directory, removed when the returned
/// guard is dropped (kept where the test fails).
pub fn synth_dataset(tag: &str, name: &str, grid: &str, rays: &str) -> Scratch {
    let dir =
        Scratch(std::env::temp_dir().join(format!("seistomo-{tag}-{name}-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir);
    let out = seistomo()
        .args(["-q", "synth", "-o"])
        .arg(&dir)
        .args(["--grid", grid, "--rays", rays, "--seed", "5"])
        .args(["--norm-damping", "0.1", "--flattening", "0.5,0.5,0.5"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Each point of an L-curve against its own solution's norms made on the host from the
/// sweep's rows (||G x - d|| and ||R x|| or ||x||), within `tol` relative, and the trace of a
/// point with GCV's probes finite. Returns how many points came with a fit made on their
/// operator ([`seistomo::model::report::Outcome::fit`]), each checked against G x.
#[allow(dead_code)]
pub fn points_match_the_host(
    sweep: &seistomo::pipeline::lcurve::Sweep,
    curve: &seistomo::pipeline::lcurve::Curve,
    tol: f64,
) -> usize {
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    let close = |a: f64, b: f64| (a - b).abs() <= tol * b.abs().max(f64::MIN_POSITIVE);
    let mut fitted = 0;
    for p in &curve.points {
        let x = &p.outcome.solution.x;
        let gx = sweep.g.par_matvec(x);
        let res: Vec<f64> = gx.iter().zip(&sweep.d).map(|(a, b)| a - b).collect();
        assert!(
            close(p.residual_norm, norm(&res)),
            "w {}: ||G x - d|| {} against {} on the host",
            p.weight,
            p.residual_norm,
            norm(&res)
        );
        let model = match &sweep.r {
            Some(r) if !sweep.on_damp => norm(&r.par_matvec(x)),
            _ => norm(x),
        };
        assert!(
            close(p.model_norm, model),
            "w {}: model norm {} against {model} on the host",
            p.weight,
            p.model_norm
        );
        if let Some(f) = &p.outcome.fit {
            fitted += 1;
            assert_eq!(f.gx.len(), gx.len());
            let scale = norm(&gx).max(f64::MIN_POSITIVE);
            let diff: Vec<f64> = f.gx.iter().zip(&gx).map(|(a, b)| a - b).collect();
            assert!(norm(&diff) <= tol * scale, "w {}: the fit's G x", p.weight);
        }
    }
    fitted
}

/// The L-curve of the dataset in `dir` (`dataset.toml`) under a config with `tables` (its
/// `[solver]`, `[backend]`, ... lines), written to `dir/name`: the sweep, its options (the
/// dataset's grid) and a batched mode with GCV's probe.
#[allow(dead_code)]
pub fn dataset_sweep(
    dir: &Path,
    name: &str,
    tables: &str,
) -> (
    seistomo::pipeline::lcurve::Sweep,
    SolveOptions,
    seistomo::pipeline::lcurve::SweepMode,
) {
    use seistomo::pipeline::config::RunConfig;
    use seistomo::pipeline::lcurve::{Sweep, SweepMode};
    let p = dir.join(name);
    std::fs::write(&p, format!("[dataset]\npath = \"dataset.toml\"\n{tables}")).unwrap();
    let cfg = RunConfig::load(&p).unwrap();
    let sweep = Sweep::from_config(&cfg).unwrap();
    let o = SolveOptions {
        grid: sweep.grid.as_ref().map(|g| g.n),
        ..cfg.options.clone()
    };
    let mode = SweepMode {
        separate: false,
        gcv_probes: 1,
        noise_norm: None,
    };
    (sweep, o, mode)
}
