//! Kernel rows on disk: the metadata file (rows with their nnz, descending), per-row files and
//! packed files (docs/formats.md), written from a CSR and read back into a local CSR.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::io::dataset::binfmt::{
    check_value_size, crc, decode_record, pad8, prefix_len, put_pad, put_prefix, put_record,
    put_u32, put_u64, record_size_v, write_plain, CrcWriter, Precision, Reader, MAGIC_META,
    MAGIC_PACK, MAGIC_ROW,
};
use crate::io::dataset::manifest::{pack_file_name, row_file_name, DatasetManifest, Layout};
use crate::io::mmap::MappedFile;
use crate::io::rowio::{file_len, in_context, RangeReader};
use crate::sparse::Csr;

/// Metadata entries per checksum block (version 2).
pub const META_BLOCK: usize = 4096;
/// Bytes of one metadata entry and of one pack row-table entry.
pub const META_ENTRY: usize = 32;
pub const PACK_ENTRY: usize = 24;

/// Bytes of the metadata's prefix and fields (rows, columns, nonzeros, files) in format
/// `version`: 48, or 64 from version 3; version 2 adds 8 after them (header CRC32C and a zero
/// u32) before the entries.
pub fn meta_fields_end(version: u32) -> usize {
    prefix_len(version) + 32
}

/// Bytes of the pack header in format `version` (prefix, pack number, rows, nonzeros, two
/// CRC32Cs or a reserved u64): 48, or 64 from version 3.
pub fn pack_header(version: u32) -> usize {
    prefix_len(version) + 32
}

/// Bytes before the record in a per-row file: the prefix (16, or 32 from version 3).
pub fn row_header(version: u32) -> usize {
    prefix_len(version)
}

/// One kernel row as the metadata lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaEntry {
    pub row: u64,
    pub nnz: u64,
    /// Pack number (packed) or the row itself (per-row).
    pub file: u64,
    /// Byte offset of the row record in its file.
    pub offset: u64,
}

/// The parsed, validated metadata file.
#[derive(Debug, Clone)]
pub struct Metadata {
    pub path: PathBuf,
    pub layout: Layout,
    pub rows: u64,
    pub cols: u64,
    pub nnz: u64,
    pub files: u64,
    /// Entries in file order: descending nnz.
    pub entries: Vec<MetaEntry>,
}

fn layout_code(l: Layout) -> u32 {
    match l {
        Layout::PerRow => 0,
        Layout::Packed => 1,
    }
}

/// Read and validate the metadata against the manifest.
pub fn read_metadata(dm: &DatasetManifest) -> Result<Metadata> {
    let path = dm.resolve(&dm.m.metadata);
    let map = MappedFile::open(&path)?;
    parse_metadata(dm, map.bytes())
}

/// Validate the metadata file's bytes (read by one rank and broadcast) against the manifest;
/// errors name the metadata file.
pub fn parse_metadata(dm: &DatasetManifest, bytes: &[u8]) -> Result<Metadata> {
    let path = dm.resolve(&dm.m.metadata);
    let r = Reader::new(&path, bytes);
    let h = parse_meta_header(dm, &r)?;
    check_meta_sums(&r, &h, dm.m.version)?;
    let entries = parse_meta_entries(&r, &h)?;
    Ok(Metadata {
        path,
        layout: h.layout,
        rows: h.rows as u64,
        cols: h.cols,
        nnz: h.nnz,
        files: h.files,
        entries,
    })
}

/// The metadata header, checked against the manifest.
struct MetaHeader {
    /// Bytes before the entries.
    head: usize,
    /// Where a per-row file's record starts (the offset every per-row entry must give).
    row_header: u64,
    layout: Layout,
    rows: usize,
    cols: u64,
    nnz: u64,
    files: u64,
}

/// Read the metadata header (version 2: its checksum) and check it against the manifest.
fn parse_meta_header(dm: &DatasetManifest, r: &Reader) -> Result<MetaHeader> {
    let (version, id) = dm.tag();
    let code = r.prefix_v(&MAGIC_META, "metadata", version, id)?;
    let bad = |msg: String| Error::format(r.path, msg);
    let (p, fields) = (prefix_len(version), meta_fields_end(version));
    let head = if version >= 2 {
        r.check_crc(0..fields, fields, "metadata header")?;
        r.zeros(fields + 4, 4, "reserved field")?;
        fields + 8
    } else {
        fields
    };
    let layout = match code {
        0 => Layout::PerRow,
        1 => Layout::Packed,
        c => {
            return Err(bad(format!(
                "layout code {c} is neither 0 (per-row) nor 1 (packed)"
            )))
        }
    };
    if layout != dm.m.layout {
        return Err(bad(format!(
            "layout {layout:?} but {} says {:?}",
            dm.path.display(),
            dm.m.layout
        )));
    }
    let rows = r.count(p, "kernel rows")?;
    let cols = r.u64(p + 8, "columns")?;
    let nnz = r.u64(p + 16, "nonzeros")?;
    let files = r.u64(p + 24, "file count")?;
    for (what, got, want) in [
        ("kernel rows", rows as u64, dm.m.kernel_rows),
        ("columns", cols, dm.m.columns),
        ("nonzeros", nnz, dm.m.kernel_nnz),
    ] {
        if got != want {
            return Err(bad(format!(
                "{got} {what} but {} says {want}",
                dm.path.display()
            )));
        }
    }
    // The file count sizes per-file tables while loading: it must fit the rows (one file per
    // row, or packs of at least one row each).
    let files_fit = match layout {
        Layout::PerRow => files == rows as u64,
        Layout::Packed => files <= rows as u64,
    };
    if !files_fit {
        return Err(bad(format!(
            "file count {files} does not fit {rows} kernel rows ({layout:?} layout)"
        )));
    }
    Ok(MetaHeader {
        head,
        row_header: row_header(version) as u64,
        layout,
        rows,
        cols,
        nnz,
        files,
    })
}

