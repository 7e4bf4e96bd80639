//! The documentation matches the tool: every command shown in README.md and
//! docs/user-guide.md runs, exits 0, and prints the output lines the docs quote.
//!
//! Commands are taken from the ```sh (or unlabelled) code blocks, in order, and run in a scratch
//! copy of configs/ and datasets/ (so their outputs land in the scratch out/, not the
//! checkout), each within [`LIMIT`]. A ```text block right after a command block quotes the
//! output of that block's last command: each of its lines must appear in the command's stdout or
//! stderr, with `…` standing for anything. No command prints a warning, and the README's
//! commands write nothing outside out/.
//!
//! `mpirun` lines run as written (with the flags a root user on a 2-core machine needs, which the
//! README explains) when the `mpi` feature is on and mpirun is installed.
//!
//! Not run, and why (printed):
//! - GPU-only commands (`--backend cuda`, `--backend all`, `bench --sums`) where there is
//!   no usable GPU (tests/gpu*.rs run them where there is one).
//! - `mpirun` lines without the `mpi` feature or without mpirun.
//! - `seistomo compare` when /usr/bin/python3 cannot import SciPy and petsc4py.
//!
//! Run smaller, to keep CI fast (the commands are the same, the sizes are not): see SMALLER.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One documented command that has not ended by then fails the test (none should take a
/// tenth of it).
const LIMIT: Duration = Duration::from_secs(300);

/// (as written, as run): problem sizes cut down for a 2-core CI machine and a debug build.
const SMALLER: &[(&str, &str)] = &[
    ("--grid 32,32,16 --rays 20000", "--grid 12,12,6 --rays 1500"),
    ("--n 64", "--n 12"),
];

#[derive(Debug)]
struct Shown {
    file: &'static str,
    line: usize,
    command: String,
    quoted: Vec<String>,
}

