//! The CUDA backend (cudarc 0.19, driver API, libraries loaded at run time).
//!
//! - [`probe`] checks that the CUDA driver, NVRTC, cuBLAS and cuSPARSE libraries can be loaded
//!   *before* any context is made (cudarc panics on a missing library), then that a device
//!   exists; it never panics and says why CUDA is not usable.
//! - The kernels live in `kernels/*.cu`, are embedded with `include_str!` and compiled once per
//!   process, device and set of preprocessor defines (`[tuning] nvrtc_defines`, src/settings/tuning.rs) by NVRTC
//!   for the device's architecture (`compute_XY` PTX, which the driver turns into machine code
//!   for `sm_XY`); the module is cached.
//! - Vectors are device buffers of f64 ([`DeviceVec`], a `CudaSlice<f64>`); only scalars come
//!   back to the host (one 8-byte copy per reduction). Reductions are single-launch and
//!   deterministic.
//! - [`CudaCsrOperator`] (operator.rs) holds the matrix (f64 or f32 values) and applies A^T by an
//!   explicit transposed copy, by f64 atomics, or through cuSPARSE.
//!
//! The files:
//! - device.rs: [`probe`], [`DeviceInfo`], [`missing_libraries`];
//! - nvrtc.rs: the kernel sources and the per-device module cache;
//! - backend.rs: [`CudaBackend`] (context, stream, kernels) and the kernel launch;
//! - vector.rs: `impl Backend for CudaBackend` and the vector kernels' launches;
//! - nccl.rs: the NCCL communicator, halo exchange and vector sums;
//! - peer.rs: the ranks' buffers mapped by each other (CUDA IPC), LSQR's sums on one node;
//! - error.rs: [`CudaError`], the typed errors, and their bridge to `crate::Error::Device`;
//! - util.rs: small helpers of the launch wrappers (uploads, kernel arguments, checks);
//! - csr.rs: CSR arrays on the device and their kernels; operator.rs, cusparse.rs:
//!   [`CudaCsrOperator`] and its memory plan;
//! - stencil.rs: damping stencils on the device; tiled.rs: column tiles; encode.rs: the
//!   tiles encoded on the device from uploaded CSR rows; compact.rs: [`CudaCompactOperator`]
//!   over delta rows or tiles, and the stencil;
//! - lsqr_loop.rs: the device-resident LSQR loop;
//! - block.rs: blocks of k vectors and [`CudaBlockOperator`], batched LSQR's products;
//! - square.rs, patterns.rs: GMRES's [`CudaSquareOperator`] and [`CudaIluSweeps`].

mod backend;
mod block;
mod compact;
mod csr;
mod cusparse;
mod device;
mod encode;
mod error;
mod graph_loop;
mod lsmr_loop;
mod lsqr_loop;
mod nccl;
mod nvrtc;
mod operator;
mod patterns;
mod peer;
mod square;
mod stencil;
mod sum_paths;
mod tiled;
mod util;
mod vector;

pub use backend::{end_head_start, head_start, CudaBackend, DeviceVec, Prestart, STAGE};
pub use block::{CudaBlock, CudaBlockOperator, MAX_MEMBERS};
pub use compact::{encode_ahead, encoding_key, CudaCompactOperator};
pub use csr::segments;
pub use device::{missing_libraries, probe, probe_device, DeviceInfo};
pub use encode::{encode_on_gpu, permute_on_gpu};
pub use error::CudaError;
pub use nccl::{communicators_made, EarlyNccl};
pub use operator::{plan_for, plan_memory, CudaCsrOperator, MemoryPlan};
pub use peer::peer_first;
pub use square::{CudaIluSweeps, CudaSquareOperator};
pub use sum_paths::SumTiming;
