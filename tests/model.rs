//! Model files: the XDMF/HDF5 axis order, the datasets and attributes, australia's cell model,
//! PNG quicklooks and the L-curve through the CLI.

mod common;

use common::{cpu_opts, identity_system, root, scratch as tmp, LSQR_SUMMARY};
use std::path::{Path, PathBuf};

use seistomo::backend::TransposeStrategy;
use seistomo::comm::SerialComm;
use seistomo::grid::Coverage;
use seistomo::grid::Grid;
use seistomo::model::hdf5::{write_model, xdmf_path, ModelFile, ModelInputs};
use seistomo::model::report::Outcome;
use seistomo::model::spec::{ModelSpec, Parameterisation, Reference, Unknowns};
use seistomo::pipeline::solve::solve_system;
use seistomo::solver::LsqrParams;

/// Solve I x = b (with var): x = b up to rounding.
fn identity_outcome(b: &[f64]) -> (Outcome, Coverage) {
    let sys = identity_system(b);
    let cov = Coverage::from_kernel_rows(&sys.a, b.len());
    let params = LsqrParams {
        atol: 1e-12,
        btol: 1e-12,
        calc_var: true,
        ..Default::default()
    };
    let opts = cpu_opts(params, TransposeStrategy::Auto);
    (solve_system(sys, &opts, &SerialComm, 0.0, 0).unwrap(), cov)
}

fn grid() -> Grid {
    let mut g = Grid::new([4, 3, 2], [-10.0, 20.0, 0.0], [2.0, 5.0, 7.5]);
    g.axes = ["x".into(), "y".into(), "depth".into()];
    g
}

/// Solve I x = `x` on [`grid`] and write its model (slowness in s/km, with the coverage) to `p`;
/// `true_model`: `x` is also the true model of a synthetic run.
fn write_grid_model(
    p: &Path,
    x: &[f64],
    reference: Reference,
    true_model: bool,
    config_text: &str,
) -> Outcome {
    let (o, cov) = identity_outcome(x);
    let spec = ModelSpec {
        param: Parameterisation::Grid(grid()),
        unknowns: Unknowns::Slowness,
        slowness_unit: "s/km".into(),
        reference,
        true_model: true_model.then(|| x.to_vec()),
    };
    let inputs = ModelInputs {
        spec: &spec,
        outcome: &o,
        coverage: Some(&cov),
        kernel_rows: x.len(),
        config_text,
        resolution: &[],
    };
    write_model(p, &inputs).unwrap();
    o
}

fn encode(i: usize, j: usize, k: usize) -> f64 {
    1.0 + i as f64 + 10.0 * j as f64 + 100.0 * k as f64
}

fn attr_between<'a>(text: &'a str, before: &str, after: &str) -> &'a str {
    let s = text
        .find(before)
        .unwrap_or_else(|| panic!("no {before} in\n{text}"))
        + before.len();
    let e = text[s..].find(after).unwrap() + s;
    &text[s..e]
}

