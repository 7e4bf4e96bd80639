//! NCCL between the GPUs of a job: the communicator, the halo exchange and the vector sums.

use std::sync::{Arc, Mutex};

use std::ffi::{c_char, c_int, c_uint};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::result::{self, NcclError};
use cudarc::nccl::sys;

use super::error::{CudaError, Doing};
use crate::backend::AllreducePath;
use crate::comm::Comm;
use crate::error::{Error, Result};

const F64: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat64;

/// An NCCL communicator on the backend's stream that can live in the backend.
struct NcclComm {
    raw: sys::ncclComm_t,
    stream: Arc<CudaStream>,
    /// The job shape it was made for (the key it is kept under once its backend is dropped).
    key: EarlyKey,
}
// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; the backend keeps it behind a Mutex, so only one thread uses it at a time.
unsafe impl Send for NcclComm {}

impl NcclComm {
    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// `x` summed over the ranks in place, on `stream` (None: the communicator's).
    fn sum<R: DevicePtrMut<f64>>(
        &self,
        x: &mut R,
        stream: Option<&CudaStream>,
    ) -> std::result::Result<(), NcclError> {
        let count = x.len();
        let (ptr, _record) = x.device_ptr_mut(&self.stream);
        let on = stream.map_or_else(|| self.cu_stream(), |s| s.cu_stream() as sys::cudaStream_t);
        // SAFETY: `ptr` points at `count` f64 on this rank's device, alive while the stream
        // runs the sum (the caller's buffer outlives its use).
        unsafe { sum_in_place(self.raw, ptr, count, on) }
    }
}

/// `count` f64 at device address `ptr` summed over the ranks of `comm` in place, on `stream`.
///
/// # Safety
/// `ptr` must point at `count` f64 on the communicator's device, alive until `stream` has run
/// the sum; `comm` must be a live communicator.
unsafe fn sum_in_place(
    comm: sys::ncclComm_t,
    ptr: u64,
    count: usize,
    stream: sys::cudaStream_t,
) -> std::result::Result<(), NcclError> {
    // SAFETY: the caller's contract; NCCL allows in place.
    unsafe {
        result::all_reduce(
            ptr as _,
            ptr as _,
            count,
            F64,
            sys::ncclRedOp_t::ncclSum,
            comm,
            stream,
        )
    }
    .map(|_| ())
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // Kept for the next run of this process on the same device ([`KEPT`]); one kept
        // before under the same key is released (RawComm's drop aborts it).
        let raw = RawComm(std::mem::replace(&mut self.raw, std::ptr::null_mut()));
        let ordinal = self.stream.context().ordinal();
        let old = {
            let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
            let old = kept
                .iter()
                .position(|(k, o, _)| *k == self.key && *o == ordinal)
                .map(|at| kept.swap_remove(at));
            kept.push((self.key, ordinal, raw));
            old
        };
        drop(old);
    }
}

/// The communicators of backends that were dropped, with the job shape and the device each
/// was made for: the next backend of this process for the same shape and device takes its
/// communicator from here (every rank must have one: [`take_kept`]), and the process's exit
/// releases the rest. Releasing a communicator (ncclCommAbort) cost 0.2-0.5 s at the end of
/// every two-rank run on 2 x H100; making one 0.5-0.7 s.
static KEPT: Mutex<Vec<(EarlyKey, usize, RawComm)>> = Mutex::new(Vec::new());

/// Where this rank keeps a communicator for `key` on device `ordinal` (None: any device).
fn kept_at(
    kept: &[(EarlyKey, usize, RawComm)],
    key: EarlyKey,
    ordinal: Option<usize>,
) -> Option<usize> {
    kept.iter()
        .position(|(k, o, _)| *k == key && ordinal.is_none_or(|d| d == *o))
}

/// Collective: whether every rank keeps a communicator for `key` on device `ordinal` (None:
/// on whichever device).
fn kept_everywhere(comm: &dyn Comm, key: EarlyKey, ordinal: Option<usize>) -> Result<bool> {
    let mine = kept_at(
        &KEPT.lock().unwrap_or_else(|e| e.into_inner()),
        key,
        ordinal,
    )
    .is_some();
    crate::comm::on_every_rank(comm, mine)
}

