//! Outputs you can trust (issue 18) and inputs never overwritten / one writer per directory
//! (issue 16, items 2 and 4): a full disk (an injected writer that fails after N bytes:
//! `SEISTOMO_FAULT_ENOSPC_AFTER`, which is what CI uses; no mount privileges needed), kill -9 at
//! random points of the output phase (`SEISTOMO_FAULT_KILL_AT`), two runs into one directory,
//! closed pipes, and absurd settings.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::scratch;
use seistomo::io::publish::{check_set, MANIFEST};

use common::{seistomo as bin, stderr};

fn run(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().unwrap()
}

/// A small synthetic dataset (grid 8 x 8 x 4, 400 rays, format version 1) and an invert config writing to `out`
/// with a checkpoint every `every` iterations.
fn setup_every(d: &Path, out: &Path, every: usize) -> PathBuf {
    let ds = d.join("ds");
    let o = run({
        let mut c = bin();
        c.args([
            "synth",
            "--grid",
            "8,8,4",
            "--rays",
            "400",
            "--smoothing",
            "0.1,0.1,0.1",
            // version 1 (no checksums): the tests below patch header fields and expect the
            // field checks, not the checksum, to refuse them
            "--format-version",
            "1",
            "--out",
        ])
        .arg(&ds);
        c
    });
    assert!(o.status.success(), "{}", stderr(&o));
    let cfg = d.join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[dataset]\npath = \"{}\"\n[solver]\natol = 1e-10\nbtol = 1e-10\niter_lim = 60\n\
             [backend]\nkind = \"cpu\"\nthreads = 2\n\
             [output]\ndir = \"{}\"\ncheckpoint_every = {every}\n\
             [model]\nunknowns = \"slowness_perturbation\"\nreference = 2.0\n",
            ds.display(),
            out.display()
        ),
    )
    .unwrap();
    cfg
}

fn setup(d: &Path, out: &Path) -> PathBuf {
    setup_every(d, out, 5)
}

/// A scratch directory NAME holding [`setup_every`]'s dataset and config, which writes to
/// NAME/out: (the directory, out, the config).
fn fresh(name: &str, every: usize) -> (common::Scratch, PathBuf, PathBuf) {
    let d = scratch(name);
    let out = d.join("out");
    let cfg = setup_every(&d, &out, every);
    (d, out, cfg)
}

fn invert(cfg: &Path, env: &[(&str, String)], resume: bool) -> Output {
    let mut c = bin();
    c.arg("invert").arg(cfg);
    if resume {
        c.arg("--resume");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    run(c)
}

/// The run ended by exiting (not by a signal) and left no dot file in `out`.
fn exited_leaving_no_dot_files(o: &Output, out: &Path, what: &str) {
    assert!(
        o.status.code().is_some(),
        "{what}: killed by signal {:?}: {}",
        o.status.signal(),
        stderr(o)
    );
    assert!(
        dot_files(out).is_empty(),
        "{what}: left {:?}",
        dot_files(out)
    );
}

fn dot_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') || n.starts_with("checkpoint"))
        .collect()
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    read_files(dir, false)
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the fault-injection feature (make test turns it on)"
)]
fn a_full_disk_at_any_fill_level_leaves_the_old_set_or_a_complete_new_one() {
    let (d, out, cfg) = fresh("enospc", 0);
    let first = invert(&cfg, &[], false);
    assert!(first.status.success(), "{}", stderr(&first));
    let old = check_set(&out).unwrap();
    let old_files = snapshot(&out);
    let total: u64 = old.files.iter().map(|f| f.bytes).sum::<u64>() + 1024;
    let mut levels: Vec<u64> = vec![0, 1, 7, 100, 4096];
    levels.extend((1..=20).map(|k| total * k / 20));
    levels.push(total * 2);
    let (mut ok, mut refused) = (0, 0);
    for &n in &levels {
        let o = invert(
            &cfg,
            &[("SEISTOMO_FAULT_ENOSPC_AFTER", n.to_string())],
            false,
        );
        let err = stderr(&o);
        exited_leaving_no_dot_files(&o, &out, &format!("fill level {n}"));
        assert!(!err.contains("panicked"), "fill level {n}: {err}");
        if o.status.success() {
            let m = check_set(&out).unwrap();
            assert_ne!(m.run_id, old.run_id);
            seistomo::model::hdf5::ModelFile::open(&out.join("model.h5")).unwrap();
            ok += 1;
        } else {
            assert_eq!(o.status.code(), Some(1));
            assert_eq!(err.trim_end().lines().count(), 1, "fill level {n}: {err}");
            assert!(
                err.contains("No space left on device"),
                "fill level {n}: {err}"
            );
            assert_eq!(
                check_set(&out).unwrap().run_id,
                old.run_id,
                "fill level {n}"
            );
            assert!(
                snapshot(&out) == old_files,
                "fill level {n}: the old outputs changed"
            );
            refused += 1;
        }
    }
    eprintln!(
        "{} fill levels: {ok} complete new sets, {refused} refused with the old set intact",
        levels.len()
    );
    assert!(ok >= 1 && refused >= 20);
    let _ = std::fs::remove_dir_all(&d);
}

