//! Binary building blocks of the dataset format (docs/formats.md): magics, the common 16-byte
//! prefix, row records, and checked little-endian reads that name the file on every error.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Format version written and accepted.
pub const VERSION: u32 = 1;

pub const MAGIC_ROW: [u8; 8] = *b"SEISKROW";
pub const MAGIC_PACK: [u8; 8] = *b"SEISPACK";
pub const MAGIC_META: [u8; 8] = *b"SEISMETA";
pub const MAGIC_DAMP: [u8; 8] = *b"SEISDAMP";
pub const MAGIC_VECT: [u8; 8] = *b"SEISVECT";

/// Value precision of a file: 4 (f32) or 8 (f64) bytes per value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    F64,
}

impl Precision {
    pub fn bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::F64 => 8,
        }
    }
    pub fn from_bytes(path: &Path, vb: u32) -> Result<Precision> {
        match vb {
            4 => Ok(Precision::F32),
            8 => Ok(Precision::F64),
            _ => Err(Error::format(
                path,
                format!("value size {vb} bytes is neither 4 (f32) nor 8 (f64)"),
            )),
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "f64" => Ok(Precision::F64),
            _ => Err(format!("unknown precision '{s}' (f32, f64)")),
        }
    }
}

/// `n` rounded up to a multiple of 8.
pub fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Bytes of one row record holding `nnz` values of `vb` bytes: row (u64), nnz (u64), columns
/// (u32, padded to 8), values (padded to 8).
pub fn record_size(nnz: usize, vb: usize) -> usize {
    16 + pad8(4 * nnz) + pad8(vb * nnz)
}

/// A file's bytes with checked little-endian reads.
pub struct Reader<'a> {
    pub path: &'a Path,
    pub data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(path: &'a Path, data: &'a [u8]) -> Self {
        Reader { path, data }
    }
    /// Error unless `len` bytes are available at `off`.
    pub fn need(&self, off: usize, len: usize, what: &str) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.data.len() => Ok(()),
            _ => Err(Error::format(
                self.path,
                format!(
                    "truncated: {what} needs bytes {off}..{} but the file has {} bytes",
                    off.saturating_add(len),
                    self.data.len()
                ),
            )),
        }
    }
    pub fn u32(&self, off: usize, what: &str) -> Result<u32> {
        self.need(off, 4, what)?;
        Ok(u32::from_le_bytes(
            self.data[off..off + 4].try_into().unwrap(),
        ))
    }
    pub fn u64(&self, off: usize, what: &str) -> Result<u64> {
        self.need(off, 8, what)?;
        Ok(u64::from_le_bytes(
            self.data[off..off + 8].try_into().unwrap(),
        ))
    }
    /// A u64 count that must fit in memory-sized arithmetic.
    pub fn count(&self, off: usize, what: &str) -> Result<usize> {
        let v = self.u64(off, what)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v <= (1usize << 48))
            .ok_or_else(|| Error::format(self.path, format!("{what} = {v} is absurd")))
    }
    /// Check the 16-byte prefix: magic, version; returns the third u32 (value size or layout).
    pub fn prefix(&self, magic: &[u8; 8], kind: &str) -> Result<u32> {
        self.need(0, 16, &format!("the {kind} header"))?;
        if &self.data[0..8] != magic {
            return Err(Error::format(
                self.path,
                format!(
                    "bad magic {:?}: not a seistomo {kind} file (expected {:?})",
                    String::from_utf8_lossy(&self.data[0..8]),
                    String::from_utf8_lossy(magic)
                ),
            ));
        }
        let v = self.u32(8, "version")?;
        if v != VERSION {
            return Err(Error::format(
                self.path,
                format!("format version {v} is not supported (this build reads version {VERSION})"),
            ));
        }
        self.u32(12, "header")
    }
    /// The file must end exactly at `end`.
    pub fn exact_len(&self, end: usize, what: &str) -> Result<()> {
        if self.data.len() < end {
            return Err(Error::format(
                self.path,
                format!(
                    "truncated: {what} needs {end} bytes but the file has {}",
                    self.data.len()
                ),
            ));
        }
        if self.data.len() > end {
            return Err(Error::format(
                self.path,
                format!(
                    "{} trailing bytes after {what} (expected {end} bytes)",
                    self.data.len() - end
                ),
            ));
        }
        Ok(())
    }
}

