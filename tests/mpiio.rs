//! Dataset rows read through MPI-IO byte ranges give the same System as memory maps: bit for
//! bit the same rows, b and weights on every rank of 1-4 (under `mpirun`), the same solution of
//! `invert`, and a truncated kernel file read through MPI-IO ends the job with one error line
//! naming it. Tests that need `mpirun` print why and return when it is absent; the
//! single-process tests (positioned reads, the same code path without MPI) always run.

#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

mod common;

#[cfg(feature = "mpi")]
use common::mpi::{child_test, finish, have_mpirun, mpi_dir, the_error_line};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use seistomo::io::dataset::binfmt::Precision;
use seistomo::io::dataset::manifest::Layout;
use seistomo::io::dataset::{load_dataset_with, write_dataset, DatasetSpec, LoadOptions};
use seistomo::io::mtx;
use seistomo::io::rowio::{IoChoice, IoPath};
use seistomo::sparse::System;

const BIN: &str = env!("CARGO_BIN_EXE_seistomo");

fn data(rel: &str) -> PathBuf {
    common::root().join("datasets").join(rel)
}

fn opts(io: IoChoice) -> LoadOptions {
    LoadOptions {
        io,
        ..Default::default()
    }
}

/// The datasets compared: demo (packed, one pack, two damping blocks), australia written
/// packed in 64 KiB packs with standard deviations and three damping blocks, and a per-row f32
/// synthetic dataset with data weights (one file per kernel row). Written once per directory.
fn datasets(dir: &Path) -> Vec<PathBuf> {
    vec![data("demo"), australia(dir), per_row(dir)]
}

fn australia(dir: &Path) -> PathBuf {
    australia_v(dir, seistomo::io::dataset::binfmt::VERSION)
}

/// [`australia`] in dataset format `version`.
fn australia_v(dir: &Path, version: u32) -> PathBuf {
    let au = dir.join("australia");
    if !au.join("dataset.toml").is_file() {
        let _ = std::fs::remove_dir_all(&au);
        let a = data("australia");
        let g = mtx::read_matrix(a.join("G.mtx.gz")).unwrap();
        let r = mtx::read_matrix(a.join("R.mtx.gz")).unwrap();
        let d = mtx::read_vector(a.join("d.txt")).unwrap();
        let sigma: Vec<f64> = (0..g.nrows()).map(|i| 0.5 + (i % 7) as f64 * 0.1).collect();
        let mut spec = DatasetSpec::new(&g, &d);
        spec.sigma = Some(&sigma);
        spec.damping = Some(&r);
        spec.damping_weight = 0.015;
        spec.damping_blocks = 3;
        spec.pack_bytes = 64 << 10;
        spec.version = version;
        write_dataset(&au, &spec, false).unwrap();
    }
    au
}

fn per_row(dir: &Path) -> PathBuf {
    let pr = dir.join("perrow");
    if !pr.join("dataset.toml").is_file() {
        let _ = std::fs::remove_dir_all(&pr);
        let demo = load_dataset_with(&data("demo"), 0, 1, &LoadOptions::default())
            .unwrap()
            .0;
        // The first 600 kernel rows of demo and its first 300 damping rows.
        let k = demo.kernel_rows;
        let a = &demo.a;
        let take = |rows: std::ops::Range<usize>| {
            let ip = a.indptr();
            let (s, e) = (ip[rows.start] as usize, ip[rows.end] as usize);
            let indptr: Vec<u64> = ip[rows.start..=rows.end]
                .iter()
                .map(|&p| p - s as u64)
                .collect();
            seistomo::sparse::Csr::try_new(
                rows.len(),
                a.ncols(),
                indptr,
                a.indices()[s..e].to_vec(),
                a.data()[s..e].to_vec(),
            )
            .unwrap()
        };
        let kern = take(0..600);
        let damp = take(k..k + 300);
        let w: Vec<f64> = (0..600).map(|i| 1.0 + (i % 5) as f64 * 0.25).collect();
        let mut spec = DatasetSpec::new(&kern, &demo.b[..600]);
        spec.weights = Some(&w);
        spec.damping = Some(&damp);
        spec.damping_weight = 0.5;
        spec.damping_blocks = 2;
        spec.layout = Layout::PerRow;
        spec.precision = Precision::F32;
        write_dataset(&pr, &spec, false).unwrap();
    }
    pr
}

/// A fresh per-row dataset whose kernel row 123 file is cut short by 8 bytes.
fn truncated_per_row(dir: &Path) -> (PathBuf, String) {
    let pr = per_row(dir);
    let name = "row_0000000123.bin".to_string();
    cut_short(&pr.join("kernel").join(&name), 8);
    (pr, name)
}