/// The commands of one markdown file.
fn commands(file: &'static str) -> Vec<Shown> {
    let text = std::fs::read_to_string(common::root().join(file)).unwrap();
    let mut out: Vec<Shown> = Vec::new();
    let mut block: Option<String> = None; // the open block's language
    let mut pending = String::new();
    let mut pending_line = 0;
    let mut last_block_had_commands = false;
    let mut quote_target: Option<usize> = None;
    for (i, raw) in text.lines().enumerate() {
        let t = raw.trim_start();
        if let Some(lang) = t.strip_prefix("```") {
            match block.take() {
                None => {
                    let lang = lang.trim().to_string();
                    quote_target = if lang == "text" && last_block_had_commands {
                        Some(out.len() - 1)
                    } else {
                        None
                    };
                    if lang != "text" {
                        last_block_had_commands = false;
                    }
                    block = Some(lang);
                }
                Some(lang) => {
                    if lang == "text" {
                        last_block_had_commands = false;
                    }
                }
            }
            continue;
        }
        let Some(lang) = &block else {
            if !t.is_empty() {
                last_block_had_commands = false;
            }
            continue;
        };
        if lang == "text" {
            if let Some(k) = quote_target {
                if !t.is_empty() {
                    out[k].quoted.push(t.to_string());
                }
            }
            continue;
        }
        if !(lang.is_empty() || lang == "sh") {
            continue;
        }
        let starts = t.starts_with("seistomo ") || t.starts_with("mpirun ");
        if pending.is_empty() && !starts {
            continue;
        }
        if pending.is_empty() {
            pending_line = i + 1;
        }
        // Drop a trailing comment (no command shown uses '#' otherwise).
        let code = match t.find(" #") {
            Some(k) => &t[..k],
            None => t,
        };
        let code = code.trim_end();
        if let Some(c) = code.strip_suffix('\\') {
            pending.push_str(c.trim_end());
            pending.push(' ');
            continue;
        }
        pending.push_str(code);
        out.push(Shown {
            file,
            line: pending_line,
            command: std::mem::take(&mut pending),
            quoted: Vec::new(),
        });
        last_block_had_commands = true;
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

/// Whether `line` appears in `output`, `…` matching anything.
fn appears(line: &str, output: &str) -> bool {
    output.lines().any(|o| {
        let mut rest = o;
        for part in line.split('…') {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    })
}

fn peers_available() -> bool {
    Command::new("/usr/bin/python3")
        .args(["-c", "import scipy, petsc4py"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn mpirun_available() -> bool {
    cfg!(feature = "mpi")
        && Command::new("mpirun")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
}

/// Run `c` to the end, or fail the test after [`LIMIT`] (the process is killed).
fn bounded(mut c: Command, what: &str) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    // Drain the pipes while waiting, so a talkative command cannot block on a full pipe.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: still running after {LIMIT:?}, killed; stderr:\n{}",
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Why a documented command is not run here, or None.
fn not_run_here(c: &str, gpu: bool, peers: bool, mpi: bool) -> Option<&'static str> {
    if c.starts_with("mpirun") && !mpi {
        Some("no mpirun, or built without the mpi feature")
    } else if (c.contains("--backend cuda")
        || c.contains("--backend all")
        || c.contains("bench --sums"))
        && !gpu
    {
        Some("needs a GPU")
    } else if c.starts_with("seistomo compare") && !peers {
        Some("no SciPy/petsc4py in /usr/bin/python3")
    } else {
        None
    }
}

#[test]
fn every_documented_command_runs() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_seistomo"));
    let work = common::scratch("docs");
    copy_dir(&common::root().join("configs"), &work.join("configs"));
    copy_dir(&common::root().join("datasets"), &work.join("datasets"));
    let (peers, mpi) = (peers_available(), mpirun_available());
    let gpu = seistomo::pipeline::operators::gpu_here().is_ok();
    let (mut ran, mut skipped) = (0, Vec::new());
    let readme = commands("README.md");
    assert!(
        readme
            .iter()
            .filter(|s| s.command.starts_with("mpirun"))
            .count()
            >= 2,
        "the README's mpirun lines were not found"
    );
    let shown: Vec<Shown> = readme
        .into_iter()
        .chain(commands("docs/user-guide.md"))
        .collect();
    assert!(shown.len() >= 25, "only {} commands found", shown.len());
    for s in &shown {
        let c = &s.command;
        if let Some(why) = not_run_here(c, gpu, peers, mpi) {
            skipped.push(format!("{}:{}: {c} ({why})", s.file, s.line));
            continue;
        }
        let mut run = c.clone();
        for (from, to) in SMALLER {
            run = run.replace(from, to);
        }
        let words: Vec<&str> = run.split_whitespace().collect();
        assert!(
            !words.iter().any(|w| w.contains('|') || *w == "..."),
            "{}:{}: not runnable as written: {c}",
            s.file,
            s.line
        );
        // The program as written; `seistomo` is the binary under test, under mpirun too.
        let bin_word = |w: &str| {
            if w == "seistomo" {
                bin.clone().into_os_string()
            } else {
                w.into()
            }
        };
        let mut cmd = Command::new(bin_word(words[0]));
        cmd.args(words[1..].iter().map(|w| bin_word(w)))
            .current_dir(&work);
        let out = bounded(cmd, &format!("{}:{}: `{run}`", s.file, s.line));
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{}:{}: `{run}` failed:\n{all}",
            s.file,
            s.line
        );
        for q in &s.quoted {
            assert!(
                appears(q, &all),
                "{}:{}: `{run}`: the quoted line\n  {q}\nis not in its output:\n{all}",
                s.file,
                s.line
            );
        }
        // As written, a documented command does what it says without a warning (an L-curve
        // point stopped by the iteration limit, GMRES not converged, ...).
        assert!(
            !all.to_lowercase().contains("warning"),
            "{}:{}: `{run}` warns:\n{all}",
            s.file,
            s.line
        );
        ran += 1;
    }
    // The documented commands write under out/ only (not into the repository's root).
    assert_eq!(
        common::names_in(&work),
        ["configs", "datasets", "out"],
        "the documented commands wrote outside out/"
    );
    eprintln!(
        "ran {ran} documented commands; not run:\n  {}",
        skipped.join("\n  ")
    );
    assert!(
        shown.iter().any(|s| !s.quoted.is_empty()),
        "no quoted output found"
    );
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn wildcards_match_like_the_docs_mean() {
    assert!(appears(
        "solve … s (… ms/iter)",
        "x solve 0.6 s (1.9 ms/iter)"
    ));
    assert!(appears(
        "model file written to out/m.h5",
        "model file written to out/m.h5"
    ));
    assert!(!appears(
        "model written to x",
        "solution vector written to y"
    ));
}

/// User guide §8's checksum command (an installed python3, no `crc32` tool) prints the CRC-32
/// that model files record for their inputs.
#[test]
fn the_checksum_command_of_the_user_guide_prints_the_recorded_crc() {
    let text = std::fs::read_to_string(common::root().join("docs/user-guide.md")).unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("python3 -c"))
        .expect("user-guide.md shows no `python3 -c` checksum command");
    let mut c = Command::new("sh");
    c.arg("-c").arg(line).current_dir(common::root());
    let out = bounded(c, line);
    assert!(
        out.status.success(),
        "`{line}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = line.split_whitespace().last().unwrap();
    let (crc, _) = seistomo::model::provenance::crc32_file(&common::root().join(file)).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{crc:08x}"),
        "{line}"
    );
}
