//! Vector files (b, weights, standard deviations, true model): docs/formats.md.

use std::path::Path;

use crate::error::{Error, Result};
use crate::io::binfmt::{put_prefix, put_u32, put_u64, Precision, Reader, MAGIC_VECT};
use crate::io::kernel_rows::write_plain;
use crate::io::mmap::MappedFile;

/// Bytes before the values.
pub const VECT_HEADER: usize = 32;

/// What a vector file holds (its `kind` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorKind {
    Rhs = 0,
    Weights = 1,
    Sigma = 2,
    Model = 3,
}

impl VectorKind {
    fn name(self) -> &'static str {
        match self {
            VectorKind::Rhs => "data vector b",
            VectorKind::Weights => "data weights",
            VectorKind::Sigma => "standard deviations",
            VectorKind::Model => "model",
        }
    }
}

/// Write a vector file (no atomic rename: used inside a dataset being built).
pub fn write_vector(path: &Path, kind: VectorKind, x: &[f64], prec: Precision) -> Result<()> {
    write_plain(path, |w| {
        put_prefix(w, &MAGIC_VECT, prec.bytes() as u32)?;
        put_u64(w, x.len() as u64)?;
        put_u32(w, kind as u32)?;
        put_u32(w, 0)?;
        crate::io::binfmt::put_values(w, x, prec)
    })
}

/// Read a vector file of `kind`; when `expected_len` is given the length must match. Values
/// must be finite (and > 0 for standard deviations, >= 0 for weights). Returns the values and
/// the bytes read.
pub fn read_vector(
    path: &Path,
    kind: VectorKind,
    expected_len: Option<u64>,
) -> Result<(Vec<f64>, u64)> {
    let map = MappedFile::open(path)?;
    let r = Reader::new(path, map.bytes());
    let vb = r.prefix(&MAGIC_VECT, "vector")?;
    let prec = Precision::from_bytes(path, vb)?;
    let n = r.count(16, "vector length")?;
    let k = r.u32(24, "vector kind")?;
    if k != kind as u32 {
        return Err(Error::format(
            path,
            format!(
                "vector kind {k} but a {} (kind {}) was expected",
                kind.name(),
                kind as u32
            ),
        ));
    }
    if let Some(want) = expected_len {
        if n as u64 != want {
            return Err(Error::format(
                path,
                format!(
                    "the {} has {n} values but the dataset needs {want} (one per {})",
                    kind.name(),
                    if kind == VectorKind::Model {
                        "column"
                    } else {
                        "kernel row"
                    }
                ),
            ));
        }
    }
    let body = crate::io::binfmt::pad8(prec.bytes() * n);
    r.exact_len(VECT_HEADER + body, &format!("{n} values"))?;
    let mut x = vec![0.0; n];
    crate::io::binfmt::decode_values(&r, VECT_HEADER, prec.bytes(), &[], &mut x, &|| {
        kind.name().to_string()
    })?;
    // Name the row of the first bad value.
    for (i, &v) in x.iter().enumerate() {
        let bad = match kind {
            VectorKind::Sigma => v <= 0.0,
            VectorKind::Weights => v < 0.0,
            _ => false,
        };
        if bad {
            return Err(Error::format(
                path,
                format!("row {i}: {} value {v} is not allowed", kind.name()),
            ));
        }
    }
    Ok((x, (VECT_HEADER + body) as u64))
}
