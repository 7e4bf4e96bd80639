//! LSQR with its scalars on the GPU: blocks of iterations captured once as a CUDA graph and
//! replayed, one host synchronisation per block instead of three per iteration.
//!
//! A replay copies the state in (page-locked host -> device), runs up to `k` iterations
//! (products with fused norms from the operator, the step kernels of kernels/lsqr.cu, the fused
//! x/w update), normalises u and v, and copies the state and the history records out. Each
//! kernel does nothing once the state says stop, so an iteration that stops early inside a
//! block leaves exactly the state the host loop would have left: the result is the same as
//! checking every iteration. Blocks end at multiples of the checkpoint interval, so checkpoints
//! and resumes see what the host loop would (resumes are bit-identical to uninterrupted runs).

use std::ffi::c_void;
use std::mem::offset_of;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream};

use super::backend::CudaBackend;
use super::error::Doing;
use super::peer::PeerBuffers;
use super::util::arg;
use super::vector::THREADS;
use crate::backend::lsqr::{BlockCallback, LsqrDevice, LsqrParams, LsqrScalars, LsqrVectors};
use crate::comm::Comm;
use crate::error::{Error, Result};

use super::graph_loop::{Graphed, LoopState, RECMAX};
/// Iterations per graph replay by default (tuning `lsqr_block`, 1..=RECMAX).
const BLOCK: usize = 32;
/// Pieces of A^T u on several ranks by default (tuning `atu_pieces`; more: each summed over
/// the ranks while the next is made). One: on two H100s joined by NVLink every further piece
/// cost about 0.02-0.07 ms an iteration more than its overlap saved, by NCCL and through the
/// ranks' memory alike (docs/performance.md, "Two GPUs").
const PIECES: usize = 1;
/// Threads of the step kernels (kernels/lsqr.cu STEP_THREADS).
pub(super) const STEP_THREADS: u32 = 1024;

/// kernels/lsqr.cu's `LsqrState`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DevState {
    alpha: f64,
    beta: f64,
    rhobar: f64,
    phibar: f64,
    bnorm: f64,
    anorm: f64,
    acond: f64,
    ddnorm: f64,
    res2: f64,
    xnorm: f64,
    xxnorm: f64,
    z: f64,
    cs2: f64,
    sn2: f64,
    rnorm: f64,
    r1norm: f64,
    r2norm: f64,
    arnorm: f64,
    su: f64,
    sv: f64,
    c_av: [f64; 2],
    c_atu: [f64; 2],
    c_upd: [f64; 4],
    phi: f64,
    rho: f64,
    theta: f64,
    tau: f64,
    psi: f64,
    damp: f64,
    atol: f64,
    btol: f64,
    ctol: f64,
    /// (1, 0): the epilogue of A^T u on several ranks (t = A^T u, summed over the ranks
    /// before lsqr_combine makes v of it).
    one_zero: [f64; 2],
    pad: f64,
    itn: i64,
    istop: i64,
    iter_lim: i64,
    stop_at: i64,
    done: i32,
    skip_atu: i32,
    error: i32,
    pad2: i32,
}
const _: () = assert!(std::mem::size_of::<DevState>() == 368);

// SAFETY: DevState is plain old data (f64, i64 and i32 fields, repr(C), no padding: 368 bytes as
// asserted above), valid for any bit pattern the device writes.
unsafe impl cudarc::driver::DeviceRepr for DevState {}
// SAFETY: all-zero bits are a valid DevState (zeros and null-free integers).
unsafe impl cudarc::driver::ValidAsZeroBits for DevState {}

impl DevState {
    fn from_scalars(s: &LsqrScalars, p: &LsqrParams, iter_lim: usize) -> DevState {
        DevState {
            alpha: s.alpha,
            beta: s.beta,
            rhobar: s.rhobar,
            phibar: s.phibar,
            bnorm: s.bnorm,
            anorm: s.anorm,
            acond: s.acond,
            ddnorm: s.ddnorm,
            res2: s.res2,
            xnorm: s.xnorm,
            xxnorm: s.xxnorm,
            z: s.z,
            cs2: s.cs2,
            sn2: s.sn2,
            rnorm: s.rnorm,
            r1norm: s.r1norm,
            r2norm: s.r2norm,
            arnorm: s.arnorm,
            su: 1.0,
            sv: 1.0,
            c_av: [1.0, -s.alpha],
            damp: p.damp,
            atol: p.atol,
            btol: p.btol,
            ctol: if p.conlim > 0.0 { 1.0 / p.conlim } else { 0.0 },
            one_zero: [1.0, 0.0],
            itn: s.itn as i64,
            istop: s.istop as i64,
            iter_lim: iter_lim as i64,
            stop_at: s.itn as i64,
            ..Default::default()
        }
    }

