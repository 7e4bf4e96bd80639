//! Vector files (b, weights, standard deviations, true model): docs/formats.md.

use std::path::Path;

use crate::error::{Error, Result};
use crate::io::dataset::binfmt::write_plain;
use crate::io::dataset::binfmt::{
    checksum_error, crc, pad8, prefix_len, put_prefix, put_u32, put_u64, CrcWriter, Precision,
    Reader, MAGIC_VECT,
};
use crate::io::mmap::MappedFile;

/// Bytes before the values in format `version`: the prefix, the length (u64), the kind (u32)
/// and the header's CRC32C (version 1: a zero u32).
pub fn vect_header(version: u32) -> usize {
    prefix_len(version) + 16
}
/// Values per checksum chunk (version 2).
pub const VECT_CHUNK: usize = 8192;

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
pub fn write_vector(
    path: &Path,
    kind: VectorKind,
    x: &[f64],
    prec: Precision,
    (version, id): (u32, u64),
) -> Result<()> {
    write_plain(path, |w| {
        let mut cw = CrcWriter::new(w);
        put_prefix(&mut cw, &MAGIC_VECT, version, prec.bytes() as u32, id)?;
        put_u64(&mut cw, x.len() as u64)?;
        put_u32(&mut cw, kind as u32)?;
        // Version 2: the header's CRC32C in place of the reserved zero.
        let head = if version >= 2 { cw.take() } else { 0 };
        put_u32(cw.inner, head)?;
        let mut sums = Vec::new();
        for chunk in x.chunks(VECT_CHUNK) {
            crate::io::dataset::binfmt::put_values(&mut cw, chunk, prec)?;
            sums.push(cw.take());
        }
        // (f32 with an odd length: the last chunk's CRC covers its padding too.)
        if x.is_empty() {
            crate::io::dataset::binfmt::put_values(&mut cw, x, prec)?;
        }
        if version >= 2 {
            for c in &sums {
                put_u32(cw.inner, *c)?;
            }
            crate::io::dataset::binfmt::put_pad(cw.inner, 4 * sums.len())?;
        }
        Ok(())
    })
}

/// Bytes of a vector file of `n` values of `vb` bytes in format `version`: header, values
/// (padded to 8), and in version 2 one CRC32C per [`VECT_CHUNK`] values (padded to 8).
fn vector_len(n: usize, vb: usize, version: u32) -> usize {
    let sums = if version >= 2 {
        pad8(4 * n.div_ceil(VECT_CHUNK))
    } else {
        0
    };
    vect_header(version) + pad8(vb * n) + sums
}

/// Verify the CRC32C of value chunk `k` (version 2): `bytes` are the chunk's bytes as stored
/// (the last chunk with the section's padding), `stored` its checksum.
fn check_chunk(
    path: &Path,
    kind: VectorKind,
    n: usize,
    k: usize,
    bytes: &[u8],
    stored: u32,
) -> Result<()> {
    let computed = crc(bytes);
    if stored != computed {
        let (a, z) = (k * VECT_CHUNK, ((k + 1) * VECT_CHUNK).min(n));
        return Err(checksum_error(
            path,
            &format!("{} rows {a}..{z}", kind.name()),
            stored,
            computed,
        ));
    }
    Ok(())
}

