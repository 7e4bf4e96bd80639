//! What LSQR's and LSMR's device loops share (src/backend/cuda/lsqr_loop.rs, lsmr_loop.rs):
//! the state in device memory and its page-locked host copy, the partial sums and the history
//! records, the captured CUDA graph of one replay (a block of iterations), and the host's loop
//! over replays (each ends where the state says: a stop, the iteration limit, or the block's
//! end), with the records of each replay handed on.

use cudarc::driver::{
    sys as dsys, CudaGraph, CudaSlice, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};

use super::backend::CudaBackend;
use super::error::Doing;
use crate::backend::lsqr::IterRecord;
use crate::error::{Error, Result};

/// Doubles per history record and records kept on the device (kernels/lsqr.cu LSQR_REC,
/// LSQR_RECMAX).
pub(super) const REC: usize = 8;
pub(super) const RECMAX: usize = crate::settings::tuning::MAX_LSQR_BLOCK;

/// A device loop's state as the host reads it between replays (kernels/lsqr.cu `LsqrState`,
/// kernels/lsmr.cu `LsmrState`).
pub(super) trait LoopState: DeviceRepr + ValidAsZeroBits + Copy + Default {
    fn itn(&self) -> usize;
    /// 0, or what was not finite: 1 beta, 2 alpha, 3 a norm estimate.
    fn error(&self) -> i32;
    /// Ready the state for a replay that pauses at iteration `stop_at` (nothing done, no
    /// error, A^T u not skipped).
    fn resume_until(&mut self, stop_at: usize);
}

/// The first iteration a replay from `itn` must pause at: a block of `k` further, the limit,
/// or the next multiple of `boundary` (when > 0: where the caller wants to see the vectors).
fn next_stop(itn: usize, k: usize, limit: usize, boundary: usize) -> usize {
    let mut next = (itn + k).min(limit);
    if let Some(blocks) = itn.checked_div(boundary) {
        next = next.min((blocks + 1) * boundary);
    }
    next
}

/// The buffers and the captured graph of one device loop.
pub(super) struct Graphed<S: LoopState> {
    pub state: CudaSlice<S>,
    pub partial: CudaSlice<f64>,
    pub rec: CudaSlice<f64>,
    host_state: PinnedHostSlice<S>,
    host_rec: PinnedHostSlice<f64>,
    /// Their addresses, taken once (reading them waits on an event, which a capture forbids).
    host_state_ptr: usize,
    host_rec_ptr: usize,
    /// What the graph was captured for (vectors, block size, ...).
    key: Vec<u64>,
    graph: Option<CudaGraph>,
}

impl<S: LoopState> Graphed<S> {
    /// The buffers, with room for `partials` partial sums.
    pub fn new(be: &CudaBackend, partials: usize) -> Result<Self> {
        let st = &be.stream;
        // SAFETY: the page-locked buffers are fully written (the state before each replay, the
        // history by the graph's copy) before they are read. Flags 0: ordinary (not
        // write-combined) page-locked memory, which the host reads fast.
        let mut host_state = unsafe { be.ctx.alloc_pinned_with_flags::<S>(1, 0) }
            .doing("page-locked memory for the solver state")?;
        // SAFETY: as above.
        let mut host_rec = unsafe { be.ctx.alloc_pinned_with_flags::<f64>(REC * RECMAX, 0) }
            .doing("page-locked memory for the solver history")?;
        let host_state_ptr = host_state.as_mut_ptr().doing("page-locked state")? as usize;
        let host_rec_ptr = host_rec.as_mut_ptr().doing("page-locked history")? as usize;
        Ok(Graphed {
            state: st
                .alloc_zeros::<S>(1)
                .doing("device memory for the solver state")?,
            partial: st
                .alloc_zeros::<f64>(partials.max(1))
                .doing("device memory for partial sums")?,
            rec: st
                .alloc_zeros::<f64>(REC * RECMAX)
                .doing("device memory for the solver history")?,
            host_state,
            host_rec,
            host_state_ptr,
            host_rec_ptr,
            key: Vec::new(),
            graph: None,
        })
    }

    /// Record the copy of the host's state into the device's (a replay's first step).
    pub fn copy_in(&self, be: &CudaBackend) -> Result<()> {
        let hs = self.host_state_ptr as *const S;
        // SAFETY: `hs` is a live page-locked S owned by self (it outlives the graph, which self
        // also owns); the device buffer holds one S.
        unsafe {
            dsys::cuMemcpyHtoDAsync_v2(
                be.ptr(&self.state),
                hs as *const _,
                size_of::<S>(),
                be.stream.cu_stream(),
            )
            .result()
            .doing("copying the solver state in")
        }
    }

