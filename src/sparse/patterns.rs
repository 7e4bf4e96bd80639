//! Row patterns: the GPU's storage for square systems whose rows repeat a few column patterns.
//!
//! On a structured grid a discretised operator (convection-diffusion, Poisson: GMRES's square
//! systems) has the same stencil in every interior row: row r holds columns r + o_1 < ... < r +
//! o_k for one list of offsets (o_1..o_k), and the boundary rows a few dozen more lists. CSR
//! stores a 4-byte column per nonzero and an 8-byte offset per row, 12 + 8/k bytes besides the
//! values (92 bytes per row of a 7-point stencil in f64, against 56 of values). Here:
//!
//! - each distinct list of offsets c - r is stored once, in a **pattern table**
//!   (`pat_start`/`pat_off`), and each row holds a 16-bit pattern number (`row_pat`);
//! - the values are cut into **slices** of [`SLICE`] consecutive rows; a slice is as wide as its
//!   longest pattern, and its values sit slot by slot (`values[slice_ptr[s] + k * SLICE + i]` is
//!   the k-th value of row s * SLICE + i: a warp's loads of one slot are coalesced); slots past
//!   a row's pattern hold 0 and are never read.
//!
//! A 7-point stencil row then costs 56 bytes of values and 2 bytes of pattern number (f64),
//! about 37 % fewer bytes than CSR per product. A matrix is stored this way only when its rows
//! fall into at most [`PatternLimits::max_patterns`] patterns of at most [`MAX_PATTERN_LEN`]
//! entries and the slices waste few slots; otherwise [`RowPatterns::from_csr`] says why and the
//! caller keeps CSR. A row's sum is taken in column order, one product added at a time (the
//! order of the GPU's CSR kernel for short rows that share a warp segment; a row alone in its
//! segment is summed there by a shuffle tree).

use std::collections::HashMap;

use crate::sparse::{CompactValues, Csr, Precision};

/// Rows per slice (a warp: one thread per row).
pub const SLICE: usize = 32;
/// Entries of a pattern at most (a thread sums its row alone).
pub const MAX_PATTERN_LEN: usize = 64;

/// When a matrix is worth storing as row patterns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PatternLimits {
    /// Distinct patterns at most (the table is read through the GPU's caches).
    pub max_patterns: usize,
    /// Value slots (with the slices' padding) per nonzero at most.
    pub max_slots_per_nnz: f64,
}

impl Default for PatternLimits {
    fn default() -> Self {
        Self {
            max_patterns: 4096,
            max_slots_per_nnz: 1.25,
        }
    }
}

/// Why a matrix is not stored as row patterns.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotPatterned {
    #[error("its rows have more than {limit} distinct column patterns")]
    TooManyPatterns { limit: usize },
    #[error("row {row} has {len} nonzeros (a pattern holds at most {MAX_PATTERN_LEN})")]
    RowTooLong { row: usize, len: usize },
    #[error("row {row} has a column whose distance from the row number does not fit 32 bits")]
    OffsetTooFar { row: usize },
    #[error(
        "the slices would hold {slots} value slots for {nnz} nonzeros (at most {max} per nonzero)"
    )]
    TooMuchPadding { slots: usize, nnz: usize, max: f64 },
    #[error("{nrows} rows or {ncols} columns do not fit 32-bit numbers")]
    TooLarge { nrows: usize, ncols: usize },
}

/// A matrix as row patterns (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct RowPatterns {
    pub nrows: usize,
    pub ncols: usize,
    pub nnz: usize,
    /// First offset of each pattern in `pat_off`; patterns + 1 entries.
    pub pat_start: Vec<u32>,
    /// Column minus row of each entry of each pattern, ascending within a pattern.
    pub pat_off: Vec<i32>,
    /// Pattern of each row.
    pub row_pat: Vec<u16>,
    /// First value slot of each slice; slices + 1 entries (a slice of width w holds w * SLICE).
    pub slice_ptr: Vec<u64>,
    /// Values slot by slot within each slice (0 in the slots no row uses).
    pub values: CompactValues,
}

