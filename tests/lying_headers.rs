//! Issue 16, items 1 and 3: every reader refuses a header that declares more than its file
//! holds with one line naming the file and the numbers, before allocating for it (the Matrix
//! Market bomb's peak memory is measured with /usr/bin/time where it exists); dataset format 2
//! refuses a flipped bit naming the file, the row and "checksum mismatch"; `seistomo verify`;
//! version 1 datasets stay readable.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use seistomo::grid::synthetic as synth;
use seistomo::grid::Grid;
use seistomo::io::dataset::binfmt::{crc, Precision};
use seistomo::io::dataset::manifest::Layout;
use seistomo::io::dataset::{load_dataset, write_dataset, DatasetSpec};
use seistomo::sparse::Csr;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_seistomo"))
}

/// Run the CLI (under `/usr/bin/time -v` when present): exit status 1, exactly one line on
/// stderr that starts with "seistomo: error" and contains every one of `want`; returns the
/// peak resident memory in KiB when measured.
fn fails_in_one_line(args: &[&str], want: &[&str]) -> Option<u64> {
    let timed = Path::new("/usr/bin/time").is_file();
    let out = if timed {
        Command::new("/usr/bin/time")
            .arg("-v")
            .arg(env!("CARGO_BIN_EXE_seistomo"))
            .args(args)
            .output()
            .unwrap()
    } else {
        bin().args(args).output().unwrap()
    };
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("seistomo:")).collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    for w in want {
        assert!(
            lines[0].contains(w),
            "{args:?}: missing '{w}' in {}",
            lines[0]
        );
    }
    if timed {
        assert!(
            err.contains("Exit status: 1"),
            "{args:?}: not exit status 1: {err}"
        );
        err.lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("Maximum resident set size (kbytes): ")
            })
            .and_then(|v| v.trim().parse().ok())
    } else {
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        None
    }
}