/// Collective: this rank's kept communicator for `key` on device `ordinal`, taken where every
/// rank has one; else None on every rank.
fn take_kept(comm: &dyn Comm, key: EarlyKey, ordinal: usize) -> Result<Option<RawComm>> {
    if !kept_everywhere(comm, key, Some(ordinal))? {
        return Ok(None);
    }
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    Ok(kept_at(&kept, key, Some(ordinal)).map(|i| kept.swap_remove(i).2))
}

/// NCCL's communicator options as NCCL 2.17 laid them out (`ncclConfig_t` of nccl.h 2.17):
/// every later NCCL reads a configuration of an older version by its `version` field.
#[repr(C)]
struct ConfigV21700 {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// nccl.h's NCCL_CONFIG_UNDEF_INT: "NCCL's default".
const UNDEF: c_int = c_int::MIN;

impl ConfigV21700 {
    /// NCCL_CONFIG_INITIALIZER of nccl.h 2.17 with at most `max_ctas` thread blocks (channels)
    /// a collective or a point-to-point transfer.
    fn with_max_ctas(max_ctas: u32) -> Self {
        ConfigV21700 {
            size: std::mem::size_of::<ConfigV21700>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: UNDEF,
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: max_ctas as c_int,
            net_name: std::ptr::null(),
            split_share: UNDEF,
        }
    }
}

/// A communicator as NCCL made it, not yet on a stream.
struct RawComm(sys::ncclComm_t);
// SAFETY: made on one thread and handed once to the backend, which keeps it (as NcclComm)
// behind a Mutex; NCCL communicators may be used from any thread, one call at a time.
unsafe impl Send for RawComm {}

impl Drop for RawComm {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a communicator never adopted is released once, here (abort: never waits
            // for a peer).
            let _ = unsafe { result::comm_abort(self.0) };
        }
    }
}

impl RawComm {
    /// The communicator, handed on (this value no longer releases it).
    fn take(mut self) -> sys::ncclComm_t {
        std::mem::replace(&mut self.0, std::ptr::null_mut())
    }
}

