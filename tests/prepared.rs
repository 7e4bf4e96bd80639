//! Prepared storage that lasts (issue: time to solution, item 2): `seistomo prepare` keeps a
//! dataset's set-up, the next `invert` reads it and gives the fresh run's solution bit for bit;
//! a file made from other rows, other options or another format version, or a damaged one, is
//! not used (the run sets up from the rows and says why) and `verify` refuses a damaged one.

mod common;

use std::path::{Path, PathBuf};

use common::{on_thread_ranks, seistomo, synth_dataset};
use seistomo::backend::storage::StoredRows;
use seistomo::comm::SerialComm;
use seistomo::pipeline::config::RunConfig;
use seistomo::pipeline::invert::{run_lsqr, LsqrRun};
use seistomo::pipeline::operators::row_cost;
use seistomo::pipeline::options::SystemSource;
use seistomo::pipeline::options::{BackendChoice, OutputPaths};
use seistomo::pipeline::prepared::{file_of, prepare_dataset, reuse, Asked};
use seistomo::sparse::Precision;

/// A run config of `dataset` with `extra` TOML lines, writing into `out`.
fn config(dataset: &Path, name: &str, extra: &str, out: &Path) -> PathBuf {
    // (beside the outputs, in the test's scratch folder)
    let p = out.with_file_name(format!("{name}.toml"));
    std::fs::write(
        &p,
        format!(
            "[dataset]\npath = \"{}\"\n[solver]\natol = 1e-10\nbtol = 1e-10\niter_lim = 60\n{extra}\n[output]\ndir = \"{}\"\n",
            dataset.join("dataset.toml").display(),
            out.display()
        ),
    )
    .unwrap();
    p
}