    fn to_scalars(self, s: &mut LsqrScalars) {
        s.itn = self.itn as usize;
        s.istop = self.istop as u32;
        s.alpha = self.alpha;
        s.beta = self.beta;
        s.rhobar = self.rhobar;
        s.phibar = self.phibar;
        s.bnorm = self.bnorm;
        s.anorm = self.anorm;
        s.acond = self.acond;
        s.ddnorm = self.ddnorm;
        s.res2 = self.res2;
        s.xnorm = self.xnorm;
        s.xxnorm = self.xxnorm;
        s.z = self.z;
        s.cs2 = self.cs2;
        s.sn2 = self.sn2;
        s.rnorm = self.rnorm;
        s.r1norm = self.r1norm;
        s.r2norm = self.r2norm;
        s.arnorm = self.arnorm;
    }
}

/// The epilogue arguments of the fused product kernels (kernels/compact.cu, tiled.cu), in their
/// order: y = a (A x) + b y (b == 0: y is not read), with (a, b) read from device memory at
/// `coef` instead when it is not 0, nothing done while the int at `skip` is nonzero (when not
/// 0), and the block partial sums of the new y^2 written to `partial` (when not 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Epilogue {
    pub a: f64,
    pub b: f64,
    pub coef: u64,
    pub skip: u64,
    pub partial: u64,
}

impl Epilogue {
    /// y = alpha A x + beta y, nothing fused.
    pub fn plain(alpha: f64, beta: f64) -> Self {
        Epilogue {
            a: alpha,
            b: beta,
            coef: 0,
            skip: 0,
            partial: 0,
        }
    }
    /// The device loop's products: coefficients at `coef`, guarded by `skip`, partials.
    pub fn fused(coef: u64, skip: u64, partial: u64) -> Self {
        Epilogue {
            a: 1.0,
            b: 0.0,
            coef,
            skip,
            partial,
        }
    }
    /// The kernel arguments a, b, coef, skip, partial (addresses into `self`).
    pub fn args(&self) -> [*mut c_void; 5] {
        [
            arg(&self.a),
            arg(&self.b),
            arg(&self.coef),
            arg(&self.skip),
            arg(&self.partial),
        ]
    }
    /// Launch the fused product kernel `f` on `grid` = (blocks, threads): its arguments are
    /// `lead`, the epilogue's five ([`Epilogue::args`]), then `tail`.
    pub fn launch(
        &self,
        be: &CudaBackend,
        f: &CudaFunction,
        (blocks, threads): (u32, u32),
        lead: &[*mut c_void],
        tail: &[*mut c_void],
    ) -> Result<()> {
        be.launch(f, blocks, threads, &mut [lead, &self.args(), tail].concat())
    }
}

/// An operator's products with LSQR's vector work fused in ([`Epilogue::fused`]): `u = c[0] A v
/// + c[1] u` and `v = c[0] A^T u + c[1] v` with the coefficients `c` read from device memory at
/// launch time, nothing done while the int at `skip` is nonzero, and the new vector's block
/// partial sums of squares written to `partial` (their count returned, in the order they must be
/// added). Every such operator is an [`LsqrDevice`] through its [`LoopSlot`].
pub(crate) trait FusedLsqr {
    fn fused_rows(&self) -> usize;
    fn fused_cols(&self) -> usize;
    /// The most partials either product writes.
    fn max_partials(&self) -> usize;
    fn av_fused(&self, be: &CudaBackend, v: u64, u: u64, e: &Epilogue) -> Result<u32>;
    fn atu_fused(&self, be: &CudaBackend, u: u64, v: u64, e: &Epilogue) -> Result<u32>;
    /// A^T u as [`Self::atu_fused`] (no partials: `e.partial` must be 0) made piece by piece
    /// of the columns `pieces` ([`column_pieces`]: the same on every rank), `done(piece)`
    /// called once each piece's columns are queued (the loop of several ranks sums a piece
    /// over them while the next is made). Operators that cannot cut their product make it
    /// whole before the first `done`.
    fn atu_in_pieces(
        &self,
        be: &CudaBackend,
        (u, v): (u64, u64),
        e: &Epilogue,
        pieces: &[Range<usize>],
        done: &mut dyn FnMut(Range<usize>) -> Result<()>,
    ) -> Result<()> {
        self.atu_fused(be, u, v, e)?;
        pieces.iter().try_for_each(|p| done(p.clone()))
    }
    /// The operator's device-loop switch and captured loop.
    fn loop_slot(&self) -> &LoopSlot;
}

