//! The documentation matches the tool: every command shown in README.md and
//! docs/user-guide.md runs, exits 0, and prints the output lines the docs quote.
//!
//! Commands are taken from the ```sh (or unlabelled) code blocks, in order, and run in a scratch
//! copy of configs/ and datasets/ (so their outputs land in the scratch out/, not the
//! checkout). A ```text block right after a command block quotes the output of that block's
//! last command: each of its lines must appear in the command's stdout or stderr, with `…`
//! standing for anything.
//!
//! Not run, and why:
//! - GPU-only commands (`--backend cuda`, `--backend all`): CI has no GPU (tests/gpu*.rs run
//!   them where there is one).
//! - `mpirun` lines: the MPI tests (tests/mpi.rs, tests/mpiio.rs) run the same commands.
//! - `seistomo compare` when /usr/bin/python3 cannot import SciPy and petsc4py.
//!
//! Run smaller, to keep CI fast (the commands are the same, the sizes are not): see SMALLER.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// (as written, as run): problem sizes cut down for a 2-core CI machine and a debug build.
const SMALLER: &[(&str, &str)] = &[
    ("--grid 32,32,16 --rays 20000", "--grid 12,12,6 --rays 1500"),
    ("--log-range 1e-5:1:11", "--log-range 1e-3:1:3"),
    ("--log-range 1e-3:3:9", "--log-range 1e-3:1:3"),
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

#[test]
fn every_documented_command_runs() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_seistomo"));
    let work = common::scratch("docs");
    copy_dir(&common::root().join("configs"), &work.join("configs"));
    copy_dir(&common::root().join("datasets"), &work.join("datasets"));
    let peers = peers_available();
    let (mut ran, mut skipped) = (0, Vec::new());
    let shown: Vec<Shown> = commands("README.md")
        .into_iter()
        .chain(commands("docs/user-guide.md"))
        .collect();
    assert!(shown.len() >= 25, "only {} commands found", shown.len());
    for s in &shown {
        let c = &s.command;
        let why = if c.starts_with("mpirun") {
            Some("MPI (tests/mpi.rs)")
        } else if c.contains("--backend cuda") || c.contains("--backend all") {
            Some("needs a GPU")
        } else if c.starts_with("seistomo compare") && !peers {
            Some("no SciPy/petsc4py in /usr/bin/python3")
        } else {
            None
        };
        if let Some(why) = why {
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
        let out = Command::new(&bin)
            .args(&words[1..])
            .current_dir(&work)
            .output()
            .unwrap();
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
        ran += 1;
    }
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
