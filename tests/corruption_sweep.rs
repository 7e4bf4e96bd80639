//! Corruption sweep (issue 16, item 5): for each binary file kind of a dataset, in format
//! versions 3, 2 and 1 and both layouts, every truncation point in the header and the tables,
//! every single-byte flip in the header and random bit flips in the body; the same for the
//! Matrix Market, .npy and PETSc readers over a small corpus. Every case runs under
//! `catch_unwind` on its own thread with a time bound: it must end in `Err` (or, for a version 1
//! body flip and for the text/npy/PETSc readers, a finite value), never a panic, an abort or a
//! hang. The count of cases is printed. Issue 35: every binary file of a version 3 dataset
//! replaced by the same file of a sibling dataset (same shape and values, another dataset id)
//! is refused by every reader, naming the file.

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use seistomo::grid::synthetic as synth;
use seistomo::grid::Grid;
use seistomo::io::dataset::binfmt::Precision;
use seistomo::io::dataset::manifest::Layout;
use seistomo::io::dataset::{load_dataset_with, write_dataset, DatasetSpec, LoadOptions};
use seistomo::io::mtx;
use seistomo::io::rowio::IoChoice;
use seistomo::sparse::Csr;

/// How one case ended (the strings are shown in failure reports).
#[derive(Debug)]
#[allow(dead_code)]
enum Outcome {
    Err(String),
    Finite,
    NonFinite,
    Panic(String),
    Hang,
}

/// Run `f` on its own thread under `catch_unwind`, waiting at most 30 s.
fn guarded<F: FnOnce() -> Outcome + Send + 'static>(f: F) -> Outcome {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let _ = tx.send(match r {
            Ok(o) => o,
            Err(p) => Outcome::Panic(
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        });
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or(Outcome::Hang)
}

fn finite(vals: &[f64]) -> Outcome {
    if vals.iter().all(|v| v.is_finite()) {
        Outcome::Finite
    } else {
        Outcome::NonFinite
    }
}

/// xorshift64.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// The sweep's tally.
#[derive(Default)]
struct Tally {
    cases: usize,
    failures: Vec<String>,
}

impl Tally {
    /// Record `o` for case `what`; `body_v1` allows a finite result.
    fn check(&mut self, what: &str, o: Outcome, allow_ok: bool) {
        self.cases += 1;
        let bad = match &o {
            Outcome::Err(e) => e.contains('\n'),
            Outcome::Finite => !allow_ok,
            Outcome::NonFinite | Outcome::Panic(_) | Outcome::Hang => true,
        };
        if bad && self.failures.len() < 50 {
            self.failures.push(format!("{what}: {o:?}"));
        }
    }
}

/// A tiny dataset: 24 rays on a 4x3x2 grid, damping in 2 blocks, weights, a true model, packs
/// of about 1 KiB.
fn tiny(dir: &Path, layout: Layout, prec: Precision, version: u32) -> PathBuf {
    let g = Grid::new([4, 3, 2], [0.0; 3], [1.0; 3]);
    let k = synth::straight_ray_kernel(&g, 24, 3);
    let m = synth::checkerboard(&g, [2, 2, 1], 0.1);
    let b = synth::travel_times(&k, &m, 0.001, 3);
    let w: Vec<f64> = (0..k.nrows()).map(|i| 1.0 + (i % 3) as f64).collect();
    let reg = seistomo::grid::regularisation(&g, 0.1, [0.5, 0.0, 0.0], [0.0; 3]);
    let mut spec = DatasetSpec::new(&k, &b);
    spec.weights = Some(&w);
    spec.damping = Some(&reg);
    spec.damping_blocks = 2;
    spec.grid = Some(g);
    spec.true_model = Some(&m);
    spec.layout = layout;
    spec.precision = prec;
    spec.pack_bytes = 1024;
    spec.version = version;
    write_dataset(dir, &spec, false).unwrap();
    dir.to_path_buf()
}

