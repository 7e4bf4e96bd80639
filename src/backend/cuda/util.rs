//! Small helpers the kernels' launch wrappers share: kernel arguments, uploads, matrix values of
//! either precision, length checks.

use std::ffi::c_void;

use cudarc::driver::CudaSlice;

use super::backend::CudaBackend;
use super::error::Doing;
use crate::error::{Error, Result};
use crate::sparse::CompactValues;

/// A kernel argument: the address of a value that lives until the launch returns.
pub(crate) fn arg<T>(v: &T) -> *mut c_void {
    v as *const T as *mut c_void
}

/// An 8-byte by-value kernel argument: a size or device address, or an f64.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Word {
    U64(u64),
    F64(f64),
}

impl Word {
    /// The kernel argument: the address of the value (which lives as long as `self`).
    pub fn arg(&self) -> *mut c_void {
        match self {
            Word::U64(v) => arg(v),
            Word::F64(v) => arg(v),
        }
    }
}

/// Nonzeros (entries) one block of a fused product kernel aims at: 16384, fewer where that
/// would leave fewer than [`FUSED_MIN_BLOCKS`] blocks. One block writes one partial sum, so the
/// cap bounds the partials a step kernel adds on large systems; the floor keeps the GPU busy on
/// small ones (without it australia's 285k nonzeros made 17 blocks of 64 warp-serial segments;
/// docs/gpu.md, "Measured" on the device loop, has the timings).
pub(crate) fn fused_entries_per_block(total: usize) -> f64 {
    (total as f64 / FUSED_MIN_BLOCKS as f64).clamp(1.0, 16384.0)
}
/// Blocks a fused product aims for at least (8 blocks of 256 threads per SM of a 132-SM GPU).
const FUSED_MIN_BLOCKS: usize = 1024;

/// Matrix values on the device, f64 or f32.
pub(crate) enum DevValues {
    F64(CudaSlice<f64>),
    F32(CudaSlice<f32>),
}

impl DevValues {
    /// Compact storage's (or row patterns') values on the device.
    pub fn upload(be: &CudaBackend, v: &CompactValues) -> Result<Self> {
        Ok(match v {
            CompactValues::F64(v) => DevValues::F64(up(be, v)?),
            CompactValues::F32(v) => DevValues::F32(up(be, v)?),
        })
    }

    /// Matrix values on the device in `precision` (f32: each rounded once).
    pub fn of(be: &CudaBackend, v: &[f64], precision: crate::backend::Precision) -> Result<Self> {
        Ok(match precision {
            crate::backend::Precision::F64 => DevValues::F64(up(be, v)?),
            crate::backend::Precision::F32 => {
                let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                DevValues::F32(up(be, &v)?)
            }
        })
    }

    /// The kernel index of the values' precision (f64 = 0, f32 = 1) and their device address.
    pub fn index_and_ptr(&self, be: &CudaBackend) -> (usize, u64) {
        match self {
            DevValues::F64(v) => (0, be.ptr(v)),
            DevValues::F32(v) => (1, be.ptr(v)),
        }
    }
}

/// The kernel index of a sub-warp width (32, 16, 8, 4 -> 0..3; kernels/compact.cu, tiled.cu).
pub(super) fn width_index(s: u32) -> usize {
    match s {
        32 => 0,
        16 => 1,
        8 => 2,
        _ => 3,
    }
}

/// The kernels number a rank's rows with 32 bits.
pub(super) fn check_row_numbers(nrows: usize) -> Result<()> {
    if nrows >= u32::MAX as usize {
        return Err(Error::Invalid(format!(
            "cuda: {nrows} rows on one rank do not fit 32-bit row numbers; use more ranks"
        )));
    }
    Ok(())
}

/// The length check of a product with a `shape` = (rows, columns) matrix: the input has `got.0`
/// entries and must have `want.0`, the output `got.1` and `want.1`.
pub(super) fn check_vectors(
    what: &str,
    got: (usize, usize),
    want: (usize, usize),
    shape: (usize, usize),
) -> Result<()> {
    if got != want {
        return Err(Error::Invalid(format!(
            "cuda {what}: vectors of {} and {} for a {} x {} matrix",
            got.0, got.1, shape.0, shape.1
        )));
    }
    Ok(())
}

/// Arrays of at least this many bytes are uploaded through page-locked staging
/// ([`CudaBackend::upload_staged`]).
const STAGED_MIN: usize = 4 * super::backend::STAGE;

/// Upload a host slice (a one-element dummy for an empty one: no zero-byte allocations).
pub(super) fn up<T: cudarc::driver::DeviceRepr + Default + Copy>(
    be: &CudaBackend,
    v: &[T],
) -> Result<CudaSlice<T>> {
    if std::mem::size_of_val(v) >= STAGED_MIN {
        return be.upload_staged(v);
    }
    let dummy = [T::default()];
    let src = if v.is_empty() { &dummy[..] } else { v };
    be.stream
        .clone_htod(src)
        .doing_with(|| format!("uploading {} bytes", std::mem::size_of_val(src)))
}

/// [`up`] of `v` when `on`, else of the one-element dummy (a part of a layout not used).
pub(super) fn up_if<T: cudarc::driver::DeviceRepr + Default + Copy>(
    be: &CudaBackend,
    on: bool,
    v: &[T],
) -> Result<CudaSlice<T>> {
    up(be, if on { v } else { &[] })
}