    /// Record the copies of the state and the history records out (a replay's last step).
    pub fn copy_out(&self, be: &CudaBackend) -> Result<()> {
        let (hs, hr) = (self.host_state_ptr as *mut S, self.host_rec_ptr as *mut f64);
        let cs = be.stream.cu_stream();
        // SAFETY: both host buffers are live page-locked allocations of the copied sizes,
        // owned by self; the device buffers hold one S and REC * RECMAX f64.
        unsafe {
            dsys::cuMemcpyDtoHAsync_v2(hs as *mut _, be.ptr(&self.state), size_of::<S>(), cs)
                .result()
                .doing("copying the solver state out")?;
            dsys::cuMemcpyDtoHAsync_v2(
                hr as *mut _,
                be.ptr(&self.rec),
                size_of::<f64>() * REC * RECMAX,
                cs,
            )
            .result()
            .doing("copying the solver history out")
        }
    }

    /// Capture the graph of one replay, which `record` records on the stream, unless the
    /// graph for `key` is there already.
    pub fn capture(
        &mut self,
        be: &CudaBackend,
        key: Vec<u64>,
        record: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        if self.graph.is_some() && self.key == key {
            return Ok(());
        }
        self.graph = None;
        be.synchronize()?;
        be.stream
            .begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .doing("starting a graph capture")?;
        let recorded = record(self);
        let graph = be
            .stream
            .end_capture(dsys::CUgraphInstantiate_flags(0))
            .doing("capturing the solver's graph");
        recorded?;
        self.graph =
            Some(graph?.ok_or_else(|| {
                Error::backend("cuda", "capturing the solver's graph gave no graph")
            })?);
        self.key = key;
        Ok(())
    }

    /// Replay the graph from `st` until it stops: each replay pauses at the next block end
    /// (`k` iterations, `limit`, `boundary`: [`next_stop`]); after each, `after` gets the state
    /// and the replay's history records and says whether to go on (false: the solve stopped).
    /// A norm that is not finite, or a replay that made no progress, is an error naming
    /// `method`.
    pub fn run(
        &mut self,
        be: &CudaBackend,
        mut st: S,
        (k, limit, boundary): (usize, usize, usize),
        method: &str,
        mut after: impl FnMut(&S, &[IterRecord]) -> Result<bool>,
    ) -> Result<()> {
        let mut recs = Vec::with_capacity(k);
        loop {
            let before = st.itn();
            st.resume_until(next_stop(before, k, limit, boundary));
            self.host_state.as_mut_slice().doing("page-locked state")?[0] = st;
            self.graph
                .as_ref()
                .ok_or_else(|| Error::backend("cuda", "the solver's graph was not captured"))?
                .launch()
                .doing("launching the solver's graph")?;
            be.synchronize()?;
            st = self.host_state.as_slice().doing("page-locked state")?[0];
            let h = self.host_rec.as_slice().doing("page-locked history")?;
            recs.clear();
            recs.extend((before + 1..=st.itn()).map(|itn| {
                let r = &h[(itn % RECMAX) * REC..(itn % RECMAX + 1) * REC];
                IterRecord {
                    itn,
                    r1norm: r[1],
                    r2norm: r[2],
                    arnorm: r[3],
                    anorm: r[4],
                    acond: r[5],
                    xnorm: r[6],
                    seconds: 0.0,
                }
            }));
            if st.error() == 4 {
                return Err(Error::backend(
                    "cuda",
                    format!(
                        "{method}, iteration {}: a sum over the ranks: {}",
                        st.itn(),
                        super::peer::PEER_TIMEOUT
                    ),
                ));
            }
            if st.error() != 0 {
                let what = match st.error() {
                    1 => "||u|| (beta)",
                    2 => "||v|| (alpha)",
                    _ => "a norm estimate",
                };
                return Err(Error::Invalid(format!(
                    "{method}: {what} is not finite at iteration {} (values overflow f64: check the matrix, the right-hand side and damp)",
                    st.itn()
                )));
            }
            if !after(&st, &recs)? {
                return Ok(());
            }
            if st.itn() == before {
                return Err(Error::backend(
                    "cuda",
                    format!("the {method} graph made no progress at iteration {before}"),
                ));
            }
        }
    }
}
