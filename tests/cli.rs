//! The command line end to end: configs in configs/ run, bad input fails with one clear line
//! naming the file (and line), a non-zero exit, and no output left behind.

mod common;

use common::{read_json, root, run_ok, scratch, seistomo as bin, stderr, LSQR_SUMMARY};

use std::path::Path;

/// `solve --matrix M [--rhs B] --solution X`.
fn solve_args<'a>(m: &'a Path, rhs: Option<&'a Path>, x: &'a Path) -> Vec<&'a str> {
    let mut a = vec!["solve", "--matrix", m.to_str().unwrap()];
    if let Some(b) = rhs {
        a.extend(["--rhs", b.to_str().unwrap()]);
    }
    a.extend(["--solution", x.to_str().unwrap()]);
    a
}

/// Run and expect failure: exactly one stderr line, containing every `want`; nothing in `dir`
/// but the inputs.
fn fails(args: &[&str], wants: &[&str], dir: &Path, inputs: usize) {
    let out = common::run_seistomo(args);
    let err = stderr(&out);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: not one line:\n{err}"
    );
    for w in wants {
        assert!(err.contains(w), "{args:?}: '{w}' not in: {err}");
    }
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), inputs, "{args:?}: files left behind: {left:?}");
}

#[test]
fn version_and_help() {
    let out = bin().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("seistomo "));
}

#[test]
fn solve_writes_solution_report_history() {
    let d = scratch("solve");
    let l = root().join("datasets/lsq");
    let (x, r, h) = (d.join("x.txt"), d.join("report.json"), d.join("h.csv"));
    let mut c = bin();
    c.args(["solve", "--method", "lsqr", "--matrix"])
        .arg(l.join("well1850.mtx.gz"))
        .arg("--rhs")
        .arg(l.join("well1850_rhs1.mtx.gz"))
        .args([
            "--atol",
            "1e-10",
            "--btol",
            "1e-10",
            "--conlim",
            "1e14",
            "--backend",
            "cpu",
            "--solution",
        ])
        .arg(&x)
        .arg("--report")
        .arg(&r)
        .arg("--history")
        .arg(&h);
    run_ok(&mut c);
    let rep = read_json(&r);
    let keys = ["method", "backend", "ranks", "m", "n", "nnz"];
    for k in keys.into_iter().chain(LSQR_SUMMARY).chain(["ms_per_iter"]) {
        assert!(rep.get(k).is_some(), "report lacks {k}");
    }
    for k in ["load", "setup", "solve", "elapsed"] {
        assert!(rep["seconds"].get(k).is_some(), "seconds lack {k}");
    }
    // the process's time to report.json holds the solve's phases
    let secs = |k: &str| rep["seconds"][k].as_f64().unwrap();
    assert!(secs("elapsed") >= secs("total"), "{}", rep["seconds"]);
    assert_eq!(rep["m"], 1850);
    assert_eq!(rep["istop"], 2);
    let xs: Vec<f64> = std::fs::read_to_string(&x)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(xs.len(), 712);
    let xn = xs.iter().map(|v| v * v).sum::<f64>().sqrt();
    assert!((xn - 16184.10251).abs() < 1e-4, "{xn}");
    let hist = std::fs::read_to_string(&h).unwrap();
    assert!(hist.starts_with("itn,r1norm"));
    assert_eq!(
        hist.lines().count(),
        rep["iterations"].as_u64().unwrap() as usize + 2
    );
}

#[test]
fn default_rhs_is_a_times_ones() {
    // Without --rhs, b = A 1, so the solution is all ones (a consistent system).
    let d = scratch("ones");
    let x = d.join("x.txt");
    let out = bin()
        .args(["solve", "--matrix"])
        .arg(root().join("datasets/lsq/well1033.mtx.gz"))
        .args(["--atol", "1e-12", "--btol", "1e-12", "--solution"])
        .arg(&x)
        .output()
        .unwrap();
    assert!(out.status.success());
    for l in std::fs::read_to_string(&x).unwrap().lines() {
        let v: f64 = l.parse().unwrap();
        assert!((v - 1.0).abs() < 1e-8, "{v}");
    }
}

