//! Matrix Market reader and writer: `coordinate` (real, integer, pattern; general, symmetric,
//! skew-symmetric) into CSR with duplicates summed, `array` (dense) vectors, `.gz` transparently.
//! Complex matrices and malformed lines are rejected with the file name and line number.
//!
//! **In parallel.** The header and the size line are read first; the body (the entries or
//! values) of a plain file is then cut into blocks of whole lines from a map of it, or, for a
//! `.gz`, by one reading thread (its members decoded on the pool where they say their lengths,
//! as seistomo's own `.gz` files do: `io::gz`; else by that thread) while the pool parses the
//! blocks as they come, into one part of triplets per block;
//! the CSR is built from the parts in parallel ([`Csr::from_triplet_parts`]). Errors are those
//! of a sequential reader, at the same lines: every block reports its first problem, and the
//! first one in file order is the one reported (with the declared count deciding, as a
//! sequential reader would, whether a line was an entry or one too many). Writing formats blocks
//! of rows in parallel (and compresses them in parallel into gzip members for `.gz`: `io::gz`),
//! in order.

use std::io::{BufRead, Read, Write};
use std::path::Path;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::sparse::{par, Csr, System, TripletPart};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Real,
    Integer,
    Pattern,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Symmetry {
    General,
    Symmetric,
    Skew,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Coordinate,
    Array,
}

#[derive(Clone, Copy)]
struct Header {
    layout: Layout,
    field: Field,
    symmetry: Symmetry,
}

fn parse_header(path: &Path, line: &str) -> Result<Header> {
    let bad = |msg: String| -> Result<Header> { Err(Error::parse(path, 1, msg)) };
    let toks: Vec<String> = line
        .split_whitespace()
        .map(|t| t.to_ascii_lowercase())
        .collect();
    if toks.len() != 5 || toks[0] != "%%matrixmarket" || toks[1] != "matrix" {
        return bad("not a Matrix Market file (expected '%%MatrixMarket matrix <layout> <field> <symmetry>')".into());
    }
    let layout = match toks[2].as_str() {
        "coordinate" => Layout::Coordinate,
        "array" => Layout::Array,
        other => return bad(format!("unknown Matrix Market layout '{other}'")),
    };
    let field = match toks[3].as_str() {
        "real" | "double" => Field::Real,
        "integer" => Field::Integer,
        "pattern" => Field::Pattern,
        "complex" => {
            return bad("complex matrices are not supported (seistomo solves real systems)".into())
        }
        other => return bad(format!("unknown Matrix Market field '{other}'")),
    };
    let symmetry = match toks[4].as_str() {
        "general" => Symmetry::General,
        "symmetric" => Symmetry::Symmetric,
        "skew-symmetric" => Symmetry::Skew,
        "hermitian" => return bad("hermitian matrices are not supported".into()),
        other => return bad(format!("unknown Matrix Market symmetry '{other}'")),
    };
    if layout == Layout::Array && field == Field::Pattern {
        return bad("an array cannot have field 'pattern'".into());
    }
    Ok(Header {
        layout,
        field,
        symmetry,
    })
}

/// Lines of a text file with their 1-based numbers, skipping `%` comments and blank lines.
struct DataLines<R> {
    inner: R,
    path: std::path::PathBuf,
    lineno: usize,
    buf: String,
    /// Bytes read so far.
    consumed: u64,
}

impl<R: BufRead> DataLines<R> {
    fn next_line(&mut self) -> Result<Option<(usize, &str)>> {
        loop {
            self.buf.clear();
            let n = self
                .inner
                .read_line(&mut self.buf)
                .map_err(|e| Error::io(&self.path, e))?;
            if n == 0 {
                return Ok(None);
            }
            self.consumed += n as u64;
            self.lineno += 1;
            let t = self.buf.trim();
            if t.is_empty() || t.starts_with('%') {
                continue;
            }
            // Re-borrow after the loop checks to satisfy the borrow checker.
            let t = self.buf.trim();
            return Ok(Some((self.lineno, t)));
        }
    }
}

fn parse_num<T: std::str::FromStr>(
    path: &Path,
    line: usize,
    tok: Option<&str>,
    what: &str,
) -> Result<T> {
    let tok = tok.ok_or_else(|| Error::parse(path, line, format!("missing {what}")))?;
    tok.parse::<T>()
        .map_err(|_| Error::parse(path, line, format!("bad {what} '{tok}'")))
}

fn parse_value(path: &Path, line: usize, tok: Option<&str>, field: Field) -> Result<f64> {
    let v = match field {
        Field::Pattern => return Ok(1.0),
        Field::Integer => parse_num::<i64>(path, line, tok, "integer value")? as f64,
        Field::Real => {
            // Fortran-style exponents (1.0D+03) appear in old collections.
            let t = tok.ok_or_else(|| Error::parse(path, line, "missing value"))?;
            let fixed;
            let t = if t.contains(['d', 'D']) {
                fixed = t.replace(['d', 'D'], "e");
                fixed.as_str()
            } else {
                t
            };
            t.parse::<f64>()
                .map_err(|_| Error::parse(path, line, format!("bad value '{t}'")))?
        }
    };
    if !v.is_finite() {
        return Err(Error::parse(
            path,
            line,
            format!("value is not finite ({v})"),
        ));
    }
    Ok(v)
}