/// Cut the last `by` bytes off the file at `path`.
fn cut_short(path: &Path, by: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - by).unwrap();
}

/// Bit-for-bit equality of two loaded systems.
fn same_system(a: &System, b: &System) -> Result<(), String> {
    if a.kernel_rows != b.kernel_rows {
        return Err(format!(
            "kernel rows {} vs {}",
            a.kernel_rows, b.kernel_rows
        ));
    }
    if (a.a.nrows(), a.a.ncols()) != (b.a.nrows(), b.a.ncols()) {
        return Err("shape differs".into());
    }
    if a.a.indptr() != b.a.indptr() || a.a.indices() != b.a.indices() {
        return Err("structure differs".into());
    }
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    if bits(a.a.data()) != bits(b.a.data()) {
        return Err("values differ".into());
    }
    if bits(&a.b) != bits(&b.b) {
        return Err("b differs".into());
    }
    Ok(())
}

/// Rank `rank` of `size` through positioned reads (the MPI-IO code path without MPI) equals the
/// memory-mapped load of the same rank.
#[test]
fn byte_range_loads_equal_mmap_loads_on_every_rank_split() {
    let dir = common::scratch("mpiio-serial");
    for ds in datasets(&dir) {
        for size in 1..=4 {
            for rank in 0..size {
                let (m, sm) = load_dataset_with(&ds, rank, size, &opts(IoChoice::Mmap)).unwrap();
                // the default coalescing, and none (every record a read of its own: many
                // spans a file, read and decoded in groups by several tasks)
                for gap in [None, Some(0)] {
                    let o = LoadOptions {
                        io_max_gap: gap,
                        ..opts(IoChoice::MpiIo)
                    };
                    let (r, sr) = load_dataset_with(&ds, rank, size, &o).unwrap();
                    assert_eq!((sm.io, sr.io), (IoPath::Mmap, IoPath::MpiIo));
                    assert!(sr.read_calls > 0 || r.a.nrows() == 0);
                    if let Err(e) = same_system(&m, &r) {
                        panic!("{}: rank {rank} of {size}, gap {gap:?}: {e}", ds.display());
                    }
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A copy of demo with its pack file cut short by `cut` bytes.
fn truncated_demo(dir: &Path, cut: u64) -> PathBuf {
    let src = data("demo");
    let dst = dir.join("demo-cut");
    let _ = std::fs::remove_dir_all(&dst);
    for sub in ["", "kernel", "damping"] {
        std::fs::create_dir_all(dst.join(sub)).unwrap();
        for e in std::fs::read_dir(src.join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                std::fs::copy(&p, dst.join(sub).join(p.file_name().unwrap())).unwrap();
            }
        }
    }
    cut_short(&dst.join("kernel/pack_00000.bin"), cut);
    dst
}

/// A fresh directory `name` (None without mpirun) with [`truncated_demo`] in it.
#[cfg(feature = "mpi")]
fn mpi_truncated_demo(name: &str, cut: u64) -> Option<(PathBuf, PathBuf)> {
    let dir = mpi_dir(name)?;
    let ds = truncated_demo(&dir, cut);
    Some((dir, ds))
}

/// Load rank 0 of `size` of the dataset `ds` through MPI-IO and through memory maps: both are
/// one error line holding every one of `names`.
fn assert_load_error(ds: &Path, size: usize, names: &[&str]) {
    for io in [IoChoice::MpiIo, IoChoice::Mmap] {
        let e = load_dataset_with(ds, 0, size, &opts(io))
            .err()
            .unwrap_or_else(|| panic!("{io:?}: {} loaded", ds.display()))
            .to_string();
        assert!(
            names.iter().all(|n| e.contains(n)) && !e.contains('\n'),
            "{io:?}: {e}"
        );
    }
}

#[test]
fn truncated_pack_read_by_byte_ranges_names_the_file() {
    let dir = common::scratch("mpiio-trunc");
    let ds = truncated_demo(&dir, 100);
    assert_load_error(&ds, 2, &["pack_00000.bin", "truncated"]);
    let (pr, name) = truncated_per_row(&dir);
    assert_load_error(&pr, 1, &[&name, "kernel row 123"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_sigma_value_read_by_byte_ranges_names_the_file_and_row() {
    let dir = common::scratch("mpiio-sigma");
    // Version 1: the patched value reaches the sign check (version 2 stops at the checksum).
    let au = australia_v(&dir, 1);
    let sigma = au.join("sigma.bin");
    let mut bytes = std::fs::read(&sigma).unwrap();
    // Values start after the 32-byte header; row 5 becomes -1.
    bytes[32 + 8 * 5..32 + 8 * 6].copy_from_slice(&(-1.0f64).to_le_bytes());
    std::fs::write(&sigma, bytes).unwrap();
    for io in [IoChoice::MpiIo, IoChoice::Mmap] {
        // Row 5 is on one of the two ranks; that rank's load fails.
        let errs: Vec<String> = (0..2)
            .filter_map(|r| load_dataset_with(&au, r, 2, &opts(io)).err())
            .map(|e| e.to_string())
            .collect();
        // Through byte ranges a rank reads only its rows' values: one rank fails; through the
        // maps every rank checks the whole file.
        let want = if io == IoChoice::MpiIo { 1 } else { 2 };
        assert_eq!(errs.len(), want, "{io:?}: {errs:?}");
        for e in &errs {
            assert!(
                e.contains("sigma.bin") && e.contains("row 5:") && e.contains("not allowed"),
                "{io:?}: {e}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn mpirun(np: usize) -> Command {
    let mut c = common::mpi::mpirun();
    c.args(["-np", &np.to_string()]);
    c
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

#[cfg(feature = "mpi")]
#[test]
fn mpiio_loads_equal_mmap_loads_on_1_to_4_ranks() {
    if !have_mpirun() {
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mpiio-ranks");
    std::fs::create_dir_all(&dir).unwrap();
    let list = datasets(&dir)
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    for np in 1..=4 {
        let out = child_test(
            np,
            "mpiio_load_rank_child",
            "SEISTOMO_MPIIO_DATASETS",
            &list,
        );
        let t = text(&out);
        assert!(out.status.success(), "np {np}: {t}");
        for r in 0..np {
            assert!(
                t.contains(&format!("rank {r} of {np}: 3 datasets identical")),
                "np {np}: {t}"
            );
        }
    }
}

/// Run by `mpiio_loads_equal_mmap_loads_on_1_to_4_ranks` on each rank (does nothing alone):
/// this rank's rows through MPI-IO, through memory maps, and picked out of a single-process
/// load by the global row order must agree bit for bit.
#[cfg(feature = "mpi")]
#[test]
fn mpiio_load_rank_child() {
    use seistomo::comm::{Comm, MpiComm};
    use seistomo::io::dataset::global_row_order;
    use seistomo::pipeline::load::load_dataset_comm;
    let Some(list) = std::env::var_os("SEISTOMO_MPIIO_DATASETS") else {
        eprintln!("mpiio_load_rank_child: only runs under mpirun, started by mpiio_loads_equal_mmap_loads_on_1_to_4_ranks");
        return;
    };
    let comm = MpiComm::init().unwrap();
    let (rank, size) = (comm.rank(), comm.size());
    let list = list.to_string_lossy().into_owned();
    let mut n = 0;
    for ds in list.lines().map(PathBuf::from) {
        let (m, sm, _) = load_dataset_comm(&ds, &comm, &opts(IoChoice::Mmap)).unwrap();
        let (r, sr, _) = load_dataset_comm(&ds, &comm, &opts(IoChoice::MpiIo)).unwrap();
        let (_, sa, _) = load_dataset_comm(&ds, &comm, &opts(IoChoice::Auto)).unwrap();
        assert_eq!((sm.io, sr.io), (IoPath::Mmap, IoPath::MpiIo));
        // Auto: maps where every rank is on this node (mpirun here), MPI-IO across nodes.
        assert_eq!(
            sa.io,
            if size > 1 && comm.local_size() < size {
                IoPath::MpiIo
            } else {
                IoPath::Mmap
            }
        );
        assert!(sr.read_calls > 0 || r.a.nrows() == 0);
        if let Err(e) = same_system(&m, &r) {
            panic!("{}: rank {rank} of {size}: {e}", ds.display());
        }
        // The same rows as the single-process system, in this rank's global row order.
        let full = load_dataset_with(&ds, 0, 1, &LoadOptions::default())
            .unwrap()
            .0;
        let order = global_row_order(&ds, rank, size, &LoadOptions::default()).unwrap();
        assert_eq!(order.len(), r.a.nrows());
        for (i, &g) in order.iter().enumerate() {
            let (c, v) = r.a.row(i);
            let (fc, fv) = full.a.row(g as usize);
            assert!(
                c == fc && v == fv && r.b[i].to_bits() == full.b[g as usize].to_bits(),
                "{}: rank {rank} of {size}: local row {i} != global row {g}",
                ds.display()
            );
        }
        n += 1;
    }
    println!("rank {rank} of {size}: {n} datasets identical");
}

fn invert_cfg(dir: &Path, tag: &str, ds: &Path, io: &str) -> PathBuf {
    let p = dir.join(format!("{tag}.toml"));
    std::fs::write(
        &p,
        format!(
            "[dataset]\npath = {:?}\nio = \"{io}\"\n[solver]\natol = 1e-12\nbtol = 1e-12\n\
             [backend]\nkind = \"cpu\"\n[output]\ndir = {:?}\nmodel = \"\"\n",
            ds.display().to_string(),
            dir.join(tag).display().to_string()
        ),
    )
    .unwrap();
    p
}

/// `invert` on 1-4 ranks: reading the rows through MPI-IO or memory maps gives the very same
/// solution, and report.json says which path was taken.
#[cfg(feature = "mpi")]
#[test]
fn invert_solution_is_the_same_through_mpiio_and_mmap() {
    let Some(dir) = mpi_dir("mpiio-invert") else {
        return;
    };
    let ds = data("demo");
    for np in 1..=4 {
        let mut xs = Vec::new();
        for io in ["mmap", "mpiio", "auto"] {
            let tag = format!("np{np}-{io}");
            let mut c = mpirun(np);
            c.arg(BIN)
                .arg("invert")
                .arg(invert_cfg(&dir, &tag, &ds, io));
            let out = finish(c);
            assert!(out.status.success(), "{tag}: {}", text(&out));
            let rep: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join(&tag).join("report.json")).unwrap(),
            )
            .unwrap();
            // Auto: maps, every rank being on this one node (MPI-IO only across nodes:
            // `IoChoice::resolve`'s unit test).
            let want = match io {
                "auto" => "mmap",
                other => other,
            };
            assert_eq!(rep["load_io"], want, "{tag}");
            if np > 1 {
                let via = if want == "mpiio" {
                    "through MPI-IO"
                } else {
                    "through memory maps"
                };
                assert_eq!(text(&out).matches(via).count(), 1, "{tag}: {}", text(&out));
            }
            xs.push(std::fs::read_to_string(dir.join(&tag).join("solution.txt")).unwrap());
        }
        assert!(
            xs.iter().all(|x| *x == xs[0]),
            "np {np}: solutions differ between mmap and MPI-IO"
        );
    }
}

/// A kernel pack cut short, read through MPI-IO on one rank (and on two): the job ends, exit
/// status not 0, with one error line naming the file.
#[cfg(feature = "mpi")]
#[test]
fn truncated_pack_through_mpiio_ends_the_job_naming_the_file() {
    let Some((dir, ds)) = mpi_truncated_demo("mpiio-truncated", 100) else {
        return;
    };
    for np in [1, 2] {
        let names = ["pack_00000.bin", "truncated"];
        failed_invert(&dir, &format!("np{np}"), &ds, "mpiio", np, &names);
    }
    // A per-row file cut short: the MPI read comes back short.
    let (pr, name) = truncated_per_row(&dir);
    for np in [1, 2] {
        let names = [name.as_str(), "kernel row 123"];
        failed_invert(&dir, &format!("row-np{np}"), &pr, "mpiio", np, &names);
    }
}

/// Run `invert` on `np` ranks expecting failure: the exit status is not 0, exactly one error
/// line is printed, which holds every one of `names`, and no solution is written.
#[cfg(feature = "mpi")]
fn failed_invert(dir: &Path, tag: &str, ds: &Path, io: &str, np: usize, names: &[&str]) {
    let mut c = mpirun(np);
    c.arg(BIN).arg("invert").arg(invert_cfg(dir, tag, ds, io));
    let out = finish(c);
    let t = text(&out);
    assert!(!out.status.success(), "{tag}: job succeeded: {t}");
    let line = the_error_line(&t, tag);
    assert!(names.iter().all(|n| line.contains(n)), "{tag}: {t}");
    assert!(!dir.join(tag).join("solution.txt").exists(), "{tag}");
}

/// The metadata file (read by rank 0 alone and broadcast) cut short: every rank learns of it and
/// the job ends with one error line naming the file, on 1 to 3 ranks.
#[cfg(feature = "mpi")]
#[test]
fn broken_metadata_read_on_rank_0_ends_the_job_naming_the_file() {
    // a copy of demo with an intact pack and a metadata file 8 bytes short
    let Some((dir, ds)) = mpi_truncated_demo("mpiio-metadata", 0) else {
        return;
    };
    cut_short(&ds.join("metadata.bin"), 8);
    for np in [1, 2, 3] {
        failed_invert(
            &dir,
            &format!("meta-np{np}"),
            &ds,
            "auto",
            np,
            &["metadata.bin"],
        );
    }
}