/// A GPU operator's device-loop switch (`[backend] lsqr_loop`), its block size (tuning
/// `lsqr_block`) and its captured loop, shared by the CSR and compact operators.
pub(crate) struct LoopSlot {
    on: AtomicBool,
    block: AtomicUsize,
    /// Pieces of A^T u on several ranks (tuning `atu_pieces`).
    pieces: AtomicUsize,
    lp: std::sync::Mutex<Option<DeviceLoop>>,
    /// LSMR's loop (src/backend/cuda/lsmr_loop.rs's `LsmrLoop`), behind the same switch and
    /// block size; opaque here, so that the two loops' files do not import each other.
    pub(super) lsmr: std::sync::Mutex<Option<Box<dyn std::any::Any>>>,
}

impl Default for LoopSlot {
    fn default() -> Self {
        LoopSlot {
            on: AtomicBool::new(false),
            block: AtomicUsize::new(BLOCK),
            pieces: AtomicUsize::new(PIECES),
            lp: Default::default(),
            lsmr: Default::default(),
        }
    }
}

impl LoopSlot {
    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
    /// Iterations per replay of the loop's graph (None: the default, 32).
    pub fn set_block(&self, block: Option<usize>) -> Result<()> {
        let k = block.unwrap_or(BLOCK);
        check_lsqr_block(k)?;
        self.block.store(k, Ordering::Relaxed);
        Ok(())
    }
    pub(super) fn block(&self) -> usize {
        self.block.load(Ordering::Relaxed)
    }
    /// Pieces of A^T u on several ranks (None: the default, 1: the whole product, then its
    /// sum).
    pub fn set_pieces(&self, pieces: Option<usize>) -> Result<()> {
        let p = pieces.unwrap_or(PIECES);
        crate::settings::tuning::check_atu_pieces(p)?;
        self.pieces.store(p, Ordering::Relaxed);
        Ok(())
    }
    pub(super) fn pieces(&self) -> usize {
        self.pieces.load(Ordering::Relaxed)
    }
}

/// The device loop's block size is 1..=256 iterations (the history records kept on the device).
pub(super) fn check_lsqr_block(k: usize) -> Result<()> {
    if (1..=RECMAX).contains(&k) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "tuning lsqr_block = {k}: expected 1..={RECMAX}"
        )))
    }
}

/// The device buffers and the captured graph of one operator's loop.
pub(crate) struct DeviceLoop {
    g: Graphed<DevState>,
    /// Several ranks: A^T u of this rank's rows (n), and the sum of u^2 (1), each summed over
    /// the ranks inside the graph.
    ranks: Option<RankSums>,
}

impl LoopState for DevState {
    fn itn(&self) -> usize {
        self.itn as usize
    }
    fn error(&self) -> i32 {
        self.error
    }
    fn resume_until(&mut self, stop_at: usize) {
        self.done = 0;
        self.skip_atu = 0;
        self.error = 0;
        self.stop_at = stop_at as i64;
    }
}

/// How the device loop of several ranks sums A^T u and ||u||^2 over them: through the other
/// ranks' GPU memory (CUDA IPC, ranks on one node: kernels/lsqr.cu `lsqr_peer_*`), or by NCCL.
enum RankSums {
    /// The buffers, the columns they were made for, and the stream that combines the pieces
    /// of A^T u (tuning `atu_pieces` > 1) while the next is made.
    Peer(PeerBuffers, usize, Side),
    Nccl(NcclSums),
}

impl RankSums {
    /// Collective: the sums of a loop over `comm`'s ranks with `n` columns (None: one rank).
    /// Through peer memory where the backend's set-up found it possible, else NCCL.
    fn new(be: &CudaBackend, comm: &dyn Comm, n: usize) -> Result<Option<RankSums>> {
        if comm.size() <= 1 {
            return Ok(None);
        }
        if be.peer.is_on() {
            // Two slots, used by turns: A^T u's n values, then this rank's part of ||u||^2.
            if let Some(p) = PeerBuffers::new(&be.stream, comm, 2 * peer_slot_values(n))? {
                return Ok(Some(RankSums::Peer(p, n, Side::new(be)?)));
            }
            if !be.nccl.ready() {
                return Err(Error::backend(
                    "cuda",
                    "the ranks' GPUs could not map each other's buffers for LSQR's sums, and NCCL is not set up",
                ));
            }
        }
        NcclSums::new(be, comm.size(), n).map(|s| Some(RankSums::Nccl(s)))
    }

