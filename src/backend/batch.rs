//! Blocks of k vectors and the products of a batch of k least-squares problems that share one
//! matrix (batched LSQR: src/solver/lsqr_batch.rs).
//!
//! A block holds `rows x k` values **row-major**: entry (i, j) of member j at `i * k + j`, so
//! the k values a matrix entry multiplies lie side by side and one pass over the matrix serves
//! every member (a GPU kernel reads them the same way: one nonzero, k contiguous values). The
//! members' matrices differ only by a weight on some rows: member j applies
//! `A_j = [G; w_j R]`, the rows a [`BlockOperator`] calls weighted taken times `w_j` (with no
//! weighted rows every member has the same A and differs by LSQR's damping, which the solver
//! applies).
//!
//! Each member's numbers are those of the single-vector kernels on its column: the same sums in
//! the same order ([`crate::backend::cpu`]'s lanes and chunks), so a batch member is bitwise
//! the single solve on the CPU.

use super::{Backend, XwStep};
use crate::comm::Comm;
use crate::error::Result;

/// The block kernels batched LSQR needs, column by column (`out[j]`, `a[j]`: member j).
pub trait BatchBackend: Backend {
    /// `rows x k` values, row-major.
    type Block: Send;

    /// A zero block.
    fn block_zeros(&self, rows: usize, k: usize) -> Result<Self::Block>;
    /// (rows, k).
    fn block_shape(&self, x: &Self::Block) -> (usize, usize);
    /// Column j on the host.
    fn block_column(&self, x: &Self::Block, j: usize) -> Result<Vec<f64>>;
    /// Column j = `col`.
    fn block_set_column(&self, x: &mut Self::Block, j: usize, col: &[f64]) -> Result<()>;
    /// Keep the columns `keep` (in that order) and drop the others: finished members leave the
    /// block, and the products stop computing them.
    fn block_keep(&self, x: &mut Self::Block, keep: &[usize]) -> Result<()>;
    /// `out[j]` = this rank's sum of squares of `factor[j] * x_j` (without factors, of x_j), in
    /// the order [`Backend::norm_sq`] sums one vector (bitwise its value).
    fn block_norms_sq(
        &self,
        x: &Self::Block,
        factor: Option<&[f64]>,
        out: &mut [f64],
    ) -> Result<()>;
    /// `x_j = a[j] x_j`
    fn block_scale(&self, x: &mut Self::Block, a: &[f64]) -> Result<()>;
    /// `y_j = a x_j + b[j] y_j`
    fn block_axpby(&self, a: f64, x: &Self::Block, b: &[f64], y: &mut Self::Block) -> Result<()>;
    /// [`Backend::lsqr_update`] on every column: `out[j]` = ||d_k||^2 of member j.
    fn block_lsqr_update(
        &self,
        k: &[XwStep],
        v: &Self::Block,
        xw: (&mut Self::Block, &mut Self::Block),
        var: Option<&mut Self::Block>,
        out: &mut [f64],
    ) -> Result<()>;
    /// Sum the block over all ranks, in place (one allreduce of rows x k values).
    fn block_allreduce_sum(&self, comm: &dyn Comm, x: &mut Self::Block) -> Result<()>;
}

/// Which product of a [`BlockOperator`]: A or A^T.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    At,
}

/// The scalars of a block product: member j's row weight `w[j]` (where the operator has
/// weighted rows), one `alpha` for all members and member j's `beta[j]`.
#[derive(Debug, Clone, Copy)]
pub struct BlockScale<'a> {
    pub w: &'a [f64],
    pub alpha: f64,
    pub beta: &'a [f64],
}

impl<'a> BlockScale<'a> {
    /// alpha = 1 (what LSQR's Golub-Kahan steps use).
    pub fn new(w: &'a [f64], beta: &'a [f64]) -> Self {
        BlockScale {
            w,
            alpha: 1.0,
            beta,
        }
    }
}

