//! Kernel rows on disk: the metadata file (rows with their nnz, descending), per-row files and
//! packed files (docs/formats.md), written from a CSR and read back into a local CSR.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::io::dataset::binfmt::{
    crc, decode_record, pad8, put_prefix, put_record, put_u32, put_u64, record_size_v, write_plain,
    CrcWriter, Precision, Reader, MAGIC_META, MAGIC_PACK, MAGIC_ROW,
};
use crate::io::dataset::manifest::{pack_file_name, row_file_name, DatasetManifest, Layout};
use crate::io::mmap::MappedFile;
use crate::sparse::Csr;

/// Bytes of the metadata header (version 1; version 2 adds 8: header CRC32C and a zero u32)
/// and of one entry.
pub const META_HEADER: usize = 48;
/// Metadata entries per checksum block (version 2).
pub const META_BLOCK: usize = 4096;
pub const META_ENTRY: usize = 32;
/// Bytes of the pack header and of one row-table entry.
pub const PACK_HEADER: usize = 48;
pub const PACK_ENTRY: usize = 24;
/// Bytes before the record in a per-row file.
pub const ROW_HEADER: usize = 16;

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
    let code = r.prefix_v(&MAGIC_META, "metadata", dm.m.version)?;
    let bad = |msg: String| Error::format(&path, msg);
    let version = dm.m.version;
    let head = if version >= 2 {
        r.check_crc(0..META_HEADER, META_HEADER, "metadata header")?;
        r.zeros(META_HEADER + 4, 4, "reserved field")?;
        META_HEADER + 8
    } else {
        META_HEADER
    };
    let layout = match code {
        0 => Layout::PerRow,
        1 => Layout::Packed,
        c => {
            return Err(Error::format(
                &path,
                format!("layout code {c} is neither 0 (per-row) nor 1 (packed)"),
            ))
        }
    };
    if layout != dm.m.layout {
        return Err(bad(format!(
            "layout {layout:?} but {} says {:?}",
            dm.path.display(),
            dm.m.layout
        )));
    }
    let rows = r.count(16, "kernel rows")?;
    let cols = r.u64(24, "columns")?;
    let nnz = r.u64(32, "nonzeros")?;
    let files = r.u64(40, "file count")?;
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
    let nblocks = if version >= 2 {
        rows.div_ceil(META_BLOCK)
    } else {
        0
    };
    let sums = head + META_ENTRY * rows;
    r.exact_len(sums + pad8(4 * nblocks), &format!("{rows} entries"))?;
    for b in 0..nblocks {
        let (k0, k1) = (b * META_BLOCK, ((b + 1) * META_BLOCK).min(rows));
        r.check_crc(
            head + META_ENTRY * k0..head + META_ENTRY * k1,
            sums + 4 * b,
            &format!("metadata entries {k0}..{k1}"),
        )?;
    }
    if version >= 2 {
        r.zeros(
            sums + 4 * nblocks,
            pad8(4 * nblocks) - 4 * nblocks,
            "padding",
        )?;
    }
    let mut entries = Vec::with_capacity(rows);
    let mut seen = vec![false; rows];
    let mut total = 0u64;
    let mut prev_nnz = u64::MAX;
    for k in 0..rows {
        let o = head + META_ENTRY * k;
        let e = MetaEntry {
            row: r.u64(o, "entry")?,
            nnz: r.u64(o + 8, "entry")?,
            file: r.u64(o + 16, "entry")?,
            offset: r.u64(o + 24, "entry")?,
        };
        if e.row >= rows as u64 {
            return Err(bad(format!(
                "entry {k}: row {} out of range (kernel rows = {rows})",
                e.row
            )));
        }
        if std::mem::replace(&mut seen[e.row as usize], true) {
            return Err(bad(format!("entry {k}: duplicate row index {}", e.row)));
        }
        if e.nnz > cols {
            return Err(bad(format!(
                "entry {k}: row {} has {} nonzeros but there are only {cols} columns",
                e.row, e.nnz
            )));
        }
        if e.nnz > prev_nnz {
            return Err(bad(format!(
                "entry {k}: row {} ({} nonzeros) breaks the descending nnz order",
                e.row, e.nnz
            )));
        }
        prev_nnz = e.nnz;
        match layout {
            Layout::PerRow if e.file != e.row || e.offset != ROW_HEADER as u64 => {
                return Err(bad(format!(
                    "entry {k}: row {} must name file {} at offset {ROW_HEADER} (got file {}, offset {})",
                    e.row, e.row, e.file, e.offset
                )))
            }
            Layout::Packed if e.file >= files => {
                return Err(bad(format!(
                    "entry {k}: row {} in pack {} but there are {files} packs",
                    e.row, e.file
                )))
            }
            _ => {}
        }
        total += e.nnz;
        entries.push(e);
    }
    if total != nnz {
        return Err(bad(format!(
            "the entries hold {total} nonzeros but the header says {nnz}"
        )));
    }
    if layout == Layout::Packed {
        let used = entries.iter().map(|e| e.file + 1).max().unwrap_or(0);
        if used != files {
            return Err(bad(format!(
                "file count {files} but the entries use packs 0..{used}"
            )));
        }
    }
    Ok(Metadata {
        path,
        layout,
        rows: rows as u64,
        cols,
        nnz,
        files,
        entries,
    })
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
    version: u32,
    progress: bool,
) -> Result<Vec<MetaEntry>> {
    let kdir = dir.join(kernel_dir);
    std::fs::create_dir_all(&kdir).map_err(|e| Error::io(&kdir, e))?;
    let nnz: Vec<u64> = (0..a.nrows())
        .map(|i| a.indptr()[i + 1] - a.indptr()[i])
        .collect();
    let order = descending_order(&nnz);
    let vb = prec.bytes();
    let pb = crate::progress::bar(a.nnz() as u64, "writing", progress);
    let mut entries: Vec<MetaEntry> = Vec::with_capacity(a.nrows());
    match layout {
        Layout::PerRow => {
            entries = order
                .iter()
                .map(|&i| MetaEntry {
                    row: i as u64,
                    nnz: nnz[i],
                    file: i as u64,
                    offset: ROW_HEADER as u64,
                })
                .collect();
            entries.par_iter().try_for_each(|e| {
                let p = kdir.join(row_file_name(e.row));
                let (c, v) = a.row(e.row as usize);
                write_plain(&p, |w| {
                    put_prefix(w, &MAGIC_ROW, version, vb as u32)?;
                    put_record(w, e.row, c, v, prec, version)
                })?;
                pb.inc(e.nnz);
                Ok::<(), Error>(())
            })?;
        }
        Layout::Packed => {
            // Consecutive runs of the metadata order, each about `pack_bytes`.
            let mut packs: Vec<Vec<usize>> = vec![Vec::new()];
            let mut bytes = 0u64;
            for &i in &order {
                let s = record_size_v(nnz[i] as usize, vb, version) as u64;
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
                .map(|(p, rows)| {
                    let mut off = (PACK_HEADER + PACK_ENTRY * rows.len()) as u64;
                    let es: Vec<MetaEntry> = rows
                        .iter()
                        .map(|&i| {
                            let e = MetaEntry {
                                row: i as u64,
                                nnz: nnz[i],
                                file: p as u64,
                                offset: off,
                            };
                            off += record_size_v(nnz[i] as usize, vb, version) as u64;
                            e
                        })
                        .collect();
                    let path = kdir.join(pack_file_name(p as u64));
                    // Version 2: bytes 40..44 hold the row table's CRC32C, 44..48 the
                    // header's (bytes 0..44).
                    let mut table = Vec::with_capacity(PACK_ENTRY * es.len());
                    for e in &es {
                        for v in [e.row, e.nnz, e.offset] {
                            table.extend_from_slice(&v.to_le_bytes());
                        }
                    }
                    write_plain(&path, |w| {
                        let mut cw = CrcWriter::new(w);
                        put_prefix(&mut cw, &MAGIC_PACK, version, vb as u32)?;
                        put_u64(&mut cw, p as u64)?;
                        put_u64(&mut cw, rows.len() as u64)?;
                        put_u64(&mut cw, es.iter().map(|e| e.nnz).sum())?;
                        if version >= 2 {
                            put_u32(&mut cw, crc(&table))?;
                            let h = cw.take();
                            put_u32(cw.inner, h)?;
                        } else {
                            put_u64(cw.inner, 0)?;
                        }
                        let w = cw.inner;
                        w.write_all(&table)?;
                        for e in &es {
                            let (c, v) = a.row(e.row as usize);
                            put_record(w, e.row, c, v, prec, version)?;
                            pb.inc(e.nnz);
                        }
                        Ok(())
                    })?;
                    Ok(es)
                })
                .collect::<Result<_>>()?;
            entries.extend(per_pack.into_iter().flatten());
        }
    }
    pb.finish_and_clear();
    let nfiles = match layout {
        Layout::PerRow => a.nrows() as u64,
        Layout::Packed => entries.last().map_or(0, |e| e.file + 1),
    };
    let mpath = dir.join(metadata);
    write_plain(&mpath, |w| {
        let mut cw = CrcWriter::new(w);
        put_prefix(&mut cw, &MAGIC_META, version, layout_code(layout))?;
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
            crate::io::dataset::binfmt::put_pad(cw.inner, 4 * sums.len())?;
        }
        Ok(())
    })?;
    Ok(entries)
}

