//! Checkpoint/resume through the CLI: kill -9 an inversion at a random iteration after its first
//! checkpoint, resume it, and check that the model is bit-for-bit the uninterrupted one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use seistomo::grid::Rng;
use seistomo::model::checkpoint::read_checkpoint;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("seistomo-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// australia with a tiny roughness weight and no stopping tolerances, so LSQR runs all 2500
/// iterations (several seconds).
fn config(dir: &Path, out: &Path, every: usize) -> PathBuf {
    let a = root().join("datasets/australia");
    let text = format!(
        "[system]\nmatrix = \"{g}\"\nrhs = \"{d}\"\nreg = \"{r}\"\nreg_weight = 1e-5\n\
         [solver]\natol = 0.0\nbtol = 0.0\nconlim = 0.0\niter_lim = 2500\n\
         [backend]\nkind = \"cpu\"\nthreads = 2\n\
         [output]\ndir = \"{o}\"\ncheckpoint_every = {every}\n\
         [model]\ncells = \"{c}\"\n",
        g = a.join("G.mtx.gz").display(),
        d = a.join("d.txt").display(),
        r = a.join("R.mtx.gz").display(),
        c = a.join("cells.txt").display(),
        o = out.display(),
    );
    let p = dir.join(format!("run{every}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn invert(cfg: &Path, resume: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_seistomo"));
    c.arg("invert").arg(cfg);
    if resume {
        c.arg("--resume");
    }
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn run_ok(mut c: Command) -> String {
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "seistomo failed: {err}");
    err
}

/// history.csv without the seconds column.
fn history_without_times(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(',').unwrap().0.to_string())
        .collect()
}

fn model_solution_bits(p: &Path) -> Vec<u64> {
    let f = hdf5::File::open(p).unwrap();
    let v: Vec<f64> = f.dataset("model/solution").unwrap().read_raw().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn kill_9_then_resume_reproduces_the_uninterrupted_model_bitwise() {
    let dir = tmp("kill");
    // The uninterrupted run, without checkpoints.
    let out_a = dir.join("a");
    let t = Instant::now();
    run_ok(invert(&config(&dir, &out_a, 0), false));
    let full_secs = t.elapsed().as_secs_f64();

    // The interrupted run.
    let out_b = dir.join("b");
    let cfg_b = config(&dir, &out_b, 40);
    let ck = out_b.join("checkpoint.bin");
    let mut child = invert(&cfg_b, false).stderr(Stdio::null()).spawn().unwrap();
    let t0 = Instant::now();
    while !ck.is_file() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before its first checkpoint"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no checkpoint after 120 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A random moment between the first checkpoint and (well before) the end.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut rng = Rng::new(seed);
    let wait = rng.uniform() * 0.5 * full_secs;
    std::thread::sleep(Duration::from_secs_f64(wait));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run finished before the kill (waited {wait:.2} s of a {full_secs:.2} s run)"
    );
    let child_pid = child.id();
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    // The kill may land in the middle of a checkpoint write; make sure the half-written
    // temporary file such a kill leaves is there, so its clean-up is always tested.
    std::fs::write(
        out_b.join(format!(".checkpoint.bin.tmp{child_pid}")),
        b"half",
    )
    .unwrap();
    assert!(!status.success());
    assert!(
        !out_b.join("model.h5").exists(),
        "a killed run left a model.h5"
    );
    let (state, ..) = read_checkpoint(&ck).unwrap();
    let k = state.scalars.itn;
    assert!(
        k >= 40 && k % 40 == 0 && k < 2500,
        "checkpoint at iteration {k}"
    );
    eprintln!("killed after {wait:.2} s; last checkpoint at iteration {k}");

    // Resume and compare.
    let err = run_ok(invert(&cfg_b, true));
    assert!(
        err.contains(&format!("resumed from the checkpoint at iteration {k}")),
        "{err}"
    );
    // Said before the solve's summary, not after it.
    let said = err.find("resumed from the checkpoint").unwrap();
    assert!(err.find("lsqr on ").is_some_and(|s| said < s), "{err}");
    // ms/iteration over the iterations run in this process (k+1..=2500), not all 2500.
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_b.join("report.json")).unwrap()).unwrap();
    let its = rep["iterations"].as_u64().unwrap() as f64;
    let want = 1e3 * rep["seconds"]["solve"].as_f64().unwrap() / (its - k as f64);
    let got = rep["ms_per_iter"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-9 * want,
        "ms/iter {got}, want {want}"
    );
    assert!(
        !ck.exists(),
        "the checkpoint of a finished run was not removed"
    );
    let sa = std::fs::read(out_a.join("solution.txt")).unwrap();
    let sb = std::fs::read(out_b.join("solution.txt")).unwrap();
    assert!(
        sa == sb,
        "resumed solution differs from the uninterrupted one"
    );
    assert_eq!(
        model_solution_bits(&out_a.join("model.h5")),
        model_solution_bits(&out_b.join("model.h5"))
    );
    let (ha, hb) = (
        history_without_times(&out_a.join("history.csv")),
        history_without_times(&out_b.join("history.csv")),
    );
    assert_eq!(ha.len(), 2502, "header + iterations 0..=2500");
    assert_eq!(ha, hb, "histories differ");
    // No temporary files are left behind.
    for d in [&out_a, &out_b] {
        for e in std::fs::read_dir(d).unwrap() {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                !n.starts_with('.'),
                "temporary file {n} left in {}",
                d.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resume_refuses_a_checkpoint_of_another_system() {
    let dir = tmp("other");
    let out = dir.join("o");
    let cfg = config(&dir, &out, 40);
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("checkpoint.bin"), b"SEISCKPT garbage").unwrap();
    let o = invert(&cfg, true).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("checkpoint.bin") && err.contains("checkpoint"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
