//! PETSc binary files (the layout of MatView/VecView with a binary viewer, read by MatLoad and
//! VecLoad): big-endian, 32-bit PetscInt (PETSc's default build, Debian's petsc-dev).
//!
//! Mat (AIJ): int32 MAT_FILE_CLASSID = 1211216, int32 rows, int32 cols, int32 total nonzeros,
//! int32 nonzeros of each row (rows values), int32 column indices (0-based, row by row),
//! float64 values. Vec: int32 VEC_FILE_CLASSID = 1211214, int32 length, float64 values.
//! A Mat followed by a Vec in one file is what `MatLoad` then `VecLoad` read in order.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};
use crate::io::write_atomic;
use crate::sparse::Csr;

pub const MAT_FILE_CLASSID: i32 = 1_211_216;
pub const VEC_FILE_CLASSID: i32 = 1_211_214;

fn i32_of(path: &Path, v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::format(
            path,
            format!("{what} = {v} exceeds PETSc's 32-bit PetscInt"),
        )
    })
}

pub(crate) fn mat_bytes(path: &Path, a: &Csr, w: &mut dyn Write) -> Result<()> {
    let (m, n, nnz) = (
        i32_of(path, a.nrows(), "rows")?,
        i32_of(path, a.ncols(), "columns")?,
        i32_of(path, a.nnz(), "nonzeros")?,
    );
    let io = |e| Error::io(path, e);
    for v in [MAT_FILE_CLASSID, m, n, nnz] {
        w.write_all(&v.to_be_bytes()).map_err(io)?;
    }
    let ip = a.indptr();
    for i in 0..a.nrows() {
        w.write_all(&((ip[i + 1] - ip[i]) as i32).to_be_bytes())
            .map_err(io)?;
    }
    for &c in a.indices() {
        w.write_all(&(c as i32).to_be_bytes()).map_err(io)?;
    }
    for &v in a.data() {
        w.write_all(&v.to_be_bytes()).map_err(io)?;
    }
    Ok(())
}

pub(crate) fn vec_bytes(path: &Path, x: &[f64], w: &mut dyn Write) -> Result<()> {
    let n = i32_of(path, x.len(), "vector length")?;
    let io = |e| Error::io(path, e);
    w.write_all(&VEC_FILE_CLASSID.to_be_bytes()).map_err(io)?;
    w.write_all(&n.to_be_bytes()).map_err(io)?;
    for &v in x {
        w.write_all(&v.to_be_bytes()).map_err(io)?;
    }
    Ok(())
}

/// Write a matrix as a PETSc binary Mat file.
pub fn write_mat(path: &Path, a: &Csr) -> Result<()> {
    write_with(path, |w| mat_bytes(path, a, w))
}

/// Write a vector as a PETSc binary Vec file.
pub fn write_vec(path: &Path, x: &[f64]) -> Result<()> {
    write_with(path, |w| vec_bytes(path, x, w))
}

/// Write `path` atomically with `f`, whose own error (not an I/O error) is the one returned.
fn write_with(path: &Path, mut f: impl FnMut(&mut dyn std::io::Write) -> Result<()>) -> Result<()> {
    let mut err = None;
    let r = write_atomic(path, |w| {
        f(w).map_err(|e| {
            err = Some(e);
            std::io::Error::other("petsc write failed")
        })
    });
    match err {
        Some(e) => Err(e),
        None => r,
    }
}

