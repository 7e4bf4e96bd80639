//! Binary building blocks of the dataset format (docs/formats.md): magics, the common 16-byte
//! prefix, row records, and checked little-endian reads that name the file on every error.

use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{Error, Result};

/// Format version written: 3 (version 2 plus the dataset id in every file's prefix). Versions
/// 2 (CRC32C checksums per section, no id) and 1 (no checksums) are read.
pub const VERSION: u32 = 3;
/// The version with checksums and without dataset ids, still read (and written on request).
pub const VERSION_2: u32 = 2;
/// The first version, still read.
pub const VERSION_1: u32 = 1;

/// Bytes of the prefix every binary file starts with: magic, version, value size or layout
/// (16), and from version 3 the dataset id (u64) and a reserved zero u64.
pub fn prefix_len(version: u32) -> usize {
    if version >= 3 {
        32
    } else {
        16
    }
}

/// A dataset id as the manifest writes it: 16 hex digits.
pub fn id_text(id: u64) -> String {
    format!("{id:016x}")
}

/// A fresh dataset id: random (the standard library's randomly seeded hasher, mixed with the
/// time and the process id), never 0.
pub fn new_dataset_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.write_u32(std::process::id());
    h.finish().max(1)
}

/// CRC32C (Castagnoli) of `data`: hardware instructions where the CPU has them (SSE 4.2 on
/// x86_64, the CRC extension on aarch64), else a table.
pub fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// CRC32C of `data` continued from `crc` (the CRC of the bytes before it).
pub fn crc_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// Bytes after a row record in version 2: u32 CRC32C of the record, u32 zero.
pub const RECORD_TRAILER: usize = 8;

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

choice_from_str!(Precision, "precision", "f32" => Precision::F32, "f64" => Precision::F64);

/// `n` rounded up to a multiple of 8.
pub fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Bytes of one row record holding `nnz` values of `vb` bytes: row (u64), nnz (u64), columns
/// (u32, padded to 8), values (padded to 8).
pub fn record_size(nnz: usize, vb: usize) -> usize {
    16 + pad8(4 * nnz) + pad8(vb * nnz)
}

/// [`record_size`] in format `version` (version 2 adds the 8-byte checksum trailer).
pub fn record_size_v(nnz: usize, vb: usize, version: u32) -> usize {
    record_size(nnz, vb) + if version >= 2 { RECORD_TRAILER } else { 0 }
}

/// The one-line error for a checksum that does not match.
pub fn checksum_error(path: &Path, what: &str, stored: u32, computed: u32) -> Error {
    Error::format(
        path,
        format!("{what}: checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is corrupted"),
    )
}

/// Error unless a file's values of `got` bytes are the dataset's precision (`want` bytes).
pub fn check_value_size(path: &Path, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::format(
            path,
            format!("values of {got} bytes but the dataset's precision has {want}"),
        ));
    }
    Ok(())
}

/// A file's bytes with checked little-endian reads.
pub struct Reader<'a> {
    pub path: &'a Path,
    pub data: &'a [u8],
    /// Where `data` starts in the file (a range read from its middle): byte offsets in error
    /// messages are the file's.
    pub base: u64,
}

