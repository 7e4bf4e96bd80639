//! Damping block files: consecutive damping rows as a small CSR (docs/formats.md).

use std::ops::Range;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::io::dataset::binfmt::write_plain;
use crate::io::dataset::binfmt::{
    checksum_error, crc, crc_append, decode_finite, pad8, prefix_len, put_columns, put_prefix,
    put_u32, put_u64, put_values, CrcWriter, Precision, Reader, MAGIC_DAMP,
};
use crate::io::mmap::MappedFile;
use crate::sparse::par::split_parts;
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
    /// Open block number `index`, check its header against the expected first row (where one
    /// is given), columns, precision and format version, and its length (version 2: the
    /// header's and the row offsets' checksums too).
    pub fn open(
        path: &Path,
        index: u64,
        first_row: Option<u64>,
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
        if let Some(want) = first_row {
            Self::check_first_row(path, fr, want)?;
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
                    fr + i as u64
                )));
            }
            prev = p;
        }
        Ok(DampingBlock {
            path: path.to_path_buf(),
            map,
            first_row: fr,
            rows: rows as u64,
            nnz: nnz as u64,
            vb,
            version,
        })
    }

    /// A block's first row `fr` (from its header) where the blocks before it end at `want`.
    pub fn check_first_row(path: &Path, fr: u64, want: u64) -> Result<()> {
        if fr != want {
            return Err(Error::format(
                path,
                format!("first row {fr} but the blocks before it end at row {want}"),
            ));
        }
        Ok(())
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
        row_of: &(dyn Fn(usize) -> u64 + Sync),
    ) -> Result<()> {
        if self.version < 2 || s >= e {
            return Ok(());
        }
        let nnz = self.nnz as usize;
        let cols_at = self.head() + 8 * (self.rows as usize + 1);
        let vals_at = cols_at + pad8(4 * nnz);
        let sums_at = vals_at + pad8(self.vb * nnz);
        let map = self.map.bytes();
        let check = |k: usize| -> Result<()> {
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
            Ok(())
        };
        let chunks = s / DAMP_CHUNK..e.div_ceil(DAMP_CHUNK);
        match reader {
            // MPI-IO reads from one thread, chunk by chunk
            Some(_) => chunks.into_iter().try_for_each(check),
            // through the map: the chunks on rayon's threads, the first bad one reported
            None => chunks
                .into_par_iter()
                .map(check)
                .collect::<Vec<_>>()
                .into_iter()
                .collect(),
        }
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
    /// bytes read ([`Self::read_rows_into`] on the arrays' new tail).
    pub fn read_rows(
        &self,
        range: Range<u64>,
        weight: f64,
        ncols: usize,
        indptr: &mut Vec<u64>,
        indices: &mut Vec<u32>,
        data: &mut Vec<f64>,
    ) -> Result<u64> {
        let nnz = self.range_nnz(range.clone()) as usize;
        let (rows, base) = ((range.end - range.start) as usize, indices.len());
        let (p0, n0) = (indptr.len(), data.len());
        indptr.resize(p0 + rows, 0);
        indices.resize(base + nnz, 0);
        data.resize(n0 + nnz, 0.0);
        let into = RowsOut {
            base: base as u64,
            indptr: &mut indptr[p0..],
            indices: &mut indices[base..],
            data: &mut data[n0..],
        };
        self.read_rows_into(range, weight, ncols, None, into)
    }

    /// Decode the block's rows `range` (block-local), scaled by `weight`, into `out` (sized by
    /// [`Self::range_nnz`]), the columns and values read with `reader` (MPI-IO) when one is
    /// given, else from the map (the row offsets come from the map, which [`Self::open`]
    /// checked). Returns the bytes read. The chunks' checksums and the rows are checked and
    /// decoded in pieces on rayon's threads (through a map); the error is the one a pass in row
    /// order finds first: a column out of range anywhere, then columns not increasing, then a
    /// value not finite.
    pub fn read_rows_into(
        &self,
        range: Range<u64>,
        weight: f64,
        ncols: usize,
        reader: Option<&crate::io::rowio::RangeReader>,
        out: RowsOut<'_>,
    ) -> Result<u64> {
        let r = Reader::new(&self.path, self.map.bytes());
        let rows = self.rows as usize;
        let nnz = self.nnz as usize;
        let (r0, r1) = (range.start as usize, range.end as usize);
        let head = self.head();
        let cols_at = head + 8 * (rows + 1);
        let vals_at = cols_at + pad8(4 * nnz);
        // Offsets were checked at open (monotone, 0..=nnz).
        let off = |i: usize| {
            let o = head + 8 * i;
            u64::from_le_bytes(r.data[o..o + 8].try_into().unwrap()) as usize
        };
        let (s, e) = (off(r0), off(r1));
        if out.indices.len() != e - s || out.data.len() != e - s || out.indptr.len() != r1 - r0 {
            return Err(Error::Invalid(format!(
                "damping rows {r0}..{r1} of {}: arrays of the wrong size",
                self.path.display()
            )));
        }
        // The first row in lo..hi (hi where none) whose offset is past `k` (`at`: or at it).
        let first_past = |(mut lo, mut hi): (usize, usize), k: usize, at: bool| {
            while lo < hi {
                let mid = (lo + hi) / 2;
                if off(mid) > k || (at && off(mid) == k) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            lo
        };
        // The block row holding block nonzero k (the last row starting at or before it).
        let block_row = |k: usize| self.first_row + (first_past((0, rows), k, false) - 1) as u64;
        // Checksums of the chunks the range touches (version 2), before anything is decoded.
        self.verify_chunks(s, e, reader, &block_row)?;
        let first_row = self.first_row + r0 as u64;
        // The columns and values of the range: from the map, or read (the file's length was
        // checked at open, so a short read means it changed since).
        let (col_bytes, val_bytes);
        let (cb, vb): (&[u8], &[u8]) = match reader {
            None => (
                &r.data[cols_at + 4 * s..cols_at + 4 * e],
                &r.data[vals_at + self.vb * s..vals_at + self.vb * e],
            ),
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
                (&col_bytes, &val_bytes)
            }
        };
        if cb.len() != 4 * (e - s) || vb.len() != self.vb * (e - s) {
            return Err(Error::format(
                &self.path,
                format!(
                    "truncated: damping rows {first_row}..{}",
                    first_row + (r1 - r0) as u64
                ),
            ));
        }
        // Pieces of whole rows of about PIECE nonzeros each, decoded in parallel.
        const PIECE: usize = 1 << 16;
        // (the first row starting at or after each multiple of PIECE past s)
        let mut cuts = vec![r0];
        for j in 1..(e - s).div_ceil(PIECE) {
            let c = first_past((r0, r1), s + j * PIECE, true);
            if c > *cuts.last().unwrap() && c < r1 {
                cuts.push(c);
            }
        }
        cuts.push(r1);
        let RowsOut {
            base,
            indptr,
            indices,
            data,
        } = out;
        let spans: Vec<(usize, usize)> = cuts.windows(2).map(|w| (w[0], w[1])).collect();
        let entries = || spans.iter().map(|&(a, b)| off(b) - off(a));
        let jobs: Vec<_> = spans
            .iter()
            .copied()
            .zip(split_parts(indptr, spans.iter().map(|&(a, b)| b - a)))
            .zip(
                split_parts(indices, entries())
                    .into_iter()
                    .zip(split_parts(data, entries())),
            )
            .map(|((span, ptr), (cols, vals))| (span, ptr, cols, vals))
            .collect();
        let vbytes = self.vb;
        // Per piece: the first column out of range, the first entry not above the one before
        // in its row, the first value not finite (range-local nonzero positions).
        let found: Vec<[Option<usize>; 3]> = jobs
            .into_par_iter()
            .map(|((a, b), ptr, cols, vals)| {
                let k0 = off(a) - s;
                let mut bad = [None; 3];
                for (j, (o, c)) in cols
                    .iter_mut()
                    .zip(cb[4 * k0..].chunks_exact(4))
                    .enumerate()
                {
                    *o = u32::from_le_bytes(c.try_into().unwrap());
                    if *o as usize >= ncols && bad[0].is_none() {
                        bad[0] = Some(k0 + j);
                    }
                }
                for (i, p) in (a..b).zip(ptr.iter_mut()) {
                    let (x, y) = (off(i) - off(a), off(i + 1) - off(a));
                    *p = (off(i + 1) - s) as u64 + base;
                    if bad[1].is_none() {
                        if let Some(q) = cols[x..y].windows(2).position(|c| c[1] <= c[0]) {
                            bad[1] = Some(k0 + x + q + 1);
                        }
                    }
                }
                let vals_b = &vb[vbytes * k0..vbytes * (k0 + vals.len())];
                if !decode_finite(vals_b, vbytes, vals) {
                    bad[2] = vals.iter().position(|v| !v.is_finite()).map(|j| k0 + j);
                }
                if weight != 1.0 {
                    vals.iter_mut().for_each(|v| *v *= weight);
                }
                bad
            })
            .collect();
        let first = |what: usize| found.iter().find_map(|b| b[what]);
        // The damping row holding range-local nonzero k, and its column and value.
        let row_of = |k: usize| block_row(s + k);
        let at = |k: usize| -> (u32, f64) {
            let c = u32::from_le_bytes(cb[4 * k..4 * k + 4].try_into().unwrap());
            let mut v = [0.0];
            decode_finite(&vb[vbytes * k..vbytes * (k + 1)], vbytes, &mut v);
            (c, v[0])
        };
        if let Some(k) = first(0) {
            return Err(Error::format(
                &self.path,
                format!(
                    "damping row {}: column {} out of range (ncols = {ncols})",
                    row_of(k),
                    at(k).0
                ),
            ));
        }
        if let Some(k) = first(1) {
            return Err(Error::format(
                &self.path,
                format!(
                    "damping row {}: columns not strictly increasing at column {} (unsorted or duplicate)",
                    row_of(k),
                    at(k).0
                ),
            ));
        }
        if let Some(k) = first(2) {
            let (c, v) = at(k);
            return Err(Error::format(
                &self.path,
                format!(
                    "damping row {}, column {c}: value is not finite ({v})",
                    row_of(k)
                ),
            ));
        }
        Ok(((r1 - r0 + 1) * 8 + (e - s) * (4 + self.vb)) as u64)
    }
}