/// The bytes of `path` when they are what is read (not `.gz`): an upper bound on what its
/// header may declare. `None` for compressed files (their readers grow as they read).
fn plain_len(path: &Path) -> Option<u64> {
    if path.extension().is_some_and(|e| e == "gz") {
        return None;
    }
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// A Matrix Market file read up to its size line: the header, the lines after the size line,
/// and what the size line declares.
struct Opened {
    header: Header,
    lines: DataLines<Box<dyn BufRead + Send>>,
    /// The size line's number.
    size_line: usize,
    nrows: usize,
    ncols: usize,
    /// The size line's fields after the row and column counts.
    rest: Vec<String>,
}

impl Opened {
    /// Open `path` (`.gz` allowed), parse its header and the row and column counts of its size
    /// line.
    fn open(path: &Path) -> Result<Opened> {
        let mut inner = open_stream(path)?;
        let mut first = String::new();
        let n = inner
            .read_line(&mut first)
            .map_err(|e| Error::io(path, e))?;
        let header = parse_header(path, first.trim())?;
        let mut lines = DataLines {
            inner,
            path: path.to_path_buf(),
            lineno: 1,
            buf: String::new(),
            consumed: n as u64,
        };
        let Some((size_line, size)) = lines.next_line()? else {
            return Err(Error::parse(path, lines.lineno, "missing size line"));
        };
        let mut it = size.split_whitespace();
        let nrows: usize = parse_num(path, size_line, it.next(), "row count")?;
        let ncols: usize = parse_num(path, size_line, it.next(), "column count")?;
        let rest = it.map(str::to_string).collect();
        Ok(Opened {
            header,
            lines,
            size_line,
            nrows,
            ncols,
            rest,
        })
    }

    /// Error if the size line has fields after the first `n` of [`Opened::rest`].
    fn no_more_fields(&self, path: &Path, n: usize) -> Result<()> {
        if self.rest.len() > n {
            return Err(Error::parse(
                path,
                self.size_line,
                "size line has extra fields",
            ));
        }
        Ok(())
    }

    /// Error unless `count` declared items of at least `min_bytes` bytes each fit in the bytes
    /// of `path` left after the size line (uncompressed files only).
    fn check_declared(&self, path: &Path, count: u128, min_bytes: u128, what: &str) -> Result<()> {
        if let Some(total) = plain_len(path) {
            let left = total.saturating_sub(self.lines.consumed) as u128;
            if count * min_bytes > left {
                return Err(Error::parse(
                    path,
                    self.size_line,
                    format!(
                        "the size line declares {count} {what}, which need at least {} bytes, but only {left} bytes follow it (truncated or a lying header)",
                        count * min_bytes
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Check an `array`'s declared size against the file and the machine's memory.
    fn check_array(&self, path: &Path) -> Result<()> {
        let (nrows, ncols, size_line) = (self.nrows, self.ncols, self.size_line);
        if self.header.symmetry != Symmetry::General && nrows != ncols {
            return Err(Error::parse(
                path,
                size_line,
                "a symmetric array must be square",
            ));
        }
        // A value line is at least "v\n".
        let total = array_values(nrows, ncols, &self.header);
        self.check_declared(path, total, 2, "values")?;
        crate::io::limits::check_alloc(
            path,
            &format!("a {nrows} x {ncols} array"),
            16 * nrows as u128 * ncols as u128,
        )
        .map_err(|e| at_line(e, size_line))
    }

    /// The body of an `array`, checked against the file and the machine's memory first
    /// (column-major).
    fn array_body(self, path: &Path) -> Result<Vec<f64>> {
        self.no_more_fields(path, 0)?;
        let (nrows, ncols, header) = (self.nrows, self.ncols, self.header);
        self.check_array(path)?;
        let total = array_values(nrows, ncols, &header) as usize;
        let body = Body::Array {
            field: header.field,
        };
        let parts = read_body(path, self, body, total, "values")?;
        let mut vals = vec![0f64; total];
        let lens = parts.iter().map(|p| p.vals.len());
        par::split_parts(&mut vals, lens)
            .into_par_iter()
            .zip(&parts)
            .for_each(|(v, p)| v.copy_from_slice(&p.vals));
        drop(parts);
        Ok(place_array(vals, nrows, ncols, &header))
    }
}

/// Read a sparse matrix from a Matrix Market file (`coordinate` or `array`; `.gz` allowed).
/// Sizes on the size line are checked against the file's length (uncompressed files), against
/// rows x columns and against the machine's memory before anything is allocated from them.
pub fn read_matrix(path: impl AsRef<Path>) -> Result<Csr> {
    let path = path.as_ref();
    let m = Opened::open(path)?;
    let (nrows, ncols) = (m.nrows, m.ncols);
    if ncols > u32::MAX as usize {
        return Err(Error::parse(
            path,
            m.size_line,
            format!("{ncols} columns exceed the 32-bit column index"),
        ));
    }
    if nrows > u32::MAX as usize + 1 {
        return Err(Error::parse(
            path,
            m.size_line,
            format!("{nrows} rows exceed the 32-bit row index"),
        ));
    }
    match m.header.layout {
        Layout::Coordinate => {
            let parts = read_coordinate(path, m)?;
            Ok(Csr::from_triplet_parts(nrows, ncols, parts))
        }
        Layout::Array => {
            let dense = m.array_body(path)?;
            let (mut rows, mut cols, mut vals) = (Vec::new(), Vec::new(), Vec::new());
            for j in 0..ncols {
                for i in 0..nrows {
                    let v = dense[j * nrows + i];
                    if v != 0.0 {
                        rows.push(i as u64);
                        cols.push(j as u64);
                        vals.push(v);
                    }
                }
            }
            Csr::from_triplets(nrows, ncols, &rows, &cols, &vals)
                .map_err(|e| Error::in_file(path, e))
        }
    }
}

/// The entries of a `coordinate` file after its size line (the mirror entries of a symmetric or
/// skew-symmetric one added after each entry), in parts in file order, the declared count
/// checked against the file's length and the machine's memory before anything is allocated.
fn read_coordinate(path: &Path, m: Opened) -> Result<Vec<TripletPart>> {
    let (nrows, ncols, size_line, header) = (m.nrows, m.ncols, m.size_line, m.header);
    let nnz: usize = parse_num(
        path,
        size_line,
        m.rest.first().map(String::as_str),
        "entry count",
    )?;
    m.no_more_fields(path, 1)?;
    if header.symmetry != Symmetry::General && nrows != ncols {
        return Err(Error::parse(
            path,
            size_line,
            "a symmetric matrix must be square",
        ));
    }
    let cells = nrows as u128 * ncols as u128;
    if nnz as u128 > cells {
        return Err(Error::parse(
            path,
            size_line,
            format!("{nnz} entries declared but a {nrows} x {ncols} matrix has {cells} cells"),
        ));
    }
    // An entry line is at least "i j\n" (pattern) or "i j v\n".
    let min_line = if header.field == Field::Pattern { 4 } else { 6 };
    m.check_declared(path, nnz as u128, min_line, "entries")?;
    let cap = if header.symmetry == Symmetry::General {
        nnz
    } else {
        2 * nnz
    };
    crate::io::limits::check_alloc(
        path,
        &format!("a {nrows} x {ncols} matrix with {nnz} entries"),
        16 * (nrows as u128 + 1) + 36 * cap as u128,
    )
    .map_err(|e| at_line(e, size_line))?;
    let body = Body::Coordinate {
        shape: (nrows, ncols),
        field: header.field,
        symmetry: header.symmetry,
    };
    read_body(path, m, body, nnz, "entries")
}

/// One entry line of a `coordinate` file: 1-based row and column, in range, and the value.
fn parse_entry(
    path: &Path,
    ln: usize,
    l: &str,
    nrows: usize,
    ncols: usize,
    field: Field,
) -> Result<(u64, u64, f64)> {
    let mut t = l.split_whitespace();
    let i: u64 = parse_num(path, ln, t.next(), "row index")?;
    let j: u64 = parse_num(path, ln, t.next(), "column index")?;
    if i == 0 || i as usize > nrows || j == 0 || j as usize > ncols {
        return Err(Error::parse(path, ln, format!("index ({i}, {j}) out of range for a {nrows} x {ncols} matrix (indices are 1-based)")));
    }
    let v = match field {
        Field::Pattern if t.next().is_some() => {
            return Err(Error::parse(
                path,
                ln,
                "entry has a value, but the matrix is 'pattern' (entries are 'row column')",
            ))
        }
        _ => parse_value(path, ln, t.next(), field)?,
    };
    if t.next().is_some() {
        return Err(Error::parse(path, ln, "entry has extra fields"));
    }
    Ok((i, j, v))
}

/// A parse error at `line` for a file error (the memory plan's), keeping its message.
fn at_line(e: Error, line: usize) -> Error {
    match e {
        Error::Format { path, msg } => Error::Parse { path, line, msg },
        other => other,
    }
}

/// Values an `array` body holds (symmetric arrays store the lower triangle).
fn array_values(nrows: usize, ncols: usize, header: &Header) -> u128 {
    let (r, c) = (nrows as u128, ncols as u128);
    match header.symmetry {
        Symmetry::General => r * c,
        Symmetry::Symmetric => r * (r + 1) / 2,
        Symmetry::Skew => r * r.saturating_sub(1) / 2,
    }
}

/// Column-major values of an `array` from the values of its body (symmetric arrays store the
/// lower triangle).
fn place_array(vals: Vec<f64>, nrows: usize, ncols: usize, header: &Header) -> Vec<f64> {
    if header.symmetry == Symmetry::General {
        return vals;
    }
    let mut dense = vec![0.0; nrows * ncols];
    let mut it = vals.into_iter();
    for j in 0..ncols {
        let start = if header.symmetry == Symmetry::Symmetric {
            j
        } else {
            j + 1
        };
        for i in start..nrows {
            let v = it.next().expect("counted above");
            dense[j * nrows + i] = v;
            dense[i * nrows + j] = if header.symmetry == Symmetry::Skew {
                -v
            } else {
                v
            };
        }
    }
    dense
}

/// `path` opened for reading (`.gz` decompressed) after checking that it is a regular file: a
/// device (/dev/zero, /dev/urandom), a FIFO or a directory is refused at once, in one line.
fn open_stream(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    if path.extension().is_some_and(|e| e == "gz") {
        return crate::io::gz::open(path);
    }
    let f = crate::io::mmap::open_regular(path)?;
    Ok(Box::new(std::io::BufReader::with_capacity(1 << 20, f)))
}

/// What the data lines of a body hold.
#[derive(Clone, Copy)]
enum Body {
    /// The entries of a `coordinate` matrix.
    Coordinate {
        /// (rows, columns).
        shape: (usize, usize),
        field: Field,
        symmetry: Symmetry,
    },
    /// The values of an `array`, one per line.
    Array { field: Field },
}

/// Why a block's parsing stopped.
enum Stop {
    /// A data line's error (its line numbered within the block).
    Parse(Error),
    /// A line that is not UTF-8.
    Utf8,
}

/// A block of a body, parsed.
#[derive(Default)]
struct Block {
    /// Lines in the block (comments and blank lines too).
    lines: usize,
    /// Data lines read before any stop.
    data: usize,
    /// The entries (coordinate) or values (array) of the data lines.
    part: TripletPart,
    /// The first problem: its line (1-based, within the block), the data lines before it in
    /// the block, and what.
    stop: Option<(usize, usize, Stop)>,
}

/// Bytes of text per block (the reader rounds down to a whole line).
const BLOCK_BYTES: usize = 4 << 20;

#[cfg(test)]
thread_local! {
    /// Tests cut bodies into small blocks (0: [`BLOCK_BYTES`]).
    static TEST_BLOCK_BYTES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The block size of a body read on this thread.
fn block_bytes() -> usize {
    #[cfg(test)]
    {
        let b = TEST_BLOCK_BYTES.with(|b| b.get());
        if b > 0 {
            return b;
        }
    }
    BLOCK_BYTES
}

/// Parse one block of whole lines: comments and blank lines skipped, data lines parsed until
/// the first problem, each error at its line within the block.
fn parse_block(path: &Path, text: &[u8], body: Body) -> Block {
    let mut b = Block::default();
    let guess = text.len() / 16;
    match body {
        Body::Coordinate { .. } => {
            b.part.rows.reserve(guess);
            b.part.cols.reserve(guess);
            b.part.vals.reserve(guess);
        }
        Body::Array { .. } => b.part.vals.reserve(guess),
    }
    let mut rest = text;
    while !rest.is_empty() {
        // the common line (`i j v`) read where it stands, its end found on the way
        if let Body::Coordinate {
            shape,
            field,
            symmetry,
        } = body
        {
            if let Some(next) = scan_entry(rest, shape, field, symmetry, &mut b.part) {
                rest = &rest[next..];
                b.lines += 1;
                b.data += 1;
                continue;
            }
        }
        let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
        let line = &rest[..end];
        rest = &rest[(end + 1).min(rest.len())..];
        b.lines += 1;
        // (the fast path takes ASCII lines only: one with other bytes goes the plain way)
        if line.is_ascii() {
            match fast_line(line, body, &mut b.part) {
                Fast::Blank => continue,
                Fast::Data => {
                    b.data += 1;
                    continue;
                }
                Fast::Slow => {}
            }
        }
        let Ok(s) = std::str::from_utf8(line) else {
            b.stop = Some((b.lines, b.data, Stop::Utf8));
            return b;
        };
        let t = s.trim();
        if t.is_empty() || t.starts_with('%') {
            continue;
        }
        if let Err(e) = parse_data_line(path, b.lines, t, body, &mut b.part) {
            b.stop = Some((b.lines, b.data, Stop::Parse(e)));
            return b;
        }
        b.data += 1;
    }
    b
}

/// What [`fast_line`] made of a line.
enum Fast {
    /// Blank or a comment.
    Blank,
    /// A data line, parsed into the part.
    Data,
    /// Anything else (an error, or a form the fast path leaves alone): parse it the plain way.
    Slow,
}

/// Whitespace as `str::trim` and `split_whitespace` see it, for ASCII bytes.
#[inline(always)]
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The decimal digits of `t` from `at` (no sign) as a number (wrapping past 19 digits) and
/// where they end.
#[inline(always)]
fn leading_digits(t: &[u8], mut at: usize) -> (u64, usize) {
    let mut v = 0u64;
    while let Some(&c) = t.get(at) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        v = v.wrapping_mul(10).wrapping_add(d as u64);
        at += 1;
    }
    (v, at)
}

/// 1 to 19 decimal digits (no sign) as a number; anything else is left to `str::parse`.
#[inline(always)]
fn digits(t: &[u8]) -> Option<u64> {
    let (v, end) = leading_digits(t, 0);
    (end == t.len() && (1..=19).contains(&end)).then_some(v)
}

/// `digits` from `at` ending at a space or tab (or, where `last`, at the line's end): the number
/// and where the digits end (1 to 19 digits, no sign); None otherwise.
#[inline(always)]
fn scan_digits(t: &[u8], start: usize, last: bool) -> Option<(u64, usize)> {
    let (v, at) = leading_digits(t, start);
    let n = at - start;
    let ends = match t.get(at) {
        Some(b' ' | b'\t') => true,
        Some(b'\r' | b'\n') | None => last,
        Some(_) => false,
    };
    (n > 0 && n <= 19 && ends).then_some((v, at))
}

/// Past spaces and tabs from `at`.
#[inline(always)]
fn skip_blanks(t: &[u8], mut at: usize) -> usize {
    while matches!(t.get(at), Some(b' ' | b'\t')) {
        at += 1;
    }
    at
}

/// A `coordinate` data line at the start of `t` in its common form (blanks, `i`, blanks, `j`,
/// blanks, the value unless `pattern`, blanks, an optional `\r`, then `\n` or the end): the entry
/// pushed as [`fast_line`] pushes it, and where the next line starts. None for anything else
/// (a comment, a blank line, an error, other bytes): [`fast_line`] and the plain parse decide
/// those. One pass over the line's bytes, without looking for its end first.
#[inline(always)]
fn scan_entry(
    t: &[u8],
    shape: (usize, usize),
    field: Field,
    symmetry: Symmetry,
    part: &mut TripletPart,
) -> Option<usize> {
    let at = skip_blanks(t, 0);
    let (i, at) = scan_digits(t, at, false)?;
    let (j, at) = scan_digits(t, skip_blanks(t, at), field == Field::Pattern)?;
    if i == 0 || i as usize > shape.0 || j == 0 || j as usize > shape.1 {
        return None;
    }
    if i == j && symmetry == Symmetry::Skew {
        return None;
    }
    let mut at = skip_blanks(t, at);
    let v = if field == Field::Pattern {
        1.0
    } else {
        let s = at;
        while let Some(&c) = t.get(at) {
            if matches!(c, b' ' | b'\t' | b'\r' | b'\n') || !c.is_ascii() {
                break;
            }
            at += 1;
        }
        value_of(&t[s..at], field)?
    };
    let mut at = skip_blanks(t, at);
    if t.get(at) == Some(&b'\r') {
        at += 1;
    }
    let next = match t.get(at) {
        None => at,
        Some(b'\n') => at + 1,
        Some(_) => return None,
    };
    push_entry(part, (i, j), v, symmetry);
    Some(next)
}

/// A value token of an ASCII line as [`fast_line`] reads it: finite, or None (left to the plain
/// parse, which says what is wrong; Fortran's `d` exponent goes that way too). `t` must be all
/// ASCII (both callers check it).
#[inline(always)]
fn value_of(t: &[u8], field: Field) -> Option<f64> {
    debug_assert!(t.is_ascii());
    if t.is_empty() {
        return None;
    }
    // SAFETY: `t` is all ASCII (the callers' contract: scan_entry stops a token at the first
    // byte that is not, fast_line takes ASCII lines only), so it is UTF-8.
    let s = unsafe { std::str::from_utf8_unchecked(t) };
    let v = match field {
        Field::Pattern => 1.0,
        Field::Integer => s.parse::<i64>().ok()? as f64,
        Field::Real => {
            if t.iter().any(|&c| c | 0x20 == b'd') {
                return None;
            }
            s.parse::<f64>().ok()?
        }
    };
    v.is_finite().then_some(v)
}

/// An ASCII line the common way (blank, a comment, or a well-formed data line), the same
/// values the plain parse gives; [`Fast::Slow`] for anything else (every error included).
/// `line` must be all ASCII.
#[inline]
fn fast_line(line: &[u8], body: Body, part: &mut TripletPart) -> Fast {
    let mut toks: [&[u8]; 4] = [&[]; 4];
    let mut n = 0;
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i == line.len() {
            break;
        }
        if n == 0 && line[i] == b'%' {
            return Fast::Blank;
        }
        let s = i;
        while i < line.len() && !is_space(line[i]) {
            i += 1;
        }
        if n == 4 {
            return Fast::Slow;
        }
        toks[n] = &line[s..i];
        n += 1;
    }
    if n == 0 {
        return Fast::Blank;
    }
    match body {
        Body::Coordinate {
            shape,
            field,
            symmetry,
        } => {
            let want = if field == Field::Pattern { 2 } else { 3 };
            if n != want {
                return Fast::Slow;
            }
            let (Some(i), Some(j)) = (digits(toks[0]), digits(toks[1])) else {
                return Fast::Slow;
            };
            if i == 0 || i as usize > shape.0 || j == 0 || j as usize > shape.1 {
                return Fast::Slow;
            }
            let Some(v) = value_of(toks[2], field) else {
                return Fast::Slow;
            };
            if i == j && symmetry == Symmetry::Skew {
                return Fast::Slow;
            }
            push_entry(part, (i, j), v, symmetry);
        }
        Body::Array { field } => {
            if n != 1 {
                return Fast::Slow;
            }
            let Some(v) = value_of(toks[0], field) else {
                return Fast::Slow;
            };
            part.vals.push(v);
        }
    }
    Fast::Data
}

/// Entry (i, j) = v of a file (1-based), and its mirror (j, i) in a symmetric or skew-symmetric
/// one (off the diagonal; the callers refuse a skew-symmetric diagonal entry).
fn push_entry(part: &mut TripletPart, (i, j): (u64, u64), v: f64, symmetry: Symmetry) {
    let mirror = match symmetry {
        _ if i == j => None,
        Symmetry::General => None,
        Symmetry::Symmetric => Some(v),
        Symmetry::Skew => Some(-v),
    };
    part.rows.push((i - 1) as u32);
    part.cols.push((j - 1) as u32);
    part.vals.push(v);
    if let Some(v) = mirror {
        part.rows.push((j - 1) as u32);
        part.cols.push((i - 1) as u32);
        part.vals.push(v);
    }
}

/// One data line (`ln` its number, `t` trimmed) into `part`.
fn parse_data_line(
    path: &Path,
    ln: usize,
    t: &str,
    body: Body,
    part: &mut TripletPart,
) -> Result<()> {
    match body {
        Body::Coordinate {
            shape: (nrows, ncols),
            field,
            symmetry,
        } => {
            let (i, j, v) = parse_entry(path, ln, t, nrows, ncols, field)?;
            if symmetry == Symmetry::Skew && i == j {
                return Err(Error::parse(
                    path,
                    ln,
                    "a skew-symmetric matrix has no diagonal entries",
                ));
            }
            push_entry(part, (i, j), v, symmetry);
        }
        Body::Array { field } => {
            let mut it = t.split_whitespace();
            let v = parse_value(path, ln, it.next(), field)?;
            if it.next().is_some() {
                return Err(Error::parse(path, ln, "line has extra fields"));
            }
            part.vals.push(v);
        }
    }
    Ok(())
}

/// A parse error found at `line` of a block, at its line in the file (`base`: the lines
/// before the block).
fn rebase(e: Error, base: usize) -> Error {
    match e {
        Error::Parse { path, line, msg } => Error::Parse {
            path,
            line: line + base,
            msg,
        },
        other => other,
    }
}

/// Read the body of `m` (everything after its size line: `count` data lines, `what` they
/// are) in blocks parsed in parallel as they are read (module docs). Returns each block's
/// part, in file order, or the first problem in file order as a sequential reader would meet
/// it.
fn read_body(
    path: &Path,
    m: Opened,
    body: Body,
    count: usize,
    what: &str,
) -> Result<Vec<TripletPart>> {
    let size_line = m.size_line;
    let (blocks, read_err) = if plain_len(path).is_some() {
        // a plain file: its body parsed in blocks straight from a map, all at once
        let map = crate::io::mmap::MappedFile::open_populated(path)?;
        let text = map.bytes().get(m.lines.consumed as usize..).unwrap_or(&[]);
        (parse_mapped(path, text, body, block_bytes()), None)
    } else {
        read_blocks(path, m.lines.inner, body, block_bytes())
    };
    let (mut line_base, mut data_base) = (size_line, 0usize);
    let more = |path: &Path| -> Error {
        Error::parse(
            path,
            nth_data_line(path, count).unwrap_or(0),
            format!("more {what} than the {count} the size line declares"),
        )
    };
    let mut parts = Vec::with_capacity(blocks.len());
    for b in blocks {
        if let Some((_, before, stop)) = b.stop {
            // A sequential reader reads data lines 0..count and then looks for one more: a
            // problem past that line is never met, the line one too many is.
            let g = data_base + before;
            return Err(match stop {
                Stop::Parse(_) if g >= count => more(path),
                Stop::Utf8 if g > count => more(path),
                Stop::Parse(e) => rebase(e, line_base),
                Stop::Utf8 => Error::io(
                    path,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "stream did not contain valid UTF-8",
                    ),
                ),
            });
        }
        if data_base + b.data > count {
            return Err(more(path));
        }
        line_base += b.lines;
        data_base += b.data;
        parts.push(b.part);
    }
    if let Some(e) = read_err {
        return Err(e);
    }
    if data_base < count {
        return Err(Error::parse(
            path,
            line_base,
            format!("file ends after {data_base} of {count} {what} (truncated?)"),
        ));
    }
    Ok(parts)
}

/// The line number of data line `n` (0-based) of the body of `path`, read again sequentially
/// (for the error of a body with more data lines than declared).
fn nth_data_line(path: &Path, n: usize) -> Result<usize> {
    let mut m = Opened::open(path)?;
    for _ in 0..n {
        m.lines.next_line()?;
    }
    let at = m.lines.next_line()?.map(|(ln, _)| ln);
    Ok(at.unwrap_or(m.lines.lineno))
}

/// The blocks of whole lines of about `block` bytes of a body held in memory (`text`, a map of
/// the file after its size line), parsed on the pool, in file order: what [`read_blocks`] makes
/// of the same bytes, without a reading thread copying them first.
fn parse_mapped(path: &Path, text: &[u8], body: Body, block: usize) -> Vec<Block> {
    use rayon::prelude::*;
    let mut cuts = vec![0usize];
    let mut at = 0;
    while at < text.len() {
        let nominal = at + block.max(1);
        let end = if nominal >= text.len() {
            text.len()
        } else {
            memchr::memchr(b'\n', &text[nominal..]).map_or(text.len(), |i| nominal + i + 1)
        };
        cuts.push(end);
        at = end;
    }
    // (read_body stops at the first block that stopped: the ones after it are never looked at)
    cuts.par_windows(2)
        .map(|w| parse_block(path, &text[w[0]..w[1]], body))
        .collect()
}

/// Blocks of whole lines from `reader`, parsed on the pool as they come (one reading thread
/// fills them; buffers are reused), in file order; with the read error that ended the input,
/// if one did (the whole lines before it are in the blocks).
fn read_blocks(
    path: &Path,
    reader: Box<dyn BufRead + Send>,
    body: Body,
    block: usize,
) -> (Vec<Block>, Option<Error>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    let nbuf = rayon::current_num_threads() + 2;
    let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
    for _ in 0..nbuf {
        free_tx.send(Vec::new()).expect("the receiver is here");
    }
    let (full_tx, full_rx) = mpsc::sync_channel::<(usize, Vec<u8>)>(nbuf);
    let (done_tx, done_rx) = mpsc::channel::<(usize, Block)>();
    // set when a block stops: what follows it is never reported
    let stopped = AtomicBool::new(false);
    let stopped = &stopped;
    // Everything the reading thread may wait on moves into the scope and is dropped when it
    // ends (a parse that panicked included), so the join never waits for ever.
    let read_err = std::thread::scope(move |ts| {
        let producer = ts.spawn(move || -> Option<Error> {
            let mut reader = reader;
            let mut carry: Vec<u8> = Vec::new();
            for idx in 0.. {
                let Ok(mut buf) = free_rx.recv() else {
                    return None;
                };
                if stopped.load(Ordering::Relaxed) {
                    return None;
                }
                buf.clear();
                buf.append(&mut carry);
                // whole lines of about BLOCK_BYTES: read on past a line longer than that
                let (eof, err) = loop {
                    let want = block.saturating_sub(buf.len()).max(block.min(64 << 10));
                    let before = buf.len();
                    let r = (&mut reader).take(want as u64).read_to_end(&mut buf);
                    match r {
                        Err(e) => break (true, Some(Error::io(path, e))),
                        Ok(0) => break (true, None),
                        Ok(_) if buf.len() < block => continue,
                        Ok(_) => {
                            if buf[before..].contains(&b'\n') {
                                break (false, None);
                            }
                        }
                    }
                };
                if !eof || err.is_some() {
                    // keep the partial last line for the next block (after an error: drop it)
                    let cut = buf.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
                    if err.is_none() {
                        carry.extend_from_slice(&buf[cut..]);
                    }
                    buf.truncate(cut);
                }
                if !buf.is_empty() && full_tx.send((idx, buf)).is_err() {
                    return err;
                }
                if eof {
                    return err;
                }
            }
            None
        });
        rayon::in_place_scope(|s| {
            for (idx, buf) in full_rx.iter() {
                let (free, done) = (free_tx.clone(), done_tx.clone());
                s.spawn(move |_| {
                    let b = parse_block(path, &buf, body);
                    if b.stop.is_some() {
                        stopped.store(true, Ordering::Relaxed);
                    }
                    let _ = done.send((idx, b));
                    let _ = free.send(buf);
                });
            }
        });
        producer
            .join()
            .unwrap_or_else(|_| Some(Error::format(path, "the reading thread panicked")))
    });
    let mut blocks: Vec<(usize, Block)> = done_rx.iter().collect();
    blocks.sort_unstable_by_key(|(i, _)| *i);
    // blocks after a gap (the reader stopped early) are never reported
    let blocks = blocks
        .into_iter()
        .enumerate()
        .take_while(|(k, (i, _))| k == i)
        .map(|(_, (_, b))| b)
        .collect();
    (blocks, read_err)
}

/// Read a vector: a Matrix Market file (an `array` with one column or one row, or a
/// `coordinate` n x 1 / 1 x n matrix), or a plain text file with one value per line
/// (`#` starts a comment). Which one is decided by the content: a file whose first line is a
/// Matrix Market header (`%%MatrixMarket ...`, whatever the file is called) or one named
/// `.mtx` / `.mtx.gz` is read as Matrix Market.
pub fn read_vector(path: impl AsRef<Path>) -> Result<Vec<f64>> {
    let path = path.as_ref();
    let name = path.to_string_lossy();
    let mut r = open_stream(path)?;
    let head = r.fill_buf().map_err(|e| Error::io(path, e))?;
    let start = head
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(head.len());
    let banner = b"%%matrixmarket";
    let has_banner = head.len() >= start + banner.len()
        && head[start..start + banner.len()].eq_ignore_ascii_case(banner);
    if has_banner || name.ends_with(".mtx") || name.ends_with(".mtx.gz") {
        drop(r);
        let m = Opened::open(path)?;
        let (nrows, ncols) = (m.nrows, m.ncols);
        if nrows != 1 && ncols != 1 {
            return Err(Error::parse(
                path,
                m.size_line,
                format!("a vector must have one row or one column, not {nrows} x {ncols}"),
            ));
        }
        return match m.header.layout {
            Layout::Array => m.array_body(path),
            Layout::Coordinate => {
                drop(m);
                let a = read_matrix(path)?;
                let v = if a.ncols() == 1 { a.transpose() } else { a };
                crate::io::limits::check_alloc(
                    path,
                    &format!("a vector of {} values", v.ncols()),
                    8 * v.ncols() as u128,
                )?;
                let mut out = vec![0.0; v.ncols()];
                let (c, x) = v.row(0);
                for (&j, &val) in c.iter().zip(x) {
                    out[j as usize] = val;
                }
                Ok(out)
            }
        };
    }
    let mut out = Vec::new();
    for (k, line) in r.lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        let t = line.split('#').next().unwrap_or("").trim();
        if t.is_empty() {
            continue;
        }
        let mut toks = t.split_whitespace();
        let v = parse_value(path, k + 1, toks.next(), Field::Real)?;
        if toks.next().is_some() {
            return Err(Error::parse(path, k + 1, "expected one value per line"));
        }
        out.push(v);
    }
    Ok(out)
}

/// Write a CSR matrix as `coordinate real general` (values in shortest round-trip form).
/// `.gz` paths are compressed in parallel, as members of one gzip stream that readers decode in
/// parallel too (`io::gz`).
/// The file appears only when complete.
pub fn write_matrix(path: impl AsRef<Path>, a: &Csr, comment: &str) -> Result<()> {
    let path = path.as_ref();
    if path.extension().is_none_or(|e| e != "gz") {
        return crate::io::write_atomic(path, |w| write_matrix_to(w, a, comment));
    }
    // Each block of rows formatted and compressed on its own thread as one member, written as
    // it is (a stream through `io::gz::Members` would copy the text once more).
    crate::io::write_atomic_as(path, false, |w| {
        w.write_all(&crate::io::gz::member(&matrix_head(a, comment))?)?;
        for_text_blocks(a, |blocks| {
            let packed: Vec<std::io::Result<Vec<u8>>> = blocks
                .par_iter()
                .map(|t| crate::io::gz::member(t))
                .collect();
            for p in packed {
                w.write_all(&p?)?;
            }
            Ok(())
        })
    })
}

/// [`write_matrix`] into `w` (blocks of rows formatted in parallel, written in order).
pub fn write_matrix_to(w: &mut dyn std::io::Write, a: &Csr, comment: &str) -> std::io::Result<()> {
    w.write_all(&matrix_head(a, comment))?;
    for_text_blocks(a, |blocks| {
        for t in blocks {
            w.write_all(t)?;
        }
        Ok(())
    })
}

/// The header, comment lines and size line of a `coordinate real general` file of `a`.
fn matrix_head(a: &Csr, comment: &str) -> Vec<u8> {
    let mut h = Vec::new();
    let _ = writeln!(h, "%%MatrixMarket matrix coordinate real general");
    for line in comment.lines() {
        let _ = writeln!(h, "%{line}");
    }
    let _ = writeln!(h, "{} {} {}", a.nrows(), a.ncols(), a.nnz());
    h
}

/// Rows per text block of a written matrix: about 1 MB of text.
const WRITE_BLOCK_ENTRIES: u64 = 40_000;

/// The entry lines of `a`, as text blocks of whole rows formatted in parallel, handed to
/// `each` a few per thread at a time, in order (the text of the whole matrix is never held).
fn for_text_blocks(
    a: &Csr,
    mut each: impl FnMut(&[Vec<u8>]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let ip = a.indptr();
    let parts = (a.nnz() as u64 / WRITE_BLOCK_ENTRIES).max(1) as usize;
    let bounds = par::row_blocks(ip, parts);
    let wave = 2 * rayon::current_num_threads();
    for group in bounds.windows(2).collect::<Vec<_>>().chunks(wave) {
        let blocks: Vec<Vec<u8>> = group
            .par_iter()
            .map(|w| {
                let mut t = Vec::with_capacity((ip[w[1]] - ip[w[0]]) as usize * 28);
                for i in w[0]..w[1] {
                    let (c, v) = a.row(i);
                    for (&j, &x) in c.iter().zip(v) {
                        let _ = writeln!(t, "{} {} {:e}", i + 1, j + 1, x);
                    }
                }
                t
            })
            .collect();
        each(&blocks)?;
    }
    Ok(())
}

/// Write a dense vector as a Matrix Market `array real general` (n x 1).
pub fn write_vector_mtx(path: impl AsRef<Path>, x: &[f64]) -> Result<()> {
    crate::io::write_atomic(path.as_ref(), |w| write_vector_mtx_to(w, x))
}

/// [`write_vector_mtx`] into `w`.
pub fn write_vector_mtx_to(w: &mut dyn std::io::Write, x: &[f64]) -> std::io::Result<()> {
    writeln!(w, "%%MatrixMarket matrix array real general")?;
    writeln!(w, "{} 1", x.len())?;
    for v in x {
        writeln!(w, "{v:e}")?;
    }
    Ok(())
}

/// What a Matrix Market system has besides A: [A; w R] x = [b; 0] (b = A 1 when no rhs).
#[derive(Debug, Clone, Copy)]
pub struct MtxParts<'a> {
    pub rhs: Option<&'a Path>,
    pub reg: Option<&'a Path>,
    pub reg_weight: f64,
}

impl MtxParts<'_> {
    /// [`load_system`] with A from `matrix`.
    pub fn load(&self, matrix: &Path) -> Result<System> {
        load_system(matrix, self.rhs, self.reg, self.reg_weight)
    }
}

/// Refuse a system matrix with no rows or no columns (0 x 0, m x 0, 0 x n): there is nothing
/// to solve, and a solver would report a meaningless "solution" of length 0.
pub fn refuse_empty(path: &Path, a: &Csr) -> Result<()> {
    if a.nrows() == 0 || a.ncols() == 0 {
        return Err(Error::format(
            path,
            format!(
                "the matrix is {} x {}: a system needs at least one row and one column",
                a.nrows(),
                a.ncols()
            ),
        ));
    }
    Ok(())
}

/// Load [A; w R], [b; 0] from Matrix Market / text files.
pub fn load_system(
    matrix: &Path,
    rhs: Option<&Path>,
    reg: Option<&Path>,
    reg_weight: f64,
) -> Result<System> {
    let a = read_matrix(matrix)?;
    refuse_empty(matrix, &a)?;
    // A file that does not fit the matrix: the error names both.
    let unfit = |p: &Path, got: String, has: String| {
        Error::format(
            p,
            format!("{got} but the matrix {} has {has}", matrix.display()),
        )
    };
    let b = match rhs {
        Some(p) => {
            let b = read_vector(p)?;
            if b.len() != a.nrows() {
                let (got, has) = (format!("{} values", b.len()), format!("{} rows", a.nrows()));
                return Err(unfit(p, got, has));
            }
            b
        }
        None => a.matvec(&vec![1.0; a.ncols()]),
    };
    let kernel_rows = a.nrows();
    match reg {
        None => Ok(System { a, b, kernel_rows }),
        Some(p) => {
            let r = read_matrix(p)?;
            if r.ncols() != a.ncols() {
                let (got, has) = (format!("{} columns", r.ncols()), a.ncols().to_string());
                return Err(unfit(p, got, has));
            }
            let mut b = b;
            b.resize(a.nrows() + r.nrows(), 0.0);
            let a = a
                .vstack_scaled(&r, reg_weight)
                .map_err(|e| Error::in_file(p, e))?;
            Ok(System { a, b, kernel_rows })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str, text: &str) -> std::path::PathBuf {
        let p = crate::io::test_dir("mtx").join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn reads_general_symmetric_pattern_and_sums_duplicates() {
        let p = tmp("g.mtx", "%%MatrixMarket matrix coordinate real general\n% c\n2 3 3\n1 1 1.5\n2 3 -2e0\n1 1 0.5\n");
        let a = read_matrix(&p).unwrap();
        assert_eq!(a.nnz(), 2);
        assert_eq!(a.matvec(&[1., 1., 1.]), vec![2.0, -2.0]);
        let p = tmp(
            "s.mtx",
            "%%MatrixMarket matrix coordinate integer symmetric\n2 2 2\n1 1 3\n2 1 4\n",
        );
        assert_eq!(read_matrix(&p).unwrap().matvec(&[1., 1.]), vec![7.0, 4.0]);
        let p = tmp(
            "p.mtx",
            "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n2 1\n",
        );
        assert_eq!(read_matrix(&p).unwrap().matvec(&[1., 1.]), vec![0.0, 1.0]);
        let p = tmp(
            "k.mtx",
            "%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n2 1 4\n",
        );
        assert_eq!(read_matrix(&p).unwrap().matvec(&[1., 1.]), vec![-4.0, 4.0]);
    }

    #[test]
    fn rejects_bad_files_with_line_numbers() {
        let cases = [
            (
                "c.mtx",
                "%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n",
                ":1:",
            ),
            (
                "h.mtx",
                "%%MatrixMarket tensor coordinate real general\n1 1 1\n1 1 1\n",
                ":1:",
            ),
            (
                "t.mtx",
                "%%MatrixMarket matrix coordinate real general\n2 2 3\n1 1 1\n2 2 1\n",
                "truncated",
            ),
            (
                "o.mtx",
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n3 1 1\n",
                ":3:",
            ),
            (
                "z.mtx",
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n0 1 1\n",
                ":3:",
            ),
            (
                "n.mtx",
                "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n2 2 nan\n",
                ":4:",
            ),
            (
                "b.mtx",
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 x 1\n",
                ":3:",
            ),
            (
                "x.mtx",
                "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 1\n2 2 2\n",
                ":4:",
            ),
        ];
        for (name, text, want) in cases {
            let p = tmp(name, text);
            let e = read_matrix(&p).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(want), "{name}: {e}");
        }
    }

    #[test]
    fn vectors_and_round_trip() {
        let p = tmp("v.txt", "# header\n1.0\n\n2e-3 # note\n");
        assert_eq!(read_vector(&p).unwrap(), vec![1.0, 2e-3]);
        let p = tmp("bad.txt", "1.0\ninf\n");
        assert!(read_vector(&p)
            .unwrap_err()
            .to_string()
            .contains("bad.txt:2:"));
        let a =
            Csr::from_triplets(3, 2, &[0, 2, 1], &[1, 0, 1], &[0.1, 1.0 / 3.0, -7e-300]).unwrap();
        for name in ["rt.mtx", "rt.mtx.gz"] {
            let p = crate::io::test_dir("mtx").join(name);
            write_matrix(&p, &a, "test").unwrap();
            assert_eq!(read_matrix(&p).unwrap(), a);
        }
        let p = crate::io::test_dir("mtx").join("vv.mtx");
        write_vector_mtx(&p, &[1.0 / 3.0, 2.0]).unwrap();
        assert_eq!(read_vector(&p).unwrap(), vec![1.0 / 3.0, 2.0]);
    }

    /// The reader as it was before blocks (lines one by one, then `Csr::from_triplets`): the
    /// reference the parallel reader must equal, errors included.
    fn sequential(path: &Path) -> Result<Csr> {
        let mut m = Opened::open(path)?;
        let (nrows, ncols, header) = (m.nrows, m.ncols, m.header);
        assert_eq!(header.layout, Layout::Coordinate);
        let nnz: usize = parse_num(path, m.size_line, m.rest.first().map(String::as_str), "")?;
        let min_line = if header.field == Field::Pattern { 4 } else { 6 };
        m.check_declared(path, nnz as u128, min_line, "entries")?;
        let (mut rows, mut cols, mut vals) = (vec![], vec![], vec![]);
        for k in 0..nnz {
            let Some((ln, l)) = m.lines.next_line()? else {
                return Err(Error::parse(
                    path,
                    m.lines.lineno,
                    format!("file ends after {k} of {nnz} entries (truncated?)"),
                ));
            };
            let mut part = TripletPart::default();
            let body = Body::Coordinate {
                shape: (nrows, ncols),
                field: header.field,
                symmetry: header.symmetry,
            };
            parse_data_line(path, ln, l, body, &mut part)?;
            rows.extend(part.rows.iter().map(|&r| r as u64));
            cols.extend(part.cols.iter().map(|&c| c as u64));
            vals.extend(part.vals);
        }
        if let Some((ln, _)) = m.lines.next_line()? {
            return Err(Error::parse(
                path,
                ln,
                format!("more entries than the {nnz} the size line declares"),
            ));
        }
        Ok(Csr::from_triplets(nrows, ncols, &rows, &cols, &vals).unwrap())
    }

    /// `p` gzipped beside it (`p` + ".gz"); its path.
    fn gz_copy(p: &Path) -> std::path::PathBuf {
        use std::io::Write;
        let gz = std::path::PathBuf::from(format!("{}.gz", p.display()));
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&std::fs::read(p).unwrap()).unwrap();
        std::fs::write(&gz, e.finish().unwrap()).unwrap();
        gz
    }

    /// `p` gzipped as seistomo writes it, in members of `bytes` bytes of text (lines cut across
    /// them), beside it; its path. Read back through the members decoded in parallel.
    fn gz_members(p: &Path, bytes: usize) -> std::path::PathBuf {
        use std::io::Write;
        let gz = std::path::PathBuf::from(format!("{}.{bytes}.gz", p.display()));
        let mut w = crate::io::gz::Members::with_member_text(Vec::new(), bytes);
        w.write_all(&std::fs::read(p).unwrap()).unwrap();
        std::fs::write(&gz, w.finish().unwrap()).unwrap();
        gz
    }

    /// Read `p` in blocks of `bytes` bytes.
    fn in_blocks(p: &Path, bytes: usize) -> Result<Csr> {
        TEST_BLOCK_BYTES.with(|b| b.set(bytes));
        let r = read_matrix(p);
        TEST_BLOCK_BYTES.with(|b| b.set(0));
        r
    }

    /// A coordinate file of random entries in `order` (0 row-major, 1 column-major, 2 any,
    /// with repeats), comments, blank lines and CRLF ends here and there.
    fn random_text(seed: u64, head: &str, n: usize, order: u32) -> String {
        let mut rng = crate::grid::Rng::new(seed);
        let mut e: Vec<(u64, u64)> = (0..400)
            .map(|_| (1 + rng.below(n as u64), 1 + rng.below(n as u64)))
            .collect();
        if head.contains("symmetric") {
            e.retain(|&(i, j)| i > j || (i == j && !head.contains("skew")));
        }
        match order {
            0 => {
                e.sort_unstable();
                e.dedup();
            }
            1 => {
                e.sort_unstable_by_key(|&(i, j)| (j, i));
                e.dedup();
            }
            _ => {}
        }
        let mut t = format!(
            "%%MatrixMarket matrix coordinate {head}\n% made up\n{n} {n} {}\n",
            e.len()
        );
        for (k, (i, j)) in e.iter().enumerate() {
            let v = match head.split(' ').next() {
                Some("pattern") => String::new(),
                Some("integer") => format!(" {}", rng.below(21) as i64 - 10),
                _ => format!(" {:e}", rng.uniform() * 2.0 - 1.0),
            };
            // separators and padding of every kind the readers take
            match k % 11 {
                2 => t.push_str(&format!("  {i}\t{j}{}", v.replace(' ', "\t "))),
                4 => t.push_str(&format!("{i}  {j}{v} \t")),
                6 => t.push_str(&format!("\t{i} {j}{v}\x0b")),
                8 => t.push_str(&format!("{i:03} {j}{v}")),
                _ => t.push_str(&format!("{i} {j}{v}")),
            }
            t.push_str(match k % 37 {
                3 => "\r\n",
                5 => "\n% a comment\n",
                7 => "\n\n   \n",
                _ => "\n",
            });
        }
        t
    }

    #[test]
    fn blocks_read_what_the_sequential_reader_reads() {
        let heads = [
            "real general",
            "integer general",
            "pattern general",
            "real symmetric",
            "real skew-symmetric",
        ];
        for (h, head) in heads.iter().enumerate() {
            for order in 0..3 {
                let text = random_text(h as u64 * 10 + order as u64, head, 50, order);
                let p = tmp(&format!("rb{h}{order}.mtx"), &text);
                let want = sequential(&p).unwrap();
                // the plain file from its map, the gzip ones through the reading thread (one
                // stream; members decoded in parallel)
                for p in [
                    p.clone(),
                    gz_copy(&p),
                    gz_members(&p, 5),
                    gz_members(&p, 700),
                ] {
                    for bytes in [7, 64, 1000, 0] {
                        assert_eq!(in_blocks(&p, bytes).unwrap(), want, "{head} order {order}");
                    }
                }
            }
        }
    }

    #[test]
    fn blocks_report_the_sequential_readers_errors() {
        let h = "%%MatrixMarket matrix coordinate real general\n% c\n3 3 4\n";
        let bodies = [
            "1 1 1\n2 2 2\n3 3 3\n1 2 4\n",
            "1 1 1\n2 2 2\n3 3 3\n1 2 4\n2 1 5\n",
            "1 1 1\n2 2 2\n3 3 3\n1 2 4\n% c\n\n2 1 x\n",
            "1 1 1\n2 2 2\n3 3 3\n1 2 4\n\u{ff}\u{fe}\n",
            "1 1 1\n2 2 2\n3 3 3\n",
            "1 1 1\n2 2 2\n% c\n",
            "1 1 1\n2 x 2\n3 3 3\n1 2 4\n",
            "1 1 1\n\u{c3}\x28\n3 3 3\n1 2 4\n",
            "1 1 1\n2 2 inf\n3 3 3\n4 4 4\n",
            "1 1 1\n2 2 2 2\n3 3 3\n1 2 4\n",
            "1 1 1\n2 2 2\n3 3 3\n1 2 4\n\n\n\n7 7 7 7\n",
            "1 1 1\n2 2 2\n3 3 3\n1 2 4",
            "1 1 1\n2 2 2\n+3 3 3\n1 2 1.5D+03\n",
            "1 1 1\n2 2 2\n3 3 3 \x0c\n1 2 +4e0\r\n",
            "1 1 1\n2 2 2\n3 3 nan\n1 2 4\n",
            "1 1 1\n2 2 2\n00000000000000000003 3 3\n1 2 4\n",
            "1 1 1\n2 2 2\n3 3 3\r\r\n1 2 4\n",
            "1 1 1\n2 2 2\n3\t3\t-3.\n1 2 .5\n",
            "1 1 1\n2 2 2\n3 4 3\n1 2 4\n",
            "1 1 1\n0 2 2\n3 3 3\n1 2 4\n",
            "1 1 1\n2 2 2\n3 3 3 \t \r\n1\t2\t4",
        ];
        for (k, body) in bodies.iter().enumerate() {
            let p = crate::io::test_dir("mtx").join(format!("e{k}.mtx"));
            let mut bytes = h.as_bytes().to_vec();
            bytes.extend(body.chars().map(|c| c as u32 as u8));
            std::fs::write(&p, &bytes).unwrap();
            for p in [p.clone(), gz_copy(&p), gz_members(&p, 6)] {
                let want = sequential(&p).map_err(|e| e.to_string());
                for b in [3, 8, 20, 0] {
                    let got = in_blocks(&p, b).map_err(|e| e.to_string());
                    assert_eq!(got, want, "body {k}, blocks of {b}, {}", p.display());
                }
            }
        }
    }

    #[test]
    fn refuses_non_files_values_on_pattern_lines_and_empty_systems() {
        for dev in ["/dev/zero", "/dev/urandom"] {
            if Path::new(dev).exists() {
                let t = std::time::Instant::now();
                let e = read_matrix(dev).unwrap_err().to_string();
                assert!(e.contains("not a regular file") && !e.contains('\n'), "{e}");
                assert!(read_vector(dev).is_err());
                assert!(t.elapsed().as_secs_f64() < 1.0);
            }
        }
        let d = crate::io::test_dir("mtx");
        assert!(read_matrix(&d)
            .unwrap_err()
            .to_string()
            .contains("directory"));
        let p = tmp(
            "pv.mtx",
            "%%MatrixMarket matrix coordinate pattern general\n2 2 2\n1 1\n2 2 3.5\n",
        );
        let e = read_matrix(&p).unwrap_err().to_string();
        assert!(e.contains("pv.mtx:4:") && e.contains("pattern"), "{e}");
        for (name, size) in [
            ("z00.mtx", "0 0 0"),
            ("z30.mtx", "3 0 0"),
            ("z03.mtx", "0 3 0"),
        ] {
            let p = tmp(
                name,
                &format!("%%MatrixMarket matrix coordinate real general\n{size}\n"),
            );
            let e = load_system(&p, None, None, 1.0).unwrap_err().to_string();
            assert!(
                e.contains(name) && e.contains("at least one row and one column"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_vector_is_matrix_market_by_its_header_whatever_its_name() {
        let text = "%%MatrixMarket matrix array real general\n% rhs\n3 1\n1\n2.5\n-3\n";
        for name in ["v.mtx", "b.txt"] {
            assert_eq!(read_vector(tmp(name, text)).unwrap(), vec![1.0, 2.5, -3.0]);
        }
        let p = crate::io::test_dir("mtx").join("bz.txt.gz");
        write_vector_mtx(&p, &[4.0, 5.0]).unwrap();
        assert_eq!(read_vector(&p).unwrap(), vec![4.0, 5.0]);
        let p = tmp("plain.txt", "1\n2\n");
        assert_eq!(read_vector(&p).unwrap(), vec![1.0, 2.0]);
    }

    #[test]
    fn written_text_is_the_sequential_format_and_gz_members_read_back() {
        let a = crate::testproblems::awkward_csr(3000, 500, 4);
        let mut par = Vec::new();
        write_matrix_to(&mut par, &a, "c").unwrap();
        let mut seq = String::from("%%MatrixMarket matrix coordinate real general\n%c\n");
        seq.push_str(&format!("{} {} {}\n", a.nrows(), a.ncols(), a.nnz()));
        for i in 0..a.nrows() {
            let (c, v) = a.row(i);
            for (&j, &x) in c.iter().zip(v) {
                seq.push_str(&format!("{} {} {:e}\n", i + 1, j + 1, x));
            }
        }
        assert_eq!(String::from_utf8(par).unwrap(), seq);
        let p = crate::io::test_dir("mtx").join("members.mtx.gz");
        write_matrix(&p, &a, "c").unwrap();
        // members that say their lengths (io::gz), read back in parallel
        assert_eq!(&std::fs::read(&p).unwrap()[12..14], b"SM");
        assert_eq!(read_matrix(&p).unwrap(), a);
        let mut text = String::new();
        flate2::read::MultiGzDecoder::new(std::fs::File::open(&p).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, seq);
    }
}