/// Check the file's length for `h.rows` entries and (version 2) the checksum of every block of
/// [`META_BLOCK`] entries and the padding after the checksums.
fn check_meta_sums(r: &Reader, h: &MetaHeader, version: u32) -> Result<()> {
    let (head, rows) = (h.head, h.rows);
    let nblocks = if version >= 2 {
        rows.div_ceil(META_BLOCK)
    } else {
        0
    };
    let sums = head + META_ENTRY * rows;
    r.exact_len(sums + pad8(4 * nblocks), &format!("{rows} entries"))?;
    // the blocks on rayon's threads, the first bad one reported
    (0..nblocks)
        .into_par_iter()
        .map(|b| {
            let (k0, k1) = (b * META_BLOCK, ((b + 1) * META_BLOCK).min(rows));
            r.check_crc(
                head + META_ENTRY * k0..head + META_ENTRY * k1,
                sums + 4 * b,
                &format!("metadata entries {k0}..{k1}"),
            )
        })
        .collect::<Vec<_>>()
        .into_iter()
        .collect::<Result<()>>()?;
    if version >= 2 {
        r.zeros(
            sums + 4 * nblocks,
            pad8(4 * nblocks) - 4 * nblocks,
            "padding",
        )?;
    }
    Ok(())
}

/// The entries, each checked (row in range and listed once, nonzeros within the columns and in
/// descending order, file and offset fit the layout), and their totals against the header.
/// Decoded and checked in pieces on rayon's threads; the error is the one a pass in entry order
/// meets first.
fn parse_meta_entries(r: &Reader, h: &MetaHeader) -> Result<Vec<MetaEntry>> {
    let bad = |msg: String| Error::format(r.path, msg);
    let (rows, cols, files) = (h.rows, h.cols, h.files);
    r.need(h.head, META_ENTRY * rows, "entry")?;
    let field = |o: usize| u64::from_le_bytes(r.data[o..o + 8].try_into().unwrap());
    let entry = |k: usize| {
        let o = h.head + META_ENTRY * k;
        MetaEntry {
            row: field(o),
            nnz: field(o + 8),
            file: field(o + 16),
            offset: field(o + 24),
        }
    };
    // Entry k's own checks (all but "listed once"), in the order a pass makes them; the row
    // range is checked before the duplicate test, the rest after it.
    let row_error = |k: usize, e: &MetaEntry| {
        (e.row >= rows as u64).then(|| {
            format!(
                "entry {k}: row {} out of range (kernel rows = {rows})",
                e.row
            )
        })
    };
    let later_error = |k: usize, e: &MetaEntry| -> Option<String> {
        if e.nnz > cols {
            return Some(format!(
                "entry {k}: row {} has {} nonzeros but there are only {cols} columns",
                e.row, e.nnz
            ));
        }
        if k > 0 && e.nnz > entry(k - 1).nnz {
            return Some(format!(
                "entry {k}: row {} ({} nonzeros) breaks the descending nnz order",
                e.row, e.nnz
            ));
        }
        match h.layout {
            Layout::PerRow if e.file != e.row || e.offset != h.row_header => Some(format!(
                "entry {k}: row {} must name file {} at offset {} (got file {}, offset {})",
                e.row, e.row, h.row_header, e.file, e.offset
            )),
            Layout::Packed if e.file >= files => Some(format!(
                "entry {k}: row {} in pack {} but there are {files} packs",
                e.row, e.file
            )),
            _ => None,
        }
    };
    let entries: Vec<MetaEntry> = (0..rows).into_par_iter().map(entry).collect();
    // The first entry with an error of its own: (entry, checked before the duplicate test).
    let own = entries.par_iter().enumerate().find_map_first(|(k, e)| {
        row_error(k, e)
            .map(|m| (k, true, m))
            .or_else(|| later_error(k, e).map(|m| (k, false, m)))
    });
    // The first row listed twice, up to that entry (rows in range only).
    let upto = own.as_ref().map_or(rows, |o| o.0 + 1);
    let mut seen = vec![false; rows];
    let duplicate = entries[..upto].iter().enumerate().find_map(|(k, e)| {
        let i = e.row as usize;
        (i < rows && std::mem::replace(&mut seen[i], true))
            .then(|| (k, format!("entry {k}: duplicate row index {}", e.row)))
    });
    match (own, duplicate) {
        (Some((k, first, m)), Some((kd, _))) if k < kd || (k == kd && first) => return Err(bad(m)),
        (_, Some((_, m))) | (Some((_, _, m)), None) => return Err(bad(m)),
        (None, None) => {}
    }
    let total: u64 = entries.par_iter().map(|e| e.nnz).sum();
    if total != h.nnz {
        return Err(bad(format!(
            "the entries hold {total} nonzeros but the header says {}",
            h.nnz
        )));
    }
    if h.layout == Layout::Packed {
        let used = entries.iter().map(|e| e.file + 1).max().unwrap_or(0);
        if used != files {
            return Err(bad(format!(
                "file count {files} but the entries use packs 0..{used}"
            )));
        }
    }
    Ok(entries)
}

