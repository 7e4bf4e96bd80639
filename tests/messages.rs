//! What the terminal says matches what the README says (issue 36): `--backend auto` without a
//! usable GPU says in one line why it ran on the CPU (not with --quiet, not when the CPU was
//! asked for; a failed run's error stays its only line), `--backend cuda` there is an error;
//! `square` says what it is writing before the long write; one thread is "1 thread".

mod common;

use common::{root, scratch, seistomo, stderr};
use std::process::Output;

const FALLBACK: &str = "auto: no usable CUDA GPU (";

fn well1033(extra: &[&str]) -> Output {
    let m = root().join("datasets/lsq/well1033.mtx.gz");
    seistomo()
        .args(["solve", "--matrix", m.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

fn gpu_here() -> bool {
    seistomo::pipeline::operators::gpu_here().is_ok()
}

#[test]
fn auto_says_why_it_ran_on_the_cpu() {
    let o = well1033(&[]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    if gpu_here() {
        assert!(!err.contains(FALLBACK), "a GPU is here:\n{err}");
        return;
    }
    let lines: Vec<&str> = err.lines().collect();
    let why = lines.iter().position(|l| l.starts_with(FALLBACK));
    let summary = lines.iter().position(|l| l.starts_with("lsqr on cpu"));
    assert!(
        matches!((why, summary), (Some(w), Some(s)) if w < s),
        "no fallback line before the summary:\n{err}"
    );
    assert!(lines[why.unwrap()].ends_with("using the CPU"), "{err}");
    // GMRES too.
    let a = root().join("datasets/square_gen/convdiff16.mtx.gz");
    let o = seistomo()
        .args([
            "solve",
            "--method",
            "gmres",
            "--matrix",
            a.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches(FALLBACK).count(), 1, "{err}");
    // Not when quiet, not when the CPU was asked for.
    for extra in [&["-q"][..], &["--backend", "cpu"]] {
        let o = well1033(extra);
        assert!(o.status.success());
        assert!(!stderr(&o).contains(FALLBACK), "{extra:?}: {}", stderr(&o));
    }
}

#[test]
fn without_a_gpu_backend_cuda_is_one_error_line_and_a_failed_auto_run_one_line() {
    if gpu_here() {
        eprintln!("a GPU is here: --backend cuda runs (tests/gpu*.rs)");
        return;
    }
    let o = well1033(&["--backend", "cuda"]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("no usable CUDA GPU") && err.contains("--backend cpu"),
        "{err}"
    );
    // A run that fails after choosing the CPU prints its error alone.
    let d = scratch("msg-fail");
    let bad = d.join("bad.mtx");
    std::fs::write(
        &bad,
        "%%MatrixMarket matrix coordinate real general\n2 2 1\n3 1 1\n",
    )
    .unwrap();
    let o = seistomo()
        .args(["solve", "--matrix", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn one_thread_is_one_thread() {
    let o = well1033(&["--threads", "1"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("lsqr on cpu (cpu (rayon, 1 thread))"), "{err}");
    assert!(!err.contains("1 threads"), "{err}");
}

#[test]
fn square_says_what_it_writes_before_writing() {
    let d = scratch("msg-square");
    let out = d.join("A.mtx.gz");
    let o = seistomo()
        .args(["square", "--kind", "convdiff", "--n", "12", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("square: 12x12x12 convdiff: 1728 rows, ")
            && lines[0].ends_with(&format!("writing {}", out.display())),
        "{err}"
    );
    assert!(lines[1].starts_with("wrote "), "{err}");
    // --quiet: the summary alone.
    let o = seistomo()
        .args(["-q", "square", "--n", "6", "-o"])
        .arg(d.join("B.mtx"))
        .output()
        .unwrap();
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}