/// Decode `n` values of `vb` bytes at `off` into `out` (checked for finiteness; the error names
/// `row` and the column).
pub fn decode_values(
    r: &Reader,
    off: usize,
    vb: usize,
    cols: &[u32],
    out: &mut [f64],
    row_label: &dyn Fn() -> String,
) -> Result<()> {
    let n = out.len();
    r.need(off, vb * n, "values")?;
    let bytes = &r.data[off..off + vb * n];
    let mut finite = true;
    if vb == 8 {
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
            *o = f64::from_le_bytes(c.try_into().unwrap());
            finite &= o.is_finite();
        }
    } else {
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes(c.try_into().unwrap()) as f64;
            finite &= o.is_finite();
        }
    }
    if finite {
        return Ok(());
    }
    if let Some(k) = out.iter().position(|v| !v.is_finite()) {
        let at = match cols.get(k) {
            Some(c) => format!("{}, column {c}", row_label()),
            None => format!("{}, row {k}", row_label()),
        };
        return Err(Error::format(
            r.path,
            format!("{at}: value is not finite ({})", out[k]),
        ));
    }
    Ok(())
}

/// Decode `out.len()` column indices at `off`, checking they strictly increase and are
/// `< ncols`.
pub fn decode_columns(
    r: &Reader,
    off: usize,
    ncols: usize,
    out: &mut [u32],
    row_label: &dyn Fn() -> String,
) -> Result<()> {
    let n = out.len();
    r.need(off, 4 * n, "column indices")?;
    let bytes = &r.data[off..off + 4 * n];
    // Branch-free first pass; the slow pass below only finds and names the bad column.
    let mut bad = false;
    let mut prev: i64 = -1;
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        let col = u32::from_le_bytes(c.try_into().unwrap());
        bad |= (col as usize >= ncols) | ((col as i64) <= prev);
        prev = col as i64;
        *o = col;
    }
    if !bad {
        return Ok(());
    }
    let mut prev: i64 = -1;
    for &col in out.iter() {
        if col as usize >= ncols {
            return Err(Error::format(
                r.path,
                format!(
                    "{}: column {col} out of range (ncols = {ncols})",
                    row_label()
                ),
            ));
        }
        if col as i64 <= prev {
            return Err(Error::format(
                r.path,
                format!(
                    "{}: columns not strictly increasing at column {col} (unsorted or duplicate)",
                    row_label()
                ),
            ));
        }
        prev = col as i64;
    }
    Ok(())
}

/// Decode a row record at `off` whose header must say (`row`, `nnz`); fills `cols`/`vals`
/// (both of length `nnz`).
pub fn decode_record(
    r: &Reader,
    off: usize,
    row: u64,
    vb: usize,
    ncols: usize,
    cols: &mut [u32],
    vals: &mut [f64],
) -> Result<()> {
    let nnz = cols.len();
    let label = || format!("kernel row {row}");
    let got_row = r.u64(off, "row record header")?;
    let got_nnz = r.u64(off + 8, "row record header")?;
    if got_row != row {
        return Err(Error::format(
            r.path,
            format!("record at byte {off} holds row {got_row} but the metadata says row {row}"),
        ));
    }
    if got_nnz != nnz as u64 {
        return Err(Error::format(
            r.path,
            format!("kernel row {row}: {got_nnz} nonzeros in the file but {nnz} in the metadata"),
        ));
    }
    r.need(off, record_size(nnz, vb), &format!("kernel row {row}"))?;
    decode_columns(r, off + 16, ncols, cols, &label)?;
    decode_values(r, off + 16 + pad8(4 * nnz), vb, cols, vals, &label)
}

/// Write little-endian primitives.
pub fn put_u32(w: &mut dyn Write, v: u32) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}
pub fn put_u64(w: &mut dyn Write, v: u64) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}
/// The 16-byte prefix.
pub fn put_prefix(w: &mut dyn Write, magic: &[u8; 8], third: u32) -> std::io::Result<()> {
    w.write_all(magic)?;
    put_u32(w, VERSION)?;
    put_u32(w, third)
}
/// Zero bytes up to the next multiple of 8 after `written` bytes.
pub fn put_pad(w: &mut dyn Write, written: usize) -> std::io::Result<()> {
    let p = pad8(written) - written;
    w.write_all(&[0u8; 8][..p])
}
/// Columns as u32 then padding.
pub fn put_columns(w: &mut dyn Write, cols: &[u32]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 * cols.len());
    for c in cols {
        buf.extend_from_slice(&c.to_le_bytes());
    }
    w.write_all(&buf)?;
    put_pad(w, buf.len())
}
/// Values in `prec` then padding.
pub fn put_values(w: &mut dyn Write, vals: &[f64], prec: Precision) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(prec.bytes() * vals.len());
    match prec {
        Precision::F64 => vals
            .iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes())),
        Precision::F32 => vals
            .iter()
            .for_each(|v| buf.extend_from_slice(&(*v as f32).to_le_bytes())),
    }
    w.write_all(&buf)?;
    put_pad(w, buf.len())
}
/// One row record.
pub fn put_record(
    w: &mut dyn Write,
    row: u64,
    cols: &[u32],
    vals: &[f64],
    prec: Precision,
) -> std::io::Result<()> {
    put_u64(w, row)?;
    put_u64(w, cols.len() as u64)?;
    put_columns(w, cols)?;
    put_values(w, vals, prec)
}
