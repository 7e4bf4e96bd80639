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
    let (prec, n) = check_header(&r, kind, expected_len)?;
    let body = crate::io::binfmt::pad8(prec.bytes() * n);
    r.exact_len(VECT_HEADER + body, &format!("{n} values"))?;
    let mut x = vec![0.0; n];
    crate::io::binfmt::decode_values(&r, VECT_HEADER, prec.bytes(), &[], &mut x, &|| {
        kind.name().to_string()
    })?;
    // Name the row of the first bad value.
    for (i, &v) in x.iter().enumerate() {
        check_value(path, kind, i as u64, v)?;
    }
    Ok((x, (VECT_HEADER + body) as u64))
}

/// An error for a value not allowed in a vector of `kind` (sigma <= 0, weight < 0).
fn check_value(path: &Path, kind: VectorKind, row: u64, v: f64) -> Result<()> {
    let bad = match kind {
        VectorKind::Sigma => v <= 0.0,
        VectorKind::Weights => v < 0.0,
        _ => false,
    };
    if bad {
        return Err(Error::format(
            path,
            format!("row {row}: {} value {v} is not allowed", kind.name()),
        ));
    }
    Ok(())
}

/// The values at `rows` (in that order) of a vector file of `kind`, read as byte ranges with
/// `reader` (MPI-IO): the header, then the rows' values coalesced into spans. The header and
/// the file length are checked as [`read_vector`] does; the values read are checked for
/// finiteness and sign. Returns the values and the bytes read.
pub fn read_vector_rows(
    path: &Path,
    kind: VectorKind,
    expected_len: Option<u64>,
    rows: &[u64],
    reader: &crate::io::rowio::RangeReader,
) -> Result<(Vec<f64>, u64)> {
    let len = crate::io::rowio::file_len(path)?;
    let head = reader.read(path, 0, VECT_HEADER.min(len as usize))?;
    let (prec, n) = check_header(&Reader::new(path, &head), kind, expected_len)?;
    let vb = prec.bytes();
    let end = (VECT_HEADER + crate::io::binfmt::pad8(vb * n)) as u64;
    if len != end {
        return Err(Error::format(
            path,
            if len < end {
                format!("truncated: {n} values need {end} bytes but the file has {len}")
            } else {
                format!(
                    "{} trailing bytes after {n} values (expected {end} bytes)",
                    len - end
                )
            },
        ));
    }
    if let Some(&r) = rows.iter().find(|&&r| r >= n as u64) {
        return Err(Error::format(
            path,
            format!("row {r} asked for but the {} has {n} values", kind.name()),
        ));
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_unstable_by_key(|&i| rows[i]);
    let pieces: Vec<(u64, u64)> = order
        .iter()
        .map(|&i| ((VECT_HEADER as u64) + vb as u64 * rows[i], vb as u64))
        .collect();
    // Rows are distinct (a rank's rows), so the ranges are disjoint.
    let mut out = vec![0.0; rows.len()];
    let mut bytes = head.len() as u64;
    let spans = reader.spans(&pieces);
    let ranges: Vec<(u64, usize)> = spans.iter().map(|s| (s.offset, s.len as usize)).collect();
    let mut failed = false;
    reader
        .read_ranges(path, &ranges, &mut |k, buf| {
            let s = &spans[k];
            bytes += s.len;
            let r = Reader::new(path, buf);
            for &i in &order[s.items.clone()] {
                let at = (VECT_HEADER as u64 + vb as u64 * rows[i] - s.offset) as usize;
                let mut v = [0.0];
                let row = rows[i];
                let label = || kind.name().to_string();
                crate::io::binfmt::decode_values(&r, at, vb, &[], &mut v, &label)
                    .map_err(|_| {
                        Error::format(
                            path,
                            format!("row {row}: {} value {} is not finite", kind.name(), v[0]),
                        )
                    })
                    .and_then(|()| check_value(path, kind, row, v[0]))
                    .inspect_err(|_| failed = true)?;
                out[i] = v[0];
            }
            Ok(())
        })
        .map_err(|e| {
            if failed {
                e
            } else {
                crate::io::rowio::in_context(e, kind.name())
            }
        })?;
    Ok((out, bytes))
}

/// Check a vector file's header (magic, version, precision, kind, length); returns the
/// precision and the length.
fn check_header(
    r: &Reader,
    kind: VectorKind,
    expected_len: Option<u64>,
) -> Result<(Precision, usize)> {
    let path = r.path;
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
    Ok((prec, n))
}
