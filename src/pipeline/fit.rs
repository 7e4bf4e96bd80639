//! A solution's products made on the operator it was solved on (`SolveOptions::fit`): the
//! product of the whole prepared system (its rows permuted, stencil rows after them) turned
//! into [`Fit`]: the kernel rows' product G x in the system's row order and the norm of the
//! other rows' product. An L-curve's points and GCV's traces read them instead of a pass over G
//! on the host (docs/lsqr.md, "L-curve").

use rayon::prelude::*;

use crate::backend::batch::{BatchBackend, BlockOperator, BlockScale, Side};
use crate::backend::{Backend, Operator, Scale};
use crate::error::{Error, Result};
use crate::model::report::Fit;

/// Rows summed in one piece of the regularisation norm (fixed pieces: the same sum whatever
/// the threads).
const PIECE: usize = 1 << 16;

/// Where a system's kernel rows went in the prepared row order.
pub struct FitRows {
    /// Kernel row o (the system's order) is prepared row `at[o]`.
    at: Vec<usize>,
    /// Whether prepared row i is a kernel row.
    kernel: Vec<bool>,
}

impl FitRows {
    /// `m` prepared rows, prepared row i being the system's row `old(i)`, whose first
    /// `kernel_rows` rows are the kernel rows. None where `old` is not a permutation of
    /// 0..m.
    pub fn new(m: usize, kernel_rows: usize, old: impl Fn(usize) -> usize) -> Option<FitRows> {
        if kernel_rows > m {
            return None;
        }
        let mut at = vec![usize::MAX; kernel_rows];
        let mut kernel = vec![false; m];
        let mut seen = vec![false; m];
        for (i, k) in kernel.iter_mut().enumerate() {
            let o = old(i);
            if o >= m || std::mem::replace(&mut seen[o], true) {
                return None;
            }
            if o < kernel_rows {
                at[o] = i;
                *k = true;
            }
        }
        Some(FitRows { at, kernel })
    }

    /// The prepared rows.
    pub fn nrows(&self) -> usize {
        self.kernel.len()
    }

    /// Whether an x of `cols` values on an operator of `shape` (rows, columns) can be fitted.
    fn check(&self, cols: usize, shape: (usize, usize)) -> Result<()> {
        if shape != (self.nrows(), cols) {
            return Err(Error::Invalid(format!(
                "a fit of {} rows and {cols} columns on an operator of {} x {}",
                self.nrows(),
                shape.0,
                shape.1
            )));
        }
        Ok(())
    }

    /// The prepared rows from the first kernel row to the last (where a product's kernel rows
    /// are read from).
    fn span(&self) -> std::ops::Range<usize> {
        match (self.at.iter().min(), self.at.iter().max()) {
            (Some(&lo), Some(&hi)) => lo..hi + 1,
            _ => 0..0,
        }
    }

    /// 1 on the prepared rows that are not kernel rows, 0 on the others.
    fn others(&self) -> Vec<f64> {
        self.kernel
            .par_iter()
            .map(|&k| if k { 0.0 } else { 1.0 })
            .collect()
    }

    /// G x from `part`, the product's prepared rows from `lo` on.
    fn kernel_values(&self, part: &[f64], lo: usize) -> Vec<f64> {
        self.at
            .par_iter()
            .with_min_len(4096)
            .map(|&i| part[i - lo])
            .collect()
    }

    /// The fit of a product `y` of the prepared system (its prepared rows).
    pub fn fit(&self, y: &[f64]) -> Fit {
        assert_eq!(y.len(), self.kernel.len(), "a fit of the prepared rows");
        let gx = self.kernel_values(y, 0);
        let pieces: Vec<f64> = y
            .par_chunks(PIECE)
            .zip(self.kernel.par_chunks(PIECE))
            .map(|(v, k)| {
                v.iter()
                    .zip(k)
                    .filter(|(_, &k)| !k)
                    .map(|(a, _)| a * a)
                    .sum::<f64>()
            })
            .collect();
        Fit {
            gx,
            reg_norm: pieces.iter().sum::<f64>().sqrt(),
        }
    }
}

/// Fits of solutions on one operator ([`Fitter::fit`]), the product's buffers made once. The
/// norm of the other rows is summed where the product is (a mask of them applied there), and
/// only the rows that hold the kernel rows come back to the host (4.8 of 46 MB a solution for
/// the 101M-nonzero system).
pub struct Fitter<'a, B: Backend> {
    rows: &'a FitRows,
    span: std::ops::Range<usize>,
    /// The product, the other rows' part of it and their mask.
    bufs: Option<[B::Vector; 3]>,
    host: Vec<f64>,
}