/// Write the kernel `a` into `dir/<kernel_dir>` and `dir/<metadata>`; returns the entries.
#[allow(clippy::too_many_arguments)]
pub fn write_kernel(
    dir: &Path,
    kernel_dir: &Path,
    metadata: &Path,
    a: &Csr,
    layout: Layout,
    prec: Precision,
    pack_bytes: u64,
    (version, id): (u32, u64),
    progress: bool,
) -> Result<Vec<MetaEntry>> {
    let kdir = dir.join(kernel_dir);
    std::fs::create_dir_all(&kdir).map_err(|e| Error::io(&kdir, e))?;
    let w = KernelWriter {
        kdir,
        a,
        nnz: (0..a.nrows())
            .map(|i| a.indptr()[i + 1] - a.indptr()[i])
            .collect(),
        prec,
        version,
        id,
        pb: crate::ui::progress::bar(a.nnz() as u64, "writing", progress),
    };
    let order = descending_order(&w.nnz);
    let entries = match layout {
        Layout::PerRow => w.row_files(&order)?,
        Layout::Packed => w.packs(&order, pack_bytes)?,
    };
    w.pb.finish_and_clear();
    let nfiles = match layout {
        Layout::PerRow => a.nrows() as u64,
        Layout::Packed => entries.last().map_or(0, |e| e.file + 1),
    };
    write_metadata(
        &dir.join(metadata),
        layout,
        a,
        nfiles,
        &entries,
        (version, id),
    )?;
    Ok(entries)
}

/// What the writers of kernel row files and packs share.
struct KernelWriter<'a> {
    kdir: PathBuf,
    a: &'a Csr,
    /// Nonzeros of each row.
    nnz: Vec<u64>,
    prec: Precision,
    version: u32,
    /// The dataset id (version 3).
    id: u64,
    pb: indicatif::ProgressBar,
}

impl KernelWriter<'_> {
    /// Bytes of row i's record.
    fn record_size(&self, i: usize) -> u64 {
        record_size_v(self.nnz[i] as usize, self.prec.bytes(), self.version) as u64
    }

    /// One file per row (rows `order`, the metadata order); their metadata entries.
    fn row_files(&self, order: &[usize]) -> Result<Vec<MetaEntry>> {
        let entries: Vec<MetaEntry> = order
            .iter()
            .map(|&i| MetaEntry {
                row: i as u64,
                nnz: self.nnz[i],
                file: i as u64,
                offset: row_header(self.version) as u64,
            })
            .collect();
        entries.par_iter().try_for_each(|e| {
            let p = self.kdir.join(row_file_name(e.row));
            let (c, v) = self.a.row(e.row as usize);
            write_plain(&p, |w| {
                put_prefix(
                    w,
                    &MAGIC_ROW,
                    self.version,
                    self.prec.bytes() as u32,
                    self.id,
                )?;
                put_record(w, e.row, c, v, self.prec, self.version)
            })?;
            self.pb.inc(e.nnz);
            Ok::<(), Error>(())
        })?;
        Ok(entries)
    }

    /// Packs of about `pack_bytes`, each a consecutive run of the metadata order `order`; the
    /// metadata entries of their rows.
    fn packs(&self, order: &[usize], pack_bytes: u64) -> Result<Vec<MetaEntry>> {
        let mut packs: Vec<Vec<usize>> = vec![Vec::new()];
        let mut bytes = 0u64;
        for &i in order {
            let s = self.record_size(i);
            if bytes > 0 && bytes + s > pack_bytes {
                packs.push(Vec::new());
                bytes = 0;
            }
            packs.last_mut().unwrap().push(i);
            bytes += s;
        }
        if order.is_empty() {
            packs.clear();
        }
        let per_pack: Vec<Vec<MetaEntry>> = packs
            .par_iter()
            .enumerate()
            .map(|(p, rows)| self.pack(p as u64, rows))
            .collect::<Result<_>>()?;
        Ok(per_pack.into_iter().flatten().collect())
    }

    /// Pack `p` holding `rows`; their metadata entries.
    fn pack(&self, p: u64, rows: &[usize]) -> Result<Vec<MetaEntry>> {
        let mut off = (pack_header(self.version) + PACK_ENTRY * rows.len()) as u64;
        let es: Vec<MetaEntry> = rows
            .iter()
            .map(|&i| {
                let e = MetaEntry {
                    row: i as u64,
                    nnz: self.nnz[i],
                    file: p,
                    offset: off,
                };
                off += self.record_size(i);
                e
            })
            .collect();
        let path = self.kdir.join(pack_file_name(p));
        // Version 2: bytes 40..44 hold the row table's CRC32C, 44..48 the header's (bytes
        // 0..44); 16 more from version 3.
        let mut table = Vec::with_capacity(PACK_ENTRY * es.len());
        for e in &es {
            for v in [e.row, e.nnz, e.offset] {
                table.extend_from_slice(&v.to_le_bytes());
            }
        }
        write_plain(&path, |w| {
            let mut cw = CrcWriter::new(w);
            put_prefix(
                &mut cw,
                &MAGIC_PACK,
                self.version,
                self.prec.bytes() as u32,
                self.id,
            )?;
            put_u64(&mut cw, p)?;
            put_u64(&mut cw, rows.len() as u64)?;
            put_u64(&mut cw, es.iter().map(|e| e.nnz).sum())?;
            if self.version >= 2 {
                put_u32(&mut cw, crc(&table))?;
                let h = cw.take();
                put_u32(cw.inner, h)?;
            } else {
                put_u64(cw.inner, 0)?;
            }
            let w = cw.inner;
            w.write_all(&table)?;
            for e in &es {
                let (c, v) = self.a.row(e.row as usize);
                put_record(w, e.row, c, v, self.prec, self.version)?;
                self.pb.inc(e.nnz);
            }
            Ok(())
        })?;
        Ok(es)
    }
}

