//! The rooms of src/ only import downwards (docs/developers.md, "Layout"):
//!
//! cli -> pipeline -> model -> solver -> backend -> comm -> io -> partition -> grid -> sparse
//! -> settings -> error/ui; `testproblems` sits beside solver and only cli (and tests) may
//! use it.
//!
//! Every `crate::room` path in a library file (comments and the trailing `#[cfg(test)]` module
//! left out) is checked against that order, which also rules out import cycles between rooms.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Rank of each room: a room may name rooms of a lower rank (and itself).
const RANKS: &[(&str, u32)] = &[
    ("error", 0),
    ("ui", 0),
    ("settings", 1),
    ("sparse", 2),
    ("grid", 3),
    ("partition", 4),
    ("io", 5),
    ("comm", 6),
    ("backend", 7),
    ("solver", 8),
    ("testproblems", 8),
    ("model", 9),
    ("pipeline", 10),
    ("cli", 11),
];

/// Items of the crate root every room may use (console.rs: the println!/eprintln! macros).
const ROOT_ITEMS: &[&str] = &[
    "Error",
    "Result",
    "VERSION",
    "__seistomo_println",
    "__seistomo_eprintln",
];

/// Rooms that may not use `testproblems` even though it ranks below them.
const NO_TESTPROBLEMS: &[&str] = &["model", "pipeline"];

fn rank(room: &str) -> Option<u32> {
    RANKS.iter().find(|(r, _)| *r == room).map(|(_, k)| *k)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The room of a file under src/: its first folder, or its stem for a top-level file.
fn room_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The library code of a file: without its unit-test module and without comments.
fn code_of(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Rooms named by `crate::room` paths, including the items of grouped imports
/// (`use crate::{a::x, b}`).
fn named_rooms(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
        rest = after;
    }
    out
}

#[test]
fn rooms_only_import_downwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for f in &files {
        let room = room_of(&src, f);
        if room == "lib" || room == "main" {
            continue;
        }
        let Some(mine) = rank(&room) else {
            bad.push(format!(
                "{}: room '{room}' is not in the layer order (tests/layers.rs)",
                f.display()
            ));
            continue;
        };
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        for target in named_rooms(&code) {
            if target == room || ROOT_ITEMS.contains(&target.as_str()) {
                continue;
            }
            *seen.entry(format!("{room} -> {target}")).or_default() += 1;
            match rank(&target) {
                None => bad.push(format!(
                    "{}: names crate::{target}, which is not a room",
                    f.display()
                )),
                Some(t) if t >= mine => bad.push(format!(
                    "{}: {room} (rank {mine}) imports {target} (rank {t})",
                    f.display()
                )),
                Some(_) if target == "testproblems" && NO_TESTPROBLEMS.contains(&room.as_str()) => {
                    bad.push(format!(
                        "{}: {room} imports testproblems (test problems are for cli and tests)",
                        f.display()
                    ))
                }
                Some(_) => {}
            }
        }
    }
    println!("import arrows between rooms (files):");
    for (edge, n) in &seen {
        println!("  {edge} ({n})");
    }
    assert!(
        bad.is_empty(),
        "imports against the layer order:\n{}",
        bad.join("\n")
    );
    // The check must have seen the rooms it is about.
    for room in [
        "cli", "pipeline", "model", "solver", "backend", "io", "grid",
    ] {
        assert!(
            seen.keys().any(|e| e.starts_with(&format!("{room} -> "))),
            "no imports seen from {room}: is the scan broken?"
        );
    }
}

#[test]
fn the_scan_sees_grouped_and_plain_paths() {
    let code = code_of(
        "use crate::{grid::Grid, io};\nlet x = crate::model::f(); // crate::cli\n\
         #[cfg(test)]\nmod tests { use crate::pipeline; }",
    );
    assert_eq!(named_rooms(&code), vec!["grid", "io", "model"]);
}

/// The module path of a file under src/ (`backend/cuda/compact.rs` -> backend::cuda::compact;
/// a `mod.rs` is its folder's module).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Paths a file names with `super::` or `crate::` (grouped imports expanded), as segments.
fn named_paths(code: &str) -> Vec<(bool, Vec<String>)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (start, is_super) in [("super::", true), ("crate::", false)] {
        let mut rest = code;
        while let Some(i) = rest.find(start) {
            let after = &rest[i + start.len()..];
            let mut head = Vec::new();
            let mut s = after;
            loop {
                if let Some(group) = s.strip_prefix('{') {
                    let end = group.find('}').unwrap_or(group.len());
                    for item in group[..end].split(',') {
                        let mut p = head.clone();
                        p.extend(item.trim().split("::").map(ident).filter(|x| !x.is_empty()));
                        out.push((is_super, p));
                    }
                    break;
                }
                let name = ident(s);
                if name.is_empty() {
                    out.push((is_super, head));
                    break;
                }
                s = &s[name.len()..];
                head.push(name);
                match s.strip_prefix("::") {
                    Some(t) => s = t,
                    None => {
                        out.push((is_super, head));
                        break;
                    }
                }
            }
            rest = after;
        }
    }
    out
}