fn u64_at(b: &[u8], off: usize) -> usize {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap()) as usize
}

/// The dataset's binary files with the length of their header and of header + tables.
fn files(ds: &Path, layout: Layout, version: u32) -> Vec<(PathBuf, usize, usize)> {
    let v2 = usize::from(version >= 2) * 8;
    // The prefix: 16 bytes, 32 from version 3 (the dataset id and a reserved u64).
    let p = seistomo::io::dataset::binfmt::prefix_len(version);
    let mut out = Vec::new();
    let meta = ds.join("metadata.bin");
    let mb = std::fs::read(&meta).unwrap();
    out.push((meta, p + 32 + v2, p + 32 + v2 + 32 * u64_at(&mb, p)));
    match layout {
        Layout::Packed => {
            let f = ds.join("kernel/pack_00000.bin");
            let pb = std::fs::read(&f).unwrap();
            out.push((f, p + 32, p + 32 + 24 * u64_at(&pb, p + 8)));
        }
        Layout::PerRow => out.push((ds.join("kernel/row_0000000003.bin"), p, p + 16)),
    }
    let d = ds.join("damping/block_0001.bin");
    let db = std::fs::read(&d).unwrap();
    out.push((d, p + 40 + v2, p + 40 + v2 + 8 * (u64_at(&db, p + 16) + 1)));
    for v in ["b.bin", "weights.bin", "true_model.bin"] {
        out.push((ds.join(v), p + 16, p + 16));
    }
    out
}

/// Every way of reading a dataset: memory maps, byte ranges, and `verify` (only `verify` when
/// `verify_only`: the true model is not part of a load).
fn read_all(ds: &Path, verify_only: bool) -> Vec<Outcome> {
    let mut out = Vec::new();
    let ios: &[IoChoice] = if verify_only {
        &[]
    } else {
        &[IoChoice::Mmap, IoChoice::MpiIo]
    };
    for &io in ios {
        let opts = LoadOptions {
            io,
            ..Default::default()
        };
        let p = ds.to_path_buf();
        out.push(guarded(move || match load_dataset_with(&p, 0, 1, &opts) {
            Err(e) => Outcome::Err(e.to_string()),
            Ok((s, _)) => {
                let mut all = s.a.data().to_vec();
                all.extend_from_slice(&s.b);
                finite(&all)
            }
        }));
    }
    let p = ds.to_path_buf();
    out.push(guarded(
        move || match seistomo::io::dataset::verify::verify_dataset(&p, false) {
            Err(e) => Outcome::Err(e.to_string()),
            Ok(_) => Outcome::Finite,
        },
    ));
    out
}