/// Run `seistomo ARGS` and return (status ok, stdout + stderr).
fn run(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let o = seistomo().args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

/// `invert CONFIG`: the solution's bytes and report.json's `prepared`.
fn invert(cfg: &Path, out: &Path) -> (Vec<u8>, String) {
    let _ = std::fs::remove_dir_all(out);
    let (ok, text) = run(&["-q".as_ref(), "invert".as_ref(), cfg.as_os_str()]);
    assert!(ok, "{text}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    (
        std::fs::read(out.join("solution.txt")).unwrap(),
        report["prepared"].as_str().unwrap_or("").to_string(),
    )
}

fn prepare(cfg: &Path) {
    let (ok, text) = run(&["prepare".as_ref(), cfg.as_os_str()]);
    assert!(ok && text.contains("prepared storage written to"), "{text}");
}

#[test]
fn a_prepared_run_gives_the_fresh_solution_bit_for_bit_with_either_storage() {
    let ds = synth_dataset("prepared", "same", "12,10,8", "1500");
    let work = common::scratch("prepared-same-work");
    for (name, extra) in [("csr", ""), ("compact", "[backend]\nstorage = \"compact\"")] {
        let out = work.join(format!("out-{name}"));
        let cfg = config(&ds, name, extra, &out);
        let _ = std::fs::remove_dir_all(ds.join("prepared"));
        let (fresh, note) = invert(&cfg, &out);
        assert_eq!(note, "", "{name}: no prepared file yet");
        prepare(&cfg);
        let (again, note) = invert(&cfg, &out);
        assert!(note.starts_with("used "), "{name}: {note}");
        assert!(
            fresh == again,
            "{name}: the prepared run's solution differs"
        );
        // a second run reads the same file again
        let (third, _) = invert(&cfg, &out);
        assert!(third == fresh, "{name}");
    }
}

#[test]
fn two_ranks_each_read_their_own_prepared_file() {
    let ds = synth_dataset("prepared", "ranks", "12,10,8", "1500");
    let work = common::scratch("prepared-ranks-work");
    let out = work.join("out");
    let cfg_path = config(&ds, "r2", "[backend]\nstorage = \"compact\"", &out);
    let cfg = RunConfig::load(&cfg_path).unwrap();
    let solve = || {
        let run = LsqrRun {
            source: &cfg.system,
            options: &cfg.options,
            outputs: &OutputPaths::default(),
            progress_every: 0,
            model: Some((&cfg, false)),
        };
        let mut o = on_thread_ranks(2, |c| run_lsqr(&run, c).unwrap());
        o.remove(0).unwrap()
    };
    let fresh = solve();
    assert_eq!(fresh.report.prepared, "");
    on_thread_ranks(2, |c| {
        prepare_dataset(&cfg, Some(BackendChoice::Cpu), c).unwrap()
    });
    for r in 0..2 {
        assert!(file_of(&ds.join("dataset.toml"), r, 2).exists());
    }
    let again = solve();
    assert!(
        again.report.prepared.starts_with("used "),
        "{}",
        again.report.prepared
    );
    assert_eq!(again.solution.x, fresh.solution.x);
    assert_eq!(again.solution.info.itn, fresh.solution.info.itn);
    // one rank's run has no file of its own: set up from the rows, no note
    let (_, note) = invert(&cfg_path, &out);
    assert_eq!(note, "");
}

#[test]
fn a_file_prepared_for_the_gpu_keeps_its_encoding_and_reads_the_rows_only_when_asked() {
    // No GPU needed: `prepare` encodes on the CPU, and reading a file back is I/O.
    let ds = synth_dataset("prepared", "encoded", "16,16,16", "3000");
    let work = common::scratch("prepared-encoded-work");
    let out = work.join("out");
    // By default the GPU encodes the stored rows itself: the file keeps none, a run reads the
    // rows (half the bytes of an encoding).
    let split = "[backend]\nstorage = \"compact\"\n[tuning]\ngpu_layout = \"split\"";
    let plain = RunConfig::load(&config(&ds, "plain", split, &out)).unwrap();
    let w = prepare_dataset(&plain, Some(BackendChoice::Cuda), &SerialComm).unwrap();
    assert!(!w.storage.contains("encoded for the GPU"), "{}", w.storage);
    // A GPU that does not encode (`gpu_encode = false`): the file keeps the encoding.
    let extra = format!("{split}\ngpu_encode = false");
    let cfg_path = config(&ds, "enc", &extra, &out);
    let cfg = RunConfig::load(&cfg_path).unwrap();
    let w = prepare_dataset(&cfg, Some(BackendChoice::Cuda), &SerialComm).unwrap();
    assert!(w.storage.contains("encoded for the GPU"), "{}", w.storage);
    let SystemSource::Dataset { path, options, .. } = &cfg.system else {
        panic!("a dataset config")
    };
    let read = |opts: &seistomo::pipeline::options::SolveOptions| {
        let asked = Asked {
            kind: BackendChoice::Cuda,
            opts,
            load: options,
            row_cost: row_cost(BackendChoice::Cuda, opts.operator.storage),
        };
        let (r, why) = reuse(path, &asked, &SerialComm).unwrap();
        assert!(why.is_none(), "{why:?}");
        r.expect("the file is used")
    };
    let r = read(&cfg.options);
    let StoredRows::Encoded(e) = &r.prepared.matrix.rows else {
        panic!("the encoding is read instead of the rows")
    };
    assert!(r
        .prepared
        .matrix
        .describe(Precision::F64)
        .starts_with("compact (f64 values"));
    // the rows, read when asked for, encode to what the file holds
    let rows = (e.csr)().unwrap();
    assert_eq!(
        (rows.nrows(), rows.ncols(), rows.nnz()),
        (e.nrows, e.ncols, e.nnz)
    );
    let tuning = &cfg.options.operator.tuning;
    let again = seistomo::backend::cuda::encode_ahead(&rows, Precision::F64, tuning).unwrap();
    assert_eq!(e.encoding.key, again.key);
    assert!(e.encoding.ax == again.ax && e.encoding.at == again.at);
    assert!(!e.encoding.ax.a_lcol.is_empty() && e.encoding.ax.b_lseg.is_empty());
    assert!(e.encoding.at.a_lcol.is_empty() && !e.encoding.at.b_lseg.is_empty());
    // another precision: the encoding does not fit, so the rows are read (the same rows)
    let mut f32 = cfg.options.clone();
    f32.operator.precision = Precision::F32;
    let r32 = read(&f32);
    assert_eq!(r32.prepared.matrix.rows.as_csr(), Some(&rows));
    // a run whose GPU encodes (the default) reads the rows, not the kept encoding
    let r_plain = read(&plain.options);
    assert_eq!(r_plain.prepared.matrix.rows.as_csr(), Some(&rows));
    // the CPU's run does not use a file made for the GPU
    let (_, note) = invert(&cfg_path, &out);
    assert!(note.contains("another backend"), "{note}");
}

#[test]
fn stale_or_damaged_prepared_files_are_not_used_and_verify_refuses_damage() {
    let ds = synth_dataset("prepared", "stale", "12,10,8", "1500");
    let work = common::scratch("prepared-stale-work");
    let out = work.join("out");
    let cfg = config(&ds, "csr", "", &out);
    let (fresh, _) = invert(&cfg, &out);
    let file = file_of(&ds.join("dataset.toml"), 0, 1);
    let not_used = |cfg: &Path, why: &str| {
        let (x, note) = invert(cfg, &out);
        assert!(note.starts_with("not used") && note.contains(why), "{note}");
        x
    };
    // other options: prepared for CSR, asked for compact
    prepare(&cfg);
    let compact = config(&ds, "compact", "[backend]\nstorage = \"compact\"", &out);
    not_used(&compact, "another storage");
    // changed rows: a kernel file rewritten (its modification time moves on)
    let pack = std::fs::read_dir(ds.join("kernel"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let f = std::fs::File::options().write(true).open(&pack).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    assert!(not_used(&cfg, "files changed") == fresh);
    // another format version
    prepare(&cfg);
    let good = std::fs::read(&file).unwrap();
    let mut v = good.clone();
    v[18] += 1;
    std::fs::write(&file, &v).unwrap();
    not_used(&cfg, "format version 2");
    // damaged: one flipped bit in the middle of the arrays
    let mut d = good.clone();
    let k = d.len() / 2;
    d[k] ^= 4;
    std::fs::write(&file, &d).unwrap();
    assert!(not_used(&cfg, "checksum mismatch") == fresh);
    let (ok, text) = run(&["verify".as_ref(), ds.as_os_str()]);
    assert!(!ok, "{text}");
    assert!(
        text.trim().lines().count() == 1
            && text.contains("rank0-of-1.prep")
            && text.contains("checksum mismatch"),
        "{text}"
    );
    // intact again: used, and verify says so
    std::fs::write(&file, &good).unwrap();
    let (x, note) = invert(&cfg, &out);
    assert!(note.starts_with("used ") && x == fresh, "{note}");
    let (ok, text) = run(&["verify".as_ref(), ds.as_os_str()]);
    assert!(ok && text.contains("1 prepared-storage file(s)"), "{text}");
    // off: not read at all
    let off = config(&ds, "off", "", &out);
    let t = std::fs::read_to_string(&off).unwrap();
    std::fs::write(&off, t.replace("[solver]", "prepared = \"off\"\n[solver]")).unwrap();
    let (x, note) = invert(&off, &out);
    assert!(note.is_empty() && x == fresh, "{note}");
}

#[test]
fn prepare_refuses_a_matrix_market_system_in_one_line() {
    let dir = common::scratch("prepared-mtx");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cfg = dir.join("mtx.toml");
    std::fs::write(
        &cfg,
        format!(
            "[system]\nmatrix = \"{}\"\nrhs = \"{}\"\n",
            root.join("datasets/australia/G.mtx.gz").display(),
            root.join("datasets/australia/d.txt").display()
        ),
    )
    .unwrap();
    let (ok, text) = run(&["prepare".as_ref(), cfg.as_os_str()]);
    assert!(!ok && text.trim().lines().count() == 1, "{text}");
    assert!(text.contains("not a dataset"), "{text}");
}
