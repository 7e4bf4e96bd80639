//! LSMR with its scalars on the GPU (one rank), as src/backend/cuda/lsqr_loop.rs is LSQR's:
//! blocks of iterations captured once as a CUDA graph and replayed, one host synchronisation
//! per block instead of three per iteration.
//!
//! A replay copies the state in (page-locked host -> device), runs up to `k` iterations (the
//! operator's fused products with their partial sums of squares, the step kernels of
//! kernels/lsmr.cu and the fused h / hbar / x update), normalises u and v, and copies the state
//! and the history records out. Each kernel does nothing once the state says stop, so an
//! iteration that stops early inside a block leaves the state the host loop would have left.

use std::mem::offset_of;

use cudarc::driver::{CudaFunction, CudaSlice};

use super::backend::CudaBackend;
use super::graph_loop::{Graphed, LoopState};
use super::lsqr_loop::{update_blocks, Epilogue, FusedLsqr, STEP_THREADS};
use super::util::arg;
use super::vector::THREADS;
use crate::backend::lsmr::{LsmrBlockCallback, LsmrDevice, LsmrLimits, LsmrScalars, LsmrVectors};
use crate::error::Result;

/// kernels/lsmr.cu's `LsmrState`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LsmrDevState {
    alpha: f64,
    beta: f64,
    normb: f64,
    zetabar: f64,
    alphabar: f64,
    rho: f64,
    rhobar: f64,
    cbar: f64,
    sbar: f64,
    zeta: f64,
    betadd: f64,
    betad: f64,
    rhodold: f64,
    tautildeold: f64,
    thetatilde: f64,
    d: f64,
    norma2: f64,
    maxrbar: f64,
    minrbar: f64,
    norma: f64,
    conda: f64,
    normx: f64,
    normr: f64,
    normar: f64,
    su: f64,
    sv: f64,
    c_av: [f64; 2],
    c_atu: [f64; 2],
    c_upd: [f64; 4],
    damp: f64,
    atol: f64,
    btol: f64,
    ctol: f64,
    itn: i64,
    istop: i64,
    iter_lim: i64,
    stop_at: i64,
    done: i32,
    skip_atu: i32,
    error: i32,
    pad: i32,
}
const _: () = assert!(std::mem::size_of::<LsmrDevState>() == 352);

// SAFETY: LsmrDevState is plain old data (f64, i64 and i32 fields, repr(C), no padding: 352
// bytes as asserted above), valid for any bit pattern the device writes.
unsafe impl cudarc::driver::DeviceRepr for LsmrDevState {}
// SAFETY: all-zero bits are a valid LsmrDevState.
unsafe impl cudarc::driver::ValidAsZeroBits for LsmrDevState {}

/// The scalars both ways: the host state with the limits into the device's, and back.
fn to_device(s: &LsmrScalars, lim: &LsmrLimits) -> LsmrDevState {
    LsmrDevState {
        alpha: s.alpha,
        beta: s.beta,
        normb: s.normb,
        zetabar: s.zetabar,
        alphabar: s.alphabar,
        rho: s.rho,
        rhobar: s.rhobar,
        cbar: s.cbar,
        sbar: s.sbar,
        zeta: s.zeta,
        betadd: s.betadd,
        betad: s.betad,
        rhodold: s.rhodold,
        tautildeold: s.tautildeold,
        thetatilde: s.thetatilde,
        d: s.d,
        norma2: s.norma2,
        maxrbar: s.maxrbar,
        minrbar: s.minrbar,
        norma: s.norma,
        conda: s.conda,
        normx: s.normx,
        normr: s.normr,
        normar: s.normar,
        su: 1.0,
        sv: 1.0,
        c_av: [1.0, -s.alpha],
        damp: lim.damp,
        atol: lim.atol,
        btol: lim.btol,
        ctol: lim.ctol,
        itn: s.itn as i64,
        istop: s.istop as i64,
        iter_lim: lim.maxiter as i64,
        stop_at: s.itn as i64,
        ..Default::default()
    }
}

fn to_host(d: &LsmrDevState, s: &mut LsmrScalars) {
    *s = LsmrScalars {
        itn: d.itn as usize,
        istop: d.istop as u32,
        alpha: d.alpha,
        beta: d.beta,
        normb: d.normb,
        zetabar: d.zetabar,
        alphabar: d.alphabar,
        rho: d.rho,
        rhobar: d.rhobar,
        cbar: d.cbar,
        sbar: d.sbar,
        zeta: d.zeta,
        betadd: d.betadd,
        betad: d.betad,
        rhodold: d.rhodold,
        tautildeold: d.tautildeold,
        thetatilde: d.thetatilde,
        d: d.d,
        norma2: d.norma2,
        maxrbar: d.maxrbar,
        minrbar: d.minrbar,
        norma: d.norma,
        conda: d.conda,
        normx: d.normx,
        normr: d.normr,
        normar: d.normar,
    };
}

