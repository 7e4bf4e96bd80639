//! Sparse matrix storage in memory: CSR/CSC, the compact 16-bit-delta format, column tiles,
//! and [`System`] (a rank's rows of [A; b]). Files live in `io` (Matrix Market: `io::mtx`).

pub mod compact;
mod csr;
pub mod lanes;
pub mod par;
pub mod patterns;
pub mod runs;
pub mod tiled;

pub use compact::{CompactCsr, CompactStats, CompactValues, GapHistogram};
pub use csr::{Csc, Csr, CsrView, TripletPart};
pub use lanes::Lanes;
pub use runs::{RowOrder, RowRuns, RowSort, LENGTH_ORDER_WINDOW};

/// A loaded least-squares system (this rank's rows).
#[derive(Debug, Clone)]
pub struct System {
    pub a: Csr,
    pub b: Vec<f64>,
    /// Rows of the kernel (data) part; the remaining rows are damping/regularisation.
    pub kernel_rows: usize,
}

/// Storage precision of matrix values. Vectors, scalars and sums are always f64.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F64,
    /// Values rounded to f32 (8 bytes per nonzero with the column index instead of 12); A and
    /// A^T share the rounded values, accumulation stays f64. Used by the CUDA backend.
    F32,
}

impl Precision {
    /// Bytes of one stored value.
    pub fn bytes(self) -> usize {
        match self {
            Self::F64 => 8,
            Self::F32 => 4,
        }
    }
}

choice_from_str!(Precision, "precision", "f64" | "double" => Self::F64, "f32" | "single" => Self::F32);

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F64 => "f64",
            Self::F32 => "f32",
        })
    }
}
