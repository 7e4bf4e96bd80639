//! Damping block files: consecutive damping rows as a small CSR (docs/formats.md).

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::dataset::binfmt::write_plain;
use crate::io::dataset::binfmt::{
    checksum_error, crc, crc_append, decode_values, pad8, prefix_len, put_columns, put_prefix,
    put_u32, put_u64, put_values, CrcWriter, Precision, Reader, MAGIC_DAMP,
};
use crate::io::mmap::MappedFile;
use crate::sparse::Csr;

/// Nonzeros per checksum chunk (version 2).
pub const DAMP_CHUNK: usize = 65536;

/// Bytes of the prefix and the header's fields (block, first row, rows, nonzeros, columns) in
/// format `version`: 56, or 72 from version 3 (the dataset id in the prefix).
fn damp_fields_end(version: u32) -> usize {
    prefix_len(version) + 40
}

/// Bytes before the row offsets in format `version` (version 2 adds 8 to the fields: the
/// header's and the row offsets' CRC32C).
fn damp_header(version: u32) -> usize {
    if version >= 2 {
        damp_fields_end(version) + 8
    } else {
        damp_fields_end(version)
    }
}

/// Write the damping matrix `d` as `nblocks` block files `dir/damping/block_NNNN.bin` with about
/// equal row counts. Returns the paths relative to `dir`.
pub fn write_damping(
    dir: &Path,
    d: &Csr,
    nblocks: usize,
    prec: Precision,
    (version, id): (u32, u64),
) -> Result<Vec<PathBuf>> {
    let sub = dir.join("damping");
    std::fs::create_dir_all(&sub).map_err(|e| Error::io(&sub, e))?;
    let nblocks = nblocks.clamp(1, d.nrows().max(1));
    let m = d.nrows();
    let mut names = Vec::new();
    for b in 0..nblocks {
        let (r0, r1) = (b * m / nblocks, (b + 1) * m / nblocks);
        let rel = PathBuf::from("damping").join(format!("block_{b:04}.bin"));
        let ip = d.indptr();
        let (s, e) = (ip[r0] as usize, ip[r1] as usize);
        write_plain(&dir.join(&rel), |w| {
            let mut cw = CrcWriter::new(w);
            put_prefix(&mut cw, &MAGIC_DAMP, version, prec.bytes() as u32, id)?;
            put_u64(&mut cw, b as u64)?;
            put_u64(&mut cw, r0 as u64)?;
            put_u64(&mut cw, (r1 - r0) as u64)?;
            put_u64(&mut cw, (e - s) as u64)?;
            put_u64(&mut cw, d.ncols() as u64)?;
            let head = cw.take();
            let w = cw.inner;
            let mut buf = Vec::with_capacity(8 * (r1 - r0 + 1));
            for &p in &ip[r0..=r1] {
                buf.extend_from_slice(&(p - s as u64).to_le_bytes());
            }
            if version >= 2 {
                put_u32(w, head)?;
                put_u32(w, crc(&buf))?;
            }
            w.write_all(&buf)?;
            put_columns(w, &d.indices()[s..e])?;
            put_values(w, &d.data()[s..e], prec)?;
            if version >= 2 {
                // One CRC32C per DAMP_CHUNK nonzeros: its columns, then its values.
                let (cols, vals) = (&d.indices()[s..e], &d.data()[s..e]);
                let mut sums = Vec::new();
                for k in 0..cols.len().div_ceil(DAMP_CHUNK) {
                    let (a, z) = (k * DAMP_CHUNK, ((k + 1) * DAMP_CHUNK).min(cols.len()));
                    let mut cb = Vec::with_capacity(4 * (z - a));
                    cols[a..z]
                        .iter()
                        .for_each(|c| cb.extend_from_slice(&c.to_le_bytes()));
                    let mut vbuf = Vec::with_capacity(prec.bytes() * (z - a));
                    put_values(&mut vbuf, &vals[a..z], prec)?;
                    vbuf.truncate(prec.bytes() * (z - a));
                    sums.push(crc_append(crc(&cb), &vbuf));
                }
                for c in &sums {
                    put_u32(w, *c)?;
                }
                crate::io::dataset::binfmt::put_pad(w, 4 * sums.len())?;
            }
            Ok(())
        })?;
        names.push(rel);
    }
    Ok(names)
}