/// Write the metadata file of kernel `a`: header, `entries`, and (version 2) the header's and
/// every [`META_BLOCK`] entries' CRC32C.
fn write_metadata(
    path: &Path,
    layout: Layout,
    a: &Csr,
    nfiles: u64,
    entries: &[MetaEntry],
    (version, id): (u32, u64),
) -> Result<()> {
    write_plain(path, |w| {
        let mut cw = CrcWriter::new(w);
        put_prefix(&mut cw, &MAGIC_META, version, layout_code(layout), id)?;
        put_u64(&mut cw, a.nrows() as u64)?;
        put_u64(&mut cw, a.ncols() as u64)?;
        put_u64(&mut cw, a.nnz() as u64)?;
        put_u64(&mut cw, nfiles)?;
        if version >= 2 {
            // Header CRC32C, a zero u32, the entries, then one CRC32C per META_BLOCK entries.
            let h = cw.take();
            put_u32(cw.inner, h)?;
            put_u32(cw.inner, 0)?;
        }
        let mut sums = Vec::new();
        for block in entries.chunks(META_BLOCK) {
            for e in block {
                for v in [e.row, e.nnz, e.file, e.offset] {
                    put_u64(&mut cw, v)?;
                }
            }
            sums.push(cw.take());
        }
        if version >= 2 {
            for c in &sums {
                put_u32(cw.inner, *c)?;
            }
            put_pad(cw.inner, 4 * sums.len())?;
        }
        Ok(())
    })
}

/// Check a pack file's header, row table and length.
fn check_pack(path: &Path, bytes: &[u8], pack: u64, vb: usize, tag: (u32, u64)) -> Result<()> {
    check_pack_table(path, bytes, bytes.len() as u64, pack, vb, tag)
}

/// Open pack `pack` of the dataset at `path` and check its header and row table (checksums in
/// version 2) and its length.
pub fn check_pack_file(dm: &DatasetManifest, path: &Path, pack: u64) -> Result<()> {
    let map = MappedFile::open(path)?;
    check_pack(path, map.bytes(), pack, dm.m.precision.bytes(), dm.tag())
}

/// [`check_pack`] on the file's first bytes (at least the header and the row table) and its
/// length.
fn check_pack_table(
    path: &Path,
    bytes: &[u8],
    file_len: u64,
    pack: u64,
    vb: usize,
    (version, id): (u32, u64),
) -> Result<()> {
    let r = Reader::new(path, bytes);
    let got_vb = r.prefix_v(&MAGIC_PACK, "kernel pack", version, id)? as usize;
    let (p, head) = (prefix_len(version), pack_header(version));
    if version >= 2 {
        r.check_crc(0..head - 4, head - 4, "pack header")?;
    }
    check_value_size(path, got_vb, vb)?;
    let idx = r.u64(p, "pack index")?;
    if idx != pack {
        return Err(Error::format(
            path,
            format!("pack index {idx} but the file is listed as pack {pack}"),
        ));
    }
    let nr = r.count(p + 8, "rows in pack")?;
    let pack_nnz = r.u64(p + 16, "nonzeros in pack")?;
    if version < 2 {
        r.zeros(p + 24, 8, "reserved field")?;
    }
    r.need(head, PACK_ENTRY * nr, "the row table")?;
    if version >= 2 {
        r.check_crc(head..head + PACK_ENTRY * nr, p + 24, "the row table")?;
    }
    let mut off = head + PACK_ENTRY * nr;
    let mut total = 0u64;
    for k in 0..nr {
        let o = head + PACK_ENTRY * k;
        let nnz = r.count(o + 8, "row table entry")?;
        total = total.saturating_add(nnz as u64);
        let at = r.u64(o + 16, "row table entry")?;
        if at != off as u64 {
            return Err(Error::format(
                path,
                format!("row table entry {k}: offset {at}, expected {off}"),
            ));
        }
        off = off.saturating_add(record_size_v(nnz, vb, version));
    }
    if total != pack_nnz {
        return Err(Error::format(
            path,
            format!("the row table holds {total} nonzeros but the header says {pack_nnz}"),
        ));
    }
    let what = format!("{nr} row records");
    if file_len < off as u64 {
        return Err(Error::format(
            path,
            format!("truncated: {what} needs {off} bytes but the file has {file_len}"),
        ));
    }
    if file_len > off as u64 {
        return Err(Error::format(
            path,
            format!(
                "{} trailing bytes after {what} (expected {off} bytes)",
                file_len - off as u64
            ),
        ));
    }
    Ok(())
}