/// Read a vector file of `kind` in format `version` (the manifest's); when `expected_len` is
/// given the length must match. Values must be finite (and > 0 for standard deviations, >= 0
/// for weights); version 2 checksums are verified. Returns the values and the bytes read.
pub fn read_vector(
    path: &Path,
    kind: VectorKind,
    expected_len: Option<u64>,
    (version, id): (u32, u64),
) -> Result<(Vec<f64>, u64)> {
    let map = MappedFile::open(path)?;
    let r = Reader::new(path, map.bytes());
    let (prec, n) = check_header(&r, kind, expected_len, (version, id))?;
    let vb = prec.bytes();
    let len = vector_len(n, vb, version);
    let head = vect_header(version);
    r.exact_len(len, &format!("{n} values"))?;
    if version >= 2 {
        let body = pad8(vb * n);
        let sums = head + body;
        let chunks = n.div_ceil(VECT_CHUNK);
        for k in 0..chunks {
            let a = head + k * VECT_CHUNK * vb;
            let z = (a + VECT_CHUNK * vb).min(sums);
            let stored = r.u32(sums + 4 * k, "checksums")?;
            check_chunk(path, kind, n, k, &r.data[a..z], stored)?;
        }
        r.zeros(sums + 4 * chunks, len - sums - 4 * chunks, "padding")?;
    }
    let mut x = vec![0.0; n];
    crate::io::dataset::binfmt::decode_values(&r, head, vb, &[], &mut x, &|| {
        kind.name().to_string()
    })?;
    // Name the row of the first bad value.
    for (i, &v) in x.iter().enumerate() {
        check_value(path, kind, i as u64, v)?;
    }
    Ok((x, len as u64))
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
/// `reader` (MPI-IO): the header, then the rows' values coalesced into spans (version 2: the
/// whole checksum chunks holding the rows, each verified). The header and the file length are
/// checked as [`read_vector`] does; the values read are checked for finiteness and sign.
/// Returns the values and the bytes read.
pub fn read_vector_rows(
    path: &Path,
    kind: VectorKind,
    expected_len: Option<u64>,
    rows: &[u64],
    reader: &crate::io::rowio::RangeReader,
    (version, id): (u32, u64),
) -> Result<(Vec<f64>, u64)> {
    let len = crate::io::rowio::file_len(path)?;
    let vect_head = vect_header(version);
    let head = reader.read(path, 0, vect_head.min(len as usize))?;
    let (prec, n) = check_header(&Reader::new(path, &head), kind, expected_len, (version, id))?;
    let vb = prec.bytes();
    let end = vector_len(n, vb, version) as u64;
    Reader::new(path, &[]).exact_len_of(len, end, &format!("{n} values"))?;
    if let Some(&r) = rows.iter().find(|&&r| r >= n as u64) {
        return Err(Error::format(
            path,
            format!("row {r} asked for but the {} has {n} values", kind.name()),
        ));
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_unstable_by_key(|&i| rows[i]);
    let sums_at = vect_head + pad8(vb * n);
    // Version 2: the checksums of the chunks, read once.
    let sums: Vec<u8> = if version >= 2 {
        let k = n.div_ceil(VECT_CHUNK);
        let sums = reader.read(path, sums_at as u64, pad8(4 * k))?;
        if sums[4 * k..].iter().any(|&b| b != 0) {
            return Err(Error::format(
                path,
                format!(
                    "padding at byte {} is not zero (corrupted file)",
                    sums_at + 4 * k
                ),
            ));
        }
        sums
    } else {
        Vec::new()
    };
    // Pieces: one per row (version 1) or one per chunk holding rows (version 2), each with the
    // range of `order` it serves.
    let mut pieces: Vec<(u64, u64)> = Vec::new();
    let mut serves: Vec<std::ops::Range<usize>> = Vec::new();
    let mut i = 0;
    while i < order.len() {
        if version >= 2 {
            let k = rows[order[i]] as usize / VECT_CHUNK;
            let mut j = i;
            while j < order.len() && rows[order[j]] as usize / VECT_CHUNK == k {
                j += 1;
            }
            let a = vect_head + k * VECT_CHUNK * vb;
            let z = (a + VECT_CHUNK * vb).min(sums_at);
            pieces.push((a as u64, (z - a) as u64));
            serves.push(i..j);
            i = j;
        } else {
            pieces.push((vect_head as u64 + vb as u64 * rows[order[i]], vb as u64));
            serves.push(i..i + 1);
            i += 1;
        }
    }
    // Rows are distinct (a rank's rows), so the ranges are disjoint.
    let mut out = vec![0.0; rows.len()];
    let mut bytes = (head.len() + sums.len()) as u64;
    let spans = reader.spans(&pieces);
    let ranges: Vec<(u64, usize)> = spans.iter().map(|s| (s.offset, s.len as usize)).collect();
    let mut failed = false;
    reader
        .read_ranges(path, &ranges, &mut |k, buf| {
            let s = &spans[k];
            bytes += s.len;
            let r = Reader::new(path, buf);
            for p in s.items.clone() {
                if version >= 2 {
                    let (a, l) = (pieces[p].0 - s.offset, pieces[p].1);
                    let chunk = ((pieces[p].0 as usize - vect_head) / vb) / VECT_CHUNK;
                    let stored =
                        u32::from_le_bytes(sums[4 * chunk..4 * chunk + 4].try_into().unwrap());
                    check_chunk(
                        path,
                        kind,
                        n,
                        chunk,
                        &buf[a as usize..(a + l) as usize],
                        stored,
                    )
                    .inspect_err(|_| failed = true)?;
                }
                for &i in &order[serves[p].clone()] {
                    let at = (vect_head as u64 + vb as u64 * rows[i] - s.offset) as usize;
                    let mut v = [0.0];
                    let row = rows[i];
                    let label = || kind.name().to_string();
                    crate::io::dataset::binfmt::decode_values(&r, at, vb, &[], &mut v, &label)
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
    (version, id): (u32, u64),
) -> Result<(Precision, usize)> {
    let path = r.path;
    let vb = r.prefix_v(&MAGIC_VECT, "vector", version, id)?;
    let p = prefix_len(version);
    if version >= 2 {
        r.check_crc(0..p + 12, p + 12, "vector header")?;
    } else {
        r.zeros(28, 4, "reserved field")?;
    }
    let prec = Precision::from_bytes(path, vb)?;
    let n = r.count(p, "vector length")?;
    let k = r.u32(p + 8, "vector kind")?;
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