impl LoopState for LsmrDevState {
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

/// The device buffers and the captured graph of one operator's LSMR loop.
pub(crate) type LsmrLoop = Graphed<LsmrDevState>;

/// Record one replay of `k` iterations on the stream (captured into a graph by the caller).
fn record_replay(
    g: &LsmrLoop,
    be: &CudaBackend,
    op: &dyn FusedLsqr,
    v: &LsmrVectors<CudaSlice<f64>>,
    k: usize,
) -> Result<()> {
    let (m, n) = (op.fused_rows(), op.fused_cols());
    let ps = be.ptr(&g.state);
    let pp = be.ptr(&g.partial);
    let prec = be.ptr(&g.rec);
    let at = |off: usize| ps + off as u64;
    let (pu, pv) = (be.ptr(&v.u), be.ptr(&v.v));
    let (ph, phb, px) = (be.ptr(&v.h), be.ptr(&v.hbar), be.ptr(&v.x));
    g.copy_in(be)?;
    let one = 1u32;
    let n64 = n as u64;
    let gu = update_blocks(n);
    let fused = |coef: usize, skip: usize| Epilogue::fused(at(coef), at(skip), pp);
    let step = |f: &CudaFunction, np: u32, more: &[*mut std::ffi::c_void]| {
        let mut args = [&[arg(&ps), arg(&pp), arg(&np)][..], more].concat();
        be.launch(f, one, STEP_THREADS, &mut args)
    };
    let (av, atu) = (
        fused(
            offset_of!(LsmrDevState, c_av),
            offset_of!(LsmrDevState, done),
        ),
        fused(
            offset_of!(LsmrDevState, c_atu),
            offset_of!(LsmrDevState, skip_atu),
        ),
    );
    for _ in 0..k {
        step(&be.k.lsmr_step1, op.av_fused(be, pv, pu, &av)?, &[])?;
        step(&be.k.lsmr_step2, op.atu_fused(be, pu, pv, &atu)?, &[])?;
        let mut args = [
            arg(&px),
            arg(&ph),
            arg(&phb),
            arg(&pv),
            arg(&n64),
            arg(&ps),
            arg(&pp),
        ];
        be.launch(&be.k.lsmr_update, gu, THREADS, &mut args)?;
        step(&be.k.lsmr_step3, gu, &[arg(&prec)])?;
    }
    let m64 = m as u64;
    be.launch_elementwise(
        &be.k.lsmr_normalize,
        m.max(n),
        &mut [arg(&pu), arg(&m64), arg(&pv), arg(&n64), arg(&ps)],
    )?;
    be.launch(&be.k.lsmr_rescaled, one, 32, &mut [arg(&ps)])?;
    g.copy_out(be)
}

/// Every fused operator runs LSMR on the device (one rank) through its loop slot's LSMR loop,
/// behind the same switch as its LSQR loop.
impl<T: FusedLsqr> LsmrDevice<CudaBackend> for T {
    fn iterate_lsmr(
        &self,
        be: &CudaBackend,
        lim: &LsmrLimits,
        (s, v): (&mut LsmrScalars, &mut LsmrVectors<CudaSlice<f64>>),
        boundary: usize,
        on_block: &mut LsmrBlockCallback<'_, CudaSlice<f64>>,
    ) -> Result<()> {
        let op: &dyn FusedLsqr = self;
        let slot = self.loop_slot();
        let mut guard = slot.lsmr.lock().unwrap_or_else(|e| e.into_inner());
        if s.itn >= lim.maxiter || s.istop != 0 {
            return Ok(());
        }
        let n = op.fused_cols();
        let partials = op.max_partials().max(update_blocks(n) as usize);
        let fits = guard
            .as_ref()
            .and_then(|b| b.downcast_ref::<LsmrLoop>())
            .is_some_and(|l| l.partial.len() >= partials);
        if !fits {
            *guard = Some(Box::new(LsmrLoop::new(be, partials)?));
        }
        let g = guard
            .as_mut()
            .and_then(|b| b.downcast_mut::<LsmrLoop>())
            .expect("set above");
        let k = slot.block();
        let key = vec![
            be.ptr(&v.u),
            be.ptr(&v.v),
            be.ptr(&v.h),
            be.ptr(&v.hbar),
            be.ptr(&v.x),
            k as u64,
        ];
        g.capture(be, key, |g| record_replay(g, be, op, v, k))?;
        let st = to_device(s, lim);
        g.run(be, st, (k, lim.maxiter, boundary), "LSMR", |st, recs| {
            to_host(st, s);
            on_block(recs, s, v)?;
            Ok(s.istop == 0 && s.itn < lim.maxiter)
        })
    }
}
