//! Matrix Market reader and writer: `coordinate` (real, integer, pattern; general, symmetric,
//! skew-symmetric) into CSR with duplicates summed, `array` (dense) vectors, `.gz` transparently.
//! Complex matrices and malformed lines are rejected with the file name and line number.

use std::io::BufRead;
use std::path::Path;

use crate::error::{Error, Result};
use crate::io::{open_text, write_atomic};
use crate::sparse::{Csr, System};

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

/// Capacity to reserve for `n` declared items: all of them where the file's length was checked,
/// else (compressed) at most 2^20, growing as the file is read.
fn reserve(path: &Path, n: usize) -> usize {
    if plain_len(path).is_some() {
        n
    } else {
        n.min(1 << 20)
    }
}

/// A Matrix Market file read up to its size line: the header, the lines after the size line,
/// and what the size line declares.
struct Opened {
    header: Header,
    lines: DataLines<Box<dyn BufRead>>,
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
        let mut inner = open_text(path)?;
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
    fn array_body(mut self, path: &Path) -> Result<Vec<f64>> {
        self.no_more_fields(path, 0)?;
        let (nrows, ncols) = (self.nrows, self.ncols);
        self.check_array(path)?;
        read_array_body(path, &mut self.lines, nrows, ncols, &self.header)
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
    let (rows, cols, vals) = match m.header.layout {
        Layout::Coordinate => read_coordinate(path, m)?,
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
            (rows, cols, vals)
        }
    };
    Csr::from_triplets(nrows, ncols, &rows, &cols, &vals).map_err(|e| Error::in_file(path, e))
}

/// Triplets (0-based rows, columns, values) of a matrix.
type Triplets = (Vec<u64>, Vec<u64>, Vec<f64>);

/// The entries of a `coordinate` file after its size line (the mirror entries of a symmetric or
/// skew-symmetric one added), the declared count checked against the file's length and the
/// machine's memory before anything is allocated.
fn read_coordinate(path: &Path, mut m: Opened) -> Result<Triplets> {
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
    let cap = reserve(path, cap);
    let (mut rows, mut cols, mut vals) = (
        Vec::with_capacity(cap),
        Vec::with_capacity(cap),
        Vec::with_capacity(cap),
    );
    for k in 0..nnz {
        let Some((ln, l)) = m.lines.next_line()? else {
            return Err(Error::parse(
                path,
                m.lines.lineno,
                format!("file ends after {k} of {nnz} entries (truncated?)"),
            ));
        };
        let (i, j, v) = parse_entry(path, ln, l, nrows, ncols, header.field)?;
        rows.push(i - 1);
        cols.push(j - 1);
        vals.push(v);
        let mirror = match header.symmetry {
            Symmetry::Skew if i == j => {
                return Err(Error::parse(
                    path,
                    ln,
                    "a skew-symmetric matrix has no diagonal entries",
                ))
            }
            _ if i == j => None,
            Symmetry::General => None,
            Symmetry::Symmetric => Some(v),
            Symmetry::Skew => Some(-v),
        };
        if let Some(v) = mirror {
            rows.push(j - 1);
            cols.push(i - 1);
            vals.push(v);
        }
    }
    if let Some((ln, _)) = m.lines.next_line()? {
        return Err(Error::parse(
            path,
            ln,
            format!("more entries than the {nnz} the size line declares"),
        ));
    }
    Ok((rows, cols, vals))
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
    let v = parse_value(path, ln, t.next(), field)?;
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

/// Column-major values of an `array` body (symmetric arrays store the lower triangle). The
/// values are collected as they are read and placed when all are there.
fn read_array_body<R: BufRead>(
    path: &Path,
    lines: &mut DataLines<R>,
    nrows: usize,
    ncols: usize,
    header: &Header,
) -> Result<Vec<f64>> {
    let total = array_values(nrows, ncols, header) as usize;
    let mut vals: Vec<f64> = Vec::with_capacity(reserve(path, total));
    for k in 0..total {
        let Some((ln, l)) = lines.next_line()? else {
            return Err(Error::parse(
                path,
                lines.lineno,
                format!("file ends after {k} of {total} values (truncated?)"),
            ));
        };
        let mut t = l.split_whitespace();
        let v = parse_value(path, ln, t.next(), header.field)?;
        if t.next().is_some() {
            return Err(Error::parse(path, ln, "line has extra fields"));
        }
        vals.push(v);
    }
    if let Some((ln, _)) = lines.next_line()? {
        return Err(Error::parse(
            path,
            ln,
            format!("more values than the {total} the size line declares"),
        ));
    }
    if header.symmetry == Symmetry::General {
        return Ok(vals);
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
    Ok(dense)
}

/// Read a vector: a Matrix Market file (an `array` with one column or one row, or a
/// `coordinate` n x 1 / 1 x n matrix), or a plain text file with one value per line
/// (`#` starts a comment).
pub fn read_vector(path: impl AsRef<Path>) -> Result<Vec<f64>> {
    let path = path.as_ref();
    let name = path.to_string_lossy();
    let is_mtx = name.ends_with(".mtx") || name.ends_with(".mtx.gz");
    if is_mtx {
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
    let r = open_text(path)?;
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
/// `.gz` paths are compressed. The file appears only when complete.
pub fn write_matrix(path: impl AsRef<Path>, a: &Csr, comment: &str) -> Result<()> {
    write_atomic(path.as_ref(), |w| write_matrix_to(w, a, comment))
}

/// [`write_matrix`] into `w`.
pub fn write_matrix_to(w: &mut dyn std::io::Write, a: &Csr, comment: &str) -> std::io::Result<()> {
    writeln!(w, "%%MatrixMarket matrix coordinate real general")?;
    for line in comment.lines() {
        writeln!(w, "%{line}")?;
    }
    writeln!(w, "{} {} {}", a.nrows(), a.ncols(), a.nnz())?;
    for i in 0..a.nrows() {
        let (c, v) = a.row(i);
        for (&j, &x) in c.iter().zip(v) {
            writeln!(w, "{} {} {:e}", i + 1, j + 1, x)?;
        }
    }
    Ok(())
}

/// Write a dense vector as a Matrix Market `array real general` (n x 1).
pub fn write_vector_mtx(path: impl AsRef<Path>, x: &[f64]) -> Result<()> {
    write_atomic(path.as_ref(), |w| write_vector_mtx_to(w, x))
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

/// Load [A; w R], [b; 0] from Matrix Market / text files.
pub fn load_system(
    matrix: &Path,
    rhs: Option<&Path>,
    reg: Option<&Path>,
    reg_weight: f64,
) -> Result<System> {
    let a = read_matrix(matrix)?;
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
        let p = tmp(
            "v.mtx",
            "%%MatrixMarket matrix array real general\n3 1\n1\n2.5\n-3\n",
        );
        assert_eq!(read_vector(&p).unwrap(), vec![1.0, 2.5, -3.0]);
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
}
