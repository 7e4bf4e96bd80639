//! Datasets: round trips, layouts, partitions, synthetic recovery, corruption handling.

mod common;

use common::{root, run_ok, scratch as tmp, seistomo as bin};

use std::path::{Path, PathBuf};

use seistomo::comm::SerialComm;
use seistomo::grid::synthetic as synth;
use seistomo::grid::Grid;
use seistomo::io::dataset::binfmt::{pad8, Precision};
use seistomo::io::dataset::manifest::Layout;
use seistomo::io::dataset::{
    load_dataset, load_dataset_with, read_true_model, write_dataset, DatasetSpec, LoadOptions,
    OpenDataset, Regularisation,
};
use seistomo::io::global_row_order;
use seistomo::pipeline;
use seistomo::sparse::Csr;
use seistomo::sparse::System;

fn same_system(a: &System, b: &System) {
    assert_eq!(a.a, b.a);
    assert_eq!(a.b, b.b);
    assert_eq!(a.kernel_rows, b.kernel_rows);
}

/// A small synthetic dataset with damping blocks and weights, in `layout`.
fn small_dataset(dir: &Path, layout: Layout, prec: Precision) -> (Csr, Vec<f64>) {
    small_dataset_v(dir, layout, prec, seistomo::io::dataset::binfmt::VERSION)
}

/// [`small_dataset`] in format `version`.
fn small_dataset_v(dir: &Path, layout: Layout, prec: Precision, version: u32) -> (Csr, Vec<f64>) {
    let g = Grid::new([6, 5, 4], [0.0; 3], [1.0, 1.5, 2.0]);
    let k = synth::straight_ray_kernel(&g, 300, 5);
    let m = synth::checkerboard(&g, [2, 2, 2], 0.1);
    let b = synth::travel_times(&k, &m, 0.001, 5);
    let w: Vec<f64> = (0..k.nrows())
        .map(|i| 1.0 + (i % 7) as f64 / 10.0)
        .collect();
    let reg = seistomo::grid::regularisation(&g, 0.1, [0.5, 0.0, 0.5], [0.0, 0.2, 0.0]);
    let mut spec = DatasetSpec::new(&k, &b);
    spec.weights = Some(&w);
    spec.damping = Some(&reg);
    spec.damping_weight = 0.7;
    spec.damping_blocks = 3;
    spec.grid = Some(g);
    spec.true_model = Some(&m);
    spec.layout = layout;
    spec.precision = prec;
    spec.pack_bytes = 4096; // several packs
    spec.version = version;
    write_dataset(dir, &spec, false).unwrap();
    (k, b)
}