#[test]
fn every_config_in_configs_runs() {
    let mut n = 0;
    for e in std::fs::read_dir(root().join("configs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        // Redirect the outputs to a scratch directory; everything else as written.
        let d = scratch(&format!("cfg-{}", p.file_stem().unwrap().to_string_lossy()));
        let text = text
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("dir =") {
                    format!("dir = {:?}", d.display().to_string())
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let cfg = root().join("configs").join(format!(
            ".test-{}",
            p.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(&cfg, text).unwrap();
        let out = bin().arg("invert").arg(&cfg).output().unwrap();
        std::fs::remove_file(&cfg).unwrap();
        assert!(out.status.success(), "{}: {}", p.display(), stderr(&out));
        let rep = read_json(&d.join("report.json"));
        assert!(
            matches!(rep["istop"].as_u64(), Some(1..=2)),
            "{}: istop {}",
            p.display(),
            rep["istop"]
        );
        assert!(d.join("solution.txt").exists());
        n += 1;
    }
    assert!(n >= 2);
}

#[test]
fn bad_matrix_files_fail_cleanly() {
    let d = scratch("badmtx");
    let good_rhs = d.join("b.txt");
    std::fs::write(&good_rhs, "1\n2\n").unwrap();
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "trunc.mtx",
            "%%MatrixMarket matrix coordinate real general\n2 2 3\n1 1 1\n2 2 1\n",
            &["trunc.mtx:", "truncated"],
        ),
        (
            "header.mtx",
            "%%MatrixMarket matrix coordinat real general\n2 2 1\n1 1 1\n",
            &["header.mtx:1:"],
        ),
        (
            "range.mtx",
            "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n3 2 1\n",
            &["range.mtx:4:", "out of range"],
        ),
        (
            "nan.mtx",
            "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 NaN\n2 2 1\n",
            &["nan.mtx:3:", "not finite"],
        ),
        (
            "complex.mtx",
            "%%MatrixMarket matrix coordinate complex general\n2 2 1\n1 1 1 0\n",
            &["complex.mtx:1:", "complex"],
        ),
    ];
    for (name, text, wants) in cases {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        let (out, r) = (d.join("x.txt"), d.join("r.json"));
        let mut args = solve_args(&p, Some(&good_rhs), &out);
        args.extend(["--report", r.to_str().unwrap()]);
        fails(&args, wants, &d, 2);
        std::fs::remove_file(&p).unwrap();
    }
    // Gzip truncated mid-stream.
    let gz = std::fs::read(root().join("datasets/lsq/well1033.mtx.gz")).unwrap();
    let p = d.join("cut.mtx.gz");
    std::fs::write(&p, &gz[..gz.len() / 2]).unwrap();
    let x = d.join("x.txt");
    fails(&solve_args(&p, None, &x), &["cut.mtx.gz"], &d, 2);
}

#[test]
fn rhs_length_mismatch_and_missing_files() {
    let d = scratch("badrhs");
    let rhs = d.join("short.txt");
    std::fs::write(&rhs, "1\n2\n3\n").unwrap();
    let m = root().join("datasets/lsq/well1033.mtx.gz");
    let x = d.join("x.txt");
    let wants = ["short.txt", "3 values", "1033 rows"];
    fails(&solve_args(&m, Some(&rhs), &x), &wants, &d, 1);
    let bad = d.join("bad.txt");
    std::fs::write(&bad, "1\n2\nfoo\n").unwrap();
    fails(&solve_args(&m, Some(&bad), &x), &["bad.txt:3:"], &d, 2);
    let nope = d.join("nope.mtx");
    fails(&solve_args(&nope, None, &x), &["nope.mtx"], &d, 2);
}

#[test]
fn bad_configs_fail_cleanly() {
    let d = scratch("badcfg");
    let m = root().join("datasets/lsq/well1033.mtx.gz");
    let cases: &[(&str, &[&str])] = &[
        (
            "[system]\nmatrix = \"M\"\n[solver]\ntolerance = 1e-8\n",
            &["c.toml:4:", "unknown field `tolerance`"],
        ),
        (
            "[system]\nmatrix = \"M\"\n[solver]\natol = -1e-8\n",
            &["c.toml", "[solver] atol must be"],
        ),
        (
            "[system]\nmatrix = \"M\"\n[solver]\niter_lim = \"many\"\n",
            &["c.toml:4:"],
        ),
        (
            "[system]\nmatrix = \"missing.mtx\"\n",
            &["c.toml", "[system] matrix", "missing.mtx"],
        ),
        ("[system\nmatrix = 1\n", &["c.toml:1:"]),
    ];
    for (text, wants) in cases {
        let out_dir = d.join("out");
        let text = text.replace("\"M\"", &format!("{:?}", m.display().to_string()))
            + &format!("[output]\ndir = {:?}\n", out_dir.display().to_string());
        let c = d.join("c.toml");
        std::fs::write(&c, text).unwrap();
        fails(&["invert", c.to_str().unwrap()], wants, &d, 1);
    }
}

/// GMRES's compact storage (row patterns) is the GPU's: asking for it on the CPU is one clear
/// line and no output.
#[test]
fn gmres_compact_storage_on_the_cpu_fails_cleanly() {
    let d = scratch("gmres_compact_cpu");
    let m = root().join("datasets/square_gen/convdiff16.mtx.gz");
    let x = d.join("x.txt");
    let args = [
        "solve",
        "--method",
        "gmres",
        "--matrix",
        m.to_str().unwrap(),
        "--backend",
        "cpu",
        "--storage",
        "compact",
        "--solution",
        x.to_str().unwrap(),
    ];
    fails(&args, &["--storage compact", "row patterns", "CPU"], &d, 0);
}
