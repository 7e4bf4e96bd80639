//! How a rank reads its rows of a dataset: memory maps (one process) or byte-range reads through
//! the communicator's MPI-IO (`MPI_File_read_at` on MPI_COMM_SELF, one file per rank at a time;
//! a positioned std read without MPI, [`LocalReads`], here). See docs/running-on-clusters.md,
//! "Loading".
//!
//! The MPI-IO path turns a rank's rows into byte ranges per file, sorts them by offset and
//! [`coalesce`]s neighbours (touching, or separated by a gap of at most `max_gap` bytes) into
//! spans of at most `max_span` bytes; each span is one buffer, read in chunks of at most
//! `max_chunk` bytes (MPI counts are C ints, so a chunk stays below 2 GiB).

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Which way rows are read (`[dataset] io` in a run config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoChoice {
    /// Memory maps where every rank is on one node (one process, or a job on one machine: the
    /// node's page cache serves every rank), MPI-IO when the ranks span several nodes.
    #[default]
    Auto,
    /// Memory maps on every rank.
    Mmap,
    /// Byte-range reads through the communicator (MPI-IO under MPI, positioned reads without).
    MpiIo,
}

choice_from_str!(IoChoice, "io", "auto" => IoChoice::Auto, "mmap" => IoChoice::Mmap, "mpiio" | "mpi-io" => IoChoice::MpiIo);

impl IoChoice {
    /// The path used on a job of `size` ranks, `node` of them on this rank's node: `Auto` is
    /// `Mmap` where they are all on one node, else `MpiIo`. Two ranks on one 2 x H100 machine
    /// read the 369M-nonzero dataset's rows in 2.7-2.9 s through maps against 5.3-5.7 s through
    /// MPI-IO (Open MPI's `MPI_File_read_at`, serialized within a rank), 0.71 against 1.56 s at
    /// 600k rays (2026-11-26).
    pub fn resolve(self, size: usize, node: usize) -> IoPath {
        match self {
            IoChoice::Mmap => IoPath::Mmap,
            IoChoice::MpiIo => IoPath::MpiIo,
            IoChoice::Auto if size > 1 && node < size => IoPath::MpiIo,
            IoChoice::Auto => IoPath::Mmap,
        }
    }
}

/// The path a load took (in [`crate::io::dataset::LoadStats`] and the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoPath {
    #[default]
    Mmap,
    MpiIo,
}

impl std::fmt::Display for IoPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoPath::Mmap => "mmap",
            IoPath::MpiIo => "mpiio",
        })
    }
}

/// Largest byte count of one read call (below 2^31: MPI counts are C ints).
pub const MAX_CHUNK: usize = 1 << 30;
/// Neighbouring ranges at most this far apart are read as one (the gap is read and discarded;
/// `[tuning] io_max_gap` overrides it through [`RangeReader::with_max_gap`], 0 merges touching
/// ranges only). Measured on a local disk
/// (docs/running-on-clusters.md, "Loading"): with the page cache warm, 0 was ~15% faster (a call
/// costs ~3 µs with the file open); with it cold, 64 KiB was ~10% faster (fewer, larger reads).
/// Clusters read cold data, often from file systems with a higher per-call latency.
pub const MAX_GAP: u64 = 64 << 10;
/// Spans are cut at this size (bounds the buffers in flight; one range longer than this is a
/// span of its own).
pub const MAX_SPAN: u64 = 64 << 20;

/// One read of a file: bytes `offset..offset + len`, holding pieces `items` of the sorted input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub offset: u64,
    pub len: u64,
    pub items: Range<usize>,
}

/// Merge byte ranges `(offset, len)`, sorted by offset and not overlapping, into spans: a range
/// joins the current span when it starts at most `max_gap` bytes after the span's end and the
/// span stays within `max_span` bytes.
pub fn coalesce(pieces: &[(u64, u64)], max_gap: u64, max_span: u64) -> Vec<Span> {
    let mut out: Vec<Span> = Vec::new();
    for (i, &(off, len)) in pieces.iter().enumerate() {
        if let Some(s) = out.last_mut() {
            let end = s.offset + s.len;
            debug_assert!(off >= end, "ranges must be sorted and disjoint");
            let new_len = off + len - s.offset;
            if off.saturating_sub(end) <= max_gap && new_len <= max_span {
                s.len = new_len;
                s.items.end = i + 1;
                continue;
            }
        }
        out.push(Span {
            offset: off,
            len,
            items: i..i + 1,
        });
    }
    out
}