/// A mapped, header-checked damping block.
pub struct DampingBlock {
    pub path: PathBuf,
    map: MappedFile,
    pub first_row: u64,
    pub rows: u64,
    pub nnz: u64,
    vb: usize,
    /// Format version (2: chunk checksums verified as rows are read).
    pub version: u32,
}

impl DampingBlock {
    /// Open block number `index`, check its header against the expected first row, columns,
    /// precision and format version, and its length (version 2: the header's and the row
    /// offsets' checksums too).
    pub fn open(
        path: &Path,
        index: u64,
        first_row: u64,
        ncols: u64,
        prec: Precision,
        (version, id): (u32, u64),
    ) -> Result<DampingBlock> {
        let map = MappedFile::open(path)?;
        let r = Reader::new(path, map.bytes());
        let vb = r.prefix_v(&MAGIC_DAMP, "damping block", version, id)? as usize;
        let head = damp_header(version);
        let (p, fields) = (prefix_len(version), damp_fields_end(version));
        if version >= 2 {
            r.check_crc(0..fields, fields, "damping block header")?;
        }
        let bad = |msg: String| Error::format(path, msg);
        if vb != prec.bytes() {
            return Err(bad(format!(
                "values of {vb} bytes but the dataset's precision has {}",
                prec.bytes()
            )));
        }
        let idx = r.u64(p, "block index")?;
        if idx != index {
            return Err(bad(format!(
                "block index {idx} but it is listed as block {index}"
            )));
        }
        let fr = r.u64(p + 8, "first row")?;
        if fr != first_row {
            return Err(bad(format!(
                "first row {fr} but the blocks before it end at row {first_row}"
            )));
        }
        let rows = r.count(p + 16, "rows")?;
        let nnz = r.count(p + 24, "nonzeros")?;
        let nc = r.u64(p + 32, "columns")?;
        if nc != ncols {
            return Err(bad(format!("{nc} columns but the dataset has {ncols}")));
        }
        let chunks = if version >= 2 {
            nnz.div_ceil(DAMP_CHUNK)
        } else {
            0
        };
        let cols_at = head + 8 * (rows + 1);
        let vals_at = cols_at + pad8(4 * nnz);
        let sums_at = vals_at + pad8(vb * nnz);
        let end = sums_at + pad8(4 * chunks);
        r.exact_len(end, &format!("{rows} rows and {nnz} nonzeros"))?;
        if version >= 2 {
            r.check_crc(head..cols_at, fields + 4, "damping row offsets")?;
            r.zeros(cols_at + 4 * nnz, pad8(4 * nnz) - 4 * nnz, "padding")?;
            r.zeros(vals_at + vb * nnz, pad8(vb * nnz) - vb * nnz, "padding")?;
            r.zeros(
                sums_at + 4 * chunks,
                pad8(4 * chunks) - 4 * chunks,
                "padding",
            )?;
        }
        let mut prev = 0u64;
        for i in 0..=rows {
            let p = r.u64(head + 8 * i, "row offsets")?;
            if (i == 0 && p != 0) || p < prev || p > nnz as u64 || (i == rows && p != nnz as u64) {
                return Err(bad(format!(
                    "damping row {}: bad row offset {p} (offsets must start at 0, not decrease and end at {nnz})",
                    first_row + i as u64
                )));
            }
            prev = p;
        }
        Ok(DampingBlock {
            path: path.to_path_buf(),
            map,
            first_row,
            rows: rows as u64,
            nnz: nnz as u64,
            vb,
            version,
        })
    }

    /// Bytes before the row offsets.
    fn head(&self) -> usize {
        damp_header(self.version)
    }

