//! Sparse matrix storage (CSR/CSC) and Matrix Market input/output.

mod csr;
pub mod mtx;

pub use csr::{Csc, Csr};