/// Split `len` bytes at `offset` into read calls of at most `max_chunk` bytes.
pub fn chunks(offset: u64, len: usize, max_chunk: usize) -> impl Iterator<Item = (u64, usize)> {
    let max_chunk = max_chunk.max(1);
    (0..len.div_ceil(max_chunk)).map(move |k| {
        let start = k * max_chunk;
        (offset + start as u64, max_chunk.min(len - start))
    })
}

/// Receives range i's bytes, in order (see [`RangeSource::read_ranges`]).
pub type RangeSink<'a> = &'a mut dyn FnMut(usize, &[u8]) -> Result<()>;

/// Where a rank's byte ranges come from: [`LocalReads`] (positioned std reads), or the MPI-IO
/// reads a communicator hands out (`comm::Comm::reader`), so that readers here never name a
/// communicator.
pub trait RangeSource: Sync {
    /// Read `len` bytes at `offset` of `path`, this rank alone: MPI-IO (MPI_File_read_at on
    /// MPI_COMM_SELF) under MPI, a positioned std read otherwise. Loaders read their rows with it.
    fn read_at(&self, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>>;
    /// Read `ranges` (offset, length) of `path`, this rank alone, opening the file once:
    /// `f(i, bytes)` receives range i's bytes, in order (MPI_File_open on MPI_COMM_SELF, then
    /// MPI_File_read_at per range under MPI; std reads otherwise). Errors name the file and the
    /// offset.
    fn read_ranges(&self, path: &Path, ranges: &[(u64, usize)], f: RangeSink) -> Result<()>;
    /// Collective: every rank reads its own range (possibly empty) of the same `path`
    /// (MPI_File_open + MPI_File_read_at_all on the world under MPI). An error on one rank is
    /// that rank's: pass the result through `comm::agree`.
    fn read_at_all(&self, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.read_at(path, offset, len)
    }
}

/// Positioned std reads: the source without MPI. Errors name the file; a short read is an
/// error naming the offset and the length.
pub struct LocalReads;

impl RangeSource for LocalReads {
    fn read_at(&self, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut f = crate::io::open_input(path)?;
        let mut buf = vec![0u8; len];
        read_file_into(&mut f, path, offset, &mut buf)?;
        Ok(buf)
    }

    fn read_ranges(&self, path: &Path, ranges: &[(u64, usize)], f: RangeSink) -> Result<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        let mut file = crate::io::open_input(path)?;
        // One buffer for all ranges (fresh pages for every range would cost a page fault each).
        let mut buf = vec![0u8; ranges.iter().map(|r| r.1).max().unwrap_or(0)];
        for (i, &(off, len)) in ranges.iter().enumerate() {
            read_file_into(&mut file, path, off, &mut buf[..len])?;
            f(i, &buf[..len])?;
        }
        Ok(())
    }
}

/// Fill `buf` from `offset` of the open file `f` (named `path` in errors).
fn read_file_into(f: &mut File, path: &Path, offset: u64, buf: &mut [u8]) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| Error::io(path, e))?;
    let len = buf.len();
    let mut got = 0;
    while got < len {
        match f.read(&mut buf[got..]) {
            Ok(0) => return Err(short_read(path, offset, len, got)),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    Ok(())
}

/// The error of a read that found `path` shorter than asked (std and MPI-IO reads alike).
pub(crate) fn short_read(path: &Path, offset: u64, len: usize, got: usize) -> Error {
    Error::format(
        path,
        format!("wanted {len} bytes at offset {offset} but the file ends after {got} of them"),
    )
}

/// Reads byte ranges through a [`RangeSource`] (a communicator's MPI-IO, or [`LocalReads`]),
/// counting calls and bytes.
pub struct RangeReader<'a> {
    source: &'a dyn RangeSource,
    pub max_gap: u64,
    pub max_span: u64,
    pub max_chunk: usize,
    calls: AtomicU64,
    bytes: AtomicU64,
}

