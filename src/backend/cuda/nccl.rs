//! NCCL between the GPUs of a job: the communicator, the halo exchange and the vector sums.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};

use cudarc::nccl::result::NcclError;

use super::error::{CudaError, Doing};
use crate::backend::AllreducePath;
use crate::comm::Comm;
use crate::error::{Error, Result};

/// An NCCL communicator that can live in the backend.
struct NcclComm(cudarc::nccl::safe::Comm);
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; the backend keeps it behind a Mutex, so only one thread uses it at a time.
unsafe impl Send for NcclComm {}

/// A backend's NCCL communicator over the job's GPUs, once set up (`setup_allreduce`).
#[derive(Default)]
pub(crate) struct Nccl(Mutex<Option<NcclComm>>);

impl Nccl {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<NcclComm>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`super::CudaBackend::setup_allreduce`] on `stream`.
    pub fn setup(
        &self,
        stream: &Arc<CudaStream>,
        comm: &dyn Comm,
        path: AllreducePath,
    ) -> Result<String> {
        if comm.size() <= 1 {
            return Ok("none (one rank)".into());
        }
        // SAFETY: only tries to dlopen libnccl; no NCCL call is made unless it loads.
        let here = path != AllreducePath::Host && unsafe { cudarc::nccl::sys::is_culib_present() };
        let everywhere = comm.allreduce_max(if here { 0.0 } else { 1.0 })? == 0.0;
        if !everywhere {
            if path == AllreducePath::Nccl {
                return Err(Error::backend(
                    "cuda",
                    "allreduce = nccl, but libnccl cannot be loaded on every rank (set LD_LIBRARY_PATH, or use allreduce = \"host\")",
                ));
            }
            return Ok("host (page-locked buffer + MPI_Allreduce)".into());
        }
        let mut id_bytes = Vec::new();
        let mut local_err = None;
        if comm.rank() == 0 {
            match cudarc::nccl::safe::Id::new() {
                Ok(id) => id_bytes = id.internal().iter().map(|&c| c as u8).collect(),
                Err(e) => local_err = Some(CudaError::during("ncclGetUniqueId", e)),
            }
        }
        comm.broadcast_bytes(0, &mut id_bytes)?;
        if id_bytes.len() != 128 {
            return Err(match local_err {
                Some(e) => e.into(),
                None => Error::backend("cuda", "rank 0 could not create an NCCL id"),
            });
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(&id_bytes) {
            *d = *s as std::ffi::c_char;
        }
        let id = cudarc::nccl::safe::Id::uninit(internal);
        let c = cudarc::nccl::safe::Comm::from_rank(stream.clone(), comm.rank(), comm.size(), id)
            .doing("ncclCommInitRank")?;
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(NcclComm(c));
        Ok("nccl (GPU to GPU)".into())
    }

    /// Whether NCCL is set up for this backend's communicator (halo and reductions GPU to GPU).
    pub fn ready(&self) -> bool {
        self.lock().is_some()
    }

    /// The point-to-point exchange of a halo GPU to GPU when NCCL is set up
    /// ([`super::CudaBackend::setup_allreduce`]): `send` holds the values for each rank in rank
    /// order (`send_counts`), `recv` receives from each rank in rank order (`recv_counts`).
    /// Returns false (nothing done) when there is no NCCL communicator.
    pub fn exchange(
        &self,
        send: Option<&CudaSlice<f64>>,
        send_counts: &[usize],
        recv: &mut CudaSlice<f64>,
        recv_offset: usize,
        recv_counts: &[usize],
    ) -> Result<bool> {
        let guard = self.lock();
        let Some(nc) = guard.as_ref() else {
            return Ok(false);
        };
        let err = |what: &str, e: NcclError| {
            CudaError::during(format!("NCCL {what} in the halo exchange"), e)
        };
        cudarc::nccl::result::group_start().map_err(|e| err("ncclGroupStart", e))?;
        // Every send and receive is queued before ncclGroupEnd launches them together; the
        // group must be closed whatever happens, so errors are collected first.
        let mut failed = None;
        if let Some(send) = send {
            let mut off = 0;
            for (r, &c) in send_counts.iter().enumerate() {
                if c > 0 && failed.is_none() {
                    if let Err(e) = nc.0.send(&send.slice(off..off + c), r as i32) {
                        failed = Some(err("ncclSend", e));
                    }
                }
                off += c;
            }
        }
        let mut off = recv_offset;
        for (r, &c) in recv_counts.iter().enumerate() {
            if c > 0 && failed.is_none() {
                if let Err(e) = nc.0.recv(&mut recv.slice_mut(off..off + c), r as i32) {
                    failed = Some(err("ncclRecv", e));
                }
            }
            off += c;
        }
        let end = cudarc::nccl::result::group_end().map_err(|e| err("ncclGroupEnd", e));
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(end.map(|_| true)?),
        }
    }

    /// `x` summed over the ranks in place, on the stream, GPU to GPU; false (nothing done) when
    /// there is no NCCL communicator.
    pub fn all_reduce<R: DevicePtrMut<f64>>(&self, x: &mut R) -> Result<bool> {
        let guard = self.lock();
        let Some(nc) = guard.as_ref() else {
            return Ok(false);
        };
        nc.0.all_reduce_in_place(x, &cudarc::nccl::safe::ReduceOp::Sum)
            .doing("ncclAllReduce")?;
        Ok(true)
    }
}
