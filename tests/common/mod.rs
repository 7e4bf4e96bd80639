//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod gpu;
pub mod mpi;

use std::io::BufRead;
use std::path::PathBuf;

use seistomo::io::mtx::load_system as load_mtx_system;
use seistomo::sparse::System;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// ||a - b|| / ||b||.
pub fn rel(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt();
    num / b.iter().map(|y| y * y).sum::<f64>().sqrt()
}

/// A vector from tests/reference/NAME (.txt.gz, one value per line).
pub fn reference_vector(name: &str) -> Vec<f64> {
    let r = seistomo::io::open_text(&root().join("tests/reference").join(name)).unwrap();
    r.lines()
        .map(|l| l.unwrap().trim().parse().unwrap())
        .collect()
}

/// tests/reference/NAME parsed as JSON.
pub fn reference_json(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("tests/reference").join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A bundled real system: "australia" ([G; 0.015 R], [d; 0]) or a Harwell-Boeing problem
/// of datasets/lsq with its right-hand side.
pub fn system(name: &str) -> System {
    let d = root().join("datasets");
    if name == "australia" {
        let a = d.join("australia");
        load_mtx_system(
            &a.join("G.mtx.gz"),
            Some(&a.join("d.txt")),
            Some(&a.join("R.mtx.gz")),
            0.015,
        )
        .unwrap()
    } else {
        let l = d.join("lsq");
        load_mtx_system(
            &l.join(format!("{name}.mtx.gz")),
            Some(&l.join(format!("{name}_rhs1.mtx.gz"))),
            None,
            0.0,
        )
        .unwrap()
    }
}

/// An empty scratch directory under the system temp dir, unique to this process and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("seistomo-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