/// A matrix applied to blocks, member j's rows weighted by `w[j]` where the operator has
/// weighted rows. `nrows` is this rank's share of the rows.
pub trait BlockOperator<B: BatchBackend> {
    fn nrows(&self) -> usize;
    fn ncols(&self) -> usize;
    /// Whether some rows are weighted (else `w` is ignored).
    fn has_weighted_rows(&self) -> bool;
    /// What is stored, in words (report.json's `storage`).
    fn describe(&self) -> String;
    /// Member matrix A_j for row weight `w` (this rank's rows), as its single solve stores it:
    /// each weighted entry `a w` (so single products of it sum as the block products do).
    fn member_matrix(&self, w: f64) -> crate::sparse::Csr;
    /// `Side::A`: `Y_j = alpha A_j X_j + beta[j] Y_j` (Y_j not read where `beta[j] == 0`);
    /// `Side::At`: `X_j = alpha A_j^T Y_j + beta[j] X_j` with this rank's rows only (no sum over
    /// ranks). `input` is X (Y), `out` Y (X).
    fn apply_block(
        &self,
        be: &B,
        side: Side,
        s: BlockScale,
        input: &B::Block,
        out: &mut B::Block,
    ) -> Result<()>;
}

/// `a` with the rows of class 1 (`class[r] != 0`) times `w`: member j's matrix as its own solve
/// stores it (each weighted entry `a w`). None: `a` as it is.
pub fn weighted_rows(a: &crate::sparse::Csr, class: Option<&[u8]>, w: f64) -> crate::sparse::Csr {
    let mut out = a.clone();
    if let Some(c) = class {
        let ptr = a.indptr();
        let vals = out.data_mut();
        for (r, &cl) in c.iter().enumerate() {
            if cl != 0 {
                let seg = &mut vals[ptr[r] as usize..ptr[r + 1] as usize];
                seg.iter_mut().for_each(|v| *v *= w);
            }
        }
    }
    out
}

/// The argument checks every backend's block kernels make, with the same words.
pub mod check {
    use crate::error::{Error, Result};

    /// A block of `got` = (rows, k) where (rows, k) is expected.
    pub fn shape(what: &str, got: (usize, usize), rows: usize, k: usize) -> Result<()> {
        if got != (rows, k) {
            return Err(Error::Invalid(format!(
                "{what}: block of {} x {}, expected {rows} x {k}",
                got.0, got.1
            )));
        }
        Ok(())
    }
    /// `got` values where the block has k columns.
    pub fn one_per_column(what: &str, got: usize, k: usize) -> Result<()> {
        if got != k {
            return Err(Error::Invalid(format!(
                "{what}: {got} values for a block of {k} columns"
            )));
        }
        Ok(())
    }
    /// The values of a rows x k block.
    pub fn len(rows: usize, k: usize) -> Result<usize> {
        rows.checked_mul(k)
            .ok_or_else(|| Error::Invalid(format!("a block of {rows} x {k} is too large")))
    }
    /// Column j of a block of k.
    pub fn column(j: usize, k: usize) -> Result<()> {
        if j >= k {
            return Err(Error::Invalid(format!("column {j} of a block of {k}")));
        }
        Ok(())
    }
    /// Column j set from `len` values in a rows x k block.
    pub fn set_column(j: usize, len: usize, (rows, k): (usize, usize)) -> Result<()> {
        if j >= k || len != rows {
            return Err(Error::Invalid(format!(
                "column {j} of {len} values into a block of {rows} x {k}"
            )));
        }
        Ok(())
    }
    /// The columns `keep` of a block of k: false where they are all, in order (nothing to do).
    pub fn keep(keep: &[usize], k: usize) -> Result<bool> {
        if keep.iter().any(|&j| j >= k) {
            return Err(Error::Invalid(format!(
                "keep {keep:?} of a block of {k} columns"
            )));
        }
        Ok(!(keep.len() == k && keep.iter().enumerate().all(|(i, &j)| i == j)))
    }
}