    /// Where this rank's A^T u is written before its sum in iteration `i` of a replay.
    fn atu(&self, be: &CudaBackend, i: usize) -> u64 {
        match self {
            RankSums::Peer(p, ..) => p.own_base() + peer_slot_offset(p, i),
            RankSums::Nccl(s) => be.ptr(&s.atu),
        }
    }

    /// (ranks, columns): a loop's sums are made again only where these change (the same on
    /// every rank, so every rank makes them again together).
    fn shape(&self) -> (usize, usize) {
        match self {
            RankSums::Peer(p, n, _) => (p.ranks, *n),
            RankSums::Nccl(s) => (s.ranks, s.n),
        }
    }
}

/// f64 of one slot of the peer buffers for `n` columns: A^T u, then ||u||^2's part, padded to
/// 256 bytes.
fn peer_slot_values(n: usize) -> usize {
    (n + 1).next_multiple_of(32)
}

/// Bytes from a peer buffer's start to the slot of iteration `i` of a replay (kernels/lsqr.cu:
/// the slots take turns).
fn peer_slot_offset(p: &PeerBuffers, i: usize) -> u64 {
    (super::peer::CTRL + (i % 2) * (p.values / 2) * 8) as u64
}

/// A second stream of the loop's graph beside the backend's, which goes on computing: work is
/// handed to it through `forked` ([`Side::hand_over`]), and the backend's stream waits for all
/// of it through `joined` ([`Side::join`]) before it needs the results.
struct Side {
    stream: Arc<CudaStream>,
    forked: CudaEvent,
    joined: CudaEvent,
}

impl Side {
    /// A stream at the highest priority (its blocks take the next free multiprocessors ahead
    /// of the product's) and its two events.
    fn new(be: &CudaBackend) -> Result<Side> {
        let (_, greatest) =
            cudarc::driver::result::stream::get_priority_range().doing("stream priorities")?;
        Ok(Side {
            stream: be
                .ctx
                .new_stream_with_priority(greatest)
                .doing("creating the sums' stream")?,
            forked: be.ctx.new_event(None).doing("creating an event")?,
            joined: be.ctx.new_event(None).doing("creating an event")?,
        })
    }

    /// Make the side stream wait for what the backend's stream has queued so far.
    fn hand_over(&self, be: &CudaBackend) -> Result<()> {
        wait_for(
            &self.stream,
            &be.stream,
            &self.forked,
            "a vector for the sums over the ranks",
        )
    }

    /// Make the backend's stream wait for what the side stream has queued so far.
    fn join(&self, be: &CudaBackend) -> Result<()> {
        wait_for(
            &be.stream,
            &self.stream,
            &self.joined,
            "the sums over the ranks",
        )
    }
}

/// The buffers NCCL sums over the ranks (see [`RankSums`]), and the stream that sums them
/// beside the backend's: the sum of u^2 and each piece of A^T u are handed to it, and the
/// backend's stream waits for all of them before it needs them.
struct NcclSums {
    ranks: usize,
    n: usize,
    atu: CudaSlice<f64>,
    usq: CudaSlice<f64>,
    side: Side,
}

/// Block partials the fused x/w update writes (its grid, as the backend's reductions).
pub(super) fn update_blocks(n: usize) -> u32 {
    n.div_ceil(THREADS as usize * 4).clamp(1, 1024) as u32
}

/// The arguments of the peer kernels of one iteration (kernels/lsqr.cu `lsqr_peer_*`): every
/// rank's buffer addresses, the ranks and this one, the iteration's slot, whether it is a
/// replay's first, the loop's state and partials.
struct PeerArgs {
    bases: u64,
    ranks: u32,
    me: u32,
    off: u64,
    first: u32,
    state: u64,
    partial: u64,
}

/// The epilogue of A^T u on several ranks: t = A^T u (coefficients (1, 0) from the loop's state
/// at `state`, no partials), nothing done while the int at `skip` bytes into the state is
/// nonzero.
fn raw_atu(state: u64, skip: usize) -> Epilogue {
    let at = |off: usize| state + off as u64;
    Epilogue::fused(at(offset_of!(DevState, one_zero)), at(skip), 0)
}

/// Blocks (and partials of v^2) of the combines of v on several ranks (kernels/lsqr.cu
/// `combine_cols`: [`COMBINE_COLS`] columns a block, whatever the pieces).
pub(super) fn combine_blocks(n: usize) -> u32 {
    n.div_ceil(COMBINE_COLS).max(1) as u32
}

