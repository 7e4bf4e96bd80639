//! Stage 2, prepare: a rank's loaded rows become the system an operator stores: the storage
//! resolved for the backend, the grid's damping rows split off as stencils (compact storage),
//! rows and cells reordered for locality, the columns scaled when asked, x0 read and mapped to
//! the new order. Everything the solve needs to map its results back travels in [`Prepared`].

use std::path::PathBuf;
use std::time::Instant;

use crate::backend::storage::{self, Storage, StoredMatrix};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::grid::reorder::{Ordering, Reorder};
use crate::io::mtx;
use crate::sparse::{Csr, System};

/// How a rank's rows are laid out for the solve.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `Csr` or `Compact` (resolved for the backend: [`super::operators::resolve_storage`]).
    pub storage: Storage,
    pub reorder: Reorder,
    /// Cells along x, y, z when the unknowns are a regular grid's cells (Morton order, stencils).
    pub grid: Option<[usize; 3]>,
    /// Scale every column to unit norm over all ranks (the solution is scaled back).
    pub col_scale: bool,
    /// Starting guess x0 (a text or Matrix Market vector of n values).
    pub x0: Option<PathBuf>,
    /// What is left to a GPU run: compact rows as read for the GPU to reorder where it encodes
    /// them ([`storage::StoredRows::Reordered`]), and with them the ray coverage.
    pub deferred: storage::Deferred,
}

/// A rank's system ready for the operator factory, and what maps the solution back.
pub struct Prepared {
    /// The matrix as the operator will store it (scaled when asked).
    pub matrix: StoredMatrix,
    /// b in the stored row order.
    pub b: Vec<f64>,
    /// x0 in the new column order (scaled when the columns are).
    pub x0: Option<Vec<f64>>,
    /// What maps a solution back to the original columns.
    pub unmap: Unmap,
    /// Rows and nonzeros of the whole system over all ranks.
    pub m: usize,
    pub nnz: usize,
    /// Seconds this stage took on this rank.
    pub seconds: f64,
}

/// Column scale factors 1/||A_:j|| over all ranks (1 for empty columns).
pub fn column_scaling(a: &Csr, comm: &dyn Comm) -> Result<Vec<f64>> {
    let mut sq: Vec<f64> = a.column_norms().iter().map(|v| v * v).collect();
    comm.allreduce_sum(&mut sq)?;
    Ok(sq
        .iter()
        .map(|&s| if s > 0.0 { 1.0 / s.sqrt() } else { 1.0 })
        .collect())
}

/// Lay out `sys` as `layout` says (collective: the sizes and column norms are summed over
/// ranks). Grid damping rows (whole stencil blocks at the end of this rank's rows) become
/// stencils unless the columns are scaled.
pub fn prepare(sys: System, layout: &Layout, comm: &dyn Comm) -> Result<Prepared> {
    let t = Instant::now();
    finish(store(sys, layout), layout, comm, t)
}

/// The part of [`prepare`] that `seistomo prepare` keeps ([`super::prepared`]): the storage,
/// the stencil split and the ordering of this rank's rows.
pub fn store(sys: System, layout: &Layout) -> storage::Prepared {
    crate::backend::cpu::keep_freed_memory();
    crate::backend::cpu::set_up_on_heap();
    let System { a, b, kernel_rows } = sys;
    storage::prepare(
        a,
        b,
        kernel_rows,
        layout.grid,
        layout.storage,
        layout.reorder,
        !layout.col_scale,
        layout.deferred,
    )
}

/// The rest of [`prepare`] on a system already stored (or read back from prepared storage,
/// [`super::prepared`]): x0 read and mapped, the columns scaled when asked, the sizes summed
/// over ranks. `t`: when the stage started.
pub fn finish(
    stored: storage::Prepared,
    layout: &Layout,
    comm: &dyn Comm,
    t: Instant,
) -> Result<Prepared> {
    // (again, for a system read back from prepared storage: the outputs' buffers then reuse
    // each other's pages)
    crate::backend::cpu::keep_freed_memory();
    let storage::Prepared {
        mut matrix,
        b,
        ordering,
    } = stored;
    let n = matrix.ncols();
    let x0 = match &layout.x0 {
        Some(p) => {
            let _s = crate::ui::phases::span("x0");
            let x0 = mtx::read_vector(p)?;
            if x0.len() != n {
                return Err(Error::format(
                    p,
                    format!("x0 has {} values but the system has {n} columns", x0.len()),
                ));
            }
            Some(ordering.to_new(&x0))
        }
        None => None,
    };
    let scale = if layout.col_scale {
        let _s = crate::ui::phases::span("scale");
        Some(column_scaling(matrix.rows.csr()?, comm)?)
    } else {
        None
    };
    let x0 = match (&scale, x0) {
        (Some(d), Some(x0)) => Some(x0.iter().zip(d).map(|(x, d)| x / d).collect::<Vec<_>>()),
        (_, x0) => x0,
    };
    if let Some(d) = &scale {
        matrix.rows.csr()?.scale_columns(d);
    }
    let m = comm.allreduce_scalar(matrix.nrows() as f64)? as usize;
    let nnz = comm.allreduce_scalar(matrix.nnz() as f64)? as usize;
    Ok(Prepared {
        matrix,
        b,
        x0,
        unmap: Unmap { ordering, scale },
        m,
        nnz,
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// The column permutation and scaling a prepared system applied.
pub struct Unmap {
    /// The row and column permutation applied.
    pub ordering: Ordering,
    /// The column scale factors (1/||A_:j||), when the columns were scaled.
    pub scale: Option<Vec<f64>>,
}

impl Unmap {
    /// Map a solution (and its variance) of the prepared system back to the original one:
    /// unscale the columns, undo the column order.
    pub fn restore(&self, x: &mut Vec<f64>, var: Option<&mut Vec<f64>>) {
        let mut var = var;
        if let Some(d) = &self.scale {
            x.iter_mut().zip(d).for_each(|(x, d)| *x *= d);
            if let Some(v) = var.as_deref_mut() {
                v.iter_mut().zip(d).for_each(|(v, d)| *v *= d * d);
            }
        }
        if self.ordering.cols.is_some() {
            *x = self.ordering.to_old(x);
            if let Some(v) = var {
                *v = self.ordering.to_old(v);
            }
        }
    }
}