#[test]
fn xdmf_dimensions_and_hdf5_layout_agree_on_axis_order() {
    let g = grid();
    let [nx, ny, nz] = g.n;
    let mut x = vec![0.0; g.ncells()];
    for k in 0..nz {
        for j in 0..ny {
            for i in 0..nx {
                x[g.index(i, j, k)] = encode(i, j, k);
            }
        }
    }
    let dir = tmp("axes");
    let p = dir.join("model.h5");
    write_grid_model(&p, &x, Reference::Constant(1.0), true, "# test");

    // HDF5: shape [nz][ny][nx]; element [k][j][i] encodes (i, j, k).
    let f = hdf5::File::open(&p).unwrap();
    let ds = f.dataset("model/true_solution").unwrap();
    assert_eq!(ds.shape(), vec![nz, ny, nx]);
    let flat: Vec<f64> = ds.read_raw().unwrap();
    for k in 0..nz {
        for j in 0..ny {
            for i in 0..nx {
                assert_eq!(
                    flat[(k * ny + j) * nx + i],
                    encode(i, j, k),
                    "({i},{j},{k})"
                );
            }
        }
    }
    let sol: Vec<f64> = f.dataset("model/solution").unwrap().read_raw().unwrap();
    for (a, b) in sol.iter().zip(&flat) {
        assert!((a - b).abs() < 1e-9 * b.abs(), "{a} vs {b}");
    }

    // XDMF: point dims nz+1 ny+1 nx+1, cell data dims nz ny nx = the HDF5 shape, origin and
    // spacing slowest axis first (z y x).
    let xdmf = std::fs::read_to_string(xdmf_path(&p)).unwrap();
    let topo = attr_between(&xdmf, "TopologyType=\"3DCoRectMesh\" Dimensions=\"", "\"");
    assert_eq!(topo, format!("{} {} {}", nz + 1, ny + 1, nx + 1));
    let floats = |name: &str| -> Vec<f64> {
        attr_between(&xdmf, &format!("Name=\"{name}\""), "</DataItem>")
            .rsplit('>')
            .next()
            .unwrap()
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect()
    };
    assert_eq!(
        floats("Origin"),
        vec![g.origin[2], g.origin[1], g.origin[0]]
    );
    assert_eq!(
        floats("Spacing"),
        vec![g.spacing[2], g.spacing[1], g.spacing[0]]
    );
    // Every attribute's DataItem names an existing dataset with the same dims.
    let mut count = 0;
    for part in xdmf.split("<Attribute ").skip(1) {
        let dims = attr_between(part, "<DataItem Dimensions=\"", "\"");
        let reference = attr_between(part, "Format=\"HDF\">", "</DataItem>");
        let (file, path) = reference.split_once(':').unwrap();
        assert_eq!(file, "model.h5");
        let shape = f.dataset(path).unwrap().shape();
        let want: Vec<usize> = dims
            .split_whitespace()
            .map(|d| d.parse().unwrap())
            .collect();
        assert_eq!(shape, want, "{path}");
        count += 1;
    }
    assert!(count >= 8, "only {count} XDMF attributes");
    assert!(xdmf.contains("model/true_velocity") && xdmf.contains("model/hit_count"));
}

#[test]
fn model_file_holds_diagnostics_history_config_and_coverage() {
    let g = grid();
    let x: Vec<f64> = (0..g.ncells()).map(|i| 0.2 + 0.001 * i as f64).collect();
    let dir = tmp("diag");
    let p = dir.join("sub/model.h5");
    let o = write_grid_model(
        &p,
        &x,
        Reference::Profile(vec![(0.0, 4.0), (15.0, 5.0)]),
        false,
        "[solver]\natol = 1e-12\n",
    );
    let f = hdf5::File::open(&p).unwrap();
    for ds in [
        "model/velocity",
        "model/slowness",
        "model/reference_velocity",
        "model/perturbation",
        "model/slowness_perturbation",
        "model/hit_count",
        "model/dws",
        "model/variance_lower_bound",
        "model/std_error_lower_bound",
        "history/r1norm",
        "history/arnorm",
        "history/xnorm",
        "history/seconds",
        "run/config_toml",
        "run/report_json",
    ] {
        assert!(f.dataset(ds).is_ok(), "missing {ds}");
    }
    assert!(
        f.dataset("model/true_velocity").is_err(),
        "not a synthetic run"
    );
    let hits: Vec<u32> = f.dataset("model/hit_count").unwrap().read_raw().unwrap();
    assert!(hits.iter().all(|&h| h == 1));
    let se = f.dataset("model/std_error_lower_bound").unwrap();
    let d: String = se
        .attr("description")
        .unwrap()
        .read_scalar::<hdf5::types::VarLenUnicode>()
        .unwrap()
        .as_str()
        .to_string();
    assert!(d.contains("LOWER BOUND"), "{d}");
    let ref_v: Vec<f64> = f
        .dataset("model/reference_velocity")
        .unwrap()
        .read_raw()
        .unwrap();
    // Layer centres at depth 3.75 and 11.25 on the profile 4 -> 5 km/s over 0..15 km.
    assert!((ref_v[0] - 4.25).abs() < 1e-12 && (ref_v[ref_v.len() - 1] - 4.75).abs() < 1e-12);
    let v: Vec<f64> = f.dataset("model/velocity").unwrap().read_raw().unwrap();
    let pert: Vec<f64> = f.dataset("model/perturbation").unwrap().read_raw().unwrap();
    for i in 0..v.len() {
        assert!((v[i] - 1.0 / x[i]).abs() < 1e-9);
        assert!((pert[i] - 100.0 * (v[i] / ref_v[i] - 1.0)).abs() < 1e-9);
    }
    let mf = ModelFile::open(&p).unwrap();
    assert_eq!(mf.grid.as_ref().unwrap(), &g);
    assert_eq!(mf.history.len(), o.report.iterations + 1);
    assert_eq!(mf.history[0].itn, 0);
    assert_eq!(mf.istop, u64::from(o.report.istop));
    let solver = f.group("solver").unwrap();
    let names = solver.attr_names().unwrap();
    for k in LSQR_SUMMARY.into_iter().chain(["version", "seconds_solve"]) {
        assert!(names.iter().any(|n| n == k), "no /solver@{k} in {names:?}");
    }
    let cfg: hdf5::types::VarLenUnicode =
        f.dataset("run/config_toml").unwrap().read_scalar().unwrap();
    assert!(cfg.as_str().contains("atol = 1e-12"));
    // Nothing but the model, its sidecar and the output manifest in the directory.
    assert_eq!(
        common::names_in(p.parent().unwrap()),
        vec!["model.h5", "model.xdmf", "seistomo-outputs.json"]
    );
}

