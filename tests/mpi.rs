//! The binary under `mpirun` on 1-4 ranks (CPU backend): the same istop, iterations and
//! solution (to 1e-10 relative: only the summation order differs) as the single-process run, a
//! rank with no rows, failing ranks ending the whole job with the file named, and MPI-IO byte
//! ranges read on several ranks. Every test prints why and returns when `mpirun` is absent.
#![cfg(feature = "mpi")]

mod common;

use common::mpi::{child_test, finish, fresh_dir, have_mpirun, mpi_dir, mpirun, the_error_line};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_seistomo");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The stopping tolerances of the runs compared with the serial one.
const TOL_1E10: [&str; 4] = ["--atol", "1e-10", "--btol", "1e-10"];

/// `--matrix A --rhs B` with [`TOL_1E10`].
fn lsq_args<'a>(a: &'a Path, b: &'a Path) -> Vec<&'a str> {
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    [&["--matrix", a, "--rhs", b][..], &TOL_1E10].concat()
}

fn data(rel: &str) -> PathBuf {
    Path::new(ROOT).join("datasets").join(rel)
}

fn tmpdir(name: &str) -> PathBuf {
    fresh_dir(&format!("mpi-{name}"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read_vec(p: &Path) -> Vec<f64> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

fn report(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

struct Run {
    x: Vec<f64>,
    report: serde_json::Value,
}

/// The binary on `np` ranks under mpirun, or alone (None).
fn launch(np: Option<usize>) -> Command {
    match np {
        None => Command::new(BIN),
        Some(np) => {
            let mut c = mpirun();
            c.args(["-np", &np.to_string(), BIN]);
            c
        }
    }
}

/// `seistomo solve ARGS` on `np` ranks (None: no mpirun at all), outputs in `dir/tag.*`.
fn solve(np: Option<usize>, args: &[&str], dir: &Path, tag: &str) -> Run {
    let sol = dir.join(format!("{tag}.x.txt"));
    let rep = dir.join(format!("{tag}.report.json"));
    let mut c = launch(np);
    if np.is_none() {
        c.env("RAYON_NUM_THREADS", "1");
    }
    c.arg("solve")
        .args(args)
        .args(["--backend", "cpu", "--solution"])
        .arg(&sol)
        .arg("--report")
        .arg(&rep);
    let out = finish(c);
    assert!(
        out.status.success(),
        "{tag} failed: {}\n{}",
        out.status,
        stderr(&out)
    );
    if np.is_some_and(|n| n > 1) {
        // Logs come from rank 0 only: one summary line.
        assert_eq!(
            stderr(&out).matches(" on cpu (").count(),
            1,
            "{}",
            stderr(&out)
        );
    }
    Run {
        x: read_vec(&sol),
        report: report(&rep),
    }
}

/// dir/run.toml: well1033 to 1e-10 on the CPU, outputs in dir/out with `output` added to the
/// [output] table; returns the paths of the matrix and the right-hand side.
fn well1033_run_toml(dir: &Path, output: &str) -> (PathBuf, PathBuf) {
    let (a, b) = (
        data("lsq/well1033.mtx.gz"),
        data("lsq/well1033_rhs1.mtx.gz"),
    );
    let cfg = format!(
        "[system]\nmatrix = \"{}\"\nrhs = \"{}\"\n[solver]\natol = 1e-10\nbtol = 1e-10\n\
         [backend]\nkind = \"cpu\"\n[output]\ndir = \"out\"\n{output}",
        a.display(),
        b.display()
    );
    std::fs::write(dir.join("run.toml"), cfg).unwrap();
    (a, b)
}

fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let n: f64 = b.iter().map(|y| y * y).sum();
    (d / n.max(f64::MIN_POSITIVE)).sqrt()
}

/// How far a multi-rank iteration count may stray from the single-process one. LSQR without
/// reorthogonalisation loses orthogonality after a few hundred iterations, and from then on its
/// alpha/beta sequence (hence anorm and the stopping tests) depends on the last bits of every
/// sum: changing the summation order (here: partial sums per rank, then over ranks) moves the
/// stopping iteration by a few (australia at 1e-10: 406 serial, 405 on 2 ranks; at 1e-8: 331
/// serial, 329/331/328 on 2/3/4 ranks; well1033: 204 serial, 201/203/206) while x agrees to
/// ~1e-11. Which count comes out depends on the MPI library's reduction algorithm, hence the
/// margin.
fn iteration_band(serial: u64) -> u64 {
    5.max(serial / 25)
}

/// Compare `np`-rank runs with the single-process run of the same arguments: one rank under
/// mpirun must be bit-for-bit the serial run; more ranks must stop for the same reason, within
/// [`iteration_band`] iterations (4%), with the solution within `tol` relative.
fn check_against_serial(args: &[&str], dir: &Path, nps: &[usize]) {
    check_against_serial_within(args, dir, nps, 1e-10)
}

fn check_against_serial_within(args: &[&str], dir: &Path, nps: &[usize], tol: f64) {
    let serial = solve(None, args, dir, "serial");
    let iters = serial.report["iterations"].as_u64().unwrap();
    assert!(
        iters > 10,
        "too easy a system for this test: {iters} iterations"
    );
    for &np in nps {
        let r = solve(Some(np), args, dir, &format!("np{np}"));
        let rep = &r.report;
        let its = rep["iterations"].as_u64().unwrap();
        assert_eq!(rep["ranks"], np, "np {np}");
        assert_eq!(rep["istop"], serial.report["istop"], "np {np}: istop");
        assert_eq!(rep["m"], serial.report["m"]);
        assert_eq!(rep["nnz"], serial.report["nnz"]);
        let d = rel_diff(&r.x, &serial.x);
        if np == 1 {
            assert_eq!(its, iters, "np 1: iterations");
            assert_eq!(r.x, serial.x, "np 1 must be the serial run exactly");
        } else {
            assert!(
                its.abs_diff(iters) <= iteration_band(iters),
                "np {np}: {its} iterations vs {iters} serial"
            );
        }
        assert!(d <= tol, "np {np}: solution differs by {d:e} (relative)");
        let t = rep["rank_timing"].as_array().expect("rank_timing");
        assert_eq!(t.len(), np);
        let rows: u64 = t.iter().map(|e| e["rows"].as_u64().unwrap()).sum();
        assert_eq!(rows, rep["m"].as_u64().unwrap(), "rows over ranks");
        for (i, e) in t.iter().enumerate() {
            assert_eq!(e["rank"], i);
            if np > 1 {
                assert!(e["allreduce_calls"].as_u64().unwrap() >= 2 * its);
            }
        }
        eprintln!("np {np}: {its} iterations (serial {iters}), solution within {d:.1e} of serial");
    }
}

/// australia's system as `solve` options: G, d, R and the regularisation weight.
fn australia_args() -> Vec<String> {
    let p = |f: &str| {
        data(&format!("australia/{f}"))
            .to_str()
            .unwrap()
            .to_string()
    };
    [
        "--matrix".into(),
        p("G.mtx.gz"),
        "--rhs".into(),
        p("d.txt"),
        "--reg".into(),
        p("R.mtx.gz"),
        "--reg-weight".into(),
        "0.015".into(),
    ]
    .to_vec()
}

#[test]
fn australia_on_1_to_4_ranks_matches_serial() {
    if !have_mpirun() {
        return;
    }
    let au = australia_args();
    let mut args: Vec<&str> = au.iter().map(String::as_str).collect();
    args.extend(TOL_1E10);
    // The system as given: ranks differ from the serial run only in how sums are split.
    let mut plain = args.to_vec();
    plain.extend(["--reorder", "none"]);
    check_against_serial(&plain, &tmpdir("australia"), &[1, 2, 3, 4]);
    // The default reordering sorts each rank's rows on their own, which changes the order of
    // the sums in A^T u a little more; after ~400 iterations LSQR on australia amplifies that to
    // ~1e-10 (reordering alone moves the serial solution by 8e-11).
    check_against_serial_within(&args, &tmpdir("australia-reordered"), &[1, 2, 3, 4], 1e-9);
}

#[test]
fn lsq_set_on_1_to_4_ranks_matches_serial() {
    if !have_mpirun() {
        return;
    }
    for (name, nps) in [("well1033", &[1usize, 2, 3, 4][..]), ("well1850", &[3][..])] {
        let a = data(&format!("lsq/{name}.mtx.gz"));
        let b = data(&format!("lsq/{name}_rhs1.mtx.gz"));
        let mut args = lsq_args(&a, &b);
        args.extend(["--conlim", "1e12"]);
        check_against_serial(&args, &tmpdir(name), nps);
    }
}

/// LSMR (`--method lsmr`) under mpirun: the same Dist as LSQR's (||u|| a scalar sum, A^T u
/// one vector sum over ranks); 1 rank bit for bit the serial run, 2 and 3 ranks the same istop
/// and x within 1e-10 (measured 1.6e-12 at atol = btol = 1e-12).
#[test]
fn lsmr_on_1_to_3_ranks_matches_serial() {
    if !have_mpirun() {
        return;
    }
    let au = australia_args();
    let mut args = vec!["--method", "lsmr"];
    args.extend(au.iter().map(String::as_str));
    args.extend([
        "--atol",
        "1e-12",
        "--btol",
        "1e-12",
        "--conlim",
        "1e14",
        "--reorder",
        "none",
    ]);
    check_against_serial(&args, &tmpdir("lsmr"), &[1, 2, 3]);
}

#[test]
fn more_ranks_than_rows_leaves_a_rank_without_rows() {
    let Some(dir) = mpi_dir("mpi-tiny") else {
        return;
    };
    let a = dir.join("A.mtx");
    std::fs::write(
        &a,
        "%%MatrixMarket matrix coordinate real general\n3 2 5\n1 1 2.0\n1 2 -1.0\n2 1 1.0\n3 2 3.0\n2 2 0.5\n",
    )
    .unwrap();
    let args = ["--matrix", a.to_str().unwrap(), "--damp", "0.1"];
    let serial = solve(None, &args, &dir, "serial");
    let r = solve(Some(4), &args, &dir, "np4");
    assert_eq!(r.report["iterations"], serial.report["iterations"]);
    assert_eq!(r.report["istop"], serial.report["istop"]);
    let d = rel_diff(&r.x, &serial.x);
    assert!(d <= 1e-12, "solution differs by {d:e}");
    let t = r.report["rank_timing"].as_array().unwrap();
    assert!(
        t.iter().any(|e| e["rows"] == 0),
        "expected a rank without rows: {t:?}"
    );
}

/// `lcurve` (one process) under mpirun: one clear line, exit 1, nothing written (each rank
/// used to run the whole L-curve and the second stopped on the first's output lock).
#[test]
fn one_process_commands_refuse_several_ranks() {
    let Some(dir) = mpi_dir("mpi-one-process") else {
        return;
    };
    let (_a, _b) = well1033_run_toml(&dir, "solution = \"x.txt\"\n");
    let mut c = mpirun();
    c.args(["-np", "2", BIN, "lcurve", "--damping", "0.1,0.2,0.4"])
        .arg(dir.join("run.toml"));
    let out = finish(c);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let line = the_error_line(&stderr(&out), "lcurve on 2 ranks").to_string();
    assert!(
        line.contains("`seistomo lcurve` runs in one process, not on 2 MPI ranks"),
        "{line}"
    );
    assert!(!dir.join("out").exists(), "nothing is written");
}

/// `bench --sums` runs on several ranks (the sums over them are what it times): on one
/// process it says to use mpirun; where there is no GPU (CI) every rank stops with the same
/// one-line error, exit 1, not a panic of the CUDA loader. On a GPU machine the GPU tests
/// (tests/gpu.rs) run it.
#[test]
fn bench_sums_needs_ranks_and_gpus() {
    let Some(_dir) = mpi_dir("mpi-bench-sums") else {
        return;
    };
    let one = std::process::Command::new(BIN)
        .args(["bench", "--sums", "1000"])
        .output()
        .unwrap();
    assert_eq!(one.status.code(), Some(1), "{}", stderr(&one));
    assert!(
        stderr(&one).contains("run it under mpirun"),
        "{}",
        stderr(&one)
    );
    if seistomo::backend::cuda::probe().is_ok() {
        return;
    }
    let mut c = mpirun();
    c.args(["-np", "2", BIN, "bench", "--sums", "1000"]);
    let out = finish(c);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let line = the_error_line(&stderr(&out), "bench --sums on 2 ranks").to_string();
    assert!(line.contains("no usable CUDA GPU"), "{line}");
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn invert_on_2_ranks_writes_the_outputs_once() {
    let Some(dir) = mpi_dir("mpi-invert") else {
        return;
    };
    let (a, b) = well1033_run_toml(
        &dir,
        "solution = \"x.txt\"\nreport = \"report.json\"\nhistory = \"history.csv\"\n",
    );
    let serial = solve(None, &lsq_args(&a, &b), &dir, "serial");
    let mut c = mpirun();
    c.args(["-np", "2", BIN, "invert"])
        .arg(dir.join("run.toml"));
    let out = finish(c);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).matches("solution vector written to").count(),
        1,
        "{}",
        stderr(&out)
    );
    let rep = report(&dir.join("out/report.json"));
    assert_eq!(rep["ranks"], 2);
    assert_eq!(rep["istop"], serial.report["istop"]);
    let its = rep["iterations"].as_u64().unwrap();
    let iters = serial.report["iterations"].as_u64().unwrap();
    assert!(
        its.abs_diff(iters) <= iteration_band(iters),
        "{its} vs {iters}"
    );
    let x = read_vec(&dir.join("out/x.txt"));
    let d = rel_diff(&x, &serial.x);
    assert!(d <= 1e-10, "solution differs by {d:e}");
    let hist = std::fs::read_to_string(dir.join("out/history.csv")).unwrap();
    assert_eq!(
        hist.lines().count() as u64,
        its + 2,
        "header + iterations 0..=itn"
    );
    // No temporary files left behind by a second writer.
    let names: Vec<_> = std::fs::read_dir(dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    // solution, report, history, the model file and the output manifest (rank 0 alone).
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(dir.join("out/seistomo-outputs.json").is_file());
    assert!(dir.join("out/model.h5").is_file());
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the fault-injection feature (make test turns it on)"
)]
fn checkpoints_on_3_ranks_are_removed_and_resume_is_announced_once_before_the_solve() {
    let Some(dir) = mpi_dir("mpi-ckpt3") else {
        return;
    };
    well1033_run_toml(&dir, "checkpoint_every = 10\n");
    let out = dir.join("out");
    let ckpts = || -> Vec<String> {
        std::fs::read_dir(&out)
            .map(|r| {
                r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains("checkpoint"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let invert = |resume: bool, kill: bool| {
        let mut c = mpirun();
        c.args(["-np", "3", BIN, "invert", "--progress", "1"])
            .arg(dir.join("run.toml"));
        if resume {
            c.arg("--resume");
        }
        if kill {
            // Rank 0 kills itself at the first step of publishing: the solve is done and every
            // rank's checkpoint is on disk.
            c.env("SEISTOMO_FAULT_KILL_AT", "1");
        }
        finish(c)
    };
    // A run that finishes: no checkpoint of any rank is left.
    let o = invert(false, false);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(ckpts().is_empty(), "{:?}", ckpts());
    // --resume without checkpoints: said once.
    let o = invert(true, false);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("no checkpoint at").count(), 1, "{err}");
    // Killed after the solve, then resumed: said once, before the first iteration line.
    let o = invert(false, true);
    assert!(!o.status.success());
    assert_eq!(ckpts().len(), 3, "{:?}", ckpts());
    // Issue 35: a one-process run into the same directory is not that job: it says the
    // ranks' checkpoints are there and leaves them for the job's --resume.
    let o = Command::new(BIN)
        .arg("invert")
        .arg(dir.join("run.toml"))
        .env("SEISTOMO_MPI", "0")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("checkpoint.bin.rank0, checkpoint.bin.rank1, checkpoint.bin.rank2")
            && err.contains("another number of ranks"),
        "{err}"
    );
    assert_eq!(ckpts().len(), 3, "{:?}", ckpts());
    let o = invert(true, false);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        err.matches("resumed from the checkpoint at iteration")
            .count(),
        1,
        "{err}"
    );
    assert_eq!(err.matches("no checkpoint").count(), 0, "{err}");
    let said = err.find("resumed from the checkpoint").unwrap();
    let first_itn = err.find("  itn ").unwrap_or(usize::MAX);
    assert!(said < first_itn, "{err}");
    assert!(ckpts().is_empty(), "{:?}", ckpts());
    seistomo::io::publish::check_set(&out).unwrap();
}

/// MPMD launch: ranks 0, 1 and 3 work in `good`, rank 2 in `bad` (as when a path exists on one
/// node only).
fn rank2_elsewhere(good: &Path, bad: &Path, args: &[&str]) -> Output {
    let mut c = mpirun();
    let mut part = |np: &str, dir: &Path, last: bool| {
        c.args(["-np", np, "--wdir", dir.to_str().unwrap(), BIN])
            .args(args);
        if !last {
            c.arg(":");
        }
    };
    part("2", good, false);
    part("1", bad, false);
    part("1", good, true);
    finish(c)
}

#[test]
fn config_file_missing_on_rank_2_ends_the_job_with_its_name() {
    let Some(good) = mpi_dir("mpi-fail-good") else {
        return;
    };
    let bad = tmpdir("fail-bad");
    std::fs::copy(data("lsq/well1033.mtx.gz"), good.join("A.mtx.gz")).unwrap();
    let cfg = "[system]\nmatrix = \"A.mtx.gz\"\n[backend]\nkind = \"cpu\"\n[output]\nsolution = \"x.txt\"\n";
    std::fs::write(good.join("run.toml"), cfg).unwrap();
    std::fs::write(bad.join("run.toml"), cfg).unwrap();
    let out = rank2_elsewhere(&good, &bad, &["invert", "run.toml"]);
    let err = stderr(&out);
    assert!(!out.status.success(), "job succeeded: {err}");
    let line = the_error_line(&err, "config missing on rank 2");
    assert!(
        line.contains("rank 2") && line.contains("A.mtx.gz") && line.contains("not found"),
        "{err}"
    );
    assert!(!good.join("out").exists(), "no output after a failed job");
}

#[test]
fn x0_unreadable_on_rank_2_aborts_the_job_with_its_name() {
    let Some(good) = mpi_dir("mpi-abort-good") else {
        return;
    };
    let bad = tmpdir("abort-bad");
    std::fs::write(good.join("x0.txt"), "0\n".repeat(320)).unwrap();
    let a = data("lsq/well1033.mtx.gz");
    let sol = good.join("x.txt");
    let args = [
        "solve",
        "--matrix",
        a.to_str().unwrap(),
        "--x0",
        "x0.txt",
        "--backend",
        "cpu",
        "--solution",
        sol.to_str().unwrap(),
    ];
    let out = rank2_elsewhere(&good, &bad, &args);
    let err = stderr(&out);
    assert!(!out.status.success(), "job succeeded: {err}");
    let line = err
        .lines()
        .find(|l| l.contains("seistomo: error"))
        .unwrap_or_else(|| panic!("no error line:\n{err}"));
    assert!(line.contains("rank 2") && line.contains("x0.txt"), "{err}");
    assert!(!sol.exists(), "no output after a failed job");
}

#[test]
fn mpiio_reads_byte_ranges_on_three_ranks() {
    let Some(dir) = mpi_dir("mpi-mpiio") else {
        return;
    };
    let f = dir.join("bytes.bin");
    std::fs::write(&f, pattern(100_000)).unwrap();
    let out = child_test(3, "mpiio_rank_child", "SEISTOMO_MPIIO_FILE", &f);
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(&out);
    assert!(out.status.success(), "{text}");
    for r in 0..3 {
        assert!(text.contains(&format!("mpiio rank {r} of 3 ok")), "{text}");
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

/// Run by `mpiio_reads_byte_ranges_on_three_ranks` on each rank (does nothing on its own).
#[test]
fn mpiio_rank_child() {
    use seistomo::comm::{Comm, MpiComm};
    use seistomo::io::mpiio::{read_at, MpiFile};
    let Some(f) = std::env::var_os("SEISTOMO_MPIIO_FILE") else {
        eprintln!("mpiio_rank_child: only runs under mpirun, started by mpiio_reads_byte_ranges_on_three_ranks");
        return;
    };
    let f = PathBuf::from(f);
    let want = pattern(100_000);
    let comm = MpiComm::init().unwrap();
    let (rank, size) = (comm.rank(), comm.size());
    // Independent reads, different ranges per rank.
    let (off, len) = (rank * 30_001 + 17, 20_000 + rank);
    assert_eq!(read_at(&f, off as u64, len).unwrap(), &want[off..off + len]);
    assert_eq!(
        comm.reader().read_at(&f, off as u64, len).unwrap(),
        &want[off..off + len]
    );
    // Collective read: rank 1 reads nothing.
    let len = if rank == 1 { 0 } else { 5_000 * (rank + 1) };
    let off = 99_000 - len;
    let file = MpiFile::open_world(&f).unwrap();
    assert_eq!(file.size().unwrap(), 100_000);
    assert_eq!(
        file.read_at_all(off as u64, len).unwrap(),
        &want[off..off + len]
    );
    // Past the end: a short read names the file.
    let e = file.read_at(99_990, 20).unwrap_err().to_string();
    assert!(e.contains("bytes.bin") && e.contains("10 of them"), "{e}");
    drop(file);
    assert_eq!(
        comm.reader()
            .read_at_all(&f, 1000 * rank as u64, 10)
            .unwrap(),
        &want[1000 * rank..1000 * rank + 10]
    );
    // A missing file: the error names it.
    let missing = f.with_file_name("missing.bin");
    let e = read_at(&missing, 0, 1).unwrap_err().to_string();
    assert!(e.contains("missing.bin"), "{e}");
    println!("mpiio rank {rank} of {size} ok");
}

/// A dataset under mpirun: every rank reads its own rows (greedy LPT partition of the kernel
/// rows, damping blocks by rank) instead of receiving them from rank 0. The solution does not
/// depend on the partition: 1-4 ranks agree with the single-process run to 1e-10.
#[test]
fn dataset_read_per_rank_on_1_to_4_ranks_matches_serial() {
    let Some(dir) = mpi_dir("mpi-dataset") else {
        return;
    };
    let ds = data("demo/dataset.toml");
    let cfg = |tag: &str| {
        let p = dir.join(format!("{tag}.toml"));
        let text = format!(
            "[dataset]\npath = {:?}\n[solver]\natol = 1e-12\nbtol = 1e-12\n[backend]\nkind = \"cpu\"\n\
             [output]\ndir = {:?}\n",
            ds.display().to_string(),
            dir.join(tag).display().to_string()
        );
        std::fs::write(&p, text).unwrap();
        p
    };
    let serial_cfg = cfg("serial");
    let out = finish({
        let mut c = Command::new(BIN);
        c.arg("invert").arg(&serial_cfg);
        c
    });
    assert!(out.status.success(), "{}", stderr(&out));
    let xs = read_vec(&dir.join("serial/solution.txt"));
    let its = report(&dir.join("serial/report.json"))["iterations"]
        .as_u64()
        .unwrap();
    for np in 1..=4usize {
        let tag = format!("np{np}");
        let c_path = cfg(&tag);
        let mut c = mpirun();
        c.args(["-np", &np.to_string(), BIN, "invert"]).arg(&c_path);
        let out = finish(c);
        assert!(out.status.success(), "{tag}: {}", stderr(&out));
        let x = read_vec(&dir.join(&tag).join("solution.txt"));
        let d = rel_diff(&x, &xs);
        assert!(d <= 1e-10, "{tag}: solution differs from serial by {d:e}");
        let rep = report(&dir.join(&tag).join("report.json"));
        let k = rep["iterations"].as_u64().unwrap();
        assert!(
            k.abs_diff(its) <= iteration_band(its),
            "{tag}: {k} vs {its} iterations"
        );
        if np > 1 {
            let t = rep["rank_timing"].as_array().unwrap();
            assert_eq!(t.len(), np);
            // balanced by the load plan's cost (partition::RowCost), not by nonzeros
            let cost: Vec<f64> = t.iter().map(|r| r["cost"].as_f64().unwrap()).collect();
            let mean = cost.iter().sum::<f64>() / np as f64;
            let max = cost.iter().cloned().fold(0.0, f64::max);
            assert!(max / mean <= 1.01, "{tag}: imbalance {}", max / mean);
        }
    }
}

/// `seistomo solve --method gmres OPTS` on convdiff24 on `np` ranks (None: no mpirun), outputs
/// in `dir/tag.*`; returns the solution and the report.
fn gmres_run(
    dir: &Path,
    np: Option<usize>,
    tag: &str,
    opts: &[&str],
) -> (Vec<f64>, serde_json::Value) {
    let m = data("square_gen/convdiff24.mtx.gz");
    let (x, r) = (
        dir.join(format!("{tag}.x")),
        dir.join(format!("{tag}.json")),
    );
    let mut c = launch(np);
    c.args(["solve", "--method", "gmres"])
        .args(opts)
        .arg("--matrix")
        .arg(&m)
        .arg("--solution")
        .arg(&x)
        .arg("--report")
        .arg(&r);
    let out = finish(c);
    assert!(out.status.success(), "{tag}: {}", stderr(&out));
    (read_vec(&x), report(&r))
}

/// GMRES on a generated convection-diffusion system across ranks (rows split by nonzeros, halo
/// exchange by all-to-all): the same iterations and the same solution as one process.
#[test]
fn gmres_on_1_to_4_ranks_matches_serial() {
    gmres_ranks_match_serial("cgs2", 1);
}

/// The same for DCGS2 (one reduction per inner step): the same iterations on every rank count.
#[test]
fn gmres_dcgs2_on_1_to_4_ranks_matches_serial() {
    gmres_ranks_match_serial("dcgs2", 0);
}

fn gmres_ranks_match_serial(orthog: &str, its_band: u64) {
    let Some(dir) = mpi_dir(&format!("mpi-gmres-{orthog}")) else {
        return;
    };
    let run = |np: Option<usize>, tag: &str| gmres_run(&dir, np, tag, &["--orthog", orthog]);
    let (xs, rs) = run(None, "serial");
    assert_eq!(rs["converged"], true);
    for np in 1..=4 {
        let (x, r) = run(Some(np), &format!("np{np}"));
        assert_eq!(r["ranks"], np);
        assert_eq!(r["converged"], true);
        let (a, b) = (
            r["iterations"].as_u64().unwrap(),
            rs["iterations"].as_u64().unwrap(),
        );
        assert!(a.abs_diff(b) <= its_band, "np {np}: {a} vs {b} iterations");
        let d = rel_diff(&x, &xs);
        assert!(d <= 1e-10, "np {np}: {d:e}");
    }
}

/// `--partition metis` under mpirun: rank 0 partitions with METIS, every rank solves its block
/// of the reordered system, x comes back in the original order. The same iterations (within
/// one, as for the default partition) and the same solution as one process; the halo in the
/// report is what each partition exchanges, and METIS receives fewer values than contiguous
/// rows on 4 ranks.
#[test]
fn gmres_metis_on_1_to_4_ranks_matches_serial() {
    let Some(dir) = mpi_dir("mpi-gmres-metis") else {
        return;
    };
    let run = |np: Option<usize>, partition: &str, tag: &str| {
        gmres_run(
            &dir,
            np,
            tag,
            &["--orthog", "cgs2", "--partition", partition],
        )
    };
    let (xs, rs) = run(None, "metis", "serial");
    assert_eq!(rs["converged"], true);
    let serial_its = rs["iterations"].as_u64().unwrap();
    for np in 1..=4 {
        let (x, r) = run(Some(np), "metis", &format!("metis{np}"));
        assert_eq!(r["ranks"], np);
        assert_eq!(r["partition"], "metis");
        assert_eq!(r["converged"], true);
        let its = r["iterations"].as_u64().unwrap();
        assert!(
            its.abs_diff(serial_its) <= 1,
            "np {np}: {its} vs {serial_its} iterations"
        );
        let d = rel_diff(&x, &xs);
        assert!(d <= 1e-10, "np {np}: {d:e}");
        if np == 1 {
            assert_eq!(x, xs, "one rank is the serial solve");
        }
        assert_eq!(r["halo"]["parts"], np);
        if np == 4 {
            let (_, rc) = run(Some(4), "contiguous", "contiguous4");
            let (vm, vc) = (
                r["halo"]["total_values"].as_u64().unwrap(),
                rc["halo"]["total_values"].as_u64().unwrap(),
            );
            // a 24^3 grid in 4 slabs: 6 planes of 576 values
            assert_eq!(vc, 6 * 576);
            assert!(vm < vc, "metis {vm} vs contiguous {vc} values per product");
        }
    }
}
