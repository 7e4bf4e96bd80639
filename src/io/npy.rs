//! A minimal NumPy .npy (format 1.0) writer and reader for 1-D arrays: little-endian f8, i8,
//! i4.

use std::path::Path;

use crate::error::{Error, Result};
use crate::io::write_atomic;

/// Element types this writer and reader know.
pub trait NpyElem: Copy {
    const DESCR: &'static str;
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    /// The element from its `SIZE` little-endian bytes.
    fn get(bytes: &[u8]) -> Self;
}
macro_rules! npy_elem {
    ($($t:ty => $descr:literal),+) => {$(
        impl NpyElem for $t {
            const DESCR: &'static str = $descr;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("SIZE bytes"))
            }
        }
    )+};
}
npy_elem!(f64 => "<f8", i64 => "<i8", i32 => "<i4");

/// Read a 1-D .npy file (format 1.0 or 2.0) of element type `T`: the header's dtype must be
/// `T`'s, `fortran_order` False and the shape one dimension whose length times the element
/// size is exactly the bytes after the header (checked before anything is allocated).
pub fn read_npy<T: NpyElem>(path: &Path) -> Result<Vec<T>> {
    let bytes = crate::io::read_input(path, ".npy file", u64::MAX)?;
    let bad = |msg: String| Error::format(path, msg);
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("not a .npy file (bad magic)".into()));
    }
    let (hl, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize,
            12,
        ),
        v => return Err(bad(format!(".npy format version {v} is not supported"))),
    };
    if hl > bytes.len() - start {
        return Err(bad(format!(
            "header length {hl} past the end of the file ({} bytes)",
            bytes.len()
        )));
    }
    let dict = std::str::from_utf8(&bytes[start..start + hl])
        .map_err(|_| bad("the header is not text".into()))?;
    // The value of `key` in the header dict, up to the next ',' outside parentheses.
    let field = |key: &str| -> Option<&str> {
        let at = dict.find(&format!("'{key}':"))? + key.len() + 3;
        let rest = dict[at..].trim_start();
        let mut depth = 0;
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' | '}' if depth <= 0 => return Some(rest[..i].trim()),
                _ => {}
            }
        }
        None
    };
    let descr = field("descr").map(|d| d.trim_matches(['\'', '"']));
    if descr != Some(T::DESCR) {
        return Err(bad(format!(
            "dtype {} but {} was expected",
            descr.unwrap_or("(none)"),
            T::DESCR
        )));
    }
    if field("fortran_order") != Some("False") {
        return Err(bad("fortran_order must be False".into()));
    }
    let shape = field("shape").unwrap_or("");
    let dims: Vec<&str> = shape
        .trim_matches(['(', ')'])
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let n: u64 = match dims.as_slice() {
        [d] => d.parse().map_err(|_| bad(format!("bad shape {shape}")))?,
        _ => return Err(bad(format!("shape {shape} is not one-dimensional"))),
    };
    let body = (bytes.len() - start - hl) as u128;
    if n as u128 * T::SIZE as u128 != body {
        return Err(bad(format!(
            "the header declares {n} elements of {} bytes but {body} bytes follow it",
            T::SIZE
        )));
    }
    Ok(bytes[start + hl..]
        .chunks_exact(T::SIZE)
        .map(T::get)
        .collect())
}

/// The .npy header for a 1-D array of `len` elements: magic, version 1.0, header length, and a
/// dict padded with spaces so that the data starts at a multiple of 64 bytes.
pub fn header(descr: &str, len: usize) -> Vec<u8> {
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({len},), }}");
    let unpadded = 10 + dict.len() + 1;
    let total = unpadded.div_ceil(64) * 64;
    let mut h = Vec::with_capacity(total);
    h.extend_from_slice(b"\x93NUMPY\x01\x00");
    h.extend_from_slice(&((total - 10) as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.resize(total - 1, b' ');
    h.push(b'\n');
    h
}

/// Write `x` as a 1-D .npy file (atomically).
pub fn write_npy<T: NpyElem>(path: &Path, x: &[T]) -> Result<()> {
    write_atomic(path, |w| npy_to(w, x))
}

/// `x` as a 1-D .npy file, into `w`.
pub fn npy_to<T: NpyElem>(w: &mut dyn std::io::Write, x: &[T]) -> std::io::Result<()> {
    w.write_all(&header(T::DESCR, x.len()))?;
    let mut buf = Vec::with_capacity(1 << 20);
    for chunk in x.chunks(1 << 17) {
        buf.clear();
        chunk.iter().for_each(|v| v.put(&mut buf));
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Write A (indptr.npy as i64, indices.npy as i32, data.npy, shape.npy) and b.npy into `dir`
/// (created), as numpy and the CuPy peer (bench/peers/cupy_lsqr.py `npy DIR`) read them.
pub fn export_system(dir: &Path, a: &crate::sparse::Csr, b: &[f64]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let ip: Vec<i64> = a.indptr().iter().map(|&p| p as i64).collect();
    let ci: Vec<i32> = a.indices().iter().map(|&c| c as i32).collect();
    write_npy(&dir.join("indptr.npy"), &ip)?;
    write_npy(&dir.join("indices.npy"), &ci)?;
    write_npy(&dir.join("data.npy"), a.data())?;
    write_npy(&dir.join("b.npy"), b)?;
    write_npy(
        &dir.join("shape.npy"),
        &[a.nrows() as i64, a.ncols() as i64],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_aligned_and_parsable() {
        let h = header("<f8", 12345);
        assert_eq!(h.len() % 64, 0);
        assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
        let hl = u16::from_le_bytes([h[8], h[9]]) as usize;
        assert_eq!(hl + 10, h.len());
        let dict = std::str::from_utf8(&h[10..]).unwrap();
        assert!(dict.starts_with("{'descr': '<f8', 'fortran_order': False, 'shape': (12345,), }"));
        assert!(dict.ends_with('\n'));
    }
}
