//! gzip files whose members can be found without decoding them, read on every thread.
//!
//! A gzip file may hold several members one after another (RFC 1952); gzip, zlib, Python and
//! SciPy read them as one stream. seistomo writes large `.gz` files (Matrix Market matrices) as
//! one member per block of about 1 MB of text, each compressed on its own thread, and puts each
//! member's length in its header (an extra subfield `SM`, 4 bytes, little-endian: the whole
//! member's bytes). BGZF files (bgzip, htslib: subfield `BC`) carry theirs the same way. When every
//! member of a file says its length, [`open`] walks the headers, decodes the members on the
//! rayon pool a window ahead of the reader and hands their text out in order; any other gzip
//! file (one member, or members without the length) is read by one decoding thread, as before.

use std::collections::VecDeque;
use std::io::{self, BufRead, Read, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::{mpsc, Arc};

use crate::error::Result;
use crate::io::mmap::MappedFile;

/// A member's header: magic, deflate, FEXTRA, no time, no extra flags, OS unknown, then XLEN = 8
/// and the `SM` subfield (4 bytes: the member's length, filled in once known).
const HEAD: [u8; 20] = [
    0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 255, 8, 0, b'S', b'M', 4, 0, 0, 0, 0, 0,
];

/// Where [`HEAD`] holds the member's length.
const LEN_AT: Range<usize> = 16..20;

/// `text` as one gzip member (fast compression) that says its own length in its header.
pub(crate) fn member(text: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 3 + HEAD.len() + 8);
    out.extend_from_slice(&HEAD);
    let mut z = flate2::write::DeflateEncoder::new(out, flate2::Compression::fast());
    z.write_all(text)?;
    let mut out = z.finish()?;
    let mut crc = flate2::Crc::new();
    crc.update(text);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    // ISIZE is the text's length modulo 2^32 (RFC 1952)
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    let len = u32::try_from(out.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a gzip member of 4 GiB or more cannot say its length",
        )
    })?;
    out[LEN_AT].copy_from_slice(&len.to_le_bytes());
    Ok(out)
}

/// Text per member of a [`Members`] stream.
const MEMBER_TEXT: usize = 1 << 20;

/// A gzip stream written as members of [`MEMBER_TEXT`] bytes of text that say their lengths,
/// compressed a wave at a time on the rayon pool (one member a thread) and written in order.
/// [`Members::finish`] writes what is left; a stream with no text is one empty member.
pub(crate) struct Members<W: Write> {
    inner: W,
    /// Text not yet compressed: up to a wave of members.
    buf: Vec<u8>,
    /// Text per member ([`MEMBER_TEXT`]; smaller in tests).
    member: usize,
    wave: usize,
    written: bool,
}

impl<W: Write> Members<W> {
    pub(crate) fn new(inner: W) -> Members<W> {
        Self::with_member_text(inner, MEMBER_TEXT)
    }

    /// Members of `member` bytes of text (tests cut lines across members with a few bytes).
    pub(crate) fn with_member_text(inner: W, member: usize) -> Members<W> {
        let wave = 2 * rayon::current_num_threads().max(1);
        Members {
            inner,
            buf: Vec::new(),
            member: member.max(1),
            wave,
            written: false,
        }
    }

    /// Compress and write the whole members in `buf` (and the partial last one when `all`).
    fn flush_members(&mut self, all: bool) -> io::Result<()> {
        use rayon::prelude::*;
        let whole = if all {
            self.buf.len()
        } else {
            self.buf.len() / self.member * self.member
        };
        let packed: Vec<io::Result<Vec<u8>>> = self.buf[..whole]
            .par_chunks(self.member)
            .map(member)
            .collect();
        for p in packed {
            self.inner.write_all(&p?)?;
            self.written = true;
        }
        self.buf.drain(..whole);
        Ok(())
    }

    /// Write what is left and hand the inner writer back.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        self.flush_members(true)?;
        if !self.written {
            self.inner.write_all(&member(&[])?)?;
        }
        Ok(self.inner)
    }
}

impl<W: Write> Write for Members<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let full = self.wave * self.member;
        if self.buf.capacity() == 0 {
            self.buf.reserve(full.min(64 << 20));
        }
        // at most a wave of text held: a long write is taken a wave at a time (write_all loops)
        let take = data.len().min(full.saturating_sub(self.buf.len()).max(1));
        self.buf.extend_from_slice(&data[..take]);
        if self.buf.len() >= full {
            self.flush_members(false)?;
        }
        Ok(take)
    }

    /// Members are whole only at [`Members::finish`]: this flushes the inner writer alone.
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// One member of an indexed file.
#[derive(Clone, Debug, PartialEq)]
struct Member {
    /// The deflate data's bytes in the file.
    data: Range<usize>,
    /// The text's CRC-32 and length modulo 2^32 (the member's trailer).
    crc: u32,
    isize: u32,
}

