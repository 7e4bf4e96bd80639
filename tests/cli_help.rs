//! The command line as a user reads it: every subcommand's `--help` gives every option a help
//! text, lists the possible values of every option with a fixed set of values, and spells the
//! output flag one way (`-o, --out`; older spellings are hidden aliases).

mod common;

use clap::CommandFactory;
use common::{run_ok, run_seistomo, seistomo};

/// Options whose values come from a fixed set, wherever they appear.
const CHOICES: &[&str] = &[
    "allreduce",
    "backend",
    "format",
    "ilu-pivot",
    "io",
    "kind",
    "layout",
    "loops",
    "lsqr-loop",
    "method",
    "model",
    "orthog",
    "partition",
    "peers",
    "precision",
    "precond",
    "reorder",
    "side",
    "stop",
    "storage",
    "transpose",
];

fn subcommands() -> Vec<clap::Command> {
    seistomo::cli::Cli::command()
        .get_subcommands()
        .cloned()
        .collect()
}

#[test]
fn every_option_has_help_and_choices_list_their_values() {
    let mut problems = Vec::new();
    let subs = subcommands();
    assert!(subs.len() >= 11, "{} subcommands", subs.len());
    for sub in &subs {
        let name = sub.get_name();
        for arg in sub.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" || arg.is_hide_set() {
                continue;
            }
            let help = arg
                .get_help()
                .or(arg.get_long_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            if help.trim().is_empty() {
                problems.push(format!("{name} {id}: no help text"));
            }
            if let Some(long) = arg.get_long() {
                if CHOICES.contains(&long) && arg.get_possible_values().is_empty() {
                    problems.push(format!("{name} --{long}: no possible values"));
                }
                if long == "output" {
                    problems.push(format!("{name}: --output shown (use -o/--out)"));
                }
                if long == "out" && arg.get_short() != Some('o') {
                    problems.push(format!("{name}: --out without -o"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_help_page_spells_the_output_flag_one_way() {
    let mut with_out = 0;
    for sub in subcommands() {
        let name = sub.get_name().to_string();
        let out = run_seistomo(&[&name, "--help"]);
        assert!(out.status.success(), "{name} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: seistomo"), "{name}: {text}");
        assert!(!text.contains("--output"), "{name} --help shows --output");
        if text.contains("--out ") || text.contains("--out <") {
            assert!(text.contains("-o, --out"), "{name}: --out without -o");
            with_out += 1;
        }
        for choice in CHOICES {
            let flag = format!("--{choice} <");
            if let Some(i) = text.find(&flag) {
                // The option's entry: up to the next option (help may be on the next line).
                let rest = &text[i..];
                let end = rest[1..].find("\n  -").map_or(rest.len(), |e| e + 1);
                let line = &rest[..end];
                assert!(
                    line.contains("[possible values:"),
                    "{name}: {line}: no possible values"
                );
            }
        }
    }
    // synth, import, export, plot, lcurve, square.
    assert!(with_out >= 6, "{with_out} commands with -o/--out");
}

#[test]
fn old_output_spellings_still_work() {
    let d = common::scratch("help");
    for (flag, name) in [("--output", "a.mtx"), ("-o", "b.mtx"), ("--out", "c.mtx")] {
        let p = d.join(name);
        run_ok(
            seistomo()
                .args(["square", "--n", "3", "--peclet", "1,2,3", flag])
                .arg(&p),
        );
        assert!(p.is_file());
    }
    // A wrong word names the possible values.
    let out = run_seistomo(&["solve", "--method", "cg", "--matrix", "x.mtx"]);
    let err = common::stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("[possible values: lsqr, lsmr, gmres]"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