impl RowPatterns {
    /// Store `a` as row patterns with values in `precision`, or say why it does not qualify
    /// under `limits`.
    pub fn from_csr(
        a: &Csr,
        precision: Precision,
        limits: PatternLimits,
    ) -> Result<Self, NotPatterned> {
        let (m, n) = a.shape();
        if m >= u32::MAX as usize || n >= u32::MAX as usize {
            return Err(NotPatterned::TooLarge { nrows: m, ncols: n });
        }
        let max_patterns = limits.max_patterns.min(u16::MAX as usize + 1);
        let mut index: HashMap<Box<[i32]>, u16> = HashMap::new();
        let mut pat_start = vec![0u32];
        let mut pat_off: Vec<i32> = Vec::new();
        let mut row_pat = Vec::with_capacity(m);
        let mut buf: Vec<i32> = Vec::with_capacity(MAX_PATTERN_LEN);
        for r in 0..m {
            let (cols, _) = a.row(r);
            if cols.len() > MAX_PATTERN_LEN {
                return Err(NotPatterned::RowTooLong {
                    row: r,
                    len: cols.len(),
                });
            }
            buf.clear();
            for &c in cols {
                let o = i32::try_from(c as i64 - r as i64)
                    .map_err(|_| NotPatterned::OffsetTooFar { row: r })?;
                buf.push(o);
            }
            let p = match index.get(&buf[..]) {
                Some(&p) => p,
                None => {
                    let p = index.len();
                    if p >= max_patterns {
                        return Err(NotPatterned::TooManyPatterns {
                            limit: max_patterns,
                        });
                    }
                    pat_off.extend_from_slice(&buf);
                    pat_start.push(pat_off.len() as u32);
                    index.insert(buf.clone().into_boxed_slice(), p as u16);
                    p as u16
                }
            };
            row_pat.push(p);
        }
        let len = |p: u16| (pat_start[p as usize + 1] - pat_start[p as usize]) as u64;
        let nslices = m.div_ceil(SLICE);
        let mut slice_ptr = Vec::with_capacity(nslices + 1);
        slice_ptr.push(0u64);
        for s in 0..nslices {
            let rows = &row_pat[s * SLICE..((s + 1) * SLICE).min(m)];
            let w = rows.iter().map(|&p| len(p)).max().unwrap_or(0);
            slice_ptr.push(slice_ptr[s] + w * SLICE as u64);
        }
        let slots = slice_ptr[nslices] as usize;
        if slots as f64 > limits.max_slots_per_nnz * a.nnz().max(1) as f64 {
            return Err(NotPatterned::TooMuchPadding {
                slots,
                nnz: a.nnz(),
                max: limits.max_slots_per_nnz,
            });
        }
        let mut vals = vec![0.0f64; slots];
        for r in 0..m {
            let base = slice_ptr[r / SLICE] as usize + r % SLICE;
            for (k, &v) in a.row(r).1.iter().enumerate() {
                vals[base + k * SLICE] = v;
            }
        }
        let values = match precision {
            Precision::F64 => CompactValues::F64(vals),
            Precision::F32 => CompactValues::F32(vals.iter().map(|&v| v as f32).collect()),
        };
        Ok(RowPatterns {
            nrows: m,
            ncols: n,
            nnz: a.nnz(),
            pat_start,
            pat_off,
            row_pat,
            slice_ptr,
            values,
        })
    }

    /// Distinct patterns.
    pub fn patterns(&self) -> usize {
        self.pat_start.len() - 1
    }

    /// Value slots (nonzeros plus the slices' padding).
    pub fn slots(&self) -> usize {
        self.values.len()
    }

    /// Bytes of the stored matrix: values, pattern numbers, slice offsets and the table.
    pub fn bytes(&self) -> usize {
        self.slots() * self.values.precision().bytes()
            + 2 * self.row_pat.len()
            + 8 * self.slice_ptr.len()
            + 4 * (self.pat_start.len() + self.pat_off.len())
    }

    /// The offsets of row r's pattern.
    fn pattern_of(&self, r: usize) -> &[i32] {
        let p = self.row_pat[r] as usize;
        &self.pat_off[self.pat_start[p] as usize..self.pat_start[p + 1] as usize]
    }