fn u16_at(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as usize)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The member at the start of `b`, and its whole length: `None` unless its header is a deflate
/// member's that says its length (`SM` or BGZF's `BC`) and the member lies within `b`.
fn member_at(b: &[u8]) -> Option<(Member, usize)> {
    const FHCRC: u8 = 2;
    const FEXTRA: u8 = 4;
    const FNAME: u8 = 8;
    const FCOMMENT: u8 = 16;
    if b.len() < 18 || b[0] != 0x1f || b[1] != 0x8b || b[2] != 8 {
        return None;
    }
    let flg = b[3];
    if flg & 0xe0 != 0 || flg & FEXTRA == 0 {
        return None;
    }
    let xlen = u16_at(b, 10)?;
    let extra = b.get(12..12 + xlen)?;
    let mut len = None;
    let mut at = 0;
    while at + 4 <= extra.len() {
        let n = u16_at(extra, at + 2)?;
        let field = extra.get(at + 4..at + 4 + n)?;
        match (&extra[at..at + 2], n) {
            (b"SM", 4) => len = Some(u32_at(field, 0)? as usize),
            (b"BC", 2) => len = Some(u16_at(field, 0)? + 1),
            _ => {}
        }
        at += 4 + n;
    }
    let len = len?;
    let mut p = 12 + xlen;
    for flag in [FNAME, FCOMMENT] {
        if flg & flag != 0 {
            p += memchr::memchr(0, b.get(p..)?)? + 1;
        }
    }
    if flg & FHCRC != 0 {
        p += 2;
    }
    if len < p + 8 || len > b.len() {
        return None;
    }
    let m = Member {
        data: p..len - 8,
        crc: u32_at(b, len - 8)?,
        isize: u32_at(b, len - 4)?,
    };
    Some((m, len))
}

/// The most text a member of an indexed file may hold (a member is decoded whole into memory,
/// a window of them at a time; seistomo writes 1 MiB, BGZF at most 64 KiB).
const MAX_MEMBER_TEXT: u32 = 64 << 20;

/// Every member of `bytes` when each says its length and they fill the file exactly; `None`
/// otherwise (the file is read by one decoder, which reports what is wrong with it), or where a
/// member's trailer says it holds more than [`MAX_MEMBER_TEXT`].
fn index(bytes: &[u8]) -> Option<Vec<Member>> {
    let mut members = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (mut m, len) = member_at(&bytes[at..])?;
        if m.isize > MAX_MEMBER_TEXT {
            return None;
        }
        m.data = m.data.start + at..m.data.end + at;
        members.push(m);
        at += len;
    }
    (!members.is_empty()).then_some(members)
}

/// The text of member `m` of `bytes`, its length and CRC checked against its trailer.
fn decode(bytes: &[u8], m: &Member) -> io::Result<Vec<u8>> {
    let data = &bytes[m.data.clone()];
    let bad = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "corrupt gzip member at byte {} ({what})",
                m.data.start.saturating_sub(1)
            ),
        )
    };
    // deflate expands at most about 1032:1; a trailer that says more is not trusted for the room
    let room = (m.isize as usize).min(data.len().saturating_mul(1032) + 1024);
    let mut out = Vec::with_capacity(room);
    let mut z = flate2::bufread::DeflateDecoder::new(data);
    // never more than the trailer says, plus one byte to tell that there is more
    (&mut z)
        .take(u64::from(m.isize) + 1)
        .read_to_end(&mut out)
        .map_err(|e| bad(&e.to_string()))?;
    if out.len() != m.isize as usize {
        return Err(bad("length does not match its trailer"));
    }
    if z.total_in() != data.len() as u64 {
        return Err(bad("data after its deflate stream"));
    }
    let mut crc = flate2::Crc::new();
    crc.update(&out);
    if crc.sum() != m.crc {
        return Err(bad("CRC does not match its trailer"));
    }
    Ok(out)
}