impl NcclSums {
    /// The buffers and the sums' stream of a loop over `ranks` ranks with `n` columns.
    fn new(be: &CudaBackend, ranks: usize, n: usize) -> Result<NcclSums> {
        let st = &be.stream;
        Ok(NcclSums {
            ranks,
            n,
            atu: st
                .alloc_zeros::<f64>(n.max(1))
                .doing("device memory for A^T u")?,
            usq: st
                .alloc_zeros::<f64>(1)
                .doing("device memory for ||u||^2")?,
            side: Side::new(be)?,
        })
    }
}

impl DeviceLoop {
    /// Record one replay on the stream (captured into a graph by the caller).
    fn record_replay(
        g: &Graphed<DevState>,
        ranks: Option<&mut RankSums>,
        be: &CudaBackend,
        op: &dyn FusedLsqr,
        v: &LsqrVectors<CudaSlice<f64>>,
        (k, pieces): (usize, usize),
    ) -> Result<()> {
        let (m, n) = (op.fused_rows(), op.fused_cols());
        let ps = be.ptr(&g.state);
        let pp = be.ptr(&g.partial);
        let prec = be.ptr(&g.rec);
        let at = |off: usize| ps + off as u64;
        let (pu, pv, pw, px) = (be.ptr(&v.u), be.ptr(&v.v), be.ptr(&v.w), be.ptr(&v.x));
        let pvar = v.var.as_ref().map_or(0u64, |d| be.ptr(d));
        g.copy_in(be)?;
        let one = 1u32;
        let n64 = n as u64;
        let gu = update_blocks(n);
        let nb = combine_blocks(n);
        // A product's epilogue (coefficients at `coef`, skipped while `skip`) and the step
        // kernel that adds its `np` partials.
        let fused = |coef: usize, skip: usize| Epilogue::fused(at(coef), at(skip), pp);
        let step = |f: &CudaFunction, np: u32, more: &[*mut c_void]| {
            let mut args = [&[arg(&ps), arg(&pp), arg(&np)][..], more].concat();
            be.launch(f, one, STEP_THREADS, &mut args)
        };
        let (av, atu) = (
            fused(offset_of!(DevState, c_av), offset_of!(DevState, done)),
            fused(offset_of!(DevState, c_atu), offset_of!(DevState, skip_atu)),
        );
        // Several ranks with NCCL: A^T u into a buffer of its own (coefficients (1, 0), no
        // partials) before beta is known (u is kept unnormalised: lsqr_combine scales it),
        // guarded by `done` instead of `skip_atu` (which lsqr_step1 sets; an A^T u it would
        // skip is made and not used), summed over the ranks on the side stream, each piece
        // while the next is made. Through the ranks' memory: [`Self::record_peer_sums`].
        let raw_atu = raw_atu(ps, offset_of!(DevState, done));
        let mut sums = ranks;
        let cut = column_pieces(n, pieces);
        for i in 0..k {
            let patu = sums.as_ref().map_or(0, |r| r.atu(be, i));
            let np = op.av_fused(be, pv, pu, &av)?;
            match &mut sums {
                None => {
                    step(&be.k.lsqr_step1, np, &[])?;
                    step(&be.k.lsqr_step2, op.atu_fused(be, pu, pv, &atu)?, &[])?;
                }
                Some(RankSums::Peer(p, _, side)) => {
                    let peer = PeerArgs {
                        bases: be.ptr(&p.bases),
                        ranks: p.ranks as u32,
                        me: p.rank as u32,
                        off: peer_slot_offset(p, i),
                        first: u32::from(i == 0),
                        state: ps,
                        partial: pp,
                    };
                    Self::record_peer_sums(be, op, (&peer, side), (np, pu, pv, patu), &cut)?;
                    step(&be.k.lsqr_step2, nb, &[])?;
                }
                Some(RankSums::Nccl(r)) => {
                    Self::record_nccl_sums(be, op, r, (pp, np, pu, patu), (&raw_atu, &cut))?;
                    let np1 = 1u32;
                    let pusq = be.ptr(&r.usq);
                    let mut args = [arg(&ps), arg(&pusq), arg(&np1)];
                    be.launch(&be.k.lsqr_step1, one, STEP_THREADS, &mut args)?;
                    be.launch(
                        &be.k.lsqr_combine,
                        nb,
                        THREADS,
                        &mut [arg(&pv), arg(&patu), arg(&n64), arg(&ps), arg(&pp)],
                    )?;
                    step(&be.k.lsqr_step2, nb, &[])?;
                }
            }
            Self::record_update(be, (px, pw, pv, pvar, n64, ps, pp), gu, prec)?;
        }
        let m64 = m as u64;
        be.launch_elementwise(
            &be.k.lsqr_normalize,
            m.max(n),
            &mut [arg(&pu), arg(&m64), arg(&pv), arg(&n64), arg(&ps)],
        )?;
        be.launch(&be.k.lsqr_rescaled, one, 32, &mut [arg(&ps)])?;
        g.copy_out(be)
    }