impl<'a, B: Backend> Fitter<'a, B> {
    pub fn new(rows: &'a FitRows) -> Self {
        Fitter {
            rows,
            span: rows.span(),
            bufs: None,
            host: Vec::new(),
        }
    }

    /// The fit of `x` (the prepared columns) on `op`: one product on the operator's backend.
    pub fn fit<O: Operator<B>>(&mut self, be: &B, op: &O, x: &[f64]) -> Result<Fit> {
        let rows = self.rows;
        rows.check(x.len(), (op.nrows(), op.ncols()))?;
        let xv = be.upload(x)?;
        let [y, z, mask] = match &mut self.bufs {
            Some(b) => b,
            none => none.insert([
                be.zeros(op.nrows())?,
                be.zeros(op.nrows())?,
                be.upload(&rows.others())?,
            ]),
        };
        op.apply(be, Scale::SET, &xv, y)?;
        be.pointwise_mul(mask, y, z)?;
        let reg = be.norm_sq(z)?;
        let lo = self.span.start;
        self.host.resize(self.span.len(), 0.0);
        be.download_range(y, lo, &mut self.host)?;
        Ok(Fit {
            gx: rows.kernel_values(&self.host, lo),
            reg_norm: reg.sqrt(),
        })
    }
}

/// [`Fitter`] for the members of a batch: each member's x (the prepared columns) on the block
/// operator with its row weight, the blocks made once.
pub struct BlockFitter<'a, B: BatchBackend> {
    rows: &'a FitRows,
    blocks: Option<(B::Block, B::Block)>,
    /// Seconds spent so far.
    pub seconds: f64,
}

impl<'a, B: BatchBackend> BlockFitter<'a, B> {
    pub fn new(rows: &'a FitRows) -> Self {
        BlockFitter {
            rows,
            blocks: None,
            seconds: 0.0,
        }
    }

    /// The fit of `x` on `op` with row weight `w`.
    pub fn fit<O: BlockOperator<B>>(
        &mut self,
        be: &B,
        op: &O,
        (x, w): (&[f64], f64),
    ) -> Result<Fit> {
        let t = std::time::Instant::now();
        let rows = self.rows;
        rows.check(x.len(), (op.nrows(), op.ncols()))?;
        let (xb, yb) = match &mut self.blocks {
            Some(b) => b,
            none => none.insert((
                be.block_zeros(op.ncols(), 1)?,
                be.block_zeros(op.nrows(), 1)?,
            )),
        };
        be.block_set_column(xb, 0, x)?;
        let s = BlockScale {
            w: &[w],
            alpha: 1.0,
            beta: &[0.0],
        };
        op.apply_block(be, Side::A, s, xb, yb)?;
        let fit = rows.fit(&be.block_column(yb, 0)?);
        self.seconds += t.elapsed().as_secs_f64();
        Ok(fit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fit_puts_the_kernel_rows_back_and_sums_the_others() {
        // prepared row i is system row old[i]; kernel rows 0..3
        let old = [4, 2, 0, 5, 1, 3];
        let rows = FitRows::new(6, 3, |i| old[i]).unwrap();
        assert_eq!(rows.nrows(), 6);
        let y = [10.0, 3.0, 1.0, 2.0, 2.0, 4.0];
        let f = rows.fit(&y);
        // system rows 0, 1, 2 are prepared rows 2, 4, 1
        assert_eq!(f.gx, vec![1.0, 2.0, 3.0]);
        // the others: prepared rows 0, 3, 5 (values 10, 2, 4)
        assert_eq!(f.reg_norm, 120f64.sqrt());
    }

    #[test]
    fn rows_that_are_not_a_permutation_give_no_fit() {
        assert!(FitRows::new(3, 2, |i| [0, 0, 1][i]).is_none());
        assert!(FitRows::new(3, 2, |i| [0, 3, 1][i]).is_none());
        assert!(FitRows::new(2, 3, |i| i).is_none());
        let all = FitRows::new(3, 3, |i| i).unwrap();
        assert_eq!(all.fit(&[1.0, 2.0, 3.0]).reg_norm, 0.0);
    }
}