/// Wait for `rx`; on a thread of the rayon pool, doing the pool's work meanwhile (a decode the
/// reader waits for may be queued behind it on this very thread's pool).
fn wait<T>(rx: &mpsc::Receiver<T>) -> Option<T> {
    if rayon::current_thread_index().is_none() {
        return rx.recv().ok();
    }
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) => {
                if rayon::yield_now() != Some(rayon::Yield::Executed) {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// The bytes of a file being read (a map; a vector in the tests).
trait Source: Send + Sync {
    fn bytes(&self) -> &[u8];
}

impl Source for MappedFile {
    fn bytes(&self) -> &[u8] {
        MappedFile::bytes(self)
    }
}

#[cfg(test)]
impl Source for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// The text of an indexed file: members decoded on the pool, up to `window` ahead, read in
/// order.
struct Parallel {
    map: Arc<dyn Source>,
    members: Arc<Vec<Member>>,
    next: usize,
    window: usize,
    pending: VecDeque<mpsc::Receiver<io::Result<Vec<u8>>>>,
    text: Vec<u8>,
    pos: usize,
    /// The first failure, returned again by every later read.
    failed: Option<(io::ErrorKind, String)>,
}

impl Parallel {
    fn new(map: Arc<dyn Source>, members: Vec<Member>) -> Parallel {
        Parallel {
            map,
            members: Arc::new(members),
            next: 0,
            window: 4 * rayon::current_num_threads().max(1),
            pending: VecDeque::new(),
            text: Vec::new(),
            pos: 0,
            failed: None,
        }
    }

    fn spawn_ahead(&mut self) {
        while self.pending.len() < self.window && self.next < self.members.len() {
            let (tx, rx) = mpsc::channel();
            let (map, members, k) = (self.map.clone(), self.members.clone(), self.next);
            rayon::spawn(move || {
                let _ = tx.send(decode(map.bytes(), &members[k]));
            });
            self.pending.push_back(rx);
            self.next += 1;
        }
    }
}

impl BufRead for Parallel {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos >= self.text.len() {
            if let Some((kind, msg)) = &self.failed {
                return Err(io::Error::new(*kind, msg.clone()));
            }
            self.spawn_ahead();
            let Some(rx) = self.pending.pop_front() else {
                return Ok(&[]);
            };
            match wait(&rx) {
                Some(Ok(t)) => {
                    self.text = t;
                    self.pos = 0;
                }
                Some(Err(e)) => self.failed = Some((e.kind(), e.to_string())),
                None => {
                    self.failed = Some((io::ErrorKind::Other, "a decoding task was lost".into()))
                }
            }
        }
        Ok(&self.text[self.pos..])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.text.len());
    }
}

