//! Values that must be finite, checked where they enter or leave the program with the file (and
//! the entry) named: a matrix whose duplicate entries summed to infinity, a data vector with a
//! NaN, values too large for f32 storage. Without this the first sign is a solver's "a norm is
//! not finite", or a dataset that its own `verify` refuses.

use std::path::Path;

use crate::error::{Error, Result};
use crate::sparse::Csr;

/// Error naming `path` and the first entry of `a`'s rows `rows` that is not finite (or, with
/// `f32`, beyond f32's range: it would be stored as infinity). Rows are counted from
/// `rows.start` (the file's first row), and also as 1-based (row, column) the way a Matrix
/// Market file numbers them.
pub fn check_matrix(
    path: &Path,
    what: &str,
    a: &Csr,
    rows: std::ops::Range<usize>,
    f32: bool,
) -> Result<()> {
    let limit = if f32 { f32::MAX as f64 } else { f64::MAX };
    let ok = |v: f64| v.abs() <= limit;
    let span = a.indptr()[rows.start] as usize..a.indptr()[rows.end] as usize;
    if a.data()[span].iter().all(|&v| ok(v)) {
        return Ok(());
    }
    for i in rows.clone() {
        let (cols, vals) = a.row(i);
        if let Some(k) = vals.iter().position(|&v| !ok(v)) {
            let (r, c, v) = (i - rows.start, cols[k] as usize, vals[k]);
            let why = if v.is_finite() {
                "is beyond the range of f32 storage (it would be stored as infinity; keep f64)"
            } else {
                "is not finite"
            };
            return Err(Error::format(
                path,
                format!(
                    "{what} row {r}, column {c} (entry {} {} counted from 1): value {v:e} {why}",
                    r + 1,
                    c + 1
                ),
            ));
        }
    }
    Ok(())
}

/// Error naming `path` and the first value of `v` (`what`, rows from 0) that is not finite.
pub fn check_vector(path: &Path, what: &str, v: &[f64]) -> Result<()> {
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::format(
            path,
            format!(
                "{what} row {i} (line {} of a text file): value {} is not finite",
                i + 1,
                v[i]
            ),
        )),
    }
}