/// What a reader of `dir` sees under the files' names: every name that is not a dot file or a
/// checkpoint, with the bytes it reads (symbolic links followed; a link that leads nowhere is
/// no file).
fn visible(dir: &Path) -> Vec<(String, Vec<u8>)> {
    read_files(dir, true)
}

/// Every file of `dir` with its bytes, sorted by name; `visible_only`: not the dot files and
/// checkpoints, and a name that reads nothing (a dangling link) is left out instead of failing.
fn read_files(dir: &Path, visible_only: bool) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            if visible_only && (n.starts_with('.') || n.starts_with("checkpoint")) {
                return None;
            }
            match std::fs::read(e.path()) {
                Ok(b) => Some((n, b)),
                Err(_) if visible_only => None,
                Err(err) => panic!("{n}: {err}"),
            }
        })
        .collect();
    v.sort();
    v
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the fault-injection feature (make test turns it on)"
)]
fn kill_9_at_every_step_of_publishing_leaves_one_whole_set_and_resume_finishes_it() {
    let (d, out, cfg) = fresh("kill9", 5);
    // The uninterrupted result, and the number of steps of its output phase.
    let o = invert(
        &cfg,
        &[("SEISTOMO_FAULT_KILL_AT", u64::MAX.to_string())],
        false,
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let points: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("publish: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no fault point count in: {err}"));
    let want = std::fs::read(out.join("solution.txt")).unwrap();
    assert!(points >= 20, "only {points} output steps");
    let (mut old_sets, mut new_sets) = (0, 0);
    // Every step of the output phase: staging, preparing, the switch, settling.
    for k in 1..=points {
        let before = check_set(&out).unwrap().run_id;
        let shown = visible(&out);
        let o = invert(&cfg, &[("SEISTOMO_FAULT_KILL_AT", k.to_string())], false);
        assert_eq!(o.status.signal(), Some(9), "step {k}: {}", stderr(&o));
        // One whole set under the files' names, right after the kill: the previous one,
        // byte for byte, or the new one with every file its manifest names.
        let m = check_set(&out).unwrap_or_else(|e| panic!("step {k}: {e}"));
        let now = visible(&out);
        let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
        assert_eq!(names(&now), names(&shown), "step {k}: the names changed");
        if m.run_id == before {
            assert!(now == shown, "step {k}: the previous set changed");
            old_sets += 1;
        } else {
            new_sets += 1;
        }
        assert!(
            out.join("checkpoint.bin").is_file(),
            "step {k}: no checkpoint to resume from"
        );
        let r = invert(&cfg, &[], true);
        let rerr = stderr(&r);
        assert!(r.status.success(), "step {k}: {rerr}");
        assert_eq!(
            rerr.matches("resumed from the checkpoint").count(),
            1,
            "{rerr}"
        );
        check_set(&out).unwrap();
        assert!(
            std::fs::read(out.join("solution.txt")).unwrap() == want,
            "step {k}: the resumed solution differs"
        );
        assert!(
            dot_files(&out).is_empty(),
            "step {k}: left {:?}",
            dot_files(&out)
        );
        for f in std::fs::read_dir(&out).unwrap() {
            let f = f.unwrap();
            assert!(f.file_type().unwrap().is_file(), "step {k}: {:?}", f.path());
        }
    }
    eprintln!(
        "{points} kills, one at each output step: {old_sets} left the previous set, {new_sets} the new one"
    );
    assert!(old_sets > 0 && new_sets > 0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the fault-injection feature (make test turns it on)"
)]
fn two_inverts_into_one_directory_one_stops_at_once_naming_the_other() {
    let (d, out, cfg) = fresh("lock", 5);
    let go = d.join("go");
    let spawn = || {
        let mut c = bin();
        c.arg("invert")
            .arg(&cfg)
            .env("SEISTOMO_FAULT_HOLD_LOCK", &go)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    // Started together; the winner holds the lock until `go` exists.
    let mut a = spawn();
    let mut b = spawn();
    let (loser, winner) = loop {
        if a.try_wait().unwrap().is_some() {
            break (a, b);
        }
        if b.try_wait().unwrap().is_some() {
            break (b, a);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let winner_pid = winner.id();
    let lo = loser.wait_with_output().unwrap();
    std::fs::write(&go, b"").unwrap();
    let wo = winner.wait_with_output().unwrap();
    assert!(wo.status.success(), "{}", stderr(&wo));
    let err = stderr(&lo);
    assert_eq!(lo.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "another seistomo run (pid {winner_pid}) is writing to"
        )) && err.contains(&out.display().to_string()),
        "{err}"
    );
    check_set(&out).unwrap();
    assert!(!out.join(".seistomo.lock").exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_closed_pipe_is_a_quiet_exit() {
    let (d, out, cfg) = fresh("epipe", 5);
    // stdout and stderr are a pipe whose reader is gone before the run starts.
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors; the read end is closed at once, the write end is
    // handed to the child (and closed here when `w` drops).
    let w = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        libc::close(fds[0]);
        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1])
    };
    let w2 = w.try_clone().unwrap();
    let o = bin()
        .args(["invert", "--progress", "1"])
        .arg(&cfg)
        .stdout(Stdio::from(w))
        .stderr(Stdio::from(w2))
        .status()
        .unwrap();
    assert_eq!(o.code(), Some(0), "{o:?}");
    check_set(&out).unwrap();
    // The shell form of the issue: `seistomo invert cfg 2>&1 | head -1`.
    let o = Command::new("bash")
        .arg("-c")
        .arg("\"$0\" invert --progress 1 \"$1\" 2>&1 | head -1; exit ${PIPESTATUS[0]}")
        .arg(env!("CARGO_BIN_EXE_seistomo"))
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(matches!(o.status.code(), Some(0) | Some(141)), "{o:?}");
    assert!(!text.contains("panicked"), "{text}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Expect exit 1 with one stderr line holding every `want`.
fn refused(o: &Output, wants: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for w in wants {
        assert!(err.contains(w), "'{w}' not in: {err}");
    }
}

#[test]
fn an_input_is_never_an_output() {
    let d = scratch("inout");
    // Not even a valid matrix: the refusal comes before A is read.
    let a = d.join("A.mtx");
    std::fs::write(&a, "not a matrix\n").unwrap();
    let o = run({
        let mut c = bin();
        c.args(["solve", "--backend", "cpu", "--matrix"])
            .arg(&a)
            .arg("--solution")
            .arg(&a);
        c
    });
    refused(&o, &["--solution", "is the input --matrix", "A.mtx"]);
    assert_eq!(std::fs::read(&a).unwrap(), b"not a matrix\n");
    // Through a symlink, and solution = report.
    std::os::unix::fs::symlink(&a, d.join("s.txt")).unwrap();
    let o = run({
        let mut c = bin();
        c.args(["solve", "--matrix"])
            .arg(&a)
            .arg("--solution")
            .arg(d.join("s.txt"));
        c
    });
    refused(&o, &["is the input --matrix"]);
    let o = run({
        let mut c = bin();
        c.args(["solve", "--matrix"])
            .arg(&a)
            .arg("--solution")
            .arg(d.join("x.txt"))
            .arg("--report")
            .arg(d.join("x.txt"));
        c
    });
    refused(&o, &["--solution and --report are the same file"]);
    // [output] dir inside the dataset; a report path naming a directory: before the solve.
    let out = d.join("out");
    let cfg = setup(&d, &out);
    let text = std::fs::read_to_string(&cfg).unwrap();
    let inside = d.join("inside.toml");
    std::fs::write(
        &inside,
        text.replace(
            &out.display().to_string(),
            &d.join("ds/out").display().to_string(),
        ),
    )
    .unwrap();
    refused(&invert(&inside, &[], false), &["inside the input dataset"]);
    assert!(!d.join("ds/out").exists());
    std::fs::create_dir_all(out.join("report.json")).unwrap();
    refused(
        &invert(&cfg, &[], false),
        &["report.json", "is an existing directory"],
    );
    assert!(!out.join("solution.txt").exists());
    // export -o into the dataset, plot over its own model.
    let o = run({
        let mut c = bin();
        c.arg("export")
            .arg(d.join("ds"))
            .arg("-o")
            .arg(d.join("ds"));
        c
    });
    refused(&o, &["inside the input dataset"]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn absurd_settings_and_broken_datasets_are_one_line_errors() {
    let (d, out, cfg) = fresh("absurd", 5);
    let text = std::fs::read_to_string(&cfg).unwrap();
    let with = |name: &str, from: &str, to: &str| {
        let p = d.join(name);
        assert!(text.contains(from));
        std::fs::write(&p, text.replace(from, to)).unwrap();
        p
    };
    let o = invert(
        &with("t.toml", "threads = 2", "threads = 100000"),
        &[],
        false,
    );
    refused(&o, &["t.toml", "threads must be in 1..=4096", "100000"]);
    let o = invert(
        &with("d.toml", "iter_lim = 60", "iter_lim = 60\ndamp = 1e300"),
        &[],
        false,
    );
    refused(&o, &["d.toml", "damp must be <= 1e100"]);
    let o = run({
        let mut c = bin();
        c.args(["solve", "--threads", "100000", "--matrix"])
            .arg(d.join("none.mtx"));
        c
    });
    refused(&o, &["--threads must be in 1..=4096"]);
    // Norms that overflow inside the solve: an error, not NaN in report.json.
    let big = d.join("big.mtx");
    std::fs::write(
        &big,
        "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1e300\n2 2 1e-300\n",
    )
    .unwrap();
    let o = run({
        let mut c = bin();
        c.args(["solve", "--backend", "cpu", "--damp", "1e100", "--matrix"])
            .arg(&big)
            .arg("--report")
            .arg(d.join("r.json"));
        c
    });
    refused(&o, &["not finite"]);
    assert!(!d.join("r.json").exists());
    // Grid spacing 0, NaN, negative in the dataset manifest.
    let ds = d.join("ds");
    let manifest = std::fs::read_to_string(ds.join("dataset.toml")).unwrap();
    let line = manifest
        .lines()
        .find(|l| l.starts_with("spacing"))
        .unwrap()
        .to_string();
    for bad in [
        "spacing = [0.0, 1.0, 1.0]",
        "spacing = [nan, 1.0, 1.0]",
        "spacing = [1.0, -1.0, 1.0]",
    ] {
        std::fs::write(ds.join("dataset.toml"), manifest.replace(&line, bad)).unwrap();
        refused(
            &invert(&cfg, &[], false),
            &["dataset.toml", "spacing must be finite and > 0"],
        );
    }
    std::fs::write(ds.join("dataset.toml"), &manifest).unwrap();
    // A directory and a FIFO in place of b.bin.
    let b = ds.join("b.bin");
    let saved = std::fs::read(&b).unwrap();
    std::fs::remove_file(&b).unwrap();
    std::fs::create_dir(&b).unwrap();
    refused(&invert(&cfg, &[], false), &["b.bin", "is a directory"]);
    std::fs::remove_dir(&b).unwrap();
    let st = Command::new("mkfifo").arg(&b).status().unwrap();
    assert!(st.success());
    refused(&invert(&cfg, &[], false), &["b.bin", "not a regular file"]);
    std::fs::remove_file(&b).unwrap();
    std::fs::write(&b, saved).unwrap();
    // A pack file count that cannot fit the rows.
    let meta = ds.join("metadata.bin");
    let bytes = std::fs::read(&meta).unwrap();
    for f in [1u64 << 40, u64::MAX] {
        let mut m = bytes.clone();
        m[40..48].copy_from_slice(&f.to_le_bytes());
        std::fs::write(&meta, &m).unwrap();
        refused(&invert(&cfg, &[], false), &["metadata.bin", "file count"]);
    }
    std::fs::write(&meta, &bytes).unwrap();
    let o = invert(&cfg, &[], false);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join(MANIFEST).is_file());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the fault-injection feature (make test turns it on)"
)]
fn export_on_a_full_disk_leaves_no_directory_and_a_losing_synth_no_partial() {
    let (d, _, _) = fresh("export", 5);
    let npy = d.join("npy");
    let o = run({
        let mut c = bin();
        c.arg("export")
            .arg(d.join("ds"))
            .args(["--format", "npy", "-o"])
            .arg(&npy);
        c.env("SEISTOMO_FAULT_ENOSPC_AFTER", "5000");
        c
    });
    refused(&o, &["No space left on device"]);
    assert!(!npy.exists(), "export left a partial directory");
    // Two synths racing for one directory: whoever loses leaves no partial directory.
    let taken = d.join("taken");
    let synth = || {
        let mut c = bin();
        c.args(["synth", "--grid", "16,16,8", "--rays", "3000", "--out"])
            .arg(&taken)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let (a, b) = (synth(), synth());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(
        a.status.success() || b.status.success(),
        "{} {}",
        stderr(&a),
        stderr(&b)
    );
    let left: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Unmounts on drop (also when an assertion fails).
struct Mounted(PathBuf);
impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The same on a real 400 KiB tmpfs, where the test may mount one (root with CAP_SYS_ADMIN);
/// elsewhere it says so and returns (CI relies on the injected writer above).
#[test]
fn a_real_tiny_tmpfs_at_many_fill_levels() {
    let d = scratch("tmpfs");
    let fs = d.join("fs");
    std::fs::create_dir_all(&fs).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=400k", "tmpfs"])
        .arg(&fs)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (the injected-writer test covers this)");
        return;
    }
    let _guard = Mounted(fs.clone());
    let out = fs.join("out");
    let cfg = setup_every(&d, &out, 0);
    let first = invert(&cfg, &[], false);
    assert!(first.status.success(), "{}", stderr(&first));
    let mut old = (check_set(&out).unwrap().run_id, snapshot(&out));
    let filler = fs.join("filler");
    let (mut ok, mut refused) = (0, 0);
    for left_kib in (0..=120).step_by(4) {
        let _ = std::fs::remove_file(&filler);
        let avail = {
            let o = Command::new("df")
                .args(["-k", "--output=avail"])
                .arg(&fs)
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .last()
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        };
        let fill = avail.saturating_sub(left_kib) * 1024;
        let _ = std::fs::write(&filler, vec![0u8; fill as usize]);
        let o = invert(&cfg, &[], false);
        let err = stderr(&o);
        exited_leaving_no_dot_files(&o, &out, &format!("{left_kib} KiB free"));
        if o.status.success() {
            let m = check_set(&out).unwrap();
            assert_ne!(m.run_id, old.0);
            old = (m.run_id, snapshot(&out));
            ok += 1;
        } else {
            assert_eq!(
                err.trim_end().lines().count(),
                1,
                "{left_kib} KiB free: {err}"
            );
            assert!(
                err.contains("No space left on device"),
                "{left_kib} KiB free: {err}"
            );
            assert_eq!(check_set(&out).unwrap().run_id, old.0);
            assert!(
                snapshot(&out) == old.1,
                "{left_kib} KiB free: the old outputs changed"
            );
            refused += 1;
        }
    }
    eprintln!("tmpfs: {ok} complete new sets, {refused} refused with the old set intact");
    assert!(ok >= 1 && refused >= 1);
}

/// Issue 35, item 3: a run removes only what it wrote. The checkpoint lies in the output
/// directory; a file at the checkpoint's name that this run never wrote survives the run; the
/// checkpoints of a job with another number of ranks are reported, not deleted; a file system
/// root, the home directory and system directories are refused as output directories.
#[test]
fn only_what_this_run_wrote_is_removed() {
    let (d, out, cfg) = fresh("mine", 100_000);
    let text = std::fs::read_to_string(&cfg).unwrap();
    let with = |name: &str, from: &str, to: &str| {
        let p = d.join(name);
        assert!(text.contains(from), "{from}");
        std::fs::write(&p, text.replace(from, to)).unwrap();
        p
    };
    // The command: the checkpoint outside the output directory.
    let precious = d.join("precious.txt");
    std::fs::write(&precious, "keep me").unwrap();
    for bad in [
        "../precious.txt",
        "/tmp/x.bin",
        "a/../../b",
        ".seistomo.lock",
    ] {
        let c = with(
            "p.toml",
            "checkpoint_every = 100000",
            &format!("checkpoint_every = 100000\ncheckpoint = \"{bad}\""),
        );
        refused(
            &invert(&c, &[], false),
            &[
                "p.toml",
                "[output] checkpoint",
                "inside the output directory",
            ],
        );
    }
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
    // A file of the user's at the checkpoint's name, never written by a run that converges
    // before its first checkpoint: left as it was.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let c = with(
        "n.toml",
        "checkpoint_every = 100000",
        "checkpoint_every = 100000\ncheckpoint = \"notes.txt\"",
    );
    let o = invert(&c, &[], false);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"mine");
    // A run that writes checkpoints removes them; the per-rank ones of a killed 3-rank job
    // are reported and left.
    let c5 = with(
        "c5.toml",
        "checkpoint_every = 100000",
        "checkpoint_every = 5",
    );
    for r in 0..3 {
        std::fs::write(out.join(format!("checkpoint.bin.rank{r}")), "old job").unwrap();
    }
    let o = invert(&c5, &[], false);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!out.join("checkpoint.bin").exists());
    assert!(
        err.contains("checkpoint.bin.rank0, checkpoint.bin.rank1, checkpoint.bin.rank2")
            && err.contains("another number of ranks"),
        "{err}"
    );
    for r in 0..3 {
        assert!(out.join(format!("checkpoint.bin.rank{r}")).is_file());
    }
    // Output directories that are not a run's own.
    let home = d.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out_s = out.display().to_string();
    for (dir, why) in [
        ("/".to_string(), "the root of the file system"),
        ("/etc".to_string(), "a system directory"),
        (home.display().to_string(), "the home directory"),
    ] {
        let c = with("root.toml", &out_s, &dir);
        let mut cmd = bin();
        cmd.arg("invert").arg(&c).env("HOME", &home);
        refused(&run(cmd), &["refused", why]);
    }
    let mut cmd = bin();
    cmd.args(["solve", "--matrix"])
        .arg(d.join("none.mtx"))
        .args(["--solution", "/x.txt"]);
    refused(&run(cmd), &["'/'", "the root of the file system"]);
    let _ = std::fs::remove_dir_all(&d);
}