impl<'a> Reader<'a> {
    pub fn new(path: &'a Path, data: &'a [u8]) -> Self {
        Reader {
            path,
            data,
            base: 0,
        }
    }
    /// A reader of bytes read from offset `base` of the file.
    pub fn at(path: &'a Path, data: &'a [u8], base: u64) -> Self {
        Reader { path, data, base }
    }
    /// Offset `off` of `data` as an offset in the file.
    fn in_file(&self, off: usize) -> u64 {
        self.base + off as u64
    }
    /// Error unless `len` bytes are available at `off`.
    pub fn need(&self, off: usize, len: usize, what: &str) -> Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.data.len() => Ok(()),
            _ if self.base > 0 => Err(Error::format(
                self.path,
                format!(
                    "truncated: {what} needs bytes {}..{} but only {}..{} were read",
                    self.in_file(off),
                    self.in_file(off.saturating_add(len)),
                    self.base,
                    self.in_file(self.data.len())
                ),
            )),
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
    /// Check the prefix: magic, a version equal to `want` (the manifest's) and, from version 3,
    /// the dataset id `id` (the manifest's: a file copied from another dataset is refused) and
    /// the reserved zeros after it; returns the third u32 (value size or layout).
    pub fn prefix_v(&self, magic: &[u8; 8], kind: &str, want: u32, id: u64) -> Result<u32> {
        let third = self.prefix(magic, kind)?;
        let v = self.u32(8, "version")?;
        if v != want {
            return Err(Error::format(
                self.path,
                format!("format version {v} but the dataset's manifest says version {want}"),
            ));
        }
        if want >= 3 {
            let got = self.u64(16, "dataset id")?;
            if got != id {
                return Err(Error::format(
                    self.path,
                    format!(
                        "belongs to dataset {} but this dataset's manifest says dataset_id = \"{}\": a file of another dataset (copied from a sibling?) is refused",
                        id_text(got),
                        id_text(id)
                    ),
                ));
            }
            self.zeros(24, 8, "reserved field after the dataset id")?;
        }
        Ok(third)
    }
    /// The u32 at `off` must equal the CRC32C of bytes `range` (checked readable first).
    pub fn check_crc(&self, range: std::ops::Range<usize>, off: usize, what: &str) -> Result<()> {
        self.need(range.start, range.len(), what)?;
        let stored = self.u32(off, what)?;
        let computed = crc(&self.data[range]);
        if stored != computed {
            return Err(checksum_error(self.path, what, stored, computed));
        }
        Ok(())
    }
    /// Bytes `off..off + len` must be zero (padding and reserved fields in version 2).
    pub fn zeros(&self, off: usize, len: usize, what: &str) -> Result<()> {
        self.need(off, len, what)?;
        if self.data[off..off + len].iter().any(|&b| b != 0) {
            return Err(Error::format(
                self.path,
                format!(
                    "{what} at byte {} is not zero (corrupted file)",
                    self.in_file(off)
                ),
            ));
        }
        Ok(())
    }
    /// Check the 16-byte prefix: magic, a known version; returns the third u32 (value size or
    /// layout).
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
        if !(VERSION_1..=VERSION).contains(&v) {
            return Err(Error::format(
                self.path,
                format!("format version {v} is not supported (this build reads versions {VERSION_1} to {VERSION})"),
            ));
        }
        self.u32(12, "header")
    }
    /// The file must end exactly at `end`.
    pub fn exact_len(&self, end: usize, what: &str) -> Result<()> {
        self.exact_len_of(self.data.len() as u64, end as u64, what)
    }
    /// A file of `len` bytes must end exactly at `end`.
    pub fn exact_len_of(&self, len: u64, end: u64, what: &str) -> Result<()> {
        if len < end {
            return Err(Error::format(
                self.path,
                format!("truncated: {what} needs {end} bytes but the file has {len}"),
            ));
        }
        if len > end {
            return Err(Error::format(
                self.path,
                format!(
                    "{} trailing bytes after {what} (expected {end} bytes)",
                    len - end
                ),
            ));
        }
        Ok(())
    }
}