fn seistomo(args: &[&str]) -> (bool, String) {
    let o = common::run_seistomo(args);
    (o.status.success(), common::stderr(&o))
}

/// `seistomo plot MODEL ARGS -o PNG`.
fn plot(model: &Path, args: &[&str], png: &Path) -> (bool, String) {
    let mut a = vec!["plot", model.to_str().unwrap()];
    a.extend(args);
    a.extend(["-o", png.to_str().unwrap()]);
    seistomo(&a)
}

fn is_png(p: &Path) -> bool {
    std::fs::read(p)
        .map(|b| b.len() > 2000 && b.starts_with(b"\x89PNG\r\n\x1a\n"))
        .unwrap_or(false)
}

fn australia_config(dir: &Path, extra: &str) -> PathBuf {
    let a = root().join("datasets/australia");
    let text = format!(
        "[system]\nmatrix = \"{g}\"\nrhs = \"{d}\"\nreg = \"{r}\"\nreg_weight = 0.015\n\
         [solver]\natol = 1e-6\nbtol = 1e-6\n[backend]\nkind = \"cpu\"\n\
         [output]\ndir = \"{o}\"\n\
         [model]\nslowness_unit = \"s/m\"\ncells = \"{c}\"\n{extra}",
        g = a.join("G.mtx.gz").display(),
        d = a.join("d.txt").display(),
        r = a.join("R.mtx.gz").display(),
        c = a.join("cells.txt").display(),
        o = dir.join("out").display(),
    );
    let p = dir.join("australia.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn australia_invert_writes_a_cell_model_and_plots() {
    let dir = tmp("australia");
    let cfg = australia_config(&dir, "");
    let (ok, err) = seistomo(&["invert", cfg.to_str().unwrap()]);
    assert!(ok, "{err}");
    let out = dir.join("out");
    let p = out.join("model.h5");
    assert!(out.join("report.json").is_file() && !xdmf_path(&p).exists());
    let mf = ModelFile::open(&p).unwrap();
    assert_eq!(mf.parameterisation, "cells");
    assert_eq!(mf.cells.len(), 11916);
    assert_eq!(
        mf.cell_columns,
        vec!["lat_min", "lat_max", "lon_min", "lon_max"]
    );
    assert_eq!(mf.cells[0], vec![-8.4, -8.1, 141.8, 142.1]);
    assert_eq!(mf.velocity_unit, "m/s");
    let (v, shape) = mf.field("velocity").unwrap();
    assert_eq!(shape, vec![11916]);
    let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    let mean = finite.iter().sum::<f64>() / finite.len() as f64;
    assert!((2500.0..4500.0).contains(&mean), "mean velocity {mean} m/s");
    let (hits, _) = mf.field("hit_count").unwrap();
    assert!(
        hits.iter().sum::<f64>() > 15661.0,
        "every ray hits at least one cell"
    );
    // The solution in the model file is the one in solution.txt.
    let (x, _) = mf.field("solution").unwrap();
    let txt: Vec<f64> = std::fs::read_to_string(out.join("solution.txt"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(x, txt);

    let map = dir.join("map.png");
    let (ok, err) = plot(&p, &["--field", "velocity"], &map);
    assert!(ok && is_png(&map), "{err}");
    let conv = dir.join("conv.png");
    let (ok, err) = plot(&p, &["--convergence"], &conv);
    assert!(ok && is_png(&conv), "{err}");
    let (ok, err) = plot(&p, &["--section", "x=140"], &map);
    assert!(!ok && err.contains("no vertical sections"), "{err}");
    let (ok, err) = plot(&p, &["--compare-true"], &map);
    assert!(!ok && err.contains("not a synthetic run"), "{err}");
}

#[test]
fn grid_slices_sections_and_bad_depths() {
    let g = grid();
    let x: Vec<f64> = (0..g.ncells())
        .map(|i| {
            let [a, b, c] = g.ijk(i);
            0.25 * (1.0 + 0.05 * if (a + b + c) % 2 == 0 { 1.0 } else { -1.0 })
        })
        .collect();
    let dir = tmp("grid");
    let p = dir.join("model.h5");
    write_grid_model(&p, &x, Reference::Constant(4.0), true, "");
    for (args, name) in [
        (vec!["--depth", "10"], "slice.png"),
        (vec!["--depth", "3", "--compare-true"], "compare.png"),
        (vec!["--section", "y=27"], "section.png"),
        (
            vec!["--section", "x=-9", "--field", "velocity"],
            "section_v.png",
        ),
        (vec!["--convergence"], "conv.png"),
    ] {
        let out = dir.join(name);
        let (ok, err) = plot(&p, &args, &out);
        assert!(ok && is_png(&out), "{args:?}: {err}");
    }
    let (ok, err) = plot(&p, &["--depth", "16"], &dir.join("x.png"));
    assert!(
        !ok && err.contains("depth = 16 is outside the grid"),
        "{err}"
    );
    let (ok, err) = plot(&p, &[], &dir.join("x.png"));
    assert!(!ok && err.contains("--depth"), "{err}");
    assert!(!dir.join("x.png").exists());
}

/// The `n` rows of an lcurve.csv, checked to trade residual (column 1, growing) for model norm
/// (column 2, falling) from one row to the next.
fn lcurve_rows(csv: &str, n: usize) -> Vec<Vec<f64>> {
    let rows: Vec<Vec<f64>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), n);
    for w in rows.windows(2) {
        assert!(
            w[1][1] >= w[0][1] * 0.999 && w[1][2] <= w[0][2] * 1.001,
            "{csv}"
        );
    }
    rows
}

#[test]
fn lcurve_on_australia_finds_a_corner() {
    let dir = tmp("lcurve");
    let cfg = australia_config(&dir, "");
    let out = dir.join("lc");
    let (ok, err) = seistomo(&[
        "lcurve",
        cfg.to_str().unwrap(),
        "--log-range",
        "1e-4:1:5",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let csv = std::fs::read_to_string(out.join("lcurve.csv")).unwrap();
    assert!(csv.starts_with("reg_weight,residual_norm,model_norm"));
    // Residual grows and roughness falls with the weight.
    let rows = lcurve_rows(&csv, 5);
    let corners: Vec<usize> = (0..5).filter(|&i| rows[i][6] == 1.0).collect();
    assert_eq!(corners.len(), 1, "{csv}");
    let c = corners[0];
    assert!(c > 0 && c < 4 && rows[c][3] > 0.0, "{csv}");
    assert!(is_png(&out.join("lcurve.png")));
    assert!(out.join("model.h5").is_file() && out.join("report.json").is_file());
    // every rule's choice in report.json (no noise level: no discrepancy weight); GCV's
    // columns in the CSV
    assert!(csv
        .lines()
        .next()
        .unwrap()
        .ends_with(",trace,gcv,gcv_min,misfit_over_noise"));
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let ch = &rep["weight_choice"];
    assert_eq!(ch["corner"].as_f64(), Some(rows[c][0]), "{ch}");
    let g = ch["gcv"].as_f64().unwrap();
    assert!((1e-4..=1.0).contains(&g), "{ch}");
    assert!(ch["discrepancy"].is_null() && ch["tried"].as_array().unwrap().len() == 5);
}

#[test]
fn invert_picks_its_weight_by_rule() {
    let dir = tmp("invert-rule");
    let cfg = australia_config(&dir, "");
    // ||G m - d|| is 9.7e-4 at w = 1e-2 and 1.25e-3 at 3.2e-2: aim at 1e-3 (sigma sqrt(m))
    let sigma = 1e-3 / (15661f64).sqrt();
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        "[solver]\n",
        &format!(
            "[solver]\nweight = \"discrepancy\"\nweights = \"1e-3:1e-1:5\"\nnoise = {sigma:e}\n"
        ),
    );
    std::fs::write(&cfg, text).unwrap();
    let (ok, err) = seistomo(&["invert", cfg.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(err.contains("by discrepancy"), "{err}");
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out/report.json")).unwrap())
            .unwrap();
    let ch = &rep["weight_choice"];
    assert_eq!(ch["rule"], "discrepancy", "{ch}");
    let w = ch["weight"].as_f64().unwrap();
    assert_eq!(ch["discrepancy"].as_f64(), Some(w));
    assert!(w > 1e-2 && w < 3.2e-2, "{ch}");
    assert!(
        (ch["noise_norm"].as_f64().unwrap() - 1e-3).abs() < 1e-12,
        "{ch}"
    );
    // a rule without weights to try, or discrepancy without a noise level, is refused
    for (keys, words) in [
        ("weight = \"gcv\"\n", "give at least 3"),
        (
            "weight = \"discrepancy\"\nweights = [0.1, 1, 10]\n",
            "noise level",
        ),
        ("weight = \"best\"\nweights = [0.1, 1, 10]\n", "weight rule"),
    ] {
        let bad = dir.join("bad.toml");
        let text = std::fs::read_to_string(australia_config(&dir, ""))
            .unwrap()
            .replace("[solver]\n", &format!("[solver]\n{keys}"));
        std::fs::write(&bad, text).unwrap();
        let (ok, err) = seistomo(&["invert", bad.to_str().unwrap()]);
        assert!(!ok && err.contains(words), "{keys}: {err}");
    }
}

#[test]
fn bundled_model_configs_load_with_their_cell_tables() {
    for name in ["australia-model.toml", "australia-checkerboard.toml"] {
        let cfg = seistomo::pipeline::config::RunConfig::load(&root().join("configs").join(name))
            .unwrap();
        let spec = cfg.model.spec(11916).unwrap();
        match &spec.param {
            Parameterisation::Cells(c) => assert_eq!(c.rows.len(), 11916),
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(spec.slowness_unit, "s/m");
        assert_eq!(spec.true_model.is_some(), name.contains("checkerboard"));
        assert!(cfg.model.path.as_ref().unwrap().ends_with("model.h5"));
        // A wrong number of unknowns is refused.
        assert!(cfg.model.spec(11915).is_err());
    }
}

#[test]
fn lcurve_batch_on_one_thread_finishes() {
    // The batch's consumer (the points' norms, in parallel) once waited for the one worker
    // that waited for it: the run hung. Killed after 120 s here.
    let dir = tmp("lcurve-1thread");
    let cfg = australia_config(&dir, "");
    let out = dir.join("lc");
    let mut child = common::seistomo()
        .args([
            "-q",
            "lcurve",
            cfg.to_str().unwrap(),
            "--log-range",
            "1e-2:1:4",
        ])
        .args(["-o", out.to_str().unwrap()])
        .env("RAYON_NUM_THREADS", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > std::time::Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("seistomo lcurve on one thread did not finish in 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success());
    lcurve_rows(&std::fs::read_to_string(out.join("lcurve.csv")).unwrap(), 4);
}

#[test]
fn lcurve_without_reg_sweeps_lsqr_damping() {
    let dir = tmp("lcurve-damp");
    let lsq = root().join("datasets/lsq");
    let cfg = dir.join("well.toml");
    std::fs::write(
        &cfg,
        format!(
            "[system]\nmatrix = \"{}\"\nrhs = \"{}\"\n[solver]\natol = 1e-10\nbtol = 1e-10\n\
             [backend]\nkind = \"cpu\"\n[output]\ndir = \"{}\"\n",
            lsq.join("illc1033.mtx.gz").display(),
            lsq.join("illc1033_rhs1.mtx.gz").display(),
            dir.join("out").display()
        ),
    )
    .unwrap();
    let (ok, err) = seistomo(&[
        "lcurve",
        cfg.to_str().unwrap(),
        "--damping",
        "1e-4,1e-3,1e-2,1e-1,1",
    ]);
    assert!(ok, "{err}");
    let out = dir.join("out/lcurve");
    let csv = std::fs::read_to_string(out.join("lcurve.csv")).unwrap();
    assert!(csv.starts_with("damp,residual_norm,model_norm"), "{csv}");
    // More damping: larger residual, smaller ||m||.
    lcurve_rows(&csv, 5);
    assert!(is_png(&out.join("lcurve.png")));
    let (ok, err) = seistomo(&["lcurve", cfg.to_str().unwrap(), "--damping", "1,2"]);
    assert!(!ok && err.contains("at least 3"), "{err}");
}

/// Fields of more than 1 MiB reach the file through the image HDF5 laid out (their values
/// copied in at their datasets' offsets, src/model/hdf5.rs `W::deferred`): every one reads back
/// bit for bit, beside the small datasets written through HDF5.
#[test]
fn large_fields_read_back_bit_for_bit() {
    use seistomo::model::fields::Fields;
    let g = Grid::new([64, 64, 40], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]);
    let n = g.ncells();
    let x: Vec<f64> = (0..n)
        .map(|i| 0.2 + 1e-6 * i as f64 - if i % 97 == 0 { 0.3 } else { 0.0 })
        .collect();
    let (o, cov) = identity_outcome(&x);
    let spec = ModelSpec {
        param: Parameterisation::Grid(g),
        unknowns: Unknowns::Slowness,
        slowness_unit: "s/km".into(),
        reference: Reference::Constant(4.5),
        true_model: Some(x.iter().map(|v| v * 1.01).collect()),
    };
    let p = tmp("large").join("model.h5");
    let inputs = ModelInputs {
        spec: &spec,
        outcome: &o,
        coverage: Some(&cov),
        kernel_rows: n,
        config_text: "",
        resolution: &[],
    };
    write_model(&p, &inputs).unwrap();
    let f = ModelFile::open(&p).unwrap();
    let want = Fields::derive(&spec, &o.solution.x);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
    let var = o.solution.var.as_ref().expect("var asked for");
    let cases: [(&str, &[f64]); 9] = [
        ("velocity", &want.velocity),
        ("slowness", &want.slowness),
        ("reference_velocity", &want.reference_velocity),
        ("perturbation", &want.perturbation),
        ("slowness_perturbation", &want.slowness_perturbation),
        ("solution", &o.solution.x),
        ("true_solution", spec.true_model.as_ref().unwrap()),
        ("variance_lower_bound", var),
        ("dws", &cov.dws),
    ];
    for (name, v) in cases {
        let (got, shape) = f.field(name).unwrap();
        assert_eq!(shape, vec![40, 64, 64], "{name}");
        assert!(bits(&got) == bits(v), "{name} differs");
    }
    assert!(
        want.velocity.iter().any(|v| v.is_nan()),
        "a NaN velocity kept"
    );
    let hits: Vec<f64> = cov.hit_count.iter().map(|&h| h as f64).collect();
    assert_eq!(f.field("hit_count").unwrap().0, hits);
    // (m = n: the standard error is sqrt(var), made for the file)
    assert_eq!(o.report.m, o.report.n);
    let se: Vec<f64> = var.iter().map(|v| (v * 1.0).sqrt()).collect();
    assert!(bits(&f.field("std_error_lower_bound").unwrap().0) == bits(&se));
}

/// `[solver] weight` on a dataset: the chosen weight goes where the sweep put it. On its
/// damping rows (stored, times `damping_weight`, and generated from the grid) by default: the
/// run equals one with those weights times w and no damping. With `weight_on = "damp"` the
/// weight is LSQR's damping on the rows as configured.
#[test]
fn invert_rule_on_a_dataset_weighs_its_damping_rows_or_damps() {
    let dir = tmp("invert-rule-dataset");
    let syn = dir.join("syn");
    let (ok, err) = seistomo(&[
        "synth",
        "-o",
        syn.to_str().unwrap(),
        "--grid",
        "8,8,4",
        "--rays",
        "300",
        "--norm-damping",
        "0.1",
        "--flattening",
        "0.5,0.5,0.5",
    ]);
    assert!(ok, "{err}");
    let run = |name: &str, dataset: &str, solver: &str| -> serde_json::Value {
        let out = dir.join(name);
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[dataset]\npath = \"{}\"\n{dataset}[solver]\natol = 1e-9\nbtol = 1e-9\n{solver}[backend]\nkind = \"cpu\"\n[output]\ndir = \"{}\"\nmodel = \"\"\n",
                syn.join("dataset.toml").display(),
                out.display()
            ),
        )
        .unwrap();
        let (ok, err) = seistomo(&["invert", cfg.to_str().unwrap()]);
        assert!(ok, "{name}: {err}");
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap()
    };
    let rows = "damping_weight = 2.0\nnorm_damping = 0.05\n";
    let rule = "weight = \"gcv\"\nweights = \"0.01:10:7\"\n";
    let a = run("rule", rows, rule);
    let ch = &a["weight_choice"];
    assert_eq!(ch["what"], "reg_weight", "{ch}");
    let w = ch["weight"].as_f64().unwrap();
    assert!(w != 1.0, "{ch}");
    assert_eq!(
        a["damp"].as_f64(),
        Some(0.0),
        "the weight is not LSQR's damping"
    );
    let b = run(
        "explicit",
        &format!(
            "damping_weight = {:e}\nnorm_damping = {:e}\n",
            2.0 * w,
            0.05 * w
        ),
        "",
    );
    let (ra, rb) = (a["r1norm"].as_f64().unwrap(), b["r1norm"].as_f64().unwrap());
    assert_eq!(a["iterations"], b["iterations"]);
    assert!((ra - rb).abs() <= 1e-12 * rb, "{ra} against {rb}");
    // the weights as LSQR's damping on the rows as configured
    let c = run("on-damp", rows, &format!("{rule}weight_on = \"damp\"\n"));
    let ch = &c["weight_choice"];
    assert_eq!(ch["what"], "damp", "{ch}");
    let wd = ch["weight"].as_f64().unwrap();
    assert_eq!(c["damp"].as_f64(), Some(wd));
    let d = run("explicit-damp", rows, &format!("damp = {wd:e}\n"));
    assert_eq!(c["iterations"], d["iterations"]);
    assert_eq!(c["r1norm"], d["r1norm"]);
    // an unknown weight_on is refused
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        format!(
            "[dataset]\npath = \"{}\"\n[solver]\nweight_on = \"rows\"\n",
            syn.join("dataset.toml").display()
        ),
    )
    .unwrap();
    let (ok, err) = seistomo(&["invert", bad.to_str().unwrap()]);
    assert!(!ok && err.contains("weight_on"), "{err}");
}

/// The L-curve's points from each solution's products on its operator (`SolveOptions::fit`,
/// the GPU's default) equal the host's: the CPU's batch (R's weight, block operator with
/// weighted rows) and one bidiagonalisation (LSQR's damping on the dataset's rows, permuted
/// and stencils), CSR and compact, GCV's traces from the probes' fits.
#[test]
fn lcurve_points_from_the_operators_products_equal_the_hosts() {
    use seistomo::pipeline::options::SolveOptions;
    let d = common::synth_dataset("model", "fit", "16,16,8", "3000");
    let weights = [0.05, 0.2, 0.8, 3.2];
    for (storage, on) in [("csr", "reg"), ("csr", "damp"), ("compact", "damp")] {
        let (sweep, o, mode) = common::dataset_sweep(
            &d,
            &format!("{storage}-{on}.toml"),
            &format!(
                "[solver]\niter_lim = 80\nweight_on = \"{on}\"\n\
                 [backend]\nkind = \"cpu\"\nstorage = \"{storage}\"\n"
            ),
        );
        let run = |fit: bool| {
            let o = SolveOptions { fit, ..o.clone() };
            sweep
                .run(&weights, &o, &SerialComm, mode, |_, _| {})
                .unwrap()
        };
        let (host, fitted) = (run(false), run(true));
        let what = format!("{storage}, weights on {on}");
        assert_eq!(
            common::points_match_the_host(&sweep, &host, 1e-12),
            0,
            "{what}"
        );
        let n = common::points_match_the_host(&sweep, &fitted, 1e-12);
        // the CPU's batch hands its last two members to single solves (no fit: the host's)
        let least = if on == "reg" {
            weights.len() - 2
        } else {
            weights.len()
        };
        assert!(n >= least, "{what}: {n} points with a fit");
        for (p, q) in fitted.points.iter().zip(&host.points) {
            assert_eq!(p.outcome.solution.x, q.outcome.solution.x, "{what}");
            let rel = |a: f64, b: f64| (a - b).abs() / b.abs();
            assert!(rel(p.residual_norm, q.residual_norm) <= 1e-12, "{what}");
            assert!(rel(p.model_norm, q.model_norm) <= 1e-12, "{what}");
            assert!(
                p.trace.is_finite() && rel(p.trace, q.trace) <= 1e-10,
                "{what}: trace {} against {}",
                p.trace,
                q.trace
            );
        }
        assert_eq!(fitted.corner, host.corner, "{what}");
    }
}
