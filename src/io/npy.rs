//! A minimal NumPy .npy (format 1.0) writer for 1-D arrays: little-endian f8, i8, i4.

use std::path::Path;

use crate::error::Result;
use crate::io::write_atomic;

/// Element types this writer knows.
pub trait NpyElem: Copy {
    const DESCR: &'static str;
    fn put(self, out: &mut Vec<u8>);
}
impl NpyElem for f64 {
    const DESCR: &'static str = "<f8";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}
impl NpyElem for i64 {
    const DESCR: &'static str = "<i8";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}
impl NpyElem for i32 {
    const DESCR: &'static str = "<i4";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
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
