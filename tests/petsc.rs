//! PETSc reads the system seistomo exports (binary Mat/Vec, MatLoad/VecLoad) and its KSPLSQR
//! reaches the same ||r|| as seistomo on australia. Needs Debian's python3-petsc4py (installed
//! by scripts/bootstrap.sh); skips with a message where it is missing.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{run_ok, seistomo};
use seistomo::backend::cpu::CpuCsrOperator;
use seistomo::backend::TransposeStrategy;
use seistomo::io::petsc;
use seistomo::solver::LsqrParams;

/// /usr/bin/python3 when it can import `modules`; None (saying that `what` is missing) when the
/// test is skipped.
fn python_with(modules: &str, what: &str) -> Option<PathBuf> {
    let python = PathBuf::from("/usr/bin/python3");
    let have = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("skipped: {what} not importable by /usr/bin/python3 (run scripts/bootstrap.sh)");
    }
    have.then_some(python)
}

#[test]
fn petsc_loads_export_and_reaches_same_residual() {
    let Some(python) = python_with("petsc4py", "petsc4py is") else {
        return;
    };
    let root = common::root();
    let sys = common::system("australia");
    let dir = std::env::temp_dir().join(format!("seistomo-petsc-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The CLI exports the exact system of the config ([G; 0.015 R], [d; 0]).
    run_ok(
        seistomo()
            .args(["export", "--format", "petsc"])
            .arg(root.join("configs/australia.toml"))
            .arg("-o")
            .arg(&dir),
    );
    assert_eq!(petsc::read_mat(&dir.join("A.petsc")).unwrap(), sys.a);
    let tol = 1e-10;
    let out = run_ok(
        Command::new(&python)
            .arg(root.join("bench/peers/petsc_load_lsqr.py"))
            .arg(&dir)
            .arg(tol.to_string()),
    );
    let j: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(j["m"], sys.a.nrows());
    assert_eq!(j["n"], sys.a.ncols());
    assert_eq!(j["nnz"], sys.a.nnz());
    assert!(
        j["reason"].as_i64().unwrap() > 0,
        "PETSc did not converge: {j}"
    );

    let params = LsqrParams {
        atol: tol,
        btol: tol,
        conlim: 1e14,
        ..Default::default()
    };
    let op = CpuCsrOperator::new(sys.a.clone(), TransposeStrategy::Csc);
    let sol = common::cpu_lsqr(&op, &sys.b, None, &params);
    let r: Vec<f64> = sys
        .a
        .matvec(&sol.x)
        .iter()
        .zip(&sys.b)
        .map(|(ax, b)| b - ax)
        .collect();
    let ours = r.iter().map(|v| v * v).sum::<f64>().sqrt();
    let theirs = j["rnorm"].as_f64().unwrap();
    let rel = (ours - theirs).abs() / theirs;
    eprintln!(
        "||r||: seistomo {ours:.15e}, PETSc {theirs:.15e} ({} its), rel diff {rel:.2e}",
        j["iterations"]
    );
    assert!(rel <= 1e-10, "||r|| differs by {rel:e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_prints_one_table_with_all_peers() {
    if python_with("scipy, petsc4py", "SciPy/petsc4py").is_none() {
        return;
    }
    let root = common::root();
    let out = run_ok(
        seistomo()
            .arg("compare")
            .arg(root.join("configs/australia.toml"))
            .args(["--backend", "cpu"]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| solver"))
        .collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert!(
        rows[0].contains("seistomo") && rows[1].contains("scipy") && rows[2].contains("petsc"),
        "{text}"
    );
    for r in &rows[1..] {
        // ||x - x_peer|| / ||x_peer|| column.
        let rel: f64 = r.split('|').nth(7).unwrap().trim().parse().unwrap();
        assert!(rel < 1e-6, "{r}");
    }
}