/// CSR arrays of some rows (indptr, indices, data) and the bytes read.
pub type RowsRead = (Vec<u64>, Vec<u32>, Vec<f64>, u64);

/// What reading a rank's kernel rows starts from.
struct Plan {
    /// Bytes of one value.
    vb: usize,
    /// Format version.
    version: u32,
    /// The dataset id (version 3).
    id: u64,
    /// Columns of the kernel (every column index is checked against it).
    ncols: usize,
    /// The kernel folder.
    kdir: PathBuf,
    /// Row offsets of the local rows, from their metadata nonzero counts.
    indptr: Vec<u64>,
    /// Nonzeros of the local rows.
    nnz: usize,
    /// Nonzeros of the rows the caller puts after them ([`read_kernel_rows`]' `tail`).
    tail_nnz: usize,
}

impl Plan {
    fn new(dm: &DatasetManifest, meta: &Metadata, local: &[MetaEntry], tail: Tail) -> Plan {
        // zeros the allocator hands out untouched, the tail's written by the caller's threads
        let mut indptr = vec![0u64; local.len() + 1 + tail.rows];
        for (i, e) in local.iter().enumerate() {
            indptr[i + 1] = indptr[i] + e.nnz;
        }
        Plan {
            tail_nnz: tail.nnz,
            vb: dm.m.precision.bytes(),
            version: dm.m.version,
            id: dm.id,
            ncols: meta.cols as usize,
            kdir: dm.resolve(&dm.m.kernel_dir),
            nnz: indptr[local.len()] as usize,
            indptr,
        }
    }

    /// The format version and dataset id every file must carry.
    fn tag(&self) -> (u32, u64) {
        (self.version, self.id)
    }

    /// Bytes of row `e`'s record.
    fn record_size(&self, e: &MetaEntry) -> usize {
        record_size_v(e.nnz as usize, self.vb, self.version)
    }

    /// Decode row `e`'s record at `at` of `r` into its output slot.
    fn decode(
        &self,
        r: &Reader,
        at: usize,
        e: &MetaEntry,
        cols: &mut [u32],
        vals: &mut [f64],
    ) -> Result<()> {
        decode_record(r, at, e.row, self.vb, self.version, self.ncols, cols, vals)
    }

    /// Check a per-row file's prefix (magic, version, value size).
    fn check_row_prefix(&self, r: &Reader) -> Result<()> {
        let got_vb = r.prefix_v(&MAGIC_ROW, "kernel row", self.version, self.id)? as usize;
        check_value_size(r.path, got_vb, self.vb)
    }
}

/// Rows and nonzeros that [`read_kernel_rows`]' arrays hold room for after the kernel rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tail {
    pub rows: usize,
    pub nnz: usize,
}

/// Read the kernel rows `local` (metadata entries, in the local row order) into CSR arrays:
/// through memory maps when `reader` is `None`, else as byte ranges read with `reader` (MPI-IO
/// under MPI). Every file's length is checked (and pack headers and row tables verified) before
/// anything is allocated for its rows: a lying metadata entry cannot make this rank allocate
/// more than the files hold. Errors name the file and the row (byte ranges: and the byte offset
/// of its record). Returns (indptr, indices, data, bytes read); the arrays hold `tail`'s rows
/// and nonzeros more after the kernel rows (zeros: offsets, columns and values for the caller
/// to fill), so that rows read after these need neither a larger copy nor one thread's
/// writing of zeros.
pub fn read_kernel_rows(
    dm: &DatasetManifest,
    meta: &Metadata,
    local: &[MetaEntry],
    reader: Option<&RangeReader>,
    progress: bool,
    tail: Tail,
) -> Result<RowsRead> {
    let plan = Plan::new(dm, meta, local, tail);
    let packs = match meta.layout {
        Layout::Packed => Some(Packs::open(&plan, meta, local, reader)?),
        Layout::PerRow => None,
    };
    match &packs {
        // The records the metadata puts in each pack must fit in it before anything is
        // allocated for them.
        Some(packs) => check_records_fit(&plan, local, packs)?,
        // Memory maps open (and check) row files a batch at a time instead.
        None if reader.is_some() => check_row_file_lengths(&plan, local)?,
        None => {}
    }
    let nnz = plan.nnz;
    crate::io::limits::check_alloc(
        &meta.path,
        &format!("{nnz} kernel nonzeros in {} rows", local.len()),
        12 * (nnz + tail.nnz) as u128,
    )?;
    let pb = crate::ui::progress::bar(nnz as u64, "loading", progress);
    let (indices, data, bytes) = match reader {
        None => read_mapped(&plan, local, packs.as_ref(), &pb)?,
        Some(rd) => read_spans(&plan, local, packs, rd, &pb)?,
    };
    pb.finish_and_clear();
    Ok((plan.indptr, indices, data, bytes))
}