    /// Verify the checksums of the chunks holding block nonzeros `s..e` (version 2), reading
    /// the chunks' columns and values with `reader` when one is given (else from the map).
    /// `row_of(k)` names the damping row of block nonzero k.
    fn verify_chunks(
        &self,
        s: usize,
        e: usize,
        reader: Option<&crate::io::rowio::RangeReader>,
        row_of: &dyn Fn(usize) -> u64,
    ) -> Result<()> {
        if self.version < 2 || s >= e {
            return Ok(());
        }
        let nnz = self.nnz as usize;
        let cols_at = self.head() + 8 * (self.rows as usize + 1);
        let vals_at = cols_at + pad8(4 * nnz);
        let sums_at = vals_at + pad8(self.vb * nnz);
        let map = self.map.bytes();
        for k in s / DAMP_CHUNK..e.div_ceil(DAMP_CHUNK) {
            let (a, z) = (k * DAMP_CHUNK, ((k + 1) * DAMP_CHUNK).min(nnz));
            let (c0, c1) = (cols_at + 4 * a, cols_at + 4 * z);
            let (v0, v1) = (vals_at + self.vb * a, vals_at + self.vb * z);
            let computed = match reader {
                None => crc_append(crc(&map[c0..c1]), &map[v0..v1]),
                Some(rd) => {
                    let cb = rd.read(&self.path, c0 as u64, c1 - c0)?;
                    let vb = rd.read(&self.path, v0 as u64, v1 - v0)?;
                    crc_append(crc(&cb), &vb)
                }
            };
            let o = sums_at + 4 * k;
            let stored = u32::from_le_bytes(map[o..o + 4].try_into().unwrap());
            if stored != computed {
                return Err(checksum_error(
                    &self.path,
                    &format!(
                        "damping rows {}..={} (nonzeros {a}..{z} of the block)",
                        row_of(a),
                        row_of(z - 1)
                    ),
                    stored,
                    computed,
                ));
            }
        }
        Ok(())
    }

    /// Nonzeros of block-local rows `range` (offsets were checked at open).
    pub fn range_nnz(&self, range: Range<u64>) -> u64 {
        let b = self.map.bytes();
        let head = self.head();
        let at = |i: u64| {
            let o = head + 8 * i as usize;
            u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
        };
        at(range.end) - at(range.start)
    }

    /// Append the block's rows `range` (block-local) scaled by `weight` to CSR arrays; returns
    /// bytes read. Columns and values of the whole range are decoded in one pass each.
    pub fn read_rows(
        &self,
        range: Range<u64>,
        weight: f64,
        ncols: usize,
        indptr: &mut Vec<u64>,
        indices: &mut Vec<u32>,
        data: &mut Vec<f64>,
    ) -> Result<u64> {
        self.read_rows_via(range, weight, ncols, None, indptr, indices, data)
    }