/// Collective: whether NCCL carries the job's sums (libnccl on every rank, not `allreduce =
/// "host"`, and a GPU for each rank of its own: [`shares_a_gpu`]), and then rank 0's NCCL id,
/// broadcast. `allreduce = "nccl"` where one of those fails is an error.
fn exchange_id(
    comm: &dyn Comm,
    path: AllreducePath,
    ordinal: Option<usize>,
) -> Result<Option<sys::ncclUniqueId>> {
    // SAFETY: only tries to dlopen libnccl; no NCCL call is made unless it loads.
    let here = path != AllreducePath::Host && unsafe { cudarc::nccl::sys::is_culib_present() };
    if !crate::comm::on_every_rank(comm, here)? {
        if path == AllreducePath::Nccl {
            return Err(Error::backend(
                "cuda",
                "allreduce = nccl, but libnccl cannot be loaded on every rank (set LD_LIBRARY_PATH, or use allreduce = \"host\")",
            ));
        }
        return Ok(None);
    }
    if shares_a_gpu(comm, ordinal)? {
        if path == AllreducePath::Nccl {
            return Err(Error::backend(
                "cuda",
                "allreduce = nccl, but two ranks share a GPU (more ranks than GPUs on a node): NCCL needs a GPU per rank; use allreduce = \"auto\" or \"host\"",
            ));
        }
        if comm.is_root() && ordinal.is_some() {
            eprintln!("two ranks share a GPU (more ranks than GPUs on a node): NCCL needs a GPU per rank, so the sums go through the host");
        }
        return Ok(None);
    }
    let mut id_bytes = Vec::new();
    let mut local_err = None;
    if comm.rank() == 0 {
        match result::get_uniqueid() {
            Ok(id) => id_bytes = id.internal.iter().map(|&c| c as u8).collect(),
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
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    for (d, s) in id.internal.iter_mut().zip(&id_bytes) {
        *d = *s as c_char;
    }
    Ok(Some(id))
}

/// Collective: whether two ranks of the job use one GPU (NCCL refuses such a job: the rank
/// that shares fails its ncclCommInitRank while the others wait for it). This rank's GPU is
/// `ordinal`, or where None the one its place on the node gives ([`super::device::rank_ordinal`],
/// as the backend's start picks it). A rank whose GPU cannot be identified counts as one of
/// its own.
fn shares_a_gpu(comm: &dyn Comm, ordinal: Option<usize>) -> Result<bool> {
    let local = (comm.size() > 1).then(|| comm.local_rank());
    let identity = || {
        // SAFETY: only tries to dlopen the driver (cudarc panics at a driver call without it).
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return None;
        }
        let o = match ordinal {
            Some(o) => o,
            None => super::device::rank_ordinal(local).ok()?.0,
        };
        super::device::gpu_identity(o).ok()
    };
    let mine = identity().map_or_else(|| vec![1, comm.rank() as u64, 0], |[h, p]| vec![0, h, p]);
    let all = comm.alltoallv_u64(&vec![mine; comm.size()])?;
    Ok(all
        .iter()
        .enumerate()
        .any(|(i, a)| all[..i].iter().any(|b| b == a)))
}

/// Communicators this process has made (ncclCommInitRank calls that succeeded).
static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many NCCL communicators this process has made so far (a backend that takes one kept
/// from an earlier backend makes none): for tests and diagnostics.
pub fn communicators_made() -> usize {
    MADE.load(std::sync::atomic::Ordering::Relaxed)
}

/// This rank's communicator of the job `id` names (collective over the job's ranks, through
/// NCCL's own connections); the rank's GPU context must be current on this thread.
fn init_rank(
    id: sys::ncclUniqueId,
    rank: usize,
    size: usize,
    max_ctas: Option<u32>,
) -> Result<RawComm> {
    let (rank, size) = (rank as c_int, size as c_int);
    let mut raw = std::mem::MaybeUninit::uninit();
    match max_ctas {
        None => {
            // SAFETY: `raw` is written by NCCL on success; id and ranks are the job's.
            unsafe { result::comm_init_rank(raw.as_mut_ptr(), size, id, rank) }
                .doing("ncclCommInitRank")?;
        }
        Some(c) => {
            let mut config = ConfigV21700::with_max_ctas(c);
            // SAFETY: as above; `config` is a valid nccl.h 2.17 configuration (NCCL reads
            // it by its version field), alive for the call.
            unsafe {
                result::comm_init_rank_config(
                    raw.as_mut_ptr(),
                    size,
                    id,
                    rank,
                    (&mut config as *mut ConfigV21700).cast(),
                )
            }
            .doing("ncclCommInitRankConfig")?;
        }
    }
    MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: initialised by the successful call above.
    Ok(RawComm(unsafe { raw.assume_init() }))
}

/// (rank, ranks, max_ctas) of a communicator made ahead.
type EarlyKey = (usize, usize, Option<u32>);
type Made = std::sync::mpsc::Receiver<Result<RawComm>>;

/// The communicators being made ahead, with the job shape each is for (one per rank of this
/// process: ranks as threads share it).
static EARLY: Mutex<Vec<(EarlyKey, Made)>> = Mutex::new(Vec::new());

/// The communicator made ahead for `key`, if one is being made (the next setup takes it).
fn take_early(key: EarlyKey) -> Option<Made> {
    let mut slots = EARLY.lock().unwrap_or_else(|e| e.into_inner());
    let at = slots.iter().position(|(k, _)| *k == key)?;
    Some(slots.swap_remove(at).1)
}

/// An NCCL communicator to be made ahead of its backend, on the thread that makes the rank's
/// GPU context, while the rank reads its rows ([`EarlyNccl::start`] on every rank, then
/// [`EarlyNccl::make`] there): NCCL's start (0.5-0.7 s on 2 x H100) beside the read. The
/// backend's `setup_allreduce` for the same job takes it.
pub struct EarlyNccl {
    id: sys::ncclUniqueId,
    key: EarlyKey,
    made: std::sync::mpsc::Sender<Result<RawComm>>,
}

// SAFETY: the id is plain bytes; the sender is Send.
unsafe impl Send for EarlyNccl {}

impl EarlyNccl {
    /// Collective (every rank of a job of several, with the same `path`): NCCL's id exchanged
    /// as the backend's setup would; None where the sums will not go through NCCL.
    pub fn start(
        comm: &dyn Comm,
        path: AllreducePath,
        max_ctas: Option<u32>,
    ) -> Result<Option<EarlyNccl>> {
        if comm.size() <= 1 {
            return Ok(None);
        }
        let key = (comm.rank(), comm.size(), max_ctas);
        // (A run before this one in the process left its communicator: the setup takes it.)
        if path != AllreducePath::Host && kept_everywhere(comm, key, None)? {
            return Ok(None);
        }
        let Some(id) = exchange_id(comm, path, None)? else {
            return Ok(None);
        };
        let (made, rx) = std::sync::mpsc::channel();
        let mut slots = EARLY.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|(k, _)| *k != key);
        slots.push((key, rx));
        Ok(Some(EarlyNccl { id, key, made }))
    }

    /// Make the communicator with `ctx` current on this thread, and connect it: NCCL links
    /// the ranks at a communicator's first sum of each size class (0.2 s on 2 x H100), so a
    /// sum of one value and one of `WARM_VALUES` run here, beside the read, rather than in
    /// the first product. The result goes to the backend's setup, an error included; dropped
    /// unmade, the setup reports that.
    pub fn make(self, ctx: &Arc<cudarc::driver::CudaContext>) {
        let r = ctx
            .bind_to_thread()
            .doing("binding the GPU context")
            .and_then(|_| init_rank(self.id, self.key.0, self.key.1, self.key.2))
            .and_then(|raw| {
                warm(ctx, &raw)?;
                Ok(raw)
            });
        let _ = self.made.send(r);
    }
}

/// The values of the sum that connects a communicator made ahead for every size its job sums
/// (8 MiB of f64: NCCL's ring with its bulk protocol, as a vector of a million cells takes).
pub const WARM_VALUES: usize = 1 << 20;

/// One sum of one value and one of [`WARM_VALUES`] over `raw` on a stream of its own (collective).
fn warm(ctx: &Arc<cudarc::driver::CudaContext>, raw: &RawComm) -> Result<()> {
    let stream = ctx.new_stream().doing("creating a stream")?;
    let mut buf = stream
        .alloc_zeros::<f64>(WARM_VALUES)
        .doing("allocating the NCCL warm-up buffer")?;
    for count in [1, WARM_VALUES] {
        let (ptr, _record) = buf.device_ptr_mut(&stream);
        // SAFETY: `ptr` points at WARM_VALUES >= count f64 on this rank's device, alive until
        // the stream is synchronised below; `raw` is the live communicator just made.
        unsafe { sum_in_place(raw.0, ptr, count, stream.cu_stream() as sys::cudaStream_t) }
            .doing("ncclAllReduce (warm-up)")?;
    }
    stream.synchronize().doing("the NCCL warm-up")?;
    Ok(())
}

/// A backend's NCCL communicator over the job's GPUs, once set up (`setup_allreduce`).
#[derive(Default)]
pub(crate) struct Nccl(Mutex<Option<NcclComm>>);

impl Nccl {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<NcclComm>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`super::CudaBackend::setup_allreduce`] on `stream`. `max_ctas`: at most this many
    /// thread blocks per NCCL operation (None: NCCL's choice; needs NCCL >= 2.17). A
    /// communicator made ahead ([`EarlyNccl`]) for this job is taken instead of a new one.
    pub fn setup(
        &self,
        stream: &Arc<CudaStream>,
        comm: &dyn Comm,
        path: AllreducePath,
        max_ctas: Option<u32>,
    ) -> Result<String> {
        if comm.size() <= 1 {
            return Ok("none (one rank)".into());
        }
        let key = (comm.rank(), comm.size(), max_ctas);
        let ordinal = stream.context().ordinal();
        let kept = match path {
            AllreducePath::Host => None,
            _ => take_kept(comm, key, ordinal)?,
        };
        let raw = match (take_early(key), kept) {
            (Some(made), _) => made
                .recv()
                .map_err(|_| {
                    Error::backend("cuda", "the NCCL communicator made ahead was not made")
                })??
                .take(),
            (None, Some(kept)) => kept.take(),
            (None, None) => {
                let Some(id) = exchange_id(comm, path, Some(ordinal))? else {
                    return Ok("host (page-locked buffer + MPI_Allreduce)".into());
                };
                stream
                    .context()
                    .bind_to_thread()
                    .doing("binding the GPU context")?;
                init_rank(id, comm.rank(), comm.size(), max_ctas)?.take()
            }
        };
        *self.lock() = Some(NcclComm {
            raw,
            stream: stream.clone(),
            key,
        });
        Ok(match max_ctas {
            None => "nccl (GPU to GPU)".into(),
            Some(c) => format!("nccl (GPU to GPU, at most {c} thread blocks an operation)"),
        })
    }

    /// Whether NCCL is set up for this backend's communicator (halo and reductions GPU to GPU).
    pub fn ready(&self) -> bool {
        self.lock().is_some()
    }

    /// The point-to-point exchange of a halo GPU to GPU when NCCL is set up
    /// ([`super::CudaBackend::setup_allreduce`]): `send` holds the values for each rank in rank
    /// order (`send_counts`), `recv` receives from each rank in rank order (`recv_counts`),
    /// on `stream` (None: the backend's). Returns false (nothing done) when there is no NCCL
    /// communicator.
    pub fn exchange(
        &self,
        stream: Option<&CudaStream>,
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
        let on = stream.map_or_else(|| nc.cu_stream(), |s| s.cu_stream() as sys::cudaStream_t);
        cudarc::nccl::result::group_start().map_err(|e| err("ncclGroupStart", e))?;
        // Every send and receive is queued before ncclGroupEnd launches them together; the
        // group must be closed whatever happens, so errors are collected first.
        let mut failed = None;
        if let Some(send) = send {
            let mut off = 0;
            for (r, &c) in send_counts.iter().enumerate() {
                if c > 0 && failed.is_none() {
                    let v = send.slice(off..off + c);
                    let (ptr, _record) = v.device_ptr(&nc.stream);
                    // SAFETY: `ptr` points at c f64 on this rank's device, alive until the
                    // stream has run the send (the slice outlives the exchange's users).
                    let sent = unsafe { result::send(ptr as _, c, F64, r as c_int, nc.raw, on) };
                    if let Err(e) = sent {
                        failed = Some(err("ncclSend", e));
                    }
                }
                off += c;
            }
        }
        let mut off = recv_offset;
        for (r, &c) in recv_counts.iter().enumerate() {
            if c > 0 && failed.is_none() {
                let mut v = recv.slice_mut(off..off + c);
                let (ptr, _record) = v.device_ptr_mut(&nc.stream);
                // SAFETY: `ptr` points at c f64 of `recv` on this rank's device.
                let got = unsafe { result::recv(ptr as _, c, F64, r as c_int, nc.raw, on) };
                if let Err(e) = got {
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
        self.all_reduce_on(None, x)
    }

    /// [`Self::all_reduce`] on `stream` (None: the backend's), e.g. a side stream that sums
    /// one piece of a vector while the backend's stream computes the next.
    pub fn all_reduce_on<R: DevicePtrMut<f64>>(
        &self,
        stream: Option<&CudaStream>,
        x: &mut R,
    ) -> Result<bool> {
        let guard = self.lock();
        let Some(nc) = guard.as_ref() else {
            return Ok(false);
        };
        nc.sum(x, stream).doing("ncclAllReduce")?;
        Ok(true)
    }
}