/// The packs of a packed dataset; those this rank reads from are checked (header, row table,
/// length).
struct Packs {
    /// The path of every pack.
    paths: Vec<PathBuf>,
    /// The length of every pack this rank reads from (0 for the others).
    lens: Vec<u64>,
    /// Their memory maps (when read through maps).
    maps: Vec<Option<MappedFile>>,
    /// The local rows (indices into `local`) in each pack.
    rows: Vec<Vec<usize>>,
}

impl Packs {
    /// Map (`reader` None) or read with `reader` the header and row table of every pack holding
    /// rows of `local`, and check them. The first failing pack's error is returned.
    fn open(
        plan: &Plan,
        meta: &Metadata,
        local: &[MetaEntry],
        reader: Option<&RangeReader>,
    ) -> Result<Packs> {
        let mut rows = vec![Vec::new(); meta.files as usize];
        for (i, e) in local.iter().enumerate() {
            rows[e.file as usize].push(i);
        }
        let paths: Vec<PathBuf> = (0..meta.files)
            .map(|p| plan.kdir.join(pack_file_name(p)))
            .collect();
        let opened: Vec<Result<(u64, Option<MappedFile>)>> = rows
            .par_iter()
            .enumerate()
            .map(|(p, rows)| {
                let path = &paths[p];
                match reader {
                    _ if rows.is_empty() => Ok((0, None)),
                    None => {
                        let map = MappedFile::open_populated(path)?;
                        check_pack(path, map.bytes(), p as u64, plan.vb, plan.tag())?;
                        Ok((map.bytes().len() as u64, Some(map)))
                    }
                    Some(rd) => Ok((read_pack_table(plan, path, p as u64, rd)?, None)),
                }
            })
            .collect();
        let (lens, maps) = opened
            .into_iter()
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        Ok(Packs {
            paths,
            lens,
            maps,
            rows,
        })
    }
}

/// Read pack `pack`'s header and row table with `reader` and check them against the file's
/// length (from a `stat`); returns the length.
fn read_pack_table(plan: &Plan, path: &Path, pack: u64, reader: &RangeReader) -> Result<u64> {
    let len = file_len(path)?;
    let ph = pack_header(plan.version);
    let head = reader.read(path, 0, ph.min(len as usize))?;
    let nr = Reader::new(path, &head).count(prefix_len(plan.version) + 8, "rows in pack")?;
    let table_end = ph
        .saturating_add(PACK_ENTRY.saturating_mul(nr))
        .min(len as usize);
    let mut table = head;
    table.extend(reader.read(path, ph as u64, table_end.saturating_sub(ph))?);
    check_pack_table(path, &table, len, pack, plan.vb, plan.tag())?;
    Ok(len)
}

/// A missing or unreadable row file: the error says the metadata lists it.
fn listed_row(path: &Path, row: u64) -> impl Fn(Error) -> Error + '_ {
    move |err| match err {
        Error::Io { err: source, .. } => Error::format(
            path,
            format!("kernel row {row} listed in the metadata: {source}"),
        ),
        other => other,
    }
}

/// Check the length of every local row's file (a `stat` each) against its metadata entry.
fn check_row_file_lengths(plan: &Plan, local: &[MetaEntry]) -> Result<()> {
    local.par_iter().with_min_len(64).try_for_each(|e| {
        let path = plan.kdir.join(row_file_name(e.row));
        let len = file_len(&path).map_err(listed_row(&path, e.row))?;
        let want = row_header(plan.version).saturating_add(plan.record_size(e));
        Reader::new(&path, &[]).exact_len_of(
            len,
            want as u64,
            &format!("kernel row {} ({} nonzeros)", e.row, e.nnz),
        )
    })
}

/// Open kernel row `e`'s file (read when small, else mapped) and check its prefix and length.
fn open_row_file(plan: &Plan, e: &MetaEntry) -> Result<MappedFile> {
    let path = plan.kdir.join(row_file_name(e.row));
    let map = MappedFile::open_small(&path).map_err(listed_row(&path, e.row))?;
    let r = Reader::new(&path, map.bytes());
    plan.check_row_prefix(&r)?;
    r.exact_len(
        row_header(plan.version).saturating_add(plan.record_size(e)),
        &format!("kernel row {} ({} nonzeros)", e.row, e.nnz),
    )?;
    Ok(map)
}