    /// The sums of one iteration through the ranks' memory (kernels/lsqr.cu `lsqr_peer_*`),
    /// from the `np` partials of A v (||u||^2) and u (A^T u into this rank's slot `patu`),
    /// into v (with its partials of v^2 at `pp`). One piece in `cut`: A^T u whole, then one
    /// wait for every rank's ||u||^2 and A^T u, then the combine. Several: first the wait for
    /// ||u||^2 (beta), then each piece of A^T u published as it is made and combined on the
    /// side stream while the next is made (the combine waits for every rank's piece).
    fn record_peer_sums(
        be: &CudaBackend,
        op: &dyn FusedLsqr,
        (p, side): (&PeerArgs, &Side),
        (np, pu, pv, patu): (u32, u64, u64, u64),
        cut: &[Range<usize>],
    ) -> Result<()> {
        let one = 1u32;
        let n = op.fused_cols() as u64;
        // A^T u (coefficients (1, 0), no partials) before beta is known (u is kept
        // unnormalised: the combine scales it): whole, guarded by `done` (an A^T u that
        // lsqr_peer_step1 then skips is made and not used); in pieces, after beta, guarded by
        // `skip_atu`.
        let raw = |skip: usize| raw_atu(p.state, skip);
        let mut args = [
            arg(&p.partial),
            arg(&np),
            arg(&p.bases),
            arg(&p.ranks),
            arg(&p.me),
            arg(&n),
            arg(&p.off),
            arg(&p.first),
            arg(&p.state),
        ];
        be.launch(&be.k.lsqr_peer_usq, one, STEP_THREADS, &mut args)?;
        let step1 = || {
            let mut args = [
                arg(&p.state),
                arg(&p.bases),
                arg(&p.ranks),
                arg(&p.me),
                arg(&n),
                arg(&p.off),
            ];
            be.launch(&be.k.lsqr_peer_step1, one, 32, &mut args)
        };
        // v over the columns `cols` on `stream`; `piece` = j + 1 of piece j, 0: whole.
        let combine = |stream: &CudaStream, cols: Range<usize>, piece: u32| {
            let (c0, c1) = (cols.start as u64, cols.end as u64);
            let mut args = [
                arg(&pv),
                arg(&p.bases),
                arg(&p.ranks),
                arg(&p.me),
                arg(&c0),
                arg(&c1),
                arg(&p.off),
                arg(&piece),
                arg(&p.state),
                arg(&p.partial),
            ];
            let blocks = combine_blocks(cols.len());
            be.launch_on(
                stream,
                &be.k.lsqr_peer_combine,
                (blocks, THREADS, 0),
                &mut args,
            )
        };
        if cut.len() <= 1 {
            op.atu_fused(be, pu, patu, &raw(offset_of!(DevState, done)))?;
            step1()?;
            return combine(&be.stream, 0..n as usize, 0);
        }
        step1()?;
        let mut j = 0u32;
        op.atu_in_pieces(
            be,
            (pu, patu),
            &raw(offset_of!(DevState, skip_atu)),
            cut,
            &mut |cols| {
                let mut args = [arg(&p.bases), arg(&p.me), arg(&j), arg(&p.state)];
                be.launch(&be.k.lsqr_peer_piece, one, 32, &mut args)?;
                j += 1;
                if cols.is_empty() {
                    return Ok(()); // no columns (the same on every rank)
                }
                side.hand_over(be)?;
                combine(&side.stream, cols, j)
            },
        )?;
        side.join(be)
    }