/// Read a PETSc binary Mat file. The header's sizes are checked against the file's length
/// (16 + 4·rows + 4·nnz + 8·nnz bytes exactly) before anything is allocated from them.
pub fn read_mat(path: &Path) -> Result<Csr> {
    let bytes = crate::io::read_input(path, "PETSc binary file", u64::MAX)?;
    let int = |pos: usize, what: &str| -> Result<i32> {
        let b = bytes
            .get(pos..pos + 4)
            .ok_or_else(|| Error::format(path, format!("file ends before {what} (truncated?)")))?;
        Ok(i32::from_be_bytes(b.try_into().expect("4 bytes")))
    };
    if int(0, "the class id")? != MAT_FILE_CLASSID {
        return Err(Error::format(
            path,
            "not a PETSc binary Mat (wrong class id)",
        ));
    }
    let (m, n, nnz) = (int(4, "rows")?, int(8, "columns")?, int(12, "nonzeros")?);
    if m < 0 || n < 0 || nnz < 0 {
        return Err(Error::format(
            path,
            format!("negative sizes in the header (rows {m}, columns {n}, nonzeros {nnz})"),
        ));
    }
    let (m, n, nnz) = (m as usize, n as usize, nnz as usize);
    let want = 16 + 4 * m as u64 + 12 * nnz as u64;
    if bytes.len() as u64 != want {
        return Err(Error::format(
            path,
            format!(
                "the header declares {m} rows and {nnz} nonzeros, which take {want} bytes, but the file has {}{}",
                bytes.len(),
                if (bytes.len() as u64) < want { " (truncated?)" } else { "" }
            ),
        ));
    }
    let words = |at: usize, k: usize| {
        bytes[at..at + 4 * k]
            .chunks_exact(4)
            .map(|c| i32::from_be_bytes(c.try_into().expect("4 bytes")))
    };
    let mut indptr = Vec::with_capacity(m + 1);
    indptr.push(0u64);
    for (i, l) in words(16, m).enumerate() {
        if l < 0 {
            return Err(Error::format(path, format!("row {i} has length {l}")));
        }
        indptr.push(indptr[i] + l as u64);
    }
    let mut indices = Vec::with_capacity(nnz);
    for (k, c) in words(16 + 4 * m, nnz).enumerate() {
        if c < 0 || c as usize >= n {
            return Err(Error::format(
                path,
                format!("column index {c} at nonzero {k} is out of range (columns = {n})"),
            ));
        }
        indices.push(c as u32);
    }
    let at = 16 + 4 * m + 4 * nnz;
    let data: Vec<f64> = bytes[at..at + 8 * nnz]
        .chunks_exact(8)
        .map(|c| f64::from_be_bytes(c.try_into().expect("8 bytes")))
        .collect();
    Csr::try_new(m, n, indptr, indices, data).map_err(|e| Error::in_file(path, e))
}

/// Read a PETSc binary Vec file (class id, length, values; the length is checked against the
/// file's size before the values are allocated). Values must be finite.
pub fn read_vec(path: &Path) -> Result<Vec<f64>> {
    let bytes = crate::io::read_input(path, "PETSc binary file", u64::MAX)?;
    if bytes.len() < 8 {
        return Err(Error::format(
            path,
            "file ends inside the header (truncated?)",
        ));
    }
    let int = |pos: usize| i32::from_be_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes"));
    if int(0) != VEC_FILE_CLASSID {
        return Err(Error::format(
            path,
            "not a PETSc binary Vec (wrong class id)",
        ));
    }
    let n = int(4);
    if n < 0 || bytes.len() as u64 != 8 + 8 * n as u64 {
        return Err(Error::format(
            path,
            format!(
                "the header declares {n} values but the file has {} bytes (expected {})",
                bytes.len(),
                8 + 8 * n.max(0) as u64
            ),
        ));
    }
    let x: Vec<f64> = bytes[8..]
        .chunks_exact(8)
        .map(|c| f64::from_be_bytes(c.try_into().expect("8 bytes")))
        .collect();
    if let Some(k) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::format(
            path,
            format!("value {k} is not finite ({})", x[k]),
        ));
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mat_round_trip_and_header() {
        let dir = crate::io::test_dir("petsc");
        let a = Csr::from_triplets(3, 4, &[0, 2, 2], &[1, 0, 3], &[1.5, -2.0, 1e-300]).unwrap();
        let p = dir.join("A.petsc");
        write_mat(&p, &a).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..4], &1_211_216i32.to_be_bytes());
        assert_eq!(bytes.len(), 16 + 3 * 4 + 3 * 4 + 3 * 8);
        assert_eq!(read_mat(&p).unwrap(), a);
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        assert!(read_mat(&p).unwrap_err().to_string().contains("truncated"));
        let v = dir.join("b.petsc");
        write_vec(&v, &[1.0, 2.0]).unwrap();
        assert_eq!(std::fs::read(&v).unwrap().len(), 8 + 16);
    }
}