#[test]
fn australia_import_invert_matches_solve_on_mtx() {
    let au = root().join("datasets/australia");
    let dir = tmp("australia");
    let ds = dir.join("au");
    // The Matrix Market system, as import and solve take it.
    let mtx_args: [std::ffi::OsString; 6] = [
        "--matrix".into(),
        au.join("G.mtx.gz").into(),
        "--rhs".into(),
        au.join("d.txt").into(),
        "--reg".into(),
        au.join("R.mtx.gz").into(),
    ];
    run_ok(
        bin()
            .arg("import")
            .args(&mtx_args)
            .args(["--lambda", "0.015", "--out"])
            .arg(&ds),
    );
    // Loaded system == the Matrix Market system, bit for bit.
    let from_ds = load_dataset(&ds, 0, 1).unwrap();
    let from_mtx = seistomo::io::mtx::load_system(
        &au.join("G.mtx.gz"),
        Some(&au.join("d.txt")),
        Some(&au.join("R.mtx.gz")),
        0.015,
    )
    .unwrap();
    same_system(&from_ds, &from_mtx);
    // invert CONFIG on the dataset == solve on the .mtx files.
    std::fs::write(
        dir.join("run.toml"),
        "[dataset]\npath = \"au\"\n[solver]\natol = 1e-8\nbtol = 1e-8\n[backend]\nkind = \"cpu\"\n[output]\ndir = \"inv\"\n",
    )
    .unwrap();
    run_ok(bin().arg("invert").arg(dir.join("run.toml")));
    run_ok(
        bin()
            .args([
                "solve",
                "--backend",
                "cpu",
                "--atol",
                "1e-8",
                "--btol",
                "1e-8",
            ])
            .args(&mtx_args)
            .args(["--reg-weight", "0.015", "--solution"])
            .arg(dir.join("solve.txt")),
    );
    let read = |p: PathBuf| -> Vec<f64> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    };
    let x1 = read(dir.join("inv/solution.txt"));
    let x2 = read(dir.join("solve.txt"));
    assert_eq!(x1.len(), 11916);
    let num: f64 = x1.iter().zip(&x2).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = x2.iter().map(|b| b * b).sum();
    let rel = (num / den).sqrt();
    println!("australia: dataset vs mtx solution relative difference {rel:e}");
    assert!(rel <= 1e-12, "{rel}");
    // The published peers' norms: ||x|| = 3.48643854e-2.
    let xn = den.sqrt();
    assert!((xn - 3.48643854e-2).abs() < 1e-8, "{xn}");
    // Export round trip: A.mtx + b.mtx == the loaded system; the same gzipped (members that
    // gzip reads as one stream and seistomo in parallel).
    for (format, out, ext) in [("mtx", "exp", ""), ("mtx.gz", "expz", ".gz")] {
        export(&ds, format, &dir.join(out));
        let back = seistomo::io::mtx::load_system(
            &dir.join(format!("{out}/A.mtx{ext}")),
            Some(&dir.join(format!("{out}/b.mtx{ext}"))),
            None,
            1.0,
        )
        .unwrap();
        assert_eq!(back.a, from_ds.a, "{format}");
        assert_eq!(back.b, from_ds.b, "{format}");
    }
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::MultiGzDecoder::new(
            std::fs::File::open(dir.join("expz/A.mtx.gz")).unwrap(),
        ),
        &mut text,
    )
    .unwrap();
    assert_eq!(
        text,
        std::fs::read_to_string(dir.join("exp/A.mtx")).unwrap()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn per_row_and_packed_layouts_load_identically_for_every_rank_count() {
    let dir = tmp("layouts");
    for prec in [Precision::F64, Precision::F32] {
        let p1 = dir.join(format!("per-row-{prec:?}"));
        let p2 = dir.join(format!("packed-{prec:?}"));
        let (k, b) = small_dataset(&p1, Layout::PerRow, prec);
        small_dataset(&p2, Layout::Packed, prec);
        let whole = load_dataset(&p1, 0, 1).unwrap();
        same_system(&whole, &load_dataset(&p2, 0, 1).unwrap());
        assert_eq!(whole.kernel_rows, k.nrows());
        // Weighted kernel rows and b, then 0.7 x damping rows.
        if prec == Precision::F64 {
            let w = 1.0 + 3.0 / 10.0;
            let (c, v) = whole.a.row(3);
            assert_eq!(c, k.row(3).0);
            assert!(v.iter().zip(k.row(3).1).all(|(a, b)| *a == b * w));
            assert_eq!(whole.b[3], b[3] * w);
        }
        assert!(whole.b[k.nrows()..].iter().all(|&v| v == 0.0));
        for size in 1..=8 {
            let mut seen = vec![0u32; whole.a.nrows()];
            for rank in 0..size {
                let s1 = load_dataset(&p1, rank, size).unwrap();
                let s2 = load_dataset(&p2, rank, size).unwrap();
                same_system(&s1, &s2);
                let order = global_row_order(&p1, rank, size, &LoadOptions::default()).unwrap();
                assert_eq!(order.len(), s1.a.nrows());
                for (i, &g) in order.iter().enumerate() {
                    seen[g as usize] += 1;
                    assert_eq!(s1.a.row(i), whole.a.row(g as usize));
                    assert_eq!(s1.b[i], whole.b[g as usize]);
                    assert_eq!(i < s1.kernel_rows, (g as usize) < k.nrows());
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "size {size}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generated_regularisation_and_weight_override() {
    let dir = tmp("generated");
    let p = dir.join("d");
    small_dataset(&p, Layout::Packed, Precision::F64);
    let reg = Regularisation {
        norm: 0.3,
        first: [0.0; 3],
        second: [1.0, 1.0, 1.0],
    };
    let opts = LoadOptions {
        progress: false,
        damping_weight: Some(2.0),
        regularisation: Some(reg),
        ..Default::default()
    };
    let (s, _) = load_dataset_with(&p, 0, 1, &opts).unwrap();
    let base = load_dataset(&p, 0, 1).unwrap();
    let g = Grid::new([6, 5, 4], [0.0; 3], [1.0, 1.5, 2.0]);
    let gen = seistomo::grid::regularisation(&g, 0.3, [0.0; 3], [1.0; 3]);
    assert_eq!(s.a.nrows(), base.a.nrows() + gen.nrows());
    // Stored damping rows scaled by 2.0 instead of 0.7.
    let r = base.kernel_rows;
    let (_, v_base) = base.a.row(r);
    let (_, v_new) = s.a.row(r);
    assert!(v_base
        .iter()
        .zip(v_new)
        .all(|(a, b)| (a / 0.7 * 2.0 - b).abs() < 1e-15));
    assert_eq!(s.a.row(s.a.nrows() - 1), gen.row(gen.nrows() - 1));
    // No grid -> a clear error.
    let au = tmp("nogrid");
    let k = synth::straight_ray_kernel(&g, 10, 1);
    let b = vec![0.0; 10];
    write_dataset(&au.join("x"), &DatasetSpec::new(&k, &b), false).unwrap();
    let e = load_dataset_with(&au.join("x"), 0, 1, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("dataset.toml") && e.contains("no [grid]"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&au);
}

#[test]
fn demo_checkerboard_is_recovered() {
    let demo = root().join("datasets/demo");
    let truth = read_true_model(&demo)
        .unwrap()
        .expect("the demo has a true model");
    let cfg = seistomo::pipeline::config::RunConfig::load(&demo.join("invert.toml")).unwrap();
    let sys = seistomo::pipeline::load::load_mtx(&cfg.system).unwrap();
    assert_eq!(sys.a.ncols(), truth.len());
    let mut opts = cfg.options.clone();
    opts.operator.backend = pipeline::options::BackendChoice::Cpu;
    let o = pipeline::solve::solve_system(sys, &opts, &SerialComm, 0.0, 0).unwrap();
    let c = synth::correlation(&o.solution.x, &truth);
    println!("demo checkerboard: correlation with the true model {c:.6}");
    assert!(c >= 0.8, "{c}");
    // Hit counts: every cell of the demo is crossed.
    let ds = OpenDataset::open(&demo, &LoadOptions::default()).unwrap();
    let (k, _) = ds.load(0, 1, false).unwrap();
    let cov = seistomo::grid::Coverage::from_kernel_rows(&k.a, k.kernel_rows);
    assert!(cov.hit_count.iter().all(|&h| h > 0));
}

#[test]
fn ray_lengths_sum_to_straight_line_lengths() {
    let g = Grid::new([9, 7, 5], [10.0, -5.0, 0.0], [2.0, 3.0, 1.25]);
    let k = synth::straight_ray_kernel(&g, 5000, 99);
    let lens = synth::ray_lengths(&g, 5000, 99);
    for (i, l) in lens.iter().enumerate() {
        let s: f64 = k.row(i).1.iter().sum();
        assert!((s - l).abs() <= 1e-9, "ray {i}: {s} vs {l}");
    }
}

/// `seistomo export DATASET --format FORMAT --out OUT`, which must succeed.
fn export(ds: &Path, format: &str, out: &Path) {
    run_ok(
        bin()
            .arg("export")
            .arg(ds)
            .args(["--format", format, "--out"])
            .arg(out),
    );
}

// ---- corruption: every case gives one error naming the file (and row) ----

fn patch(path: &Path, off: usize, bytes: &[u8]) {
    let mut d = std::fs::read(path).unwrap();
    d[off..off + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, d).unwrap();
}

/// Replace `from` by `to` in the dataset's manifest (dataset.toml).
fn edit_manifest(d: &Path, from: &str, to: &str) {
    let p = d.join("dataset.toml");
    let t = std::fs::read_to_string(&p).unwrap().replace(from, to);
    std::fs::write(p, t).unwrap();
}

fn truncate(path: &Path, by: usize) {
    let d = std::fs::read(path).unwrap();
    std::fs::write(path, &d[..d.len() - by]).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &t);
        } else {
            std::fs::copy(e.path(), t).unwrap();
        }
    }
}

/// Offset of metadata entry k (row, nnz, file, offset).
fn meta_entry(k: usize) -> usize {
    48 + 32 * k
}

fn read_u64(path: &Path, off: usize) -> u64 {
    let d = std::fs::read(path).unwrap();
    u64::from_le_bytes(d[off..off + 8].try_into().unwrap())
}

#[test]
fn corruptions_give_one_clear_error_naming_the_file() {
    let dir = tmp("corrupt");
    let per_row = dir.join("per-row");
    let packed = dir.join("packed");
    // Version 1 (no checksums): each structural check is reached; version 2 files are swept in
    // tests/corruption_sweep.rs.
    small_dataset_v(&per_row, Layout::PerRow, Precision::F64, 1);
    small_dataset_v(&packed, Layout::Packed, Precision::F64, 1);
    let row5 = |d: &Path| d.join("kernel/row_0000000005.bin");
    let nnz5 = {
        let p = row5(&per_row);
        read_u64(&p, 24) as usize
    };
    type Case = (
        &'static str,
        bool,
        Box<dyn Fn(&Path)>,
        &'static str,
        &'static str,
    );
    // One corruption: its name, whether it applies to the packed copy, the file and the words
    // the error must name, and what it does to a copy of the dataset.
    fn case(
        what: &'static str,
        packed: bool,
        file: &'static str,
        msg: &'static str,
        corrupt: impl Fn(&Path) + 'static,
    ) -> Case {
        (what, packed, Box::new(corrupt), file, msg)
    }
    let cases: Vec<Case> = vec![
        case(
            "truncated row file",
            false,
            "row_0000000005.bin",
            "truncated",
            move |d| truncate(&row5(d), 8),
        ),
        case(
            "row file trailing bytes",
            false,
            "row_0000000005.bin",
            "trailing bytes",
            move |d| {
                let p = row5(d);
                let mut v = std::fs::read(&p).unwrap();
                v.extend_from_slice(&[0; 8]);
                std::fs::write(&p, v).unwrap();
            },
        ),
        case(
            "wrong magic",
            false,
            "row_0000000005.bin",
            "bad magic",
            move |d| patch(&row5(d), 0, b"NOTMAGIC"),
        ),
        case(
            "wrong version",
            false,
            "row_0000000005.bin",
            "version 7",
            move |d| patch(&row5(d), 8, &7u32.to_le_bytes()),
        ),
        case(
            "nnz in metadata != file",
            false,
            "row_0000000005.bin",
            "kernel row 5: ",
            move |d| patch(&row5(d), 24, &((nnz5 + 1) as u64).to_le_bytes()),
        ),
        case(
            "column >= ncols",
            false,
            "row_0000000005.bin",
            "kernel row 5: column 1000 out of range",
            move |d| patch(&row5(d), 32, &1000u32.to_le_bytes()),
        ),
        case(
            "unsorted columns",
            false,
            "row_0000000005.bin",
            "not strictly increasing",
            move |d| {
                let p = row5(d);
                let c0 = std::fs::read(&p).unwrap()[36..40].to_vec();
                patch(&p, 32, &c0);
            },
        ),
        case(
            "NaN value",
            false,
            "row_0000000005.bin",
            "kernel row 5, column",
            move |d| patch(&row5(d), 32 + pad8(4 * nnz5), &f64::NAN.to_le_bytes()),
        ),
        case(
            "Inf value (packed)",
            true,
            "pack_00000.bin",
            "value is not finite (inf)",
            |d| {
                let meta = d.join("metadata.bin");
                let (row, file, off) = (
                    read_u64(&meta, meta_entry(0)),
                    read_u64(&meta, meta_entry(0) + 16),
                    read_u64(&meta, meta_entry(0) + 24) as usize,
                );
                assert_eq!(row, row);
                let nnz = read_u64(&meta, meta_entry(0) + 8) as usize;
                patch(
                    &d.join(format!("kernel/pack_{file:05}.bin")),
                    off + 16 + pad8(4 * nnz),
                    &f64::INFINITY.to_le_bytes(),
                );
            },
        ),
        case("truncated pack", true, "pack_00000.bin", "truncated", |d| {
            truncate(&d.join("kernel/pack_00000.bin"), 3)
        }),
        case(
            "b shorter than rows",
            false,
            "b.bin",
            "299 values but the dataset needs 300",
            |d| {
                let p = d.join("b.bin");
                let mut v = std::fs::read(&p).unwrap();
                let n = u64::from_le_bytes(v[16..24].try_into().unwrap()) - 1;
                v[16..24].copy_from_slice(&n.to_le_bytes());
                v.truncate(v.len() - 8);
                std::fs::write(&p, v).unwrap();
            },
        ),
        case("NaN in b", false, "b.bin", "row 17", |d| {
            patch(&d.join("b.bin"), 32 + 8 * 17, &f64::NAN.to_le_bytes())
        }),
        case("negative weight", false, "weights.bin", "row 4", |d| {
            patch(&d.join("weights.bin"), 32 + 8 * 4, &(-1.0f64).to_le_bytes())
        }),
        case(
            "duplicate row index",
            false,
            "metadata.bin",
            "duplicate row index",
            |d| {
                let meta = d.join("metadata.bin");
                let r0 = read_u64(&meta, meta_entry(0));
                patch(&meta, meta_entry(1), &r0.to_le_bytes());
            },
        ),
        case(
            "metadata row out of range",
            true,
            "metadata.bin",
            "row 999 out of range",
            |d| {
                patch(
                    &d.join("metadata.bin"),
                    meta_entry(2),
                    &999u64.to_le_bytes(),
                )
            },
        ),
        case(
            "metadata truncated",
            true,
            "metadata.bin",
            "truncated",
            |d| truncate(&d.join("metadata.bin"), 32),
        ),
        case(
            "metadata nnz total",
            true,
            "metadata.bin",
            "nonzeros",
            |d| patch(&d.join("metadata.bin"), 32, &1u64.to_le_bytes()),
        ),
        case(
            "missing row file",
            false,
            "row_0000000005.bin",
            "kernel row 5 listed in the metadata",
            move |d| std::fs::remove_file(row5(d)).unwrap(),
        ),
        case(
            "missing pack file",
            true,
            "pack_00001.bin",
            "No such file",
            |d| std::fs::remove_file(d.join("kernel/pack_00001.bin")).unwrap(),
        ),
        case(
            "damping block truncated",
            true,
            "block_0001.bin",
            "truncated",
            |d| truncate(&d.join("damping/block_0001.bin"), 8),
        ),
        case(
            "damping block wrong first row",
            true,
            "block_0002.bin",
            "first row 3",
            |d| patch(&d.join("damping/block_0002.bin"), 24, &3u64.to_le_bytes()),
        ),
        case(
            "damping NaN",
            true,
            "block_0000.bin",
            "damping row 0",
            |d| {
                let p = d.join("damping/block_0000.bin");
                let v = std::fs::read(&p).unwrap();
                let (rows, nnz) = (read_u64(&p, 32) as usize, read_u64(&p, 40) as usize);
                let at = 56 + 8 * (rows + 1) + pad8(4 * nnz);
                assert!(at + 8 <= v.len());
                patch(&p, at, &f64::NAN.to_le_bytes());
            },
        ),
        case(
            "manifest wrong format",
            true,
            "dataset.toml",
            "not a seistomo dataset",
            |d| edit_manifest(d, "seistomo-dataset", "other"),
        ),
        case(
            "manifest count mismatch",
            true,
            "metadata.bin",
            "300 kernel rows",
            |d| edit_manifest(d, "kernel_rows = 300", "kernel_rows = 301"),
        ),
    ];
    for (i, (what, is_packed, corrupt, file, msg)) in cases.iter().enumerate() {
        let d = dir.join(format!("case{i}"));
        copy_dir(if *is_packed { &packed } else { &per_row }, &d);
        corrupt(&d);
        // Every rank count reaches the error on the rank that owns the damage (try all).
        let errs: Vec<String> = (0..3)
            .filter_map(|r| load_dataset(&d, r, 3).err().map(|e| e.to_string()))
            .collect();
        assert!(!errs.is_empty(), "{what}: no rank failed");
        let e = load_dataset(&d, 0, 1).unwrap_err().to_string();
        assert!(e.contains(file) && e.contains(msg), "{what}: {e}");
        assert!(!e.contains('\n'), "{what}: multi-line: {e}");
        // The CLI: exit != 0 and one line on stderr.
        {
            let out = bin().arg("inspect").arg(&d).arg("--load").output().unwrap();
            assert!(!out.status.success(), "{what}");
            let err = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = err
                .lines()
                .filter(|l| l.starts_with("seistomo: error"))
                .collect();
            assert_eq!(lines.len(), 1, "{what}: {err}");
            assert!(lines[0].contains(file), "{what}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_synth_inspect_export_npy() {
    let dir = tmp("cli");
    let d = dir.join("syn");
    run_ok(
        bin()
            .args([
                "synth",
                "--grid",
                "5,4,3",
                "--rays",
                "50",
                "--model",
                "spike",
                "--noise",
                "0.01",
                "--norm-damping",
                "0.1",
                "--layout",
                "per-row",
                "--out",
            ])
            .arg(&d),
    );
    // A second synth into the same place refuses (no overwrite).
    let again = bin().args(["synth", "--out"]).arg(&d).output().unwrap();
    assert!(!again.status.success());
    let out = bin()
        .arg("inspect")
        .arg(&d)
        .args(["--ranks", "1,3"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("kernel       50 rows") && text.contains("3 ranks  imbalance"),
        "{text}"
    );
    export(&d, "npy", &dir.join("npy"));
    let sys = load_dataset(&d, 0, 1).unwrap();
    // One rank holds every nonzero (the partition's load is bytes, not nonzeros).
    assert!(
        text.contains(&format!(
            "1 ranks  imbalance 1.000000000  max {} nnz/rank",
            sys.a.nnz()
        )),
        "{text}"
    );
    let data = std::fs::read(dir.join("npy/data.npy")).unwrap();
    let hl = u16::from_le_bytes([data[8], data[9]]) as usize;
    let vals: Vec<f64> = data[10 + hl..]
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vals, sys.a.data());
    let shape = std::fs::read(dir.join("npy/shape.npy")).unwrap();
    let hl = u16::from_le_bytes([shape[8], shape[9]]) as usize;
    assert_eq!(
        i64::from_le_bytes(shape[10 + hl..18 + hl].try_into().unwrap()),
        sys.a.nrows() as i64
    );
    // Bad arguments: one line, non-zero.
    let out = bin()
        .arg("inspect")
        .arg(dir.join("nothing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim().lines().count(),
        1
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigma_divides_rows_and_data() {
    let dir = tmp("sigma");
    let g = Grid::new([4, 4, 2], [0.0; 3], [1.0; 3]);
    let k = synth::straight_ray_kernel(&g, 40, 3);
    let b: Vec<f64> = (0..40).map(|i| i as f64 * 0.5).collect();
    let sigma: Vec<f64> = (0..40).map(|i| 0.5 + i as f64 / 40.0).collect();
    let mut spec = DatasetSpec::new(&k, &b);
    spec.sigma = Some(&sigma);
    spec.layout = Layout::PerRow;
    // Version 1: the patch below must reach the value check (version 2 stops at the checksum).
    spec.version = 1;
    write_dataset(&dir.join("s"), &spec, false).unwrap();
    let s = load_dataset(&dir.join("s"), 0, 1).unwrap();
    for i in 0..40 {
        assert_eq!(s.b[i], b[i] / sigma[i]);
        let want: Vec<f64> = k.row(i).1.iter().map(|v| v / sigma[i]).collect();
        assert_eq!(s.a.row(i).1, &want[..]);
    }
    // sigma <= 0 is refused, naming the file and row.
    patch(&dir.join("s/sigma.bin"), 32 + 8 * 9, &0.0f64.to_le_bytes());
    let e = load_dataset(&dir.join("s"), 0, 1).unwrap_err().to_string();
    assert!(e.contains("sigma.bin") && e.contains("row 9"), "{e}");
    // Both weights and sigma: refused at write and in a manifest.
    let w = vec![1.0; 40];
    spec.weights = Some(&w);
    let e = write_dataset(&dir.join("both"), &spec, false).unwrap_err();
    assert!(e.to_string().contains("not both"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn solution_is_independent_of_the_partition() {
    let demo = root().join("datasets/demo");
    let cfg = seistomo::pipeline::config::RunConfig::load(&demo.join("invert.toml")).unwrap();
    let mut opts = cfg.options.clone();
    opts.operator.backend = pipeline::options::BackendChoice::Cpu;
    opts.params.atol = 1e-14;
    opts.params.btol = 1e-14;
    let whole = load_dataset(&demo, 0, 1).unwrap();
    let x1 = pipeline::solve::solve_system(whole, &opts, &SerialComm, 0.0, 0)
        .unwrap()
        .solution
        .x;
    // The rows of 3 ranks stacked in rank order: a row permutation of the same system.
    let parts: Vec<System> = (0..3).map(|r| load_dataset(&demo, r, 3).unwrap()).collect();
    let mut a = parts[0].a.clone();
    let mut b = parts[0].b.clone();
    for p in &parts[1..] {
        a = a.vstack_scaled(&p.a, 1.0).unwrap();
        b.extend_from_slice(&p.b);
    }
    let permuted = System {
        a,
        b,
        kernel_rows: parts.iter().map(|p| p.kernel_rows).sum(),
    };
    let x2 = pipeline::solve::solve_system(permuted, &opts, &SerialComm, 0.0, 0)
        .unwrap()
        .solution
        .x;
    let num: f64 = x1.iter().zip(&x2).map(|(a, b)| (a - b).powi(2)).sum();
    let den: f64 = x1.iter().map(|a| a * a).sum();
    let rel = (num / den).sqrt();
    println!("demo: 1 rank vs 3 ranks' rows, relative difference {rel:e}");
    assert!(rel < 1e-9, "{rel}");
}

/// Issue 35: an error in a row read as a byte range (the MPI-IO path) gives one byte offset,
/// the record's offset in its file (not a second one relative to the buffer read).
#[test]
fn a_bad_row_read_as_a_byte_range_names_one_offset_in_the_file() {
    use seistomo::io::rowio::IoChoice;
    let dir = tmp("range-offset");
    let ds = dir.join("ds");
    small_dataset(&ds, Layout::Packed, Precision::F64);
    let meta = OpenDataset::open(&ds, &LoadOptions::default())
        .unwrap()
        .meta;
    // The record of a row in the middle of a pack other than the first.
    let e = *meta
        .entries
        .iter()
        .filter(|e| e.file == 1 && e.nnz > 0)
        .nth(2)
        .unwrap();
    let pack = ds.join("kernel/pack_00001.bin");
    let pristine = std::fs::read(&pack).unwrap();
    let mut bytes = pristine.clone();
    bytes[e.offset as usize + 16] ^= 1; // a column index: the record's checksum fails
    std::fs::write(&pack, &bytes).unwrap();
    for io in [IoChoice::Mmap, IoChoice::MpiIo] {
        let opts = LoadOptions {
            io,
            ..Default::default()
        };
        let err = load_dataset_with(&ds, 0, 1, &opts).unwrap_err().to_string();
        assert_eq!(err.matches("at byte").count(), 1, "{io:?}: {err}");
        assert!(
            err.contains(&format!(
                "kernel row {} (record at byte {})",
                e.row, e.offset
            )) && err.contains("pack_00001.bin")
                && err.contains("checksum mismatch"),
            "{io:?}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