    /// NCCL's sums of one iteration: ||u||^2 from the `np` partials of A v, then A^T u (made
    /// from `u` into `atu` with `raw`, piece by piece of `cut`), each summed on the side
    /// stream while the next is made; the backend's stream waits for all of them.
    fn record_nccl_sums(
        be: &CudaBackend,
        op: &dyn FusedLsqr,
        r: &mut NcclSums,
        (pp, np, pu, patu): (u64, u32, u64, u64),
        (raw, cut): (&Epilogue, &[Range<usize>]),
    ) -> Result<()> {
        let pusq = be.ptr(&r.usq);
        be.launch(
            &be.k.lsqr_sum,
            1,
            STEP_THREADS,
            &mut [arg(&pp), arg(&np), arg(&pusq)],
        )?;
        r.side.hand_over(be)?;
        be.nccl_sum_on(&r.side.stream, &mut r.usq)?;
        op.atu_in_pieces(be, (pu, patu), raw, cut, &mut |cols| {
            if cols.is_empty() {
                return Ok(()); // no columns (the same on every rank)
            }
            r.side.hand_over(be)?;
            let mut piece = r.atu.slice_mut(cols);
            be.nccl_sum_on(&r.side.stream, &mut piece)
        })?;
        r.side.join(be)
    }

    /// The fused x/w update and the third step kernel (the stopping tests and the history
    /// record at `prec`); the addresses are x, w, v, var, then n, the state and the partials.
    fn record_update(
        be: &CudaBackend,
        (px, pw, pv, pvar, n64, ps, pp): (u64, u64, u64, u64, u64, u64, u64),
        gu: u32,
        prec: u64,
    ) -> Result<()> {
        let mut args = [
            arg(&px),
            arg(&pw),
            arg(&pv),
            arg(&pvar),
            arg(&n64),
            arg(&ps),
            arg(&pp),
        ];
        be.launch(&be.k.lsqr_update_dev, gu, THREADS, &mut args)?;
        let mut args = [arg(&ps), arg(&pp), arg(&gu), arg(&prec)];
        be.launch(&be.k.lsqr_step3, 1, STEP_THREADS, &mut args)
    }
}

/// Make `waits` wait for what `first` has queued so far, through `ev` (`what`: for errors).
fn wait_for(waits: &CudaStream, first: &CudaStream, ev: &CudaEvent, what: &str) -> Result<()> {
    ev.record(first)
        .doing_with(|| format!("recording an event after {what}"))?;
    waits.wait(ev).doing_with(|| format!("waiting for {what}"))
}

/// Every fused operator runs LSQR on the device through its `LoopSlot`'s loop (captured on
/// first use); on several ranks where their GPUs' memory or NCCL sums over them inside the
/// graph.
impl<T: FusedLsqr> LsqrDevice<CudaBackend> for T {
    fn runs_on(&self, be: &CudaBackend, ranks: usize) -> bool {
        ranks == 1 || be.sums_on_device()
    }

    /// Run LSQR from `s`, `v` to a stop (see [`LsqrDevice::iterate`]).
    fn iterate(
        &self,
        be: &CudaBackend,
        params: &LsqrParams,
        (s, v): (&mut LsqrScalars, &mut LsqrVectors<CudaSlice<f64>>),
        (boundary, comm): (usize, &dyn Comm),
        on_block: &mut BlockCallback<'_, CudaSlice<f64>>,
    ) -> Result<()> {
        let ranks = comm.size();
        let op: &dyn FusedLsqr = self;
        let slot: &mut Option<DeviceLoop> = &mut self
            .loop_slot()
            .lp
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let n = op.fused_cols();
        let iter_lim = params.iter_lim.unwrap_or(2 * n);
        if s.itn >= iter_lim || s.istop != 0 || s.arnorm == 0.0 {
            return Ok(());
        }
        let k = self.loop_slot().block();
        let pieces = self.loop_slot().pieces();
        let partials = op
            .max_partials()
            .max(update_blocks(n) as usize)
            .max(combine_blocks(n) as usize);
        // The sums over the ranks are made again only where the job's shape changes (the same
        // on every rank: making them is collective); the graph's buffers where this rank's
        // operator needs more partials.
        let shape = (ranks > 1).then_some((ranks, n));
        let l = match slot {
            Some(l) => l,
            None => slot.insert(DeviceLoop {
                g: Graphed::new(be, partials)?,
                ranks: RankSums::new(be, comm, n)?,
            }),
        };
        if l.ranks.as_ref().map(RankSums::shape) != shape {
            l.ranks = None; // (the old buffers go first)
            l.ranks = RankSums::new(be, comm, n)?;
        }
        if l.g.partial.len() < partials {
            l.g = Graphed::new(be, partials)?;
        }
        let DeviceLoop { g, ranks: sums } = l;
        let key = vec![
            be.ptr(&v.u),
            be.ptr(&v.v),
            be.ptr(&v.w),
            be.ptr(&v.x),
            v.var.as_ref().map_or(0, |d| be.ptr(d)),
            k as u64,
            ranks as u64,
            pieces as u64,
            sums.as_ref().map_or(0, |r| r.atu(be, 0)),
        ];
        g.capture(be, key, |g| {
            DeviceLoop::record_replay(g, sums.as_mut(), be, op, v, (k, pieces))
        })?;
        let st = DevState::from_scalars(s, params, iter_lim);
        g.run(be, st, (k, iter_lim, boundary), "LSQR", |st, recs| {
            st.to_scalars(s);
            on_block(recs, s, v)?;
            Ok(s.istop == 0 && s.itn < iter_lim)
        })
    }
}

