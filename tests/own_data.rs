//! A geophysicist's own data to a first model without writing a file (issue 36): `import` writes
//! `invert.toml` beside the dataset and prints the next command; that command (`invert DIR`)
//! runs and prints the next one (`plot`), which draws a map from the cell table given to
//! `import`. `invert` on a dataset directory or its dataset.toml without an invert.toml runs the
//! defaults and says so; the summary line comes before "model file written".

mod common;

use common::{root, scratch, seistomo, stderr};
use std::path::Path;
use std::process::Output;

fn run_in(dir: &Path, args: &[&str]) -> Output {
    seistomo().args(args).current_dir(dir).output().unwrap()
}

fn ok_in(dir: &Path, args: &[&str]) -> String {
    let o = run_in(dir, args);
    let err = stderr(&o);
    assert!(o.status.success(), "{args:?} failed:\n{err}");
    err
}

/// The command after "next: " in `text` (the last one), as words.
fn next_command(text: &str) -> Vec<String> {
    let line = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("next: "))
        .unwrap_or_else(|| panic!("no 'next:' line in:\n{text}"));
    let line = line.split(" (").next().unwrap();
    line.split_whitespace().map(String::from).collect()
}

/// Run a printed `seistomo ...` command in `dir`.
fn run_printed(dir: &Path, words: &[String]) -> String {
    assert_eq!(words[0], "seistomo", "{words:?}");
    let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
    ok_in(dir, &args)
}

fn australia(file: &str) -> String {
    root()
        .join("datasets/australia")
        .join(file)
        .display()
        .to_string()
}

fn import_args<'a>(g: &'a str, d: &'a str, r: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "import", "--matrix", g, "--rhs", d, "--reg", r, "--lambda", "0.015", "-o", out,
    ]
}

#[test]
fn import_then_the_printed_commands_give_a_map() {
    let d = scratch("own-import");
    let (g, dd, r, cells) = (
        australia("G.mtx.gz"),
        australia("d.txt"),
        australia("R.mtx.gz"),
        australia("cells.txt"),
    );
    let mut args = import_args(&g, &dd, &r, "au");
    args.extend(["--cells", &cells, "--slowness-unit", "s/m"]);
    let err = ok_in(&d, &args);
    assert!(
        err.contains("run config written to au/invert.toml"),
        "{err}"
    );
    let next = next_command(&err);
    assert_eq!(next, ["seistomo", "invert", "au"], "{err}");
    let cfg = std::fs::read_to_string(d.join("au/invert.toml")).unwrap();
    assert!(cfg.contains("slowness_unit = \"s/m\""), "{cfg}");
    assert!(cfg.contains("dir = \"../au-inversion\""), "{cfg}");

    // The printed next command, as printed.
    let err = run_printed(&d, &next);
    assert!(err.contains("run config: au/invert.toml"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no '{what}' in:\n{err}"))
    };
    // The summary first, then where the files went.
    assert!(
        at("lsqr on ") < at("model file written to au-inversion/model.h5"),
        "{err}"
    );
    assert!(err.contains("xnorm 3.48643854e-2"), "{err}");
    let rep = common::read_json(&d.join("au-inversion/report.json"));
    assert_eq!(rep["istop"], 2, "{rep}");

    // And the next one: a map from the cell table.
    let next = next_command(&err);
    assert_eq!(
        next,
        [
            "seistomo",
            "plot",
            "au-inversion/model.h5",
            "-o",
            "au-inversion/map.png"
        ],
        "{err}"
    );
    run_printed(&d, &next);
    let png = std::fs::read(d.join("au-inversion/map.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
    // The dataset with its run config is still a valid dataset.
    ok_in(&d, &["verify", "au"]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn invert_on_a_dataset_without_a_run_config_uses_the_defaults_and_says_so() {
    let d = scratch("own-defaults");
    let (g, dd, r) = (
        australia("G.mtx.gz"),
        australia("d.txt"),
        australia("R.mtx.gz"),
    );
    ok_in(&d, &import_args(&g, &dd, &r, "au"));
    std::fs::remove_file(d.join("au/invert.toml")).unwrap();
    for (arg, shown) in [("au", "au"), ("au/dataset.toml", "au")] {
        let _ = std::fs::remove_dir_all(d.join("au-inversion"));
        let err = ok_in(&d, &["invert", arg]);
        assert!(
            err.contains(&format!(
                "{shown} has no invert.toml: the defaults (LSQR to atol = btol = 1e-8"
            )) && err.contains("outputs in au-inversion"),
            "{arg}: {err}"
        );
        assert!(err.contains("xnorm 3.48643854e-2"), "{arg}: {err}");
        // No cell table: the next step says why there is no map.
        assert!(
            err.contains("--convergence") && err.contains("no map"),
            "{err}"
        );
        assert!(d.join("au-inversion/model.h5").is_file());
        assert!(!d.join("au/au-inversion").exists());
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn wrong_own_data_inputs_fail_in_one_line_naming_the_file() {
    let d = scratch("own-errors");
    std::fs::create_dir_all(d.join("empty")).unwrap();
    let one_line = |args: &[&str], wants: &[&str]| {
        let o = run_in(&d, args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}:\n{err}");
        for w in wants {
            assert!(err.contains(w), "{args:?}: no '{w}' in {err}");
        }
    };
    one_line(
        &["invert", "empty"],
        &["empty: a directory with neither invert.toml nor dataset.toml"],
    );
    // A cell table that does not match the columns is refused before anything is written.
    let cells = d.join("cells.txt");
    std::fs::write(&cells, "-10 -9 120 121\n-10 -9 121 122\n").unwrap();
    let (g, dd) = (australia("G.mtx.gz"), australia("d.txt"));
    let args = [
        "import",
        "--matrix",
        &g,
        "--rhs",
        &dd,
        "--cells",
        cells.to_str().unwrap(),
        "-o",
        "bad",
    ];
    one_line(&args, &["cells.txt", "2 cells", "11916 columns"]);
    assert!(!d.join("bad/dataset.toml").exists());
    let args = [
        "import",
        "--matrix",
        &g,
        "--unknowns",
        "slowness_perturbation",
        "-o",
        "bad",
    ];
    one_line(&args, &["--reference"]);
    let _ = std::fs::remove_dir_all(&d);
}