/// Inside a room, files that name each other must not form a circle (a circle means a shared
/// type or helper belongs in a file of its own). `mod.rs` facades are not files here: naming an
/// item through `super::Item` is naming the folder, not a sibling.
#[test]
fn files_inside_a_room_import_no_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: Vec<Vec<String>> = files
        .iter()
        .filter(|f| !f.ends_with("mod.rs"))
        .map(|f| module_of(&src, f))
        .collect();
    let is_file = |m: &[String]| modules.iter().any(|x| x == m);
    let mut edges: BTreeMap<Vec<String>, Vec<Vec<String>>> = BTreeMap::new();
    for f in files.iter().filter(|f| !f.ends_with("mod.rs")) {
        let me = module_of(&src, f);
        let parent = &me[..me.len() - 1];
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        for (is_super, path) in named_paths(&code) {
            let full: Vec<String> = if is_super {
                parent.iter().cloned().chain(path).collect()
            } else {
                path
            };
            // the longest prefix that is a file of the same folder
            for k in (1..=full.len()).rev() {
                let m = &full[..k];
                if m != me.as_slice() && m.len() == me.len() && m[..k - 1] == *parent && is_file(m)
                {
                    let e = edges.entry(me.clone()).or_default();
                    if !e.contains(&m.to_vec()) {
                        e.push(m.to_vec());
                    }
                    break;
                }
            }
        }
    }
    // a circle: a file that reaches itself
    let mut circles = Vec::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.join("::")])];
        let mut seen = std::collections::BTreeSet::new();
        while let Some((m, trail)) = stack.pop() {
            for n in edges.get(&m).into_iter().flatten() {
                if n == start {
                    circles.push(format!("{} -> {}", trail.join(" -> "), n.join("::")));
                } else if seen.insert(n.clone()) {
                    let mut t = trail.clone();
                    t.push(n.join("::"));
                    stack.push((n.clone(), t));
                }
            }
        }
    }
    assert!(
        !edges.is_empty(),
        "no imports between files seen: is the scan broken?"
    );
    assert!(
        circles.is_empty(),
        "files inside a room import each other in a circle:\n{}",
        circles.join("\n")
    );
}

/// The environment is read in one place (src/settings/launch.rs: what describes the launch);
/// everything that tunes a run is configuration (src/settings/tuning.rs), recorded in
/// report.json.
#[test]
fn only_the_launch_module_reads_the_environment() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let launch = src.join("settings").join("launch.rs");
    let mut bad = Vec::new();
    for f in files.iter().filter(|f| **f != launch) {
        let text = std::fs::read_to_string(f).unwrap();
        // comments out, tests in: a test may not read the environment either
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for pat in ["env::var(", "env::var_os(", "env::vars(", "env::vars_os("] {
            if code.contains(pat) {
                bad.push(format!("{}: {pat}", f.display()));
            }
        }
    }
    assert!(
        std::fs::read_to_string(&launch)
            .unwrap()
            .contains("env::var("),
        "the scan must see the launch module's reads"
    );
    assert!(
        bad.is_empty(),
        "environment read outside src/settings/launch.rs:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_path_scan_expands_groups_and_supers() {
    let p = named_paths("use super::{a::X, b};\nlet y = crate::io::mtx::read(x);");
    assert!(p.contains(&(true, vec!["a".into(), "X".into()])), "{p:?}");
    assert!(p.contains(&(true, vec!["b".into()])), "{p:?}");
    assert!(
        p.contains(&(false, vec!["io".into(), "mtx".into(), "read".into()])),
        "{p:?}"
    );
}

/// One operator factory (src/pipeline/operators.rs): above the backends, nothing else builds a
/// concrete operator or names the CUDA backend; the CLI and the Python module go through the
/// pipeline.
#[test]
fn only_the_factory_builds_operators() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut files = Vec::new();
    for room in ["cli", "pipeline", "model", "solver"] {
        rust_files(&src.join(room), &mut files);
    }
    files.push(root.join("python").join("src").join("lib.rs"));
    let factory = src.join("pipeline").join("operators.rs");
    let concrete = [
        "CpuCsrOperator::",
        "CpuCompactOperator::",
        "CudaCsrOperator::",
        "CudaCompactOperator::",
        "CudaSquareOperator::",
        "DistSquareOperator::",
        "CudaBackend::",
        "CpuBackend::",
        "backend::cuda",
    ];
    let mut bad = Vec::new();
    for f in files.iter().filter(|f| **f != factory) {
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        for c in concrete {
            if code.contains(c) {
                bad.push(format!("{}: {c}", f.display()));
            }
        }
    }
    assert!(
        std::fs::read_to_string(&factory)
            .unwrap()
            .contains("CudaCompactOperator::"),
        "the scan must see the factory's constructors"
    );
    assert!(
        bad.is_empty(),
        "concrete operators built outside the factory:\n{}",
        bad.join("\n")
    );
}
