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
    let mut err = None;
    let r = write_atomic(path, |w| {
        mat_bytes(path, a, w).map_err(|e| {
            err = Some(e);
            std::io::Error::other("petsc write failed")
        })
    });
    match err {
        Some(e) => Err(e),
        None => r,
    }
}

/// Write a vector as a PETSc binary Vec file.
pub fn write_vec(path: &Path, x: &[f64]) -> Result<()> {
    let mut err = None;
    let r = write_atomic(path, |w| {
        vec_bytes(path, x, w).map_err(|e| {
            err = Some(e);
            std::io::Error::other("petsc write failed")
        })
    });
    match err {
        Some(e) => Err(e),
        None => r,
    }
}

/// Read a PETSc binary Mat file back (for tests and round trips).
pub fn read_mat(path: &Path) -> Result<Csr> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut pos = 0usize;
    let mut int = |what: &str| -> Result<i32> {
        let b = bytes
            .get(pos..pos + 4)
            .ok_or_else(|| Error::format(path, format!("file ends before {what} (truncated?)")))?;
        pos += 4;
        Ok(i32::from_be_bytes(b.try_into().expect("4 bytes")))
    };
    if int("the class id")? != MAT_FILE_CLASSID {
        return Err(Error::format(
            path,
            "not a PETSc binary Mat (wrong class id)",
        ));
    }
    let (m, n, nnz) = (int("rows")?, int("columns")?, int("nonzeros")?);
    if m < 0 || n < 0 || nnz < 0 {
        return Err(Error::format(path, "negative sizes in the header"));
    }
    let mut indptr = vec![0u64];
    for i in 0..m {
        let l = int(&format!("the length of row {i}"))?;
        indptr.push(indptr[i as usize] + l.max(0) as u64);
    }
    let mut indices = Vec::with_capacity(nnz as usize);
    for _ in 0..nnz {
        indices.push(int("column indices")? as u32);
    }
    let mut data = Vec::with_capacity(nnz as usize);
    for k in 0..nnz as usize {
        let b = bytes.get(pos..pos + 8).ok_or_else(|| {
            Error::format(
                path,
                format!("file ends at value {k} of {nnz} (truncated?)"),
            )
        })?;
        pos += 8;
        data.push(f64::from_be_bytes(b.try_into().expect("8 bytes")));
    }
    Csr::try_new(m as usize, n as usize, indptr, indices, data).map_err(|e| Error::in_file(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mat_round_trip_and_header() {
        let dir = std::env::temp_dir().join(format!("seistomo-petsc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