#[test]
fn matrix_market_bomb_is_one_line_and_small() {
    let dir = common::scratch("bomb");
    std::fs::create_dir_all(&dir).unwrap();
    let bomb = dir.join("bomb.mtx");
    std::fs::write(
        &bomb,
        "%%MatrixMarket matrix coordinate real general\n2000000000 1000 100000000000\n1 1 1.0\n",
    )
    .unwrap();
    let b = bomb.to_str().unwrap();
    let kib = fails_in_one_line(&["solve", "--matrix", b], &["bomb.mtx", "100000000000"]);
    if let Some(kib) = kib {
        println!("matrix market bomb: peak resident memory {kib} KiB");
        assert!(kib < 100 << 10, "peak memory {kib} KiB");
    }
    // Compressed: the same header is refused by the memory plan (the reader cannot know the
    // file's length, and would otherwise grow as it reads).
    let gz = dir.join("bomb.mtx.gz");
    {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::fast(),
        );
        e.write_all(&std::fs::read(&bomb).unwrap()).unwrap();
        e.finish().unwrap();
    }
    let kib = fails_in_one_line(
        &["solve", "--matrix", gz.to_str().unwrap()],
        &["bomb.mtx.gz", "100000000000"],
    );
    if let Some(kib) = kib {
        assert!(kib < 100 << 10, "peak memory {kib} KiB");
    }
    // More entries than cells, and an array larger than its file.
    let solve_refuses = |name: &str, text: &str, want: &[&str]| {
        let m = dir.join(name);
        std::fs::write(&m, text).unwrap();
        fails_in_one_line(&["solve", "--matrix", m.to_str().unwrap()], want);
    };
    solve_refuses(
        "cells.mtx",
        "%%MatrixMarket matrix coordinate real general\n2 2 5\n1 1 1\n",
        &["cells.mtx:2:", "5 entries", "4 cells"],
    );
    solve_refuses(
        "arr.mtx",
        "%%MatrixMarket matrix array real general\n100000 100000\n1\n",
        &["arr.mtx:2:", "10000000000 values"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn npy_and_petsc_lying_headers_are_refused() {
    let dir = common::scratch("lying-npy");
    std::fs::create_dir_all(&dir).unwrap();
    // .npy: a shape of 10^12 elements over 16 bytes of data.
    let p = dir.join("x.npy");
    let mut bytes = seistomo::io::npy::header("<f8", 1_000_000_000_000);
    bytes.extend_from_slice(&[0u8; 16]);
    std::fs::write(&p, &bytes).unwrap();
    let e = seistomo::io::npy::read_npy::<f64>(&p)
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.npy") && e.contains("1000000000000"), "{e}");
    // PETSc Mat: 2^31 - 1 rows and nonzeros declared, a few bytes present.
    let p = dir.join("A.petsc");
    let mut b = Vec::new();
    for v in [1_211_216i32, i32::MAX, 10, i32::MAX] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b.extend_from_slice(&[0u8; 12]);
    std::fs::write(&p, &b).unwrap();
    let e = seistomo::io::petsc::read_mat(&p).unwrap_err().to_string();
    assert!(
        e.contains("A.petsc") && e.contains(&i32::MAX.to_string()),
        "{e}"
    );
    // PETSc Vec.
    let p = dir.join("b.petsc");
    let mut b = Vec::new();
    for v in [1_211_214i32, 1_000_000_000] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    std::fs::write(&p, &b).unwrap();
    let e = seistomo::io::petsc::read_vec(&p).unwrap_err().to_string();
    assert!(e.contains("b.petsc") && e.contains("1000000000"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A dataset with few rows but 2^32 columns (so that a row may claim billions of nonzeros).
fn wide_dataset(dir: &Path, layout: Layout, version: u32) -> PathBuf {
    let n = 1usize << 32;
    let k = Csr::from_triplets(
        4,
        n,
        &[0, 1, 2, 3, 3],
        &[5, 7, 9, 11, n as u64 - 1],
        &[1.0, 2.0, 3.0, 4.0, 5.0],
    )
    .unwrap();
    let b = vec![1.0; 4];
    let mut spec = DatasetSpec::new(&k, &b);
    spec.layout = layout;
    spec.version = version;
    write_dataset(dir, &spec, false).unwrap();
    dir.to_path_buf()
}

/// Set metadata entry 0's nonzeros to `nnz` (and the totals in the header and the manifest),
/// rewriting the version 2 checksums so that only the sizes lie.
fn lie_in_metadata(ds: &Path, nnz: u64, version: u32) {
    let p = ds.join("metadata.bin");
    let mut m = std::fs::read(&p).unwrap();
    // The prefix is 16 bytes, 32 from version 3 (the dataset id).
    let q = seistomo::io::dataset::binfmt::prefix_len(version);
    let fields = q + 32;
    let head = if version >= 2 { fields + 8 } else { fields };
    let rows = u64::from_le_bytes(m[q..q + 8].try_into().unwrap()) as usize;
    let old = u64::from_le_bytes(m[head + 8..head + 16].try_into().unwrap());
    let total = u64::from_le_bytes(m[q + 16..q + 24].try_into().unwrap()) - old + nnz;
    m[head + 8..head + 16].copy_from_slice(&nnz.to_le_bytes());
    m[q + 16..q + 24].copy_from_slice(&total.to_le_bytes());
    if version >= 2 {
        let c = crc(&m[..fields]);
        m[fields..fields + 4].copy_from_slice(&c.to_le_bytes());
        let end = head + 32 * rows;
        let c = crc(&m[head..end]);
        m[end..end + 4].copy_from_slice(&c.to_le_bytes());
    }
    std::fs::write(&p, m).unwrap();
    let t = ds.join("dataset.toml");
    let text = std::fs::read_to_string(&t).unwrap();
    let text = text
        .lines()
        .map(|l| {
            if l.starts_with("kernel_nnz") {
                format!("kernel_nnz = {total}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&t, text).unwrap();
}

#[test]
fn dataset_files_with_lying_sizes_are_refused_before_allocating() {
    let dir = common::scratch("lying-dataset");
    for version in [3u32, 2, 1] {
        for layout in [Layout::Packed, Layout::PerRow] {
            let ds = wide_dataset(&dir.join(format!("v{version}-{layout:?}")), layout, version);
            // Metadata: row 0 claims 4e9 nonzeros (48 GB of CSR arrays).
            lie_in_metadata(&ds, 4_000_000_000, version);
            let d = ds.to_str().unwrap();
            let kib = fails_in_one_line(&["inspect", d, "--load"], &[".bin", "400000000"]);
            if let Some(kib) = kib {
                assert!(kib < 100 << 10, "v{version} {layout:?}: peak {kib} KiB");
            }
            for io in ["mmap", "mpiio"] {
                fails_in_one_line(&["inspect", d, "--load", "--io", io], &[".bin"]);
            }
        }
    }
    // Vector and damping headers declaring 2^40 values / rows.
    let g = Grid::new([3, 3, 2], [0.0; 3], [1.0; 3]);
    let k = synth::straight_ray_kernel(&g, 10, 1);
    let b = vec![0.5; 10];
    let reg = seistomo::grid::regularisation(&g, 0.1, [0.0; 3], [0.0; 3]);
    for version in [3u32, 2, 1] {
        let ds = dir.join(format!("small-v{version}"));
        let mut spec = DatasetSpec::new(&k, &b);
        spec.damping = Some(&reg);
        spec.version = version;
        write_dataset(&ds, &spec, false).unwrap();
        let q = seistomo::io::dataset::binfmt::prefix_len(version);
        for (file, off, what) in [
            ("b.bin", q, "b.bin"),
            ("damping/block_0000.bin", q + 16, "block_0000.bin"),
        ] {
            let p = ds.join(file);
            let pristine = std::fs::read(&p).unwrap();
            let mut bytes = pristine.clone();
            bytes[off..off + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
            if version >= 2 {
                // Checksum rewritten: only the size lies.
                let (range, at) = if file == "b.bin" {
                    (0..q + 12, q + 12)
                } else {
                    (0..q + 40, q + 40)
                };
                let c = crc(&bytes[range]);
                bytes[at..at + 4].copy_from_slice(&c.to_le_bytes());
            }
            std::fs::write(&p, &bytes).unwrap();
            let e = load_dataset(&ds, 0, 1).unwrap_err().to_string();
            assert!(
                e.contains(what) && !e.contains('\n'),
                "v{version} {file}: {e}"
            );
            std::fs::write(&p, &pristine).unwrap();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small synthetic dataset in `version`.
fn small(dir: &Path, layout: Layout, version: u32) -> PathBuf {
    let g = Grid::new([6, 5, 4], [0.0; 3], [1.0; 3]);
    let k = synth::straight_ray_kernel(&g, 200, 2);
    let m = synth::checkerboard(&g, [2, 2, 2], 0.1);
    let b = synth::travel_times(&k, &m, 0.001, 2);
    let reg = seistomo::grid::regularisation(&g, 0.1, [0.5, 0.0, 0.5], [0.0; 3]);
    let mut spec = DatasetSpec::new(&k, &b);
    spec.damping = Some(&reg);
    spec.damping_blocks = 2;
    spec.grid = Some(g);
    spec.true_model = Some(&m);
    spec.layout = layout;
    spec.precision = Precision::F64;
    spec.pack_bytes = 8192;
    spec.version = version;
    write_dataset(dir, &spec, false).unwrap();
    dir.to_path_buf()
}

/// Byte offset (file, offset of its record) of metadata entry 0's row and its row index.
fn first_row_record(ds: &Path, version: u32, layout: Layout) -> (PathBuf, usize, u64, usize) {
    let m = std::fs::read(ds.join("metadata.bin")).unwrap();
    let head = if version >= 2 { 56 } else { 48 };
    let at = |o: usize| u64::from_le_bytes(m[o..o + 8].try_into().unwrap());
    let (row, nnz, file, off) = (at(head), at(head + 8), at(head + 16), at(head + 24));
    let path = match layout {
        Layout::Packed => ds.join(format!("kernel/pack_{file:05}.bin")),
        Layout::PerRow => ds.join(format!("kernel/row_{row:010}.bin")),
    };
    (path, off as usize, row, nnz as usize)
}

#[test]
fn a_flipped_value_bit_is_a_checksum_mismatch_in_version_2_only() {
    let dir = common::scratch("flip");
    for layout in [Layout::Packed, Layout::PerRow] {
        let v2 = small(&dir.join(format!("v2-{layout:?}")), layout, 2);
        let v1 = small(&dir.join(format!("v1-{layout:?}")), layout, 1);
        // Both versions hold the same system, and both verify.
        let (s2, s1) = (
            load_dataset(&v2, 0, 1).unwrap(),
            load_dataset(&v1, 0, 1).unwrap(),
        );
        assert_eq!(s2.a, s1.a);
        assert_eq!(s2.b, s1.b);
        for (ds, says) in [(&v2, "every checksum matches"), (&v1, "no checksums")] {
            let out = bin().arg("verify").arg(ds).output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains(says));
        }
        // The lowest mantissa bit of the row's first value: still finite.
        for (ds, version) in [(&v2, 2u32), (&v1, 1)] {
            let (path, off, row, nnz) = first_row_record(ds, version, layout);
            let at = off + 16 + 4 * nnz.div_ceil(2) * 2;
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[at] ^= 1;
            std::fs::write(&path, &bytes).unwrap();
            let fname = path.file_name().unwrap().to_string_lossy().into_owned();
            if version == 2 {
                let e = load_dataset(ds, 0, 1).unwrap_err().to_string();
                assert!(
                    e.contains(&fname)
                        && e.contains(&format!("kernel row {row}"))
                        && e.contains("checksum mismatch"),
                    "{e}"
                );
                fails_in_one_line(
                    &["verify", ds.to_str().unwrap()],
                    &[&fname, &format!("kernel row {row}"), "checksum mismatch"],
                );
            } else {
                // Version 1 cannot tell: the value loads, changed.
                let s = load_dataset(ds, 0, 1).unwrap();
                assert_ne!(s.a, s1.a);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
