//! `seistomo resolution`: the `[resolution]` tests and the data inverted as one batch, against
//! the same solves one after another and against `invert`; what the outputs hold; bad tables.

mod common;

use std::path::{Path, PathBuf};

use common::{rel, run_ok, run_seistomo, scratch, seistomo as bin, stderr};
use seistomo::model::hdf5::ModelFile;

/// A synthetic dataset `d/s` on a 16 x 16 x 8 grid (2048 cells, 3000 rays) with norm damping
/// and flattening, its data with Gaussian noise of sd `noise` (0: none).
fn synth(d: &Path, noise: &str) {
    run_ok(
        bin()
            .args(["synth", "-q", "--grid", "16,16,8", "--rays", "3000"])
            .args(["--norm-damping", "0.1", "--flattening", "0.5,0.5,0.5"])
            .args(["--noise", noise, "-o", d.join("s").to_str().unwrap()]),
    );
}

/// A noise-free [`synth`] dataset (made once per directory), and a config with `resolution`
/// as its [resolution] table.
fn setup(d: &Path, resolution: &str) -> PathBuf {
    if !d.join("s").exists() {
        synth(d, "0");
    }
    let cfg = d.join("r.toml");
    let text = format!(
        "[dataset]\npath = \"s/dataset.toml\"\n[solver]\niter_lim = 400\n[output]\ndir = \"out\"\n{resolution}"
    );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

const TABLE: &str =
    "[resolution]\ncheckerboard = [[4, 4, 2], [8, 8, 4]]\nspikes = [[8, 8, 4], [3, 12, 2]]\n";

fn csv_rows(p: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(String::from).collect())
        .collect()
}