/// Where [`DampingBlock::read_rows_into`] puts a range of rows: each row's end offset (relative
/// to the range's first nonzero, plus `base`: the entries before the range in the whole
/// arrays), and the range's columns and values.
pub struct RowsOut<'a> {
    pub base: u64,
    pub indptr: &'a mut [u64],
    pub indices: &'a mut [u32],
    pub data: &'a mut [f64],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200,000 rows of 1-2 entries (about 300k nonzeros: several pieces of the parallel decode)
    /// in one version-1 block (no checksums, so a changed byte reaches the decoder).
    fn block(dir: &Path) -> (Csr, PathBuf) {
        let (m, n) = (200_000usize, 1000usize);
        let mut ip = vec![0u64];
        let (mut ix, mut dv) = (Vec::new(), Vec::new());
        for i in 0..m {
            ix.push((i % n) as u32);
            dv.push(1.0 + i as f64);
            if i % 2 == 0 {
                ix.push((i % n + 1) as u32);
                dv.push(-0.5);
            }
            ip.push(ix.len() as u64);
        }
        let d = Csr::try_new(m, n + 1, ip, ix, dv).unwrap();
        let rel = write_damping(dir, &d, 1, Precision::F64, (1, 0)).unwrap();
        (d, dir.join(&rel[0]))
    }

    fn read(path: &Path, d: &Csr) -> Result<(Vec<u64>, Vec<u32>, Vec<f64>)> {
        let blk = DampingBlock::open(path, 0, Some(0), d.ncols() as u64, Precision::F64, (1, 0))?;
        let (mut ip, mut ix, mut dv) = (vec![0u64], vec![7u32], vec![0.25]);
        blk.read_rows(
            0..d.nrows() as u64,
            2.0,
            d.ncols(),
            &mut ip,
            &mut ix,
            &mut dv,
        )?;
        Ok((ip, ix, dv))
    }

    /// Overwrite block nonzero k's column (or, with `value`, its value) in the file.
    fn poke(path: &Path, d: &Csr, k: usize, col: Option<u32>, value: Option<f64>) {
        let mut b = std::fs::read(path).unwrap();
        let cols_at = damp_header(1) + 8 * (d.nrows() + 1);
        let vals_at = cols_at + pad8(4 * d.nnz());
        if let Some(c) = col {
            b[cols_at + 4 * k..cols_at + 4 * k + 4].copy_from_slice(&c.to_le_bytes());
        }
        if let Some(v) = value {
            b[vals_at + 8 * k..vals_at + 8 * k + 8].copy_from_slice(&v.to_le_bytes());
        }
        std::fs::write(path, b).unwrap();
    }

    #[test]
    fn rows_decoded_in_pieces_equal_the_block_and_errors_are_a_row_order_pass() {
        let dir = std::env::temp_dir().join(format!("seistomo-damp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (d, path) = block(&dir);
        // whole: after one entry already there, offsets past it, values times the weight
        let (ip, ix, dv) = read(&path, &d).unwrap();
        assert_eq!(ip.len(), d.nrows() + 1);
        assert!(ip[1..]
            .iter()
            .zip(&d.indptr()[1..])
            .all(|(a, b)| *a == b + 1));
        assert_eq!(&ix[1..], d.indices());
        assert!(dv[1..].iter().zip(d.data()).all(|(a, b)| *a == 2.0 * b));
        let nnz = d.nnz();
        let row_of = |k: usize| d.indptr().partition_point(|&o| o as usize <= k) - 1;
        // a row out of order early, a column out of range late: the column (checked first)
        let (early, late) = (4, nnz - 5);
        poke(&path, &d, early, Some(0), None);
        poke(&path, &d, late, Some(5000), None);
        let e = read(&path, &d).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "damping row {}: column 5000 out of range",
                row_of(late)
            )),
            "{e}"
        );
        // without it: the row out of order, though a value late is not finite
        let (_, path) = block(&dir);
        poke(&path, &d, early, Some(0), None);
        poke(&path, &d, late, None, Some(f64::NAN));
        let e = read(&path, &d).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "damping row {}: columns not strictly increasing at column 0",
                row_of(early)
            )),
            "{e}"
        );
        // the first of two values not finite, in different pieces
        let (_, path) = block(&dir);
        poke(&path, &d, nnz / 2, None, Some(f64::INFINITY));
        poke(&path, &d, late, None, Some(f64::NAN));
        let e = read(&path, &d).unwrap_err().to_string();
        let k = nnz / 2;
        assert!(
            e.contains(&format!(
                "damping row {}, column {}: value is not finite (inf)",
                row_of(k),
                d.indices()[k]
            )),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