impl Read for Parallel {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// The text of the gzip file `path` (a regular file: [`crate::io::open_input`]): decoded on
/// every thread when each member says its length (seistomo's own and BGZF files), else by one
/// decoder as a stream.
pub(crate) fn open(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let map = MappedFile::open(path)?;
    if let Some(members) = index(map.bytes()) {
        map.advise_sequential();
        return Ok(Box::new(Parallel::new(Arc::new(map), members)));
    }
    drop(map);
    let f = crate::io::open_input(path)?;
    Ok(Box::new(io::BufReader::with_capacity(
        1 << 20,
        flate2::read::MultiGzDecoder::new(f),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut t = Vec::new();
        while t.len() < n {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let _ = writeln!(
                t,
                "{} {} {:e}",
                s >> 44,
                (s >> 20) & 0xfff,
                (s as f64) / 7.0
            );
        }
        t.truncate(n);
        t
    }

    fn read_all(mut r: impl Read) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        r.read_to_end(&mut v)?;
        Ok(v)
    }

    fn file_of(members: &[Vec<u8>]) -> Vec<u8> {
        members.concat()
    }

    fn parallel(bytes: &[u8]) -> Option<Parallel> {
        let members = index(bytes)?;
        Some(Parallel::new(Arc::new(bytes.to_vec()), members))
    }

    #[test]
    fn members_are_read_by_others_and_in_parallel_as_one_stream() {
        let parts: Vec<Vec<u8>> = [0, 1, 70_000, 3, 1 << 20, 12_345]
            .iter()
            .enumerate()
            .map(|(i, &n)| text(n, i as u64))
            .collect();
        let members: Vec<Vec<u8>> = parts.iter().map(|t| member(t).unwrap()).collect();
        let file = file_of(&members);
        let whole = parts.concat();
        // a standard decoder reads them as one stream
        let seq = read_all(flate2::read::MultiGzDecoder::new(&file[..])).unwrap();
        assert_eq!(seq, whole);
        // the index finds every member, and the parallel reader gives the same text
        assert_eq!(index(&file).unwrap().len(), parts.len());
        let par = read_all(parallel(&file).unwrap()).unwrap();
        assert_eq!(par, whole);
        // and line by line through BufRead
        let mut r = parallel(&file).unwrap();
        let mut lines = 0;
        let mut line = String::new();
        while r.read_line(&mut line).unwrap() > 0 {
            lines += 1;
            line.clear();
        }
        assert_eq!(lines, whole.iter().filter(|&&c| c == b'\n').count() + 1);
    }

    #[test]
    fn a_members_stream_is_one_gzip_stream_cut_into_indexed_members() {
        let t = text(5 * MEMBER_TEXT + 777, 4);
        let mut w = Members::new(Vec::new());
        // written in odd pieces, as a formatter would
        for piece in t.chunks(300_001) {
            w.write_all(piece).unwrap();
        }
        let file = w.finish().unwrap();
        // one write of it all holds no more than a wave of text at a time, and makes the same
        let mut w = Members::new(Vec::new());
        assert!(w.write(&t).unwrap() <= w.wave * MEMBER_TEXT);
        let mut w = Members::new(Vec::new());
        w.write_all(&t).unwrap();
        assert!(w.buf.capacity() <= 2 * w.wave * MEMBER_TEXT);
        assert_eq!(w.finish().unwrap(), file);
        let idx = index(&file).unwrap();
        assert_eq!(idx.len(), 6);
        assert_eq!(idx.iter().map(|m| m.isize as usize).sum::<usize>(), t.len());
        assert_eq!(
            read_all(flate2::read::MultiGzDecoder::new(&file[..])).unwrap(),
            t
        );
        assert_eq!(read_all(parallel(&file).unwrap()).unwrap(), t);
        // nothing written: one empty member, a valid gzip file of no text
        let empty = Members::new(Vec::new()).finish().unwrap();
        assert_eq!(index(&empty).unwrap().len(), 1);
        assert!(read_all(flate2::read::MultiGzDecoder::new(&empty[..]))
            .unwrap()
            .is_empty());
        assert!(read_all(parallel(&empty).unwrap()).unwrap().is_empty());
    }

    #[test]
    fn bgzf_members_are_indexed_too() {
        // a BGZF block: FEXTRA with BC = block size - 1, then deflate data and the trailer
        let t = text(30_000, 9);
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&t).unwrap();
        let data = z.finish().unwrap();
        let mut b = vec![
            0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 255, 6, 0, b'B', b'C', 2, 0, 0, 0,
        ];
        b.extend_from_slice(&data);
        let mut crc = flate2::Crc::new();
        crc.update(&t);
        b.extend_from_slice(&crc.sum().to_le_bytes());
        b.extend_from_slice(&(t.len() as u32).to_le_bytes());
        let bsize = (b.len() - 1) as u16;
        b[16..18].copy_from_slice(&bsize.to_le_bytes());
        let file = [b.clone(), member(b"tail\n").unwrap()].concat();
        assert_eq!(index(&file).unwrap().len(), 2);
        let got = read_all(parallel(&file).unwrap()).unwrap();
        assert_eq!(got, [&t[..], b"tail\n"].concat());
    }

    #[test]
    fn files_that_do_not_say_their_lengths_are_not_indexed() {
        let t = text(10_000, 3);
        let mut plain = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        plain.write_all(&t).unwrap();
        let plain = plain.finish().unwrap();
        assert!(index(&plain).is_none());
        let ours = member(&t).unwrap();
        // one standard member after ours, trailing junk, a cut member: all left to the stream
        assert!(index(&[ours.clone(), plain].concat()).is_none());
        assert!(index(&[ours.clone(), b"junk".to_vec()].concat()).is_none());
        assert!(index(&ours[..ours.len() - 1]).is_none());
        assert!(index(&[]).is_none());
    }

    #[test]
    fn a_corrupt_member_is_an_error_at_its_byte_not_garbage() {
        let a = member(&text(50_000, 1)).unwrap();
        let b = member(&text(50_000, 2)).unwrap();
        for at in [b.len() / 2, b.len() - 6, b.len() - 2] {
            let mut bad = b.clone();
            bad[at] ^= 0x55;
            let file = [a.clone(), bad].concat();
            let e = read_all(parallel(&file).unwrap()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(e.to_string().contains("corrupt gzip member"), "{e}");
            // the stream decoder refuses it too
            assert!(read_all(flate2::read::MultiGzDecoder::new(&file[..])).is_err());
        }
    }

    #[test]
    fn a_member_that_holds_more_than_its_trailer_says_is_refused_without_decoding_it_all() {
        let t = vec![b'0'; 3 << 20];
        let mut m = member(&t).unwrap();
        let n = m.len();
        // the trailer says 10 bytes: at most 11 are decoded
        m[n - 4..].copy_from_slice(&10u32.to_le_bytes());
        let e = read_all(parallel(&m).unwrap()).unwrap_err();
        assert!(e.to_string().contains("length does not match"), "{e}");
        // a trailer beyond the members' limit: not indexed (the stream decoder reads it)
        m[n - 4..].copy_from_slice(&(MAX_MEMBER_TEXT + 1).to_le_bytes());
        assert!(index(&m).is_none());
    }

    #[test]
    fn a_reader_on_a_pool_thread_does_not_wait_for_itself() {
        let parts: Vec<Vec<u8>> = (0..40).map(|i| text(20_000, i)).collect();
        let file = file_of(&parts.iter().map(|t| member(t).unwrap()).collect::<Vec<_>>());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let got = pool.install(|| read_all(parallel(&file).unwrap()).unwrap());
        assert_eq!(got, parts.concat());
    }
}
