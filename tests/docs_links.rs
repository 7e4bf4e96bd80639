//! Every file the documentation points at is in the repository: relative markdown links, and
//! the repository paths written in the text (`src/...`, `tests/...`, `bench/...`, ...; a glob
//! such as `tests/gpu*.rs` needs its folder), in README.md, docs/*.md, bench/README.md and
//! datasets/README.md; and nothing points into a folder outside the repository (`../shared`,
//! `/work/shared`). docs/performance-history.md is a dated record and names files as they were
//! then; it is not checked.

mod common;

use std::path::{Path, PathBuf};

/// The first folder of a repository path.
const TOP: [&str; 11] = [
    "src", "tests", "bench", "scripts", "docs", "configs", "datasets", "examples", "python",
    "kernels", "assets",
];

fn documents() -> Vec<PathBuf> {
    let root = common::root();
    let mut v = vec![
        root.join("README.md"),
        root.join("bench/README.md"),
        root.join("datasets/README.md"),
    ];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "performance-history.md" {
            v.push(p);
        }
    }
    v.sort();
    v
}

/// The targets of `[text](target)` links that are files of the repository.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap().trim();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target.to_string());
        }
    }
    out
}

/// Repository paths written in the text (`src/io/mod.rs`, `docs/images/x.png`, `tests/gpu*.rs`).
fn paths(text: &str) -> Vec<String> {
    let is_path_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '*' | '{');
    text.split(|c: char| !is_path_char(c))
        .filter(|w| TOP.iter().any(|t| w.starts_with(&format!("{t}/"))))
        .map(|w| w.trim_end_matches(['.', '-', '/']).to_string())
        .collect()
}

/// Whether a written path is in the repository (a glob: its folder).
fn exists(root: &Path, p: &str) -> bool {
    match p.find(['*', '{']) {
        Some(k) => root.join(&p[..p[..k].rfind('/').unwrap_or(0)]).is_dir(),
        None => root.join(p).exists(),
    }
}

#[test]
fn every_file_the_docs_point_at_is_in_the_repository() {
    let root = common::root();
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(&root).unwrap().display().to_string();
        for (i, line) in text.lines().enumerate() {
            for l in links(line) {
                checked += 1;
                if !doc.parent().unwrap().join(&l).exists() {
                    missing.push(format!("{name}:{}: link {l}", i + 1));
                }
            }
            for p in paths(line) {
                checked += 1;
                if !exists(&root, &p) {
                    missing.push(format!("{name}:{}: {p}", i + 1));
                }
            }
            for outside in ["../shared/", "/work/shared"] {
                if line.contains(outside) {
                    missing.push(format!("{name}:{}: points outside: {line}", i + 1));
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} references found");
    assert!(
        missing.is_empty(),
        "not in the repository:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_reference_finder_sees_what_it_should() {
    assert_eq!(
        links("see [a](docs/a.md#x) and [b](https://x.org) [c](../b.md)"),
        ["docs/a.md", "../b.md"]
    );
    assert_eq!(
        paths("(src/io/publish.rs), `tests/gpu*.rs`; src/io/dataset/{binfmt,load}.rs, out/x"),
        [
            "src/io/publish.rs",
            "tests/gpu*.rs",
            "src/io/dataset/{binfmt"
        ]
    );
    let root = common::root();
    assert!(exists(&root, "tests/gpu*.rs") && exists(&root, "src/io/dataset/{binfmt"));
    assert!(!exists(&root, "scripts/nothing_here.sh"));
}