#[test]
fn tests_and_data_in_one_batch_equal_the_separate_solves_and_invert() {
    let d = scratch("resolution");
    let cfg = setup(&d, TABLE);
    let (a, b) = (d.join("batched"), d.join("separate"));
    let out = run_ok(bin().arg("resolution").arg(&cfg).arg("-o").arg(&a));
    let err = stderr(&out);
    assert!(err.contains("spike_8_8_4: correlation"), "{err}");
    run_ok(
        bin()
            .arg("resolution")
            .arg(&cfg)
            .arg("--separate")
            .arg("-o")
            .arg(&b),
    );
    // the batch is each member's own solve, bit for bit (the CPU's batch)
    let (ra, rb) = (
        csv_rows(&a.join("resolution.csv")),
        csv_rows(&b.join("resolution.csv")),
    );
    assert_eq!(ra, rb);
    let names: Vec<&str> = ra.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "checkerboard_4x4x2",
            "checkerboard_8x8x4",
            "spike_8_8_4",
            "spike_3_12_2"
        ]
    );
    let num = |r: &Vec<String>, i: usize| r[i].parse::<f64>().unwrap();
    for r in &ra {
        // noise-free and well covered: the tests come back
        assert!(num(r, 2) > 0.9, "{r:?}: correlation");
        assert!(num(r, 3) > 0.8, "{r:?}: worst depth layer");
        if r[1] == "spike" {
            assert!((0.7..1.3).contains(&num(r, 5)), "{r:?}: peak");
            assert!(num(r, 6) >= num(r, 7) && num(r, 6) < 2.5, "{r:?}: spread");
            assert!(num(r, 8) < 0.2, "{r:?}: leakage");
        } else {
            assert!(r[5] == "NaN" && r[8] == "NaN", "{r:?}");
        }
    }
    for f in ["model.h5", "model.xdmf", "report.json"] {
        assert!(a.join(f).exists(), "{f}");
    }
    for n in &names {
        assert!(a.join(format!("resolution_{n}.png")).exists(), "{n}");
    }
    // model.h5: the data's model, and per test its true and recovered models
    let mf = ModelFile::open(&a.join("model.h5")).unwrap();
    let tests = mf.resolution_tests().unwrap();
    assert_eq!(tests.len(), 4);
    let f = hdf5::File::open(a.join("model.h5")).unwrap();
    let g = f.group("resolution/spike_8_8_4").unwrap();
    let dc: Vec<f64> = g.dataset("depth_correlation").unwrap().read_raw().unwrap();
    assert_eq!(dc.len(), 8);
    assert!(dc[4] > 0.9 && dc[0].is_nan(), "{dc:?}");
    let peak: f64 = g.attr("peak_recovery").unwrap().read_scalar().unwrap();
    assert!((peak - num(&ra[2], 5)).abs() < 1e-12);
    let truth: Vec<f64> = g.dataset("true").unwrap().read_raw().unwrap();
    assert_eq!(
        truth.iter().filter(|&&v| v != 0.0).count(),
        27,
        "a 3 x 3 x 3 spike"
    );
    // the data member is the config's inversion
    let inv = d.join("inv");
    let icfg = d.join("i.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("dir = \"out\"", &format!("dir = \"{}\"", inv.display()));
    std::fs::write(&icfg, text).unwrap();
    run_ok(bin().arg("-q").arg("invert").arg(&icfg));
    let (x, _) = mf.field("solution").unwrap();
    let want = ModelFile::open(&inv.join("model.h5"))
        .unwrap()
        .field("solution")
        .unwrap()
        .0;
    assert!(rel(&x, &want) < 1e-10, "{}", rel(&x, &want));
    // and plot draws each test from the file
    let png = d.join("p.png");
    let out = run_seistomo(&[
        "plot",
        a.join("model.h5").to_str().unwrap(),
        "--resolution",
        "-o",
        png.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(d.join("p_spike_3_12_2.png").exists());
}

#[test]
fn bad_resolution_tables_fail_with_one_line_and_write_nothing() {
    let d = scratch("resolution-bad");
    for (table, want) in [
        ("", "no [resolution] table"),
        ("[resolution]\n", "no test"),
        ("[resolution]\nspikes = [[16, 1, 1]]\n", "outside the grid"),
        (
            "[resolution]\ncheckerboard = [[0, 1, 1]]\n",
            "cells per checker",
        ),
        ("[resolution]\nspikes = [[1, 1, 1]]\nnoise = -1\n", "noise"),
        ("[resolution]\nspike = [[1, 1, 1]]\n", "unknown field"),
    ] {
        let cfg = setup(&d, table);
        let o = d.join("o");
        let out = run_seistomo(&[
            "resolution",
            cfg.to_str().unwrap(),
            "-o",
            o.to_str().unwrap(),
        ]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{table}: succeeded");
        assert_eq!(err.trim_end().lines().count(), 1, "{table}: {err}");
        assert!(err.contains(want), "{table}: '{want}' not in {err}");
        assert!(!o.join("model.h5").exists() && !o.join("resolution.csv").exists());
    }
    // a Matrix Market system without a grid
    let root = common::root();
    let cfg = d.join("au.toml");
    std::fs::write(
        &cfg,
        format!(
            "[system]\nmatrix = \"{0}/datasets/australia/G.mtx.gz\"\nrhs = \"{0}/datasets/australia/d.txt\"\n{TABLE}",
            root.display()
        ),
    )
    .unwrap();
    let out = run_seistomo(&[
        "resolution",
        cfg.to_str().unwrap(),
        "-o",
        d.join("o").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("on a grid"), "{}", stderr(&out));
}

#[test]
fn members_of_one_matrix_share_a_set_up_and_equal_their_own_solves() {
    use seistomo::pipeline::batch::Member;
    use seistomo::pipeline::config::RunConfig;
    use seistomo::pipeline::lcurve::Sweep;
    let d = scratch("resolution-shared");
    // CSR, and compact storage on the CPU (its damping rows split off as a stencil: the
    // right-hand sides follow the stored rows' order and the stencil rows' places)
    for storage in ["csr", "compact"] {
        let cfg = setup(&d, &format!("[backend]\nstorage = \"{storage}\"\n"));
        let cfg = RunConfig::load(&cfg).unwrap();
        let sweep = Sweep::from_config(&cfg).unwrap();
        let n = sweep.g.ncols();
        let data = sweep.full_rhs(&sweep.d);
        let other: Vec<Vec<f64>> = (0..2)
            .map(|j| {
                let m: Vec<f64> = (0..n).map(|c| ((c * (j + 3)) % 7) as f64 * 0.01).collect();
                sweep.full_rhs(&sweep.g.matvec(&m))
            })
            .collect();
        let rhs: Vec<&[f64]> = [&data, &other[0], &other[1]]
            .iter()
            .map(|b| b.as_slice())
            .collect();
        let members: Vec<Member> = [0.0, 0.01, 0.0]
            .iter()
            .map(|&damp| Member { weight: 1.0, damp })
            .collect();
        // the dataset's grid, as resolution and lcurve set it (cell order, stencils)
        let o = &seistomo::pipeline::options::SolveOptions {
            grid: sweep.grid.as_ref().map(|g| g.n),
            ..cfg.options.clone()
        };
        let comm = seistomo::comm::SerialComm;
        let shared = sweep
            .solve_shared(1.0, (&members, &rhs), o, &comm, false)
            .unwrap()
            .expect("the rows can be followed");
        for (j, s) in shared.iter().enumerate() {
            let one = sweep.solve_one(members[j], rhs[j], o, &comm).unwrap();
            let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&s.solution.x),
                bits(&one.solution.x),
                "{storage}: member {j}"
            );
            assert_eq!(s.report.iterations, one.report.iterations);
            assert_eq!(s.report.storage, one.report.storage, "{storage}");
            if storage == "compact" {
                assert!(s.report.storage.contains("stencil"), "{}", s.report.storage);
            }
        }
    }
}

#[test]
fn lcurve_on_a_dataset_weighs_its_damping_rows_and_writes_a_grid_model() {
    let d = scratch("lcurve-dataset");
    synth(&d, "0.02");
    let cfg = d.join("c.toml");
    std::fs::write(
        &cfg,
        "[dataset]\npath = \"s/dataset.toml\"\n[solver]\niter_lim = 500\ngcv_probes = 0\n",
    )
    .unwrap();
    let o = d.join("l");
    let out = run_ok(
        bin()
            .arg("lcurve")
            .arg(&cfg)
            .args(["--log-range", "0.01:100:13", "-o"])
            .arg(&o),
    );
    let err = stderr(&out);
    assert!(err.contains("reg_weight 1.0000e0"), "{err}");
    assert!(err.contains("corner: reg_weight"), "{err}");
    let csv = std::fs::read_to_string(o.join("lcurve.csv")).unwrap();
    assert!(csv.starts_with("reg_weight,"), "{csv}");
    // the corner's model has the dataset's grid and true model, as invert's does
    let mf = ModelFile::open(&o.join("model.h5")).unwrap();
    assert_eq!(mf.grid.as_ref().map(|g| g.n), Some([16, 16, 8]));
    assert!(mf.has_field("true_solution"));
    assert!(o.join("model.xdmf").exists());
}