/// Check a pack file's header and row table; returns its value size.
fn check_pack(path: &Path, bytes: &[u8], pack: u64, vb: usize, version: u32) -> Result<()> {
    check_pack_table(path, bytes, bytes.len() as u64, pack, vb, version)
}

/// Open pack `pack` of the dataset at `path` and check its header and row table (checksums in
/// version 2) and its length.
pub fn check_pack_file(dm: &DatasetManifest, path: &Path, pack: u64) -> Result<()> {
    let map = MappedFile::open(path)?;
    check_pack(
        path,
        map.bytes(),
        pack,
        dm.m.precision.bytes(),
        dm.m.version,
    )
}

/// [`check_pack`] on the file's first bytes (at least the header and the row table) and its
/// length.
fn check_pack_table(
    path: &Path,
    bytes: &[u8],
    file_len: u64,
    pack: u64,
    vb: usize,
    version: u32,
) -> Result<()> {
    let r = Reader::new(path, bytes);
    let got_vb = r.prefix_v(&MAGIC_PACK, "kernel pack", version)? as usize;
    if version >= 2 {
        r.check_crc(0..PACK_HEADER - 4, PACK_HEADER - 4, "pack header")?;
    }
    if got_vb != vb {
        return Err(Error::format(
            path,
            format!("values of {got_vb} bytes but the dataset's precision has {vb}"),
        ));
    }
    let idx = r.u64(16, "pack index")?;
    if idx != pack {
        return Err(Error::format(
            path,
            format!("pack index {idx} but the file is listed as pack {pack}"),
        ));
    }
    let nr = r.count(24, "rows in pack")?;
    let pack_nnz = r.u64(32, "nonzeros in pack")?;
    if version < 2 {
        r.zeros(40, 8, "reserved field")?;
    }
    r.need(PACK_HEADER, PACK_ENTRY * nr, "the row table")?;
    if version >= 2 {
        r.check_crc(
            PACK_HEADER..PACK_HEADER + PACK_ENTRY * nr,
            40,
            "the row table",
        )?;
    }
    let mut off = PACK_HEADER + PACK_ENTRY * nr;
    let mut total = 0u64;
    for k in 0..nr {
        let o = PACK_HEADER + PACK_ENTRY * k;
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

/// What both kernel-row readers start from: value width, format version, columns, the kernel
/// folder, the row offsets of the local rows (from their metadata nonzero counts), nonzeros.
struct Plan(usize, u32, usize, std::path::PathBuf, Vec<u64>, usize);

impl Plan {
    fn new(dm: &DatasetManifest, meta: &Metadata, local: &[MetaEntry]) -> Plan {
        let mut indptr = Vec::with_capacity(local.len() + 1);
        indptr.push(0u64);
        for e in local {
            indptr.push(indptr.last().unwrap() + e.nnz);
        }
        let nnz = *indptr.last().unwrap() as usize;
        let kdir = dm.resolve(&dm.m.kernel_dir);
        Plan(
            dm.m.precision.bytes(),
            dm.m.version,
            meta.cols as usize,
            kdir,
            indptr,
            nnz,
        )
    }
}

/// Read the kernel rows `local` (metadata entries, in the local row order) into CSR arrays.
/// Returns (indptr, indices, data, bytes read).
pub fn read_kernel_rows(
    dm: &DatasetManifest,
    meta: &Metadata,
    local: &[MetaEntry],
    progress: bool,
) -> Result<RowsRead> {
    let Plan(vb, version, ncols, kdir, indptr, nnz) = Plan::new(dm, meta, local);
    let bytes_read = AtomicU64::new(0);
    // Packs this rank touches, opened and checked once.
    let packs: Vec<Option<MappedFile>> = if meta.layout == Layout::Packed {
        let mut need = vec![false; meta.files as usize];
        for e in local {
            need[e.file as usize] = true;
        }
        need.par_iter()
            .enumerate()
            .map(|(p, &n)| {
                if !n {
                    return Ok(None);
                }
                let path = kdir.join(pack_file_name(p as u64));
                let map = MappedFile::open_populated(&path)?;
                check_pack(&path, map.bytes(), p as u64, vb, version)?;
                Ok(Some(map))
            })
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    let pack_paths: Vec<PathBuf> = (0..packs.len() as u64)
        .map(|p| kdir.join(pack_file_name(p)))
        .collect();
    if meta.layout == Layout::Packed {
        // The records the metadata puts in each pack must fit in it before anything is
        // allocated for them.
        check_records_fit(local, vb, version, |p| {
            (
                pack_paths[p].as_path(),
                packs[p].as_ref().map_or(0, |m| m.bytes().len() as u64),
            )
        })?;
    }
    crate::io::limits::check_alloc(
        &meta.path,
        &format!("{nnz} kernel nonzeros in {} rows", local.len()),
        12 * nnz as u128,
    )?;
    let pb = crate::progress::bar(nnz as u64, "loading", progress);
    let (mut indices, mut data) = (Vec::new(), Vec::new());
    // Rows in batches: per-row files are opened (and their lengths checked) a batch at a time
    // before the batch's output grows, so a lying metadata entry allocates nothing.
    let mut start = 0;
    while start < local.len() {
        let (mut end, mut bnnz) = (start, 0usize);
        while end < local.len()
            && (end == start
                || meta.layout == Layout::Packed
                || (bnnz + local[end].nnz as usize <= 1 << 24 && end - start < 1 << 16))
        {
            bnnz += local[end].nnz as usize;
            end += 1;
        }
        let batch = &local[start..end];
        let files: Vec<MappedFile> = if meta.layout == Layout::PerRow {
            batch
                .par_iter()
                .with_min_len(64)
                .map(|e| open_row_file(&kdir, e, vb, version))
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let base = indices.len();
        indices.resize(base + bnnz, 0u32);
        data.resize(base + bnnz, 0f64);
        // Disjoint output slices, one per row.
        let mut jobs: Vec<(usize, &MetaEntry, &mut [u32], &mut [f64])> =
            Vec::with_capacity(batch.len());
        {
            let (mut ri, mut rv) = (&mut indices[base..], &mut data[base..]);
            for (i, e) in batch.iter().enumerate() {
                let k = e.nnz as usize;
                let (a, rest_i) = std::mem::take(&mut ri).split_at_mut(k);
                let (b, rest_v) = std::mem::take(&mut rv).split_at_mut(k);
                ri = rest_i;
                rv = rest_v;
                jobs.push((i, e, a, b));
            }
        }
        jobs.par_iter_mut()
            .with_min_len(64)
            .try_for_each(|(i, e, cols, vals)| {
                match meta.layout {
                    Layout::PerRow => {
                        let path = kdir.join(row_file_name(e.row));
                        let map = &files[*i];
                        let r = Reader::new(&path, map.bytes());
                        decode_record(&r, ROW_HEADER, e.row, vb, version, ncols, cols, vals)?;
                        bytes_read.fetch_add(map.bytes().len() as u64, Ordering::Relaxed);
                    }
                    Layout::Packed => {
                        let p = e.file as usize;
                        let map = packs[p].as_ref().expect("pack opened above");
                        let r = Reader::new(&pack_paths[p], map.bytes());
                        decode_record(
                            &r,
                            e.offset as usize,
                            e.row,
                            vb,
                            version,
                            ncols,
                            cols,
                            vals,
                        )?;
                        bytes_read.fetch_add(
                            record_size_v(e.nnz as usize, vb, version) as u64,
                            Ordering::Relaxed,
                        );
                    }
                }
                pb.inc(e.nnz);
                Ok::<(), Error>(())
            })?;
        start = end;
    }
    pb.finish_and_clear();
    Ok((indptr, indices, data, bytes_read.into_inner()))
}

/// Open kernel row `e`'s file (read when small, else mapped) and check its prefix and length.
fn open_row_file(kdir: &Path, e: &MetaEntry, vb: usize, version: u32) -> Result<MappedFile> {
    let path = kdir.join(row_file_name(e.row));
    let map = MappedFile::open_small(&path).map_err(|err| match err {
        Error::Io { err: source, .. } => Error::format(
            &path,
            format!("kernel row {} listed in the metadata: {source}", e.row),
        ),
        other => other,
    })?;
    let r = Reader::new(&path, map.bytes());
    let got_vb = r.prefix_v(&MAGIC_ROW, "kernel row", version)? as usize;
    if got_vb != vb {
        return Err(Error::format(
            &path,
            format!("values of {got_vb} bytes but the dataset's precision has {vb}"),
        ));
    }
    r.exact_len(
        ROW_HEADER.saturating_add(record_size_v(e.nnz as usize, vb, version)),
        &format!("kernel row {} ({} nonzeros)", e.row, e.nnz),
    )?;
    Ok(map)
}

/// Error unless the records that `local` puts in each pack fit in that pack's length
/// (`pack(p)` gives the path and length of pack p).
fn check_records_fit<'p>(
    local: &[MetaEntry],
    vb: usize,
    version: u32,
    pack: impl Fn(usize) -> (&'p Path, u64),
) -> Result<()> {
    // Per pack: bytes of records, rows, nonzeros.
    let mut per_pack: Vec<(u64, u64, u64)> = Vec::new();
    for e in local {
        let p = e.file as usize;
        if per_pack.len() <= p {
            per_pack.resize(p + 1, (0, 0, 0));
        }
        let t = &mut per_pack[p];
        t.0 =
            t.0.saturating_add(record_size_v(e.nnz as usize, vb, version) as u64);
        t.1 += 1;
        t.2 = t.2.saturating_add(e.nnz);
    }
    for (p, &(need, rows, nnz)) in per_pack.iter().enumerate() {
        let (path, len) = pack(p);
        if need > len {
            return Err(Error::format(
                path,
                format!(
                    "the metadata puts {rows} rows with {nnz} nonzeros ({need} bytes of records) in this pack but it has {len} bytes"
                ),
            ));
        }
    }
    Ok(())
}

/// One row's metadata entry and its output columns and values.
type Slot<'s> = (&'s MetaEntry, &'s mut [u32], &'s mut [f64]);

/// [`read_kernel_rows`] through byte-range reads (MPI-IO under MPI): for each file this rank
/// needs, its rows' records sorted by offset are coalesced into spans
/// ([`crate::io::rowio::coalesce`]), each span read with `reader` and decoded in parallel.
/// Pack headers and row tables are read and checked first (the file length from a `stat`).
/// Errors name the file and the row (and the byte offset of its record).
pub fn read_kernel_rows_ranges(
    dm: &DatasetManifest,
    meta: &Metadata,
    local: &[MetaEntry],
    reader: &crate::io::rowio::RangeReader,
    progress: bool,
) -> Result<RowsRead> {
    use crate::io::rowio::{file_len, in_context};
    let Plan(vb, version, ncols, kdir, indptr, nnz) = Plan::new(dm, meta, local);
    // Every file's length is checked (and pack tables verified) before anything is allocated
    // for the rows: a lying metadata entry cannot make this rank allocate more than the files
    // hold.
    let mut by_file: Vec<Vec<usize>> = Vec::new();
    match meta.layout {
        Layout::PerRow => {
            local.par_iter().with_min_len(64).try_for_each(|e| {
                let path = kdir.join(row_file_name(e.row));
                let len = file_len(&path).map_err(|err| match err {
                    Error::Io { err: source, .. } => Error::format(
                        &path,
                        format!("kernel row {} listed in the metadata: {source}", e.row),
                    ),
                    other => other,
                })?;
                let want = ROW_HEADER.saturating_add(record_size_v(e.nnz as usize, vb, version));
                Reader::new(&path, &[]).exact_len_of(
                    len,
                    want as u64,
                    &format!("kernel row {} ({} nonzeros)", e.row, e.nnz),
                )
            })?;
        }
        Layout::Packed => {
            // Local rows by pack.
            by_file = vec![Vec::new(); meta.files as usize];
            for (i, e) in local.iter().enumerate() {
                by_file[e.file as usize].push(i);
            }
            let lens: Vec<Result<u64>> = by_file
                .par_iter()
                .enumerate()
                .map(|(p, rows)| {
                    if rows.is_empty() {
                        return Ok(0);
                    }
                    let path = kdir.join(pack_file_name(p as u64));
                    let len = file_len(&path)?;
                    let head = reader.read(&path, 0, PACK_HEADER.min(len as usize))?;
                    let nr = Reader::new(&path, &head).count(24, "rows in pack")?;
                    let table_end = PACK_HEADER
                        .saturating_add(PACK_ENTRY.saturating_mul(nr))
                        .min(len as usize);
                    let mut table = head;
                    table.extend(reader.read(
                        &path,
                        PACK_HEADER as u64,
                        table_end.saturating_sub(PACK_HEADER),
                    )?);
                    check_pack_table(&path, &table, len, p as u64, vb, version)?;
                    Ok(len)
                })
                .collect();
            let lens = lens.into_iter().collect::<Result<Vec<u64>>>()?;
            let paths: Vec<PathBuf> = (0..lens.len() as u64)
                .map(|p| kdir.join(pack_file_name(p)))
                .collect();
            check_records_fit(local, vb, version, |p| (paths[p].as_path(), lens[p]))?;
        }
    }
    crate::io::limits::check_alloc(
        &meta.path,
        &format!("{nnz} kernel nonzeros in {} rows", local.len()),
        12 * nnz as u128,
    )?;
    let mut indices = vec![0u32; nnz];
    let mut data = vec![0f64; nnz];
    let bytes_read = AtomicU64::new(0);
    let pb = crate::progress::bar(nnz as u64, "loading", progress);
    // One output slot per local row, handed to the span that holds the row.
    let mut slots: Vec<Option<Slot>> = Vec::with_capacity(local.len());
    {
        let (mut ri, mut rv) = (&mut indices[..], &mut data[..]);
        for e in local {
            let k = e.nnz as usize;
            let (a, rest_i) = std::mem::take(&mut ri).split_at_mut(k);
            let (b, rest_v) = std::mem::take(&mut rv).split_at_mut(k);
            ri = rest_i;
            rv = rest_v;
            slots.push(Some((e, a, b)));
        }
    }
    // Per file: its spans (offset, length, the rows inside).
    type Rows<'s> = Vec<Slot<'s>>;
    type Job<'s> = (PathBuf, Vec<(u64, u64, Rows<'s>)>);
    let mut jobs: Vec<Job> = Vec::new();
    match meta.layout {
        Layout::PerRow => {
            // One file per row: the whole file is one read.
            for slot in slots.iter_mut() {
                let (e, c, v) = slot.take().expect("each row once");
                let path = kdir.join(row_file_name(e.row));
                let len = (ROW_HEADER + record_size_v(e.nnz as usize, vb, version)) as u64;
                jobs.push((path, vec![(0, len, vec![(e, c, v)])]));
            }
        }
        Layout::Packed => {
            // Each pack's rows by offset.
            for (p, mut rows) in by_file.into_iter().enumerate() {
                if rows.is_empty() {
                    continue;
                }
                rows.sort_unstable_by_key(|&i| local[i].offset);
                let pieces: Vec<(u64, u64)> = rows
                    .iter()
                    .map(|&i| {
                        let e = &local[i];
                        (e.offset, record_size_v(e.nnz as usize, vb, version) as u64)
                    })
                    .collect();
                let path = kdir.join(pack_file_name(p as u64));
                let spans = reader
                    .spans(&pieces)
                    .into_iter()
                    .map(|s| {
                        let members = rows[s.items.clone()]
                            .iter()
                            .map(|&i| slots[i].take().expect("each row once"))
                            .collect();
                        (s.offset, s.len, members)
                    })
                    .collect();
                jobs.push((path, spans));
            }
        }
    }
    let what = |e: &MetaEntry| format!("kernel row {} (record at byte {})", e.row, e.offset);
    // Decode the rows of one span, read from `offset` of `path`.
    let decode_span = |path: &Path, offset: u64, len: u64, rows: &mut Rows, buf: &[u8]| {
        let r = Reader::new(path, buf);
        if meta.layout == Layout::PerRow {
            let (e, cols, vals) = &mut rows[0];
            let got_vb = r.prefix_v(&MAGIC_ROW, "kernel row", version)? as usize;
            if got_vb != vb {
                return Err(Error::format(
                    path,
                    format!("values of {got_vb} bytes but the dataset's precision has {vb}"),
                ));
            }
            // The file's length was checked before the read.
            decode_record(&r, ROW_HEADER, e.row, vb, version, ncols, cols, vals)?;
        } else {
            for (e, cols, vals) in rows.iter_mut() {
                let at = (e.offset - offset) as usize;
                decode_record(&r, at, e.row, vb, version, ncols, cols, vals)
                    .map_err(|err| in_context(err, &what(e)))?;
            }
        }
        bytes_read.fetch_add(len, Ordering::Relaxed);
        pb.inc(rows.iter().map(|(e, _, _)| e.nnz).sum());
        Ok(())
    };
    // Files in parallel; each file opened once and its spans read in offset order.
    jobs.par_iter_mut()
        .with_min_len(if meta.layout == Layout::PerRow { 64 } else { 1 })
        .try_for_each(|(path, spans)| {
            let ranges: Vec<(u64, usize)> = spans.iter().map(|s| (s.0, s.1 as usize)).collect();
            let (mut next, mut decode_failed) = (0, false);
            reader
                .read_ranges(path, &ranges, &mut |k, buf| {
                    next = k + 1;
                    let (offset, len, rows) = &mut spans[k];
                    let r = decode_span(path, *offset, *len, rows, buf);
                    decode_failed = r.is_err();
                    r
                })
                .map_err(|err| match spans.get(next) {
                    // A read failed (not a decode): name the first row it was reading.
                    Some((_, _, rows)) if !decode_failed => in_context(err, &what(rows[0].0)),
                    _ => err,
                })
        })?;
    pb.finish_and_clear();
    drop(jobs);
    Ok((indptr, indices, data, bytes_read.into_inner()))
}
/// The metadata order: indices of `nnz` sorted by descending nnz, ties by ascending index.
pub fn descending_order(nnz: &[u64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..nnz.len()).collect();
    idx.sort_by_key(|&i| (std::cmp::Reverse(nnz[i]), i));
    idx
}
