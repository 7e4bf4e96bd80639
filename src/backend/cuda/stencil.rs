//! Grid damping rows as stencils on the GPU ([`DevStencil`], kernels/compact.cu): the block
//! descriptions and renumbering tables a kernel reads instead of stored rows.

use cudarc::driver::CudaSlice;

use super::backend::CudaBackend;
use super::lsqr_loop::Epilogue;
use super::util::{arg, up};
use crate::error::{Error, Result};
use crate::grid::stencil::BlockKind;
use crate::grid::StencilOp;

/// A block of stencil rows as kernels/compact.cu's `StencilBlock`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StencilBlockArg {
    w: f64,
    row0: u64,
    lo: [u32; 3],
    dims: [u32; 3],
    kind: i32,
    axis: i32,
}

/// kernels/compact.cu's `StencilArgs`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StencilArgs {
    b: [StencilBlockArg; 7],
    new_of_old: u64,
    old_of_new: u64,
    n: [u32; 3],
    nblocks: i32,
}

/// The stencil arguments of a kernel that may add the stencil rows' transposed terms: whether
/// it does, the stencil, and the address of the stencil rows' part of y (zeros without).
pub(crate) fn stencil_parts(st: Option<(&StencilArgs, u64)>) -> (bool, StencilArgs, u64) {
    match st {
        Some((s, yd)) => (true, *s, yd),
        None => (false, StencilArgs::default(), 0u64),
    }
}

/// Threads per block and rows per thread of the stencil kernels.
const STENCIL_THREADS: u32 = 256;
const STENCIL_ROWS_PER_THREAD: u64 = 4;

/// Stencil rows on the device: the block descriptions and the renumbering tables.
pub(crate) struct DevStencil {
    pub(super) args: StencilArgs,
    pub(super) nrows: u64,
    _tables: Option<(CudaSlice<u32>, CudaSlice<u32>)>,
}

impl DevStencil {
    pub(super) fn upload(be: &CudaBackend, op: &StencilOp) -> Result<Self> {
        let st = op.stencil();
        if op.blocks().len() > 7 || st.ncells() >= u32::MAX as usize {
            return Err(Error::Invalid("cuda: stencil too large".into()));
        }
        let mut args = StencilArgs {
            n: [st.n[0] as u32, st.n[1] as u32, st.n[2] as u32],
            nblocks: op.blocks().len() as i32,
            ..Default::default()
        };
        for (d, b) in args.b.iter_mut().zip(op.blocks()) {
            let (kind, axis) = match b.kind {
                BlockKind::Norm => (0, 0),
                BlockKind::First(a) => (1, a as i32),
                BlockKind::Second(a) => (2, a as i32),
            };
            *d = StencilBlockArg {
                w: b.weight,
                row0: b.row0 as u64,
                lo: b.lo.map(|v| v as u32),
                dims: b.dims.map(|v| v as u32),
                kind,
                axis,
            };
        }
        let tables = match (op.new_of_old(), op.old_of_new()) {
            (Some(p), Some(q)) => {
                let (p, q) = (up(be, p)?, up(be, q)?);
                args.new_of_old = be.ptr(&p);
                args.old_of_new = be.ptr(&q);
                Some((p, q))
            }
            _ => None,
        };
        Ok(DevStencil {
            args,
            nrows: op.nrows() as u64,
            _tables: tables,
        })
    }

    pub(super) fn blocks(&self, rows: u64) -> u32 {
        rows.div_ceil(STENCIL_THREADS as u64 * STENCIL_ROWS_PER_THREAD) as u32
    }

    pub(super) fn av(&self, be: &CudaBackend, x: u64, y: u64, e: &Epilogue) -> Result<()> {
        let lead = [arg(&self.args), arg(&self.nrows), arg(&x), arg(&y)];
        let grid = (self.blocks(self.nrows), STENCIL_THREADS);
        e.launch(be, &be.k.stencil_av, grid, &lead, &[])
    }
}