/// Decode `n` values of `vb` bytes at `off` into `out` (checked for finiteness; the error names
/// `row` and the column).
/// Decode `out.len()` little-endian values of `vb` bytes (8: f64, else f32) from `bytes`;
/// whether every one is finite.
pub fn decode_finite(bytes: &[u8], vb: usize, out: &mut [f64]) -> bool {
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
    finite
}

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
    if decode_finite(&r.data[off..off + vb * n], vb, out) {
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
/// (both of length `nnz`). In version 2 the record's checksum is verified first.
#[allow(clippy::too_many_arguments)]
pub fn decode_record(
    r: &Reader,
    off: usize,
    row: u64,
    vb: usize,
    version: u32,
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
            format!(
                "record at byte {} holds row {got_row} but the metadata says row {row}",
                r.in_file(off)
            ),
        ));
    }
    if got_nnz != nnz as u64 {
        return Err(Error::format(
            r.path,
            format!("kernel row {row}: {got_nnz} nonzeros in the file but {nnz} in the metadata"),
        ));
    }
    let rs = record_size(nnz, vb);
    // (The labels are formatted only on the error paths: this runs once per row.)
    let size = record_size_v(nnz, vb, version);
    if off.checked_add(size).is_none_or(|end| end > r.data.len()) {
        r.need(off, size, &label())?;
    }
    if version >= 2 {
        let stored = u32::from_le_bytes(r.data[off + rs..off + rs + 4].try_into().unwrap());
        let computed = crc(&r.data[off..off + rs]);
        if stored != computed {
            return Err(checksum_error(
                r.path,
                &format!("kernel row {row} (record at byte {})", r.in_file(off)),
                stored,
                computed,
            ));
        }
        if r.data[off + rs + 4..off + rs + 8] != [0; 4] {
            r.zeros(
                off + rs + 4,
                4,
                &format!("kernel row {row}: reserved field"),
            )?;
        }
    }
    // Padding is covered by the checksum in version 2 (ignored in version 1).
    decode_columns(r, off + 16, ncols, cols, &label)?;
    decode_values(r, off + 16 + pad8(4 * nnz), vb, cols, vals, &label)
}

/// Write a file inside a dataset being built (the whole directory is renamed into place at the
/// end, so single files need no atomic rename).
pub fn write_plain<F>(path: &Path, body: F) -> Result<()>
where
    F: FnOnce(&mut dyn Write) -> std::io::Result<()>,
{
    let r = (|| {
        let f = std::fs::File::create(path)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        body(&mut w)?;
        w.flush()
    })();
    r.map_err(|e| Error::io(path, e))
}

/// Write little-endian primitives.
pub fn put_u32(w: &mut dyn Write, v: u32) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}
pub fn put_u64(w: &mut dyn Write, v: u64) -> std::io::Result<()> {
    w.write_all(&v.to_le_bytes())
}
/// The prefix of format `version` ([`prefix_len`] bytes; from version 3 with the dataset id
/// `id` and a reserved zero u64).
pub fn put_prefix(
    w: &mut dyn Write,
    magic: &[u8; 8],
    version: u32,
    third: u32,
    id: u64,
) -> std::io::Result<()> {
    w.write_all(magic)?;
    put_u32(w, version)?;
    put_u32(w, third)?;
    if version >= 3 {
        put_u64(w, id)?;
        put_u64(w, 0)?;
    }
    Ok(())
}

/// A writer that keeps the CRC32C of what went through it since the last [`CrcWriter::take`].
pub struct CrcWriter<'a> {
    pub inner: &'a mut dyn Write,
    crc: u32,
}

impl<'a> CrcWriter<'a> {
    pub fn new(inner: &'a mut dyn Write) -> Self {
        CrcWriter { inner, crc: 0 }
    }
    /// The CRC32C of the bytes written since the last call; starts a new one.
    pub fn take(&mut self) -> u32 {
        std::mem::take(&mut self.crc)
    }
}

impl Write for CrcWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.crc = crc_append(self.crc, &buf[..k]);
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
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
/// One row record of format `version` (version 2: followed by its CRC32C and a zero u32).
pub fn put_record(
    w: &mut dyn Write,
    row: u64,
    cols: &[u32],
    vals: &[f64],
    prec: Precision,
    version: u32,
) -> std::io::Result<()> {
    let mut cw = CrcWriter::new(w);
    put_u64(&mut cw, row)?;
    put_u64(&mut cw, cols.len() as u64)?;
    put_columns(&mut cw, cols)?;
    put_values(&mut cw, vals, prec)?;
    if version >= 2 {
        let c = cw.take();
        put_u32(cw.inner, c)?;
        put_u32(cw.inner, 0)?;
    }
    Ok(())
}