fn sweep_datasets(t: &mut Tally) {
    let dir = common::scratch("sweep");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for version in [3u32, 2, 1] {
        for (layout, prec) in [
            (Layout::Packed, Precision::F64),
            (Layout::PerRow, Precision::F32),
        ] {
            let ds = tiny(
                &dir.join(format!("v{version}-{layout:?}")),
                layout,
                prec,
                version,
            );
            // The intact dataset loads.
            for o in read_all(&ds, false) {
                assert!(matches!(o, Outcome::Finite), "intact: {o:?}");
            }
            for (path, header, tables) in files(&ds, layout, version) {
                let pristine = std::fs::read(&path).unwrap();
                let name = format!(
                    "v{version} {layout:?} {}",
                    path.strip_prefix(&ds).unwrap().display()
                );
                let verify_only = path.ends_with("true_model.bin");
                let case = |what: String, bytes: &[u8], allow_ok: bool, t: &mut Tally| {
                    std::fs::write(&path, bytes).unwrap();
                    for o in read_all(&ds, verify_only) {
                        t.check(&what, o, allow_ok);
                    }
                };
                // Every truncation point in the header and the tables, and a few in the body.
                let mut cuts: Vec<usize> = (0..tables.min(pristine.len())).collect();
                if pristine.len() > tables {
                    cuts.extend((0..8).map(|_| tables + rng.below(pristine.len() - tables)));
                }
                for cut in cuts {
                    case(format!("{name} cut at {cut}"), &pristine[..cut], false, t);
                }
                // Every single-byte flip in the header (two patterns).
                for at in 0..header {
                    for x in [0xffu8, 0x01] {
                        let mut b = pristine.clone();
                        b[at] ^= x;
                        case(format!("{name} byte {at} ^ {x:#x}"), &b, false, t);
                    }
                }
                // Random bit flips after the header (tables and body): version 1 may load them
                // as finite values (a row table entry or a damping row offset that stays
                // consistent is undetectable without checksums); versions 2 and 3 must refuse
                // every one.
                for _ in 0..24 {
                    let at = header + rng.below(pristine.len() - header);
                    let bit = 1u8 << rng.below(8);
                    let mut b = pristine.clone();
                    b[at] ^= bit;
                    case(format!("{name} bit flip at {at}"), &b, version == 1, t);
                }
                std::fs::write(&path, &pristine).unwrap();
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One reader of the text/npy/PETSc corpus: the file's path → outcome.
type ReadFn = fn(&Path) -> Outcome;

fn sweep_other_readers(t: &mut Tally) {
    let dir = common::scratch("sweep-other");
    std::fs::create_dir_all(&dir).unwrap();
    let mut corpus: Vec<(PathBuf, ReadFn)> = Vec::new();
    let matrix: ReadFn = |p| match mtx::read_matrix(p) {
        Err(e) => Outcome::Err(e.to_string()),
        Ok(a) => finite(a.data()),
    };
    let vector: ReadFn = |p| match mtx::read_vector(p) {
        Err(e) => Outcome::Err(e.to_string()),
        Ok(x) => finite(&x),
    };
    for (name, text) in [
        (
            "g.mtx",
            "%%MatrixMarket matrix coordinate real general\n% c\n3 4 4\n1 1 1.5\n2 3 -2e0\n3 4 7\n1 2 0.25\n",
        ),
        (
            "s.mtx",
            "%%MatrixMarket matrix coordinate integer symmetric\n3 3 3\n1 1 3\n2 1 4\n3 2 -1\n",
        ),
        (
            "p.mtx",
            "%%MatrixMarket matrix coordinate pattern general\n2 3 2\n2 1\n1 3\n",
        ),
        (
            "a.mtx",
            "%%MatrixMarket matrix array real general\n2 2\n1\n2.5\n-3\n4e1\n",
        ),
        (
            "k.mtx",
            "%%MatrixMarket matrix array real skew-symmetric\n3 3\n1\n2\n3\n",
        ),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        corpus.push((p, matrix));
    }
    let v = dir.join("v.mtx");
    std::fs::write(
        &v,
        "%%MatrixMarket matrix array real general\n3 1\n1\n2.5\n-3\n",
    )
    .unwrap();
    corpus.push((v, vector));
    let a =
        Csr::from_triplets(3, 4, &[0, 2, 2, 1], &[1, 0, 3, 2], &[1.5, -2.0, 1e-3, 4.0]).unwrap();
    let p = dir.join("A.petsc");
    seistomo::io::petsc::write_mat(&p, &a).unwrap();
    corpus.push((p, |p| match seistomo::io::petsc::read_mat(p) {
        Err(e) => Outcome::Err(e.to_string()),
        Ok(a) => finite(a.data()),
    }));
    let p = dir.join("b.petsc");
    seistomo::io::petsc::write_vec(&p, &[1.0, -2.0, 3.5]).unwrap();
    corpus.push((p, |p| match seistomo::io::petsc::read_vec(p) {
        Err(e) => Outcome::Err(e.to_string()),
        Ok(x) => finite(&x),
    }));
    use seistomo::io::npy::{read_npy, write_npy};
    let p = dir.join("d.npy");
    write_npy(&p, &[1.0f64, 2.0, -0.5]).unwrap();
    corpus.push((p, |p| match read_npy::<f64>(p) {
        Err(e) => Outcome::Err(e.to_string()),
        Ok(x) => finite(&x),
    }));
    let p = dir.join("i.npy");
    write_npy(&p, &[0i64, 2, 5]).unwrap();
    corpus.push((p, |p| match read_npy::<i64>(p) {
        Err(e) => Outcome::Err(e.to_string()),
        Ok(_) => Outcome::Finite,
    }));
    let p = dir.join("j.npy");
    write_npy(&p, &[7i32, 1, 0]).unwrap();
    corpus.push((p, |p| match read_npy::<i32>(p) {
        Err(e) => Outcome::Err(e.to_string()),
        Ok(_) => Outcome::Finite,
    }));
    for (path, read) in corpus {
        let pristine = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let case = |what: String, bytes: &[u8], t: &mut Tally| {
            std::fs::write(&path, bytes).unwrap();
            let p = path.clone();
            t.check(&what, guarded(move || read(&p)), true);
        };
        // Every truncation point; every byte flipped (XOR 0xff) and set to '9' (big numbers)
        // and to a space (split tokens).
        for cut in 0..pristine.len() {
            case(format!("{name} cut at {cut}"), &pristine[..cut], t);
        }
        let changes: [fn(u8) -> u8; 3] = [|b| b ^ 0xff, |_| b'9', |_| b' '];
        for at in 0..pristine.len() {
            for f in changes {
                let mut b = pristine.clone();
                b[at] = f(b[at]);
                case(format!("{name} byte {at} changed"), &b, t);
            }
        }
        std::fs::write(&path, &pristine).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every binary file of a version 3 dataset replaced by its twin from a sibling dataset (the
/// same spec written twice: the same bytes but for the dataset id): every reader refuses it,
/// naming the file and "another dataset". A version 2 dataset has no id: the same copy loads
/// (which is what version 3 is for).
fn sweep_siblings(t: &mut Tally) {
    let dir = common::scratch("sweep-sibling");
    for layout in [Layout::Packed, Layout::PerRow] {
        for version in [3u32, 2] {
            let name = format!("v{version}-{layout:?}");
            let ds = tiny(&dir.join(&name), layout, Precision::F64, version);
            let sib = tiny(
                &dir.join(format!("{name}-sibling")),
                layout,
                Precision::F64,
                version,
            );
            for (path, ..) in files(&ds, layout, version) {
                let rel = path.strip_prefix(&ds).unwrap().to_path_buf();
                let pristine = std::fs::read(&path).unwrap();
                let twin = std::fs::read(sib.join(&rel)).unwrap();
                assert_eq!(pristine.len(), twin.len(), "{}", rel.display());
                std::fs::write(&path, &twin).unwrap();
                let what = format!("{name} {} copied from the sibling", rel.display());
                for o in read_all(&ds, rel.ends_with("true_model.bin")) {
                    t.cases += 1;
                    let ok = match (&o, version) {
                        (Outcome::Err(e), 3) => {
                            e.contains(&*rel.to_string_lossy())
                                && e.contains("another dataset")
                                && !e.contains('\n')
                        }
                        (Outcome::Finite, 2) => true,
                        _ => false,
                    };
                    if !ok {
                        t.failures.push(format!("{what}: {o:?}"));
                    }
                }
                std::fs::write(&path, &pristine).unwrap();
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_truncation_and_flip_ends_in_an_error_or_a_finite_value() {
    let mut t = Tally::default();
    sweep_datasets(&mut t);
    sweep_siblings(&mut t);
    let datasets = t.cases;
    sweep_other_readers(&mut t);
    println!(
        "corruption sweep: {} cases ({datasets} on dataset files, {} on Matrix Market, .npy and PETSc files); {} failed",
        t.cases,
        t.cases - datasets,
        t.failures.len()
    );
    assert!(
        t.failures.is_empty(),
        "{} failures:\n{}",
        t.failures.len(),
        t.failures.join("\n")
    );
}