/// Error unless the records that `local` puts in each pack fit in that pack's length.
fn check_records_fit(plan: &Plan, local: &[MetaEntry], packs: &Packs) -> Result<()> {
    // Per pack: bytes of records, rows, nonzeros.
    let mut per_pack: Vec<(u64, u64, u64)> = Vec::new();
    for e in local {
        let p = e.file as usize;
        if per_pack.len() <= p {
            per_pack.resize(p + 1, (0, 0, 0));
        }
        let t = &mut per_pack[p];
        t.0 = t.0.saturating_add(plan.record_size(e) as u64);
        t.1 += 1;
        t.2 = t.2.saturating_add(e.nnz);
    }
    for (p, &(need, rows, nnz)) in per_pack.iter().enumerate() {
        let len = packs.lens[p];
        if need > len {
            return Err(Error::format(
                &packs.paths[p],
                format!(
                    "the metadata puts {rows} rows with {nnz} nonzeros ({need} bytes of records) in this pack but it has {len} bytes"
                ),
            ));
        }
    }
    // Records that overlap (a metadata offset changed in a version 1 file, which has no
    // checksum) are refused here, before byte ranges are merged over them.
    for (p, rows) in packs.rows.iter().enumerate() {
        let mut at: Vec<(u64, u64, u64)> = rows
            .iter()
            .map(|&i| {
                let e = &local[i];
                (
                    e.offset,
                    e.offset.saturating_add(plan.record_size(e) as u64),
                    e.row,
                )
            })
            .collect();
        at.sort_unstable();
        for w in at.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(Error::format(
                    &packs.paths[p],
                    format!(
                        "the metadata puts kernel row {} at byte {} inside kernel row {}'s record (bytes {}..{}): corrupted metadata offsets",
                        w[1].2, w[1].0, w[0].2, w[0].0, w[0].1
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// One row's metadata entry and its output columns and values.
type Slot<'s> = (&'s MetaEntry, &'s mut [u32], &'s mut [f64]);

/// Split `indices` and `data` into one slot per row of `rows`, in order.
fn row_slots<'s>(
    rows: &'s [MetaEntry],
    mut indices: &'s mut [u32],
    mut data: &'s mut [f64],
) -> Vec<Slot<'s>> {
    let mut slots = Vec::with_capacity(rows.len());
    for e in rows {
        let k = e.nnz as usize;
        let (a, rest_i) = std::mem::take(&mut indices).split_at_mut(k);
        let (b, rest_v) = std::mem::take(&mut data).split_at_mut(k);
        indices = rest_i;
        data = rest_v;
        slots.push((e, a, b));
    }
    slots
}

/// [`read_kernel_rows`] through memory maps: rows in batches; per-row files are opened (and
/// their lengths checked) a batch at a time before the batch's output grows, so a lying
/// metadata entry allocates nothing. Returns (indices, data, bytes read).
fn read_mapped(
    plan: &Plan,
    local: &[MetaEntry],
    packs: Option<&Packs>,
    pb: &indicatif::ProgressBar,
) -> Result<(Vec<u32>, Vec<f64>, u64)> {
    let bytes_read = AtomicU64::new(0);
    // Every row's place at once: zeros the allocator hands out untouched (a resize per batch
    // wrote every byte on one thread first).
    let total = plan.nnz + plan.tail_nnz;
    let (mut indices, mut data) = (vec![0u32; total], vec![0f64; total]);
    let (mut start, mut base) = (0, 0);
    while start < local.len() {
        let (mut end, mut bnnz) = (start, 0usize);
        while end < local.len()
            && (end == start
                || packs.is_some()
                || (bnnz + local[end].nnz as usize <= 1 << 24 && end - start < 1 << 16))
        {
            bnnz += local[end].nnz as usize;
            end += 1;
        }
        let batch = &local[start..end];
        let files: Vec<MappedFile> = match packs {
            None => batch
                .par_iter()
                .with_min_len(64)
                .map(|e| open_row_file(plan, e))
                .collect::<Result<_>>()?,
            Some(_) => Vec::new(),
        };
        // Disjoint output slices, one per row.
        let (ib, db) = (
            &mut indices[base..base + bnnz],
            &mut data[base..base + bnnz],
        );
        let mut slots = row_slots(batch, ib, db);
        slots
            .par_iter_mut()
            .enumerate()
            .with_min_len(64)
            .try_for_each(|(i, (e, cols, vals))| {
                let read = match packs {
                    None => {
                        let path = plan.kdir.join(row_file_name(e.row));
                        let bytes = files[i].bytes();
                        let at = row_header(plan.version);
                        plan.decode(&Reader::new(&path, bytes), at, e, cols, vals)?;
                        bytes.len()
                    }
                    Some(packs) => {
                        let p = e.file as usize;
                        let map = packs.maps[p].as_ref().expect("pack opened above");
                        let r = Reader::new(&packs.paths[p], map.bytes());
                        plan.decode(&r, e.offset as usize, e, cols, vals)?;
                        plan.record_size(e)
                    }
                };
                bytes_read.fetch_add(read as u64, Ordering::Relaxed);
                pb.inc(e.nnz);
                Ok::<(), Error>(())
            })?;
        start = end;
        base += bnnz;
    }
    Ok((indices, data, bytes_read.into_inner()))
}

/// The rows of one span: where the span starts and how long it is, and the rows inside.
struct Span<'s> {
    offset: u64,
    len: u64,
    rows: Vec<Slot<'s>>,
}

/// [`read_kernel_rows`] through byte-range reads: for each file this rank needs, its rows'
/// records sorted by offset are coalesced into spans ([`crate::io::rowio::coalesce`]), each
/// span read with `reader` and decoded; files in parallel, each opened once and its spans read
/// in offset order. Returns (indices, data, bytes read).
fn read_spans(
    plan: &Plan,
    local: &[MetaEntry],
    packs: Option<Packs>,
    reader: &RangeReader,
    pb: &indicatif::ProgressBar,
) -> Result<(Vec<u32>, Vec<f64>, u64)> {
    let mut indices = vec![0u32; plan.nnz + plan.tail_nnz];
    let mut data = vec![0f64; plan.nnz + plan.tail_nnz];
    let bytes_read = AtomicU64::new(0);
    let per_row = packs.is_none();
    let mut jobs = span_jobs(
        plan,
        local,
        packs,
        row_slots(local, &mut indices, &mut data),
        reader,
    );
    let what = |e: &MetaEntry| format!("kernel row {} (record at byte {})", e.row, e.offset);
    // Decode the rows of one span, read into `buf`.
    let decode_span = |path: &Path, span: &mut Span, buf: &[u8]| {
        let r = Reader::new(path, buf);
        if per_row {
            let (e, cols, vals) = &mut span.rows[0];
            plan.check_row_prefix(&r)?;
            // The file's length was checked before the read.
            plan.decode(&r, row_header(plan.version), e, cols, vals)?;
        } else {
            // Offsets in errors are the file's (the reader knows where the span starts).
            let r = Reader::at(path, buf, span.offset);
            for (e, cols, vals) in span.rows.iter_mut() {
                let at = (e.offset - span.offset) as usize;
                plan.decode(&r, at, e, cols, vals)?;
            }
        }
        bytes_read.fetch_add(span.len, Ordering::Relaxed);
        pb.inc(span.rows.iter().map(|(e, _, _)| e.nnz).sum());
        Ok(())
    };
    jobs.par_iter_mut()
        .with_min_len(if per_row { 64 } else { 1 })
        .try_for_each(|(path, spans)| {
            let ranges: Vec<(u64, usize)> =
                spans.iter().map(|s| (s.offset, s.len as usize)).collect();
            let (mut next, mut decode_failed) = (0, false);
            reader
                .read_ranges(path, &ranges, &mut |k, buf| {
                    next = k + 1;
                    let r = decode_span(path, &mut spans[k], buf);
                    decode_failed = r.is_err();
                    r
                })
                .map_err(|err| match spans.get(next) {
                    // A read failed (not a decode): name the first row it was reading.
                    Some(s) if !decode_failed => in_context(err, &what(s.rows[0].0)),
                    _ => err,
                })
        })?;
    drop(jobs);
    Ok((indices, data, bytes_read.into_inner()))
}

/// Per file this rank reads: its path and its spans, each holding the output slots of its rows.
/// Per-row files are one span each (the whole file); a pack's rows are sorted by offset and
/// coalesced with `reader`'s limits.
fn span_jobs<'s>(
    plan: &Plan,
    local: &[MetaEntry],
    packs: Option<Packs>,
    slots: Vec<Slot<'s>>,
    reader: &RangeReader,
) -> Vec<(PathBuf, Vec<Span<'s>>)> {
    let Some(packs) = packs else {
        return slots
            .into_iter()
            .map(|(e, c, v)| {
                let path = plan.kdir.join(row_file_name(e.row));
                let len = (row_header(plan.version) + plan.record_size(e)) as u64;
                let rows = vec![(e, c, v)];
                (
                    path,
                    vec![Span {
                        offset: 0,
                        len,
                        rows,
                    }],
                )
            })
            .collect();
    };
    let mut slots: Vec<Option<Slot>> = slots.into_iter().map(Some).collect();
    let mut jobs = Vec::new();
    for (path, mut rows) in packs.paths.into_iter().zip(packs.rows) {
        if rows.is_empty() {
            continue;
        }
        rows.sort_unstable_by_key(|&i| local[i].offset);
        let pieces: Vec<(u64, u64)> = rows
            .iter()
            .map(|&i| (local[i].offset, plan.record_size(&local[i]) as u64))
            .collect();
        let spans = reader
            .spans(&pieces)
            .into_iter()
            .map(|s| Span {
                offset: s.offset,
                len: s.len,
                rows: rows[s.items]
                    .iter()
                    .map(|&i| slots[i].take().expect("each row once"))
                    .collect(),
            })
            .collect();
        jobs.push((path, spans));
    }
    jobs
}

/// The metadata order: indices of `nnz` sorted by descending nnz, ties by ascending index.
pub fn descending_order(nnz: &[u64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..nnz.len()).collect();
    idx.sort_by_key(|&i| (std::cmp::Reverse(nnz[i]), i));
    idx
}
