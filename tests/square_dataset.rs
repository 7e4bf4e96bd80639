//! `seistomo square` writes a binary dataset (`-o DIR`, or `--format dataset`) that
//! `solve --method gmres --matrix DIR` reads: the same system, solution and iterations as through
//! the Matrix Market file; and the Matrix Market reader's refusals on the command line (a
//! device, a FIFO, an empty system) in one line, at once.

mod common;

use common::{run_ok, run_seistomo, scratch, seistomo, stderr};
use seistomo::io::mtx;
use seistomo::testproblems::square::{cube, SquareKind};

#[test]
fn a_square_dataset_solves_as_its_matrix_market_file() {
    let d = scratch("square-dataset");
    std::fs::create_dir_all(&d).unwrap();
    let (ds, m) = (d.join("cd"), d.join("cd.mtx.gz"));
    for out in [&ds, &m] {
        run_ok(
            seistomo()
                .args(["square", "--kind", "convdiff", "--n", "10", "-o"])
                .arg(out),
        );
    }
    assert!(ds.join("dataset.toml").is_file());
    let want = cube(SquareKind::Convdiff, 10).unwrap();
    assert_eq!(mtx::read_matrix(&m).unwrap(), want);
    let sys = seistomo::io::dataset::load_dataset(&ds, 0, 1).unwrap();
    assert_eq!(sys.a, want);
    assert_eq!(sys.b, vec![1.0; want.nrows()]);
    // --format overrides the name
    let forced = d.join("forced.mtx");
    run_ok(
        seistomo()
            .args(["square", "--n", "3", "--format", "dataset", "-o"])
            .arg(&forced),
    );
    assert!(forced.join("dataset.toml").is_file());
    let x = |input: &std::path::Path, tag: &str| {
        let (sol, rep) = (
            d.join(format!("x-{tag}.txt")),
            d.join(format!("r-{tag}.json")),
        );
        run_ok(
            seistomo()
                .args(["solve", "--method", "gmres", "--backend", "cpu", "--matrix"])
                .arg(input)
                .arg("--solution")
                .arg(&sol)
                .arg("--report")
                .arg(&rep),
        );
        let r = common::read_json(&rep);
        (
            std::fs::read(&sol).unwrap(),
            r["iterations"].as_u64().unwrap(),
        )
    };
    let from_mtx = x(&m, "mtx");
    assert_eq!(x(&ds, "dir"), from_mtx);
    assert_eq!(x(&ds.join("dataset.toml"), "toml"), from_mtx);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn solve_refuses_devices_and_empty_systems_in_one_line() {
    let d = scratch("square-refusals");
    std::fs::create_dir_all(&d).unwrap();
    for dev in ["/dev/zero", "/dev/urandom"] {
        if !std::path::Path::new(dev).exists() {
            continue;
        }
        for method in ["lsqr", "gmres"] {
            let t = std::time::Instant::now();
            let o = run_seistomo(&["solve", "--method", method, "--matrix", dev]);
            let e = stderr(&o);
            assert!(!o.status.success());
            assert!(e.contains(dev) && e.trim().lines().count() == 1, "{e}");
            assert!(t.elapsed().as_secs_f64() < 1.0, "{dev}: {:?}", t.elapsed());
        }
    }
    for (name, size) in [
        ("e00.mtx", "0 0 0"),
        ("e30.mtx", "3 0 0"),
        ("e03.mtx", "0 3 0"),
    ] {
        let p = d.join(name);
        std::fs::write(
            &p,
            format!("%%MatrixMarket matrix coordinate real general\n{size}\n"),
        )
        .unwrap();
        for method in ["lsqr", "gmres"] {
            let o = run_seistomo(&["solve", "--method", method, "--matrix", p.to_str().unwrap()]);
            let e = stderr(&o);
            assert!(!o.status.success(), "{name} {method}");
            assert!(e.contains("at least one row and one column"), "{e}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}
