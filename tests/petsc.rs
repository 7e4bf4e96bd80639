//! PETSc reads the system seistomo exports (binary Mat/Vec, MatLoad/VecLoad) and its KSPLSQR
//! reaches the same ||r|| as seistomo on australia. Needs Debian's python3-petsc4py (installed
//! by scripts/bootstrap.sh); skips with a message where it is missing.

use std::path::PathBuf;
use std::process::Command;

use seistomo::backend::cpu::{CpuBackend, CpuCsrOperator};
use seistomo::backend::TransposeStrategy;
use seistomo::comm::SerialComm;
use seistomo::io::mtx::load_system as load_mtx_system;
use seistomo::io::petsc;
use seistomo::solver::{lsqr, LsqrParams, NoMonitor};

#[test]
fn petsc_loads_export_and_reaches_same_residual() {
    let python = PathBuf::from("/usr/bin/python3");
    let have = Command::new(&python)
        .args(["-c", "import petsc4py"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have {
        eprintln!(
            "skipped: petsc4py is not importable by /usr/bin/python3 (run scripts/bootstrap.sh)"
        );
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let d = root.join("datasets/australia");
    let sys = load_mtx_system(
        &d.join("G.mtx.gz"),
        Some(&d.join("d.txt")),
        Some(&d.join("R.mtx.gz")),
        0.015,
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("seistomo-petsc-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The CLI exports the exact system of the config ([G; 0.015 R], [d; 0]).
    let out = Command::new(env!("CARGO_BIN_EXE_seistomo"))
        .args(["export", "--format", "petsc"])
        .arg(root.join("configs/australia.toml"))
        .arg("-o")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(petsc::read_mat(&dir.join("A.petsc")).unwrap(), sys.a);
    let tol = 1e-10;
    let out = Command::new(&python)
        .arg(root.join("bench/peers/petsc_load_lsqr.py"))
        .arg(&dir)
        .arg(tol.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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
    let sol = lsqr(
        &CpuBackend::new(),
        &op,
        &SerialComm,
        &sys.b,
        None,
        &params,
        &mut NoMonitor,
    )
    .unwrap();
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
    let python = PathBuf::from("/usr/bin/python3");
    let have = Command::new(&python)
        .args(["-c", "import scipy, petsc4py"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have {
        eprintln!(
            "skipped: SciPy/petsc4py not importable by /usr/bin/python3 (run scripts/bootstrap.sh)"
        );
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(env!("CARGO_BIN_EXE_seistomo"))
        .arg("compare")
        .arg(root.join("configs/australia.toml"))
        .args(["--backend", "cpu"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