impl<'a> RangeReader<'a> {
    /// A reader of `source` with the default limits.
    pub fn new(source: &'a dyn RangeSource) -> Self {
        RangeReader {
            source,
            max_gap: MAX_GAP,
            max_span: MAX_SPAN,
            max_chunk: MAX_CHUNK,
            calls: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Without MPI: positioned std reads.
    pub fn serial() -> RangeReader<'static> {
        RangeReader::new(&LocalReads)
    }

    /// This reader with coalescing gap `max_gap` bytes (0: only touching ranges are merged);
    /// `None` keeps [`MAX_GAP`]. (`io_max_gap` of [`crate::io::LoadOptions`].)
    pub fn with_max_gap(mut self, max_gap: Option<u64>) -> Self {
        if let Some(gap) = max_gap {
            self.max_gap = gap;
        }
        self
    }

    /// Read `len` bytes at `offset` of `path` in chunks of at most `max_chunk` bytes. A short
    /// read is an error naming the file, the offset and the length.
    pub fn read(&self, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
        if len <= self.max_chunk {
            let v = self.source.read_at(path, offset, len)?;
            self.count(len);
            return Ok(v);
        }
        let mut buf = Vec::with_capacity(len);
        for (off, n) in chunks(offset, len, self.max_chunk) {
            buf.extend_from_slice(&self.source.read_at(path, off, n)?);
            self.count(n);
        }
        Ok(buf)
    }

    /// Read `ranges` (offset, length) of `path`, opening it once (see [`RangeSource::read_ranges`]);
    /// `f(i, bytes)` receives range i's bytes in order. Ranges longer than `max_chunk` are read
    /// in chunks and handed over whole.
    pub fn read_ranges(&self, path: &Path, ranges: &[(u64, usize)], f: RangeSink) -> Result<()> {
        let mut calls: Vec<(u64, usize)> = Vec::with_capacity(ranges.len());
        let mut owner: Vec<usize> = Vec::with_capacity(ranges.len());
        for (i, &(off, len)) in ranges.iter().enumerate() {
            if len == 0 {
                calls.push((off, 0));
                owner.push(i);
            }
            for c in chunks(off, len, self.max_chunk) {
                calls.push(c);
                owner.push(i);
            }
        }
        // Chunks of one range are gathered and the range handed over as soon as it is complete.
        let mut pending: Vec<u8> = Vec::new();
        self.source.read_ranges(path, &calls, &mut |k, bytes| {
            self.count(bytes.len());
            let i = owner[k];
            let last = owner.get(k + 1) != Some(&i);
            if pending.is_empty() && last {
                return f(i, bytes);
            }
            pending.extend_from_slice(bytes);
            if last {
                f(i, &std::mem::take(&mut pending))?;
            }
            Ok(())
        })
    }

    fn count(&self, n: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Read calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Bytes read so far (gaps between coalesced ranges included).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Spans for sorted ranges with this reader's limits.
    pub fn spans(&self, pieces: &[(u64, u64)]) -> Vec<Span> {
        coalesce(pieces, self.max_gap, self.max_span)
    }
}

/// The length of `path` in bytes (a `stat`; errors name the file; a directory, FIFO or device
/// is refused: [`crate::io::check_regular`]).
pub fn file_len(path: &Path) -> Result<u64> {
    crate::io::check_regular(path)?;
    Ok(std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len())
}

/// Put `what` (row, offset) in front of a file error's message, keeping the file name first.
pub fn in_context(e: Error, what: &str) -> Error {
    match e {
        Error::Io { path, err } => Error::Format {
            path,
            msg: format!("{what}: {err}"),
        },
        Error::Format { path, msg } => Error::Format {
            path,
            msg: format!("{what}: {msg}"),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_touching_and_close_ranges_within_the_span_limit() {
        // Touching, a gap of 4, a gap of 100, then a range that would exceed the span limit.
        let p = [(0, 10), (10, 5), (19, 1), (120, 30), (150, 60)];
        let s = coalesce(&p, 4, 200);
        assert_eq!(
            s,
            vec![
                Span {
                    offset: 0,
                    len: 20,
                    items: 0..3
                },
                Span {
                    offset: 120,
                    len: 90,
                    items: 3..5
                },
            ]
        );
        // No gap allowed: only touching ranges merge; the span limit cuts 120..210.
        let s = coalesce(&p, 0, 50);
        let got: Vec<_> = s
            .iter()
            .map(|s| (s.offset, s.len, s.items.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 15, 0..2),
                (19, 1, 2..3),
                (120, 30, 3..4),
                (150, 60, 4..5)
            ]
        );
        // One range longer than the span limit is a span of its own.
        assert_eq!(coalesce(&[(5, 1000)], 0, 10).len(), 1);
        assert!(coalesce(&[], 8, 8).is_empty());
        // Every item lands in exactly one span, in order.
        let p: Vec<(u64, u64)> = (0..1000u64).map(|i| (i * 10 + i % 3, 7)).collect();
        let s = coalesce(&p, 3, 333);
        let mut next = 0;
        for sp in &s {
            assert_eq!(sp.items.start, next);
            next = sp.items.end;
            assert!(sp.len <= 333);
            let (o, l) = p[sp.items.end - 1];
            assert_eq!(sp.offset + sp.len, o + l);
        }
        assert_eq!(next, p.len());
    }

    #[test]
    fn chunks_stay_below_the_limit_and_cover_the_range() {
        let c: Vec<_> = chunks(100, 25, 10).collect();
        assert_eq!(c, vec![(100, 10), (110, 10), (120, 5)]);
        assert_eq!(chunks(0, 0, 10).count(), 0);
        assert_eq!(chunks(7, 10, 10).collect::<Vec<_>>(), vec![(7, 10)]);
        // A 5 GiB range in MPI-sized chunks: each below 2^31 bytes.
        let big: Vec<_> = chunks(3, 5 << 30, MAX_CHUNK).collect();
        assert_eq!(big.len(), 5);
        assert!(big.iter().all(|&(_, n)| n < i32::MAX as usize));
        assert_eq!(big.iter().map(|&(_, n)| n).sum::<usize>(), 5 << 30);
    }

    #[test]
    fn reader_reads_in_chunks_and_names_the_file_on_a_short_read() {
        let dir = crate::io::test_dir("rowio");
        let p = dir.join("r.bin");
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        assert_eq!(RangeReader::serial().with_max_gap(None).max_gap, MAX_GAP);
        assert_eq!(RangeReader::serial().with_max_gap(Some(0)).max_gap, 0);
        let mut r = RangeReader::serial();
        r.max_chunk = 64;
        assert_eq!(r.read(&p, 10, 300).unwrap(), &data[10..310]);
        assert_eq!((r.calls(), r.bytes()), (5, 300));
        let mut got = Vec::new();
        r.read_ranges(
            &p,
            &[(0, 10), (20, 150), (500, 64), (600, 0)],
            &mut |i, b| {
                got.push((i, b.to_vec()));
                Ok(())
            },
        )
        .unwrap();
        let want: Vec<(usize, Vec<u8>)> = vec![
            (0, data[0..10].to_vec()),
            (1, data[20..170].to_vec()),
            (2, data[500..564].to_vec()),
            (3, Vec::new()),
        ];
        assert_eq!(got, want);
        // 1 + 3 chunks + 1 + 1 (the empty range) more calls.
        assert_eq!(r.calls(), 5 + 6);
        let e = r.read(&p, 900, 200).unwrap_err().to_string();
        assert!(e.contains("r.bin") && e.contains("offset"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn io_choice_parses_and_resolves() {
        assert_eq!("mpiio".parse::<IoChoice>().unwrap(), IoChoice::MpiIo);
        assert!("posix".parse::<IoChoice>().unwrap_err().contains("auto"));
        assert_eq!(IoChoice::Auto.resolve(1, 1), IoPath::Mmap);
        assert_eq!(IoChoice::Auto.resolve(2, 1), IoPath::MpiIo);
        assert_eq!(IoChoice::Auto.resolve(4, 2), IoPath::MpiIo);
        assert_eq!(IoChoice::Auto.resolve(2, 2), IoPath::Mmap);
        assert_eq!(IoChoice::MpiIo.resolve(1, 1), IoPath::MpiIo);
        assert_eq!(IoChoice::MpiIo.resolve(2, 2), IoPath::MpiIo);
        assert_eq!(IoChoice::Mmap.resolve(4, 1), IoPath::Mmap);
    }

    #[test]
    fn local_reads_ranges_and_names_the_file_on_errors() {
        let dir = crate::io::test_dir("localreads");
        let p = dir.join("bytes.bin");
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        assert_eq!(LocalReads.read_at(&p, 123, 1000).unwrap(), &data[123..1123]);
        assert_eq!(LocalReads.read_at(&p, 5000, 0).unwrap(), Vec::<u8>::new());
        let e = LocalReads.read_at(&p, 4990, 20).unwrap_err().to_string();
        assert!(e.contains("bytes.bin") && e.contains("10 of them"), "{e}");
        let e = LocalReads
            .read_at(&dir.join("missing.bin"), 0, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.bin"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