    /// y = A x, each row summed in column order one product at a time (the GPU kernel's order:
    /// the reference its results equal bit for bit).
    pub fn matvec(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.ncols);
        (0..self.nrows)
            .map(|r| {
                let base = self.slice_ptr[r / SLICE] as usize + r % SLICE;
                let mut s = 0.0;
                for (k, &o) in self.pattern_of(r).iter().enumerate() {
                    let v = match &self.values {
                        CompactValues::F64(v) => v[base + k * SLICE],
                        CompactValues::F32(v) => v[base + k * SLICE] as f64,
                    };
                    s += v * x[(r as i64 + o as i64) as usize];
                }
                s
            })
            .collect()
    }

    /// One line for logs and reports.
    pub fn describe(&self) -> String {
        format!(
            "row patterns: {} patterns, {:.3} value slots per nonzero, {:.2} bytes per nonzero ({} values)",
            self.patterns(),
            self.slots() as f64 / self.nnz.max(1) as f64,
            self.bytes() as f64 / self.nnz.max(1) as f64,
            self.values.precision()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 5-point Laplacian of an nx x ny grid.
    fn laplace(nx: usize, ny: usize) -> Csr {
        let mut t = Vec::new();
        for j in 0..ny {
            for i in 0..nx {
                let r = j * nx + i;
                t.push((r, r, 4.0 + r as f64 * 1e-3));
                if i > 0 {
                    t.push((r, r - 1, -1.0));
                }
                if i + 1 < nx {
                    t.push((r, r + 1, -1.1));
                }
                if j > 0 {
                    t.push((r, r - nx, -0.9));
                }
                if j + 1 < ny {
                    t.push((r, r + nx, -1.2));
                }
            }
        }
        csr(nx * ny, nx * ny, &t)
    }

    fn csr(m: usize, n: usize, t: &[(usize, usize, f64)]) -> Csr {
        let r: Vec<u64> = t.iter().map(|e| e.0 as u64).collect();
        let c: Vec<u64> = t.iter().map(|e| e.1 as u64).collect();
        let v: Vec<f64> = t.iter().map(|e| e.2).collect();
        Csr::from_triplets(m, n, &r, &c, &v).unwrap()
    }

    fn seq_matvec(a: &Csr, x: &[f64]) -> Vec<f64> {
        (0..a.nrows())
            .map(|r| {
                let (c, v) = a.row(r);
                let mut s = 0.0;
                for k in 0..c.len() {
                    s += v[k] * x[c[k] as usize];
                }
                s
            })
            .collect()
    }

    #[test]
    fn a_stencil_has_nine_patterns_and_the_sequential_product() {
        let a = laplace(37, 11);
        let p = RowPatterns::from_csr(&a, Precision::F64, PatternLimits::default()).unwrap();
        // interior, 4 edges, 4 corners
        assert_eq!(p.patterns(), 9);
        assert!(p.slots() as f64 <= 1.25 * a.nnz() as f64);
        let x: Vec<f64> = (0..a.ncols()).map(|i| (i as f64 * 0.37).sin()).collect();
        assert_eq!(p.matvec(&x), seq_matvec(&a, &x));
        assert!(p.bytes() < a.nnz() * 12 + 8 * (a.nrows() + 1));
    }

    #[test]
    fn f32_values_are_the_rounded_values() {
        let a = laplace(9, 7);
        let p = RowPatterns::from_csr(&a, Precision::F32, PatternLimits::default()).unwrap();
        let mut a32 = a.clone();
        for v in a32.data_mut() {
            *v = *v as f32 as f64;
        }
        let x: Vec<f64> = (0..a.ncols()).map(|i| 1.0 + i as f64 * 0.01).collect();
        assert_eq!(p.matvec(&x), seq_matvec(&a32, &x));
    }

    #[test]
    fn awkward_shapes() {
        // empty rows, a partial last slice, more columns than rows (a halo), negative and
        // far offsets, an empty matrix
        let t = vec![
            (0, 5, 1.0),
            (0, 70_000, 2.0),
            (2, 0, 3.0),
            (40, 39, -1.0),
            (40, 40, 2.0),
            (40, 99_999, 0.5),
        ];
        let a = csr(41, 100_000, &t);
        let limits = PatternLimits {
            max_slots_per_nnz: 1e9,
            ..Default::default()
        };
        let p = RowPatterns::from_csr(&a, Precision::F64, limits).unwrap();
        let x: Vec<f64> = (0..a.ncols()).map(|i| i as f64).collect();
        assert_eq!(p.matvec(&x), seq_matvec(&a, &x));
        let e = csr(0, 0, &[]);
        let p = RowPatterns::from_csr(&e, Precision::F64, PatternLimits::default()).unwrap();
        assert!(p.matvec(&[]).is_empty());
    }

    #[test]
    fn says_why_a_matrix_does_not_qualify() {
        // every row its own pattern
        let t: Vec<_> = (0..100).map(|r| (r, (r * r) % 100, 1.0)).collect();
        let a = csr(100, 100, &t);
        let limits = PatternLimits {
            max_patterns: 8,
            ..Default::default()
        };
        assert_eq!(
            RowPatterns::from_csr(&a, Precision::F64, limits),
            Err(NotPatterned::TooManyPatterns { limit: 8 })
        );
        // a long row
        let t: Vec<_> = (0..80).map(|c| (3, c, 1.0)).collect();
        let a = csr(4, 80, &t);
        assert_eq!(
            RowPatterns::from_csr(&a, Precision::F64, PatternLimits::default()),
            Err(NotPatterned::RowTooLong { row: 3, len: 80 })
        );
        // one row of 8 among rows of 1: the slice is 8 wide
        let mut t: Vec<_> = (0..64).map(|r| (r, r, 1.0)).collect();
        t.extend((1..8).map(|c| (0, c, 1.0)));
        let a = csr(64, 64, &t);
        let err = RowPatterns::from_csr(&a, Precision::F64, PatternLimits::default());
        assert!(
            matches!(
                err,
                Err(NotPatterned::TooMuchPadding {
                    slots: 288,
                    nnz: 71,
                    ..
                })
            ),
            "{err:?}"
        );
    }
}