    /// [`Self::read_rows`], the columns and values of the range read with `reader` (MPI-IO)
    /// instead of through the map when one is given (the row offsets come from the map, which
    /// [`Self::open`] checked).
    #[allow(clippy::too_many_arguments)]
    pub fn read_rows_via(
        &self,
        range: Range<u64>,
        weight: f64,
        ncols: usize,
        reader: Option<&crate::io::rowio::RangeReader>,
        indptr: &mut Vec<u64>,
        indices: &mut Vec<u32>,
        data: &mut Vec<f64>,
    ) -> Result<u64> {
        let r = Reader::new(&self.path, self.map.bytes());
        let rows = self.rows as usize;
        let nnz = self.nnz as usize;
        let (r0, r1) = (range.start as usize, range.end as usize);
        let head = self.head();
        let cols_at = head + 8 * (rows + 1);
        let vals_at = cols_at + pad8(4 * nnz);
        // Offsets were checked at open (monotone, 0..=nnz).
        let offs: Vec<usize> = r.data[head + 8 * r0..head + 8 * (r1 + 1)]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect();
        let (s, e) = (offs[0], offs[offs.len() - 1]);
        let base = indices.len();
        let first_row = self.first_row + r0 as u64;
        // The damping row holding local nonzero k of this range.
        let row_of = |k: usize| first_row + (offs.partition_point(|&o| o <= s + k) - 1) as u64;
        // Checksums of the chunks the range touches (version 2), before anything is decoded.
        {
            let at = |i: usize| {
                u64::from_le_bytes(r.data[head + 8 * i..head + 8 * i + 8].try_into().unwrap())
                    as usize
            };
            // The last row of the block starting at or before nonzero k.
            let block_row = |k: usize| {
                let (mut lo, mut hi) = (0usize, rows);
                while lo + 1 < hi {
                    let mid = (lo + hi) / 2;
                    if at(mid) <= k {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                self.first_row + lo as u64
            };
            self.verify_chunks(s, e, reader, &block_row)?;
        }
        indices.resize(base + e - s, 0);
        data.resize(base + e - s, 0.0);
        let label_all = || format!("damping rows {first_row}..{}", first_row + (r1 - r0) as u64);
        // The columns and values of the range: from the map, or read (the file's length was
        // checked at open, so a short read means it changed since).
        let (col_bytes, val_bytes);
        let (rc, c_off, rv, v_off) = match reader {
            None => (&r, cols_at + 4 * s, &r, vals_at + self.vb * s),
            Some(rd) => {
                let what = format!("damping rows {first_row}..{}", first_row + (r1 - r0) as u64);
                let ctx = |e| crate::io::rowio::in_context(e, &what);
                col_bytes = rd
                    .read(&self.path, (cols_at + 4 * s) as u64, 4 * (e - s))
                    .map_err(ctx)?;
                val_bytes = rd
                    .read(
                        &self.path,
                        (vals_at + self.vb * s) as u64,
                        self.vb * (e - s),
                    )
                    .map_err(ctx)?;
                (
                    &Reader::new(&self.path, &col_bytes),
                    0,
                    &Reader::new(&self.path, &val_bytes),
                    0,
                )
            }
        };
        // Range check of every column (strict increase is checked per row below).
        let cols = &mut indices[base..];
        if let Err(err) = decode_columns_unordered(rc, c_off, ncols, cols) {
            return Err(match err {
                Some(k) => Error::format(
                    &self.path,
                    format!(
                        "damping row {}: column {} out of range (ncols = {ncols})",
                        row_of(k),
                        cols[k]
                    ),
                ),
                None => Error::format(&self.path, format!("truncated: {}", label_all())),
            });
        }
        for w in offs.windows(2) {
            let row = &cols[w[0] - s..w[1] - s];
            if let Some(p) = row.windows(2).position(|c| c[1] <= c[0]) {
                return Err(Error::format(
                    &self.path,
                    format!(
                        "damping row {}: columns not strictly increasing at column {} (unsorted or duplicate)",
                        row_of(w[0] - s + p + 1),
                        row[p + 1]
                    ),
                ));
            }
        }
        let vals = &mut data[base..];
        decode_values(rv, v_off, self.vb, &[], vals, &label_all).map_err(|_| {
            let k = vals.iter().position(|v| !v.is_finite()).unwrap_or(0);
            Error::format(
                &self.path,
                format!(
                    "damping row {}, column {}: value is not finite ({})",
                    row_of(k),
                    cols[k],
                    vals[k]
                ),
            )
        })?;
        if weight != 1.0 {
            vals.iter_mut().for_each(|v| *v *= weight);
        }
        // each offset relative to the range's first entry, after the `base` entries before it
        // (a rank's damping range may start deep in a block while it holds few entries)
        indptr.extend(
            offs[1..]
                .iter()
                .map(|&o| (o as u64 - s as u64) + base as u64),
        );
        Ok(((r1 - r0 + 1) * 8 + (e - s) * (4 + self.vb)) as u64)
    }
}

/// Decode column indices checking only the range; `Err(Some(k))` names the bad position,
/// `Err(None)` a truncated file.
fn decode_columns_unordered(
    r: &Reader,
    off: usize,
    ncols: usize,
    out: &mut [u32],
) -> std::result::Result<(), Option<usize>> {
    let n = out.len();
    if off + 4 * n > r.data.len() {
        return Err(None);
    }
    let mut bad = false;
    for (o, c) in out.iter_mut().zip(r.data[off..off + 4 * n].chunks_exact(4)) {
        *o = u32::from_le_bytes(c.try_into().unwrap());
        bad |= *o as usize >= ncols;
    }
    if bad {
        return Err(out.iter().position(|&c| c as usize >= ncols));
    }
    Ok(())
}