/// Columns a piece of A^T starts at a multiple of: the widest tile (2^12 columns: tuning
/// `tile_bits` <= 12) and a block of the tiles' column pass (kernels/tiled.cu: 1024 columns) both divide it, so the pieces
/// are the same on every rank whatever its layout.
pub(crate) const PIECE_ALIGN: usize = 1 << 12;
/// Columns of a block of the combines of v on several ranks (kernels/lsqr.cu `COMBINE_COLS`:
/// [`PIECE_ALIGN`] is a multiple, so the blocks of the pieces are the whole's). 1024 measured
/// as fast as the earlier grid-stride combine on two H100s (0.625-0.635 ms an LSQR iteration
/// at 101M nonzeros against 0.622-0.625); 4096 was 0.627-0.641.
pub(super) const COMBINE_COLS: usize = 1 << 10;

/// `ncols` columns cut into at most `pieces` pieces of about as many columns, in order, each
/// starting at a multiple of [`PIECE_ALIGN`] (fewer where the columns are too few): the same
/// on every rank (they depend on nothing else), so each piece's sum over the ranks has the
/// same length everywhere.
pub(crate) fn column_pieces(ncols: usize, pieces: usize) -> Vec<std::ops::Range<usize>> {
    let blocks = ncols.div_ceil(PIECE_ALIGN).max(1);
    let pieces = pieces.clamp(1, blocks);
    (0..pieces)
        .map(|p| {
            let at = |p: usize| (blocks * p / pieces * PIECE_ALIGN).min(ncols);
            at(p)..at(p + 1)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_pieces_cover_the_columns_on_aligned_boundaries() {
        for (ncols, pieces, want) in [
            (1_310_720, 4, 4),
            (1_310_720, 1, 1),
            (1_310_720, 64, 64),
            (2921, 4, 1),
            (9000, 4, 3),
            (0, 4, 1),
        ] {
            let out = column_pieces(ncols, pieces);
            assert_eq!(out.len(), want, "{ncols} {pieces}: {out:?}");
            assert_eq!(out[0].start, 0);
            assert_eq!(out.last().unwrap().end, ncols);
            for w in out.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].start < w[0].end);
                assert_eq!(w[0].end % PIECE_ALIGN, 0);
            }
            let sizes: Vec<usize> = out.iter().map(|r| r.len()).collect();
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(hi - lo <= PIECE_ALIGN || ncols < PIECE_ALIGN, "{sizes:?}");
        }
    }

    /// The combine's blocks of each piece are the whole combine's, in order: every piece
    /// starts on a block's first column, and the pieces' blocks add up to the whole's (so a
    /// block's partial of v^2 lands where the whole combine puts it). The kernels' block
    /// (kernels/lsqr.cu: COMBINE_PER values a thread, 256 threads) is COMBINE_COLS columns.
    #[test]
    fn the_pieces_combine_in_the_whole_combines_blocks() {
        assert_eq!(PIECE_ALIGN % COMBINE_COLS, 0);
        let src = include_str!("../../../kernels/lsqr.cu");
        let per: usize = src
            .lines()
            .find_map(|l| l.strip_prefix("#define COMBINE_PER "))
            .expect("kernels/lsqr.cu defines COMBINE_PER")
            .trim()
            .parse()
            .unwrap();
        assert_eq!(256 * per, COMBINE_COLS);
        for ncols in [1, 1023, 1024, 1025, 9000, 16_384, 1_310_720, 1_310_721] {
            for pieces in [1, 2, 3, 4, 7, 64] {
                let out = column_pieces(ncols, pieces);
                let blocks: u32 = out.iter().map(|p| combine_blocks(p.len())).sum();
                assert_eq!(blocks, combine_blocks(ncols), "{ncols} {pieces}: {out:?}");
                assert!(out.iter().all(|p| p.start % COMBINE_COLS == 0));
            }
        }
    }
}
