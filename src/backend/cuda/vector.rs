//! The vector kernels: `impl Backend for CudaBackend` and the launches of the element-wise,
//! reduction and batched Gram-Schmidt kernels (kernels/vector.cu).

use std::ffi::c_void;

use cudarc::driver::{CudaFunction, CudaSlice};

use super::backend::{CudaBackend, DeviceVec, MULTI_MAX, RED_MAX_BLOCKS};
use super::error::Doing;
use super::peer::{PeerBuffers, CTRL, PEER_TIMEOUT};
use super::util::{arg, Word};
use crate::backend::{Backend, Measure, ScalarSlots, XwState, XwStep};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// Threads per block of the element-wise and reduction kernels.
pub(super) const THREADS: u32 = 256;
/// Elements per thread a reduction aims at before adding blocks.
const RED_PER_THREAD: usize = 4;

/// Where the coefficients of a batched Gram-Schmidt launch come from: by value from the host,
/// or from device memory (GMRES's device-resident Arnoldi cycle).
#[derive(Clone, Copy)]
enum Coeffs<'a> {
    Host(&'a [f64]),
    Device(u64),
}

impl<'a> Coeffs<'a> {
    /// The kernel's two coefficient arguments: the by-value ones (empty: zeros) and the device
    /// address (0: use the by-value ones).
    fn args(self) -> (&'a [f64], u64) {
        match self {
            Coeffs::Host(c) => (c, 0),
            Coeffs::Device(p) => (&[], p),
        }
    }
}

impl CudaBackend {
    fn elementwise_grid(&self, n: usize) -> u32 {
        let max = (self.info.multiprocessors.max(1) as usize) * 16;
        n.div_ceil(THREADS as usize).clamp(1, max) as u32
    }

    /// Launch a grid-stride element-wise kernel over `n` entries (THREADS per block).
    pub(crate) fn launch_elementwise(
        &self,
        f: &CudaFunction,
        n: usize,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.launch(f, self.elementwise_grid(n), THREADS, args)
    }

    /// [`Self::launch_elementwise`] of a kernel whose arguments are `n` (u64), then `words`
    /// (at most 7).
    pub(crate) fn elementwise(&self, f: &CudaFunction, n: usize, words: &[Word]) -> Result<()> {
        assert!(
            words.len() < 8,
            "an element-wise kernel takes n and at most 7 words"
        );
        let n64 = n as u64;
        let mut args = [std::ptr::null_mut(); 8];
        args[0] = arg(&n64);
        for (a, w) in args[1..].iter_mut().zip(words) {
            *a = w.arg();
        }
        self.launch_elementwise(f, n, &mut args[..=words.len()])
    }

    /// Launch a single-launch reduction over `n` entries (kernels/vector.cu): `args`, then the
    /// partial-sum buffer, the ticket counter and where the result goes; returns the result.
    fn reduce(&self, f: &CudaFunction, n: usize, args: &[*mut c_void]) -> Result<f64> {
        self.reduce_to(f, n, args, self.result_ptr())?;
        self.read_result()
    }

    /// [`Self::reduce`] without waiting: the result goes to device address `pr`.
    fn reduce_to(&self, f: &CudaFunction, n: usize, args: &[*mut c_void], pr: u64) -> Result<()> {
        let (pp, pc) = (self.ptr(&self.partial), self.ptr(&self.counter));
        let mut all = [args, &[arg(&pp), arg(&pc), arg(&pr)]].concat();
        self.launch(f, Self::reduction_grid(n), THREADS, &mut all)
    }

    fn reduction_grid(n: usize) -> u32 {
        n.div_ceil(THREADS as usize * RED_PER_THREAD)
            .clamp(1, RED_MAX_BLOCKS) as u32
    }

    /// Where a reduction kernel writes its result.
    fn result_ptr(&self) -> u64 {
        match &self.mapped {
            Some(m) => m.device,
            None => self.ptr(&self.result),
        }
    }

    /// The reduction result on the host (waits for the stream).
    fn read_result(&self) -> Result<f64> {
        if let Some(m) = &self.mapped {
            self.synchronize()?;
            // SAFETY: `m.host` is the live page-locked word the finished kernel wrote.
            return Ok(unsafe { std::ptr::read_volatile(m.host as *const f64) });
        }
        let mut h = [0.0f64];
        self.stream
            .memcpy_dtoh(&self.result, &mut h)
            .doing("copying a scalar to the host")?;
        self.synchronize()?;
        Ok(h[0])
    }

    /// One launch of the batched Gram-Schmidt reduction (`mode` as in vector.cu's multi_dot)
    /// over at most MULTI_MAX basis vectors of length `n`, with w at device address `pw`
    /// (written only in modes 1 and 2); the results land in `out`.
    fn multi_launch(
        &self,
        basis: &[CudaSlice<f64>],
        coeffs: Option<&[f64]>,
        mode: i32,
        pw: u64,
        n: usize,
        out: &mut [f64],
    ) -> Result<()> {
        let nout = if mode == 2 { 1 } else { basis.len() };
        let pr = match &self.multi_mapped {
            Some(m) => m.device,
            None => self.ptr(&self.multi_result),
        };
        self.multi_launch_to(basis, Coeffs::Host(coeffs.unwrap_or(&[])), mode, pw, n, pr)?;
        self.read_multi(&mut out[..nout])
    }

    /// [`Backend::lsqr_update`]'s launch without waiting: ||d_k||^2 written to device address
    /// `pr`.
    fn lsqr_update_to(
        &self,
        k: XwStep,
        v: &DeviceVec,
        s: XwState<'_, DeviceVec>,
        pr: u64,
    ) -> Result<()> {
        let (XwStep { t1, t2, inv_rho }, XwState { x, w, var }) = (k, s);
        let n = x.len();
        self.check_len("lsqr_update", w.len(), n)?;
        self.check_len("lsqr_update", v.len(), n)?;
        let pvar = match var {
            Some(var) => {
                self.check_len("lsqr_update", var.len(), n)?;
                self.ptr(var)
            }
            None => 0u64,
        };
        let (px, pw, pv, n64) = (self.ptr(x), self.ptr(w), self.ptr(v), n as u64);
        self.reduce_to(
            &self.k.lsqr_update,
            n,
            &[
                arg(&px),
                arg(&pw),
                arg(&pv),
                arg(&t1),
                arg(&t2),
                arg(&inv_rho),
                arg(&pvar),
                arg(&n64),
            ],
            pr,
        )
    }

    /// Device address of result slot `j` (< MULTI_MAX) of the batched reductions.
    fn multi_slot(&self, j: usize) -> u64 {
        debug_assert!(j < MULTI_MAX);
        let base = match &self.multi_mapped {
            Some(m) => m.device,
            None => self.ptr(&self.multi_result),
        };
        base + (j * std::mem::size_of::<f64>()) as u64
    }

    /// The first `out.len()` (<= MULTI_MAX) result slots on the host, once the stream's work
    /// is done (one wait).
    fn read_multi(&self, out: &mut [f64]) -> Result<()> {
        let nout = out.len();
        debug_assert!(nout <= MULTI_MAX);
        if let Some(m) = &self.multi_mapped {
            self.synchronize()?;
            for (j, o) in out.iter_mut().enumerate() {
                // SAFETY: `m.host` holds MULTI_MAX page-locked f64 that the finished kernels
                // wrote; j < nout <= MULTI_MAX.
                *o = unsafe { std::ptr::read_volatile((m.host as *const f64).add(j)) };
            }
        } else {
            self.stream
                .memcpy_dtoh(&self.multi_result.slice(..nout), out)
                .doing("copying results to the host")?;
            self.synchronize()?;
        }
        Ok(())
    }

    /// [`Self::multi_launch`] without waiting: the coefficients by value or from device
    /// memory, the results written to device address `pr`.
    fn multi_launch_to(
        &self,
        basis: &[CudaSlice<f64>],
        coeffs: Coeffs<'_>,
        mode: i32,
        pw: u64,
        n: usize,
        pr: u64,
    ) -> Result<()> {
        let k = basis.len();
        debug_assert!(k <= MULTI_MAX && k > 0);
        let (host, cdev) = coeffs.args();
        let (ptrs, c) = self.multi_args("multi_dot", basis, host, n)?;
        let (k32, n64) = (k as i32, n as u64);
        let (pp, pc) = (self.ptr(&self.multi_partial), self.ptr(&self.counter));
        self.launch(
            // the kernel with the fewest slots that hold k vectors
            &self.k.multi_dot[k.next_power_of_two().trailing_zeros() as usize],
            Self::reduction_grid(n),
            THREADS,
            &mut [
                arg(&ptrs),
                arg(&k32),
                arg(&c),
                arg(&cdev),
                arg(&mode),
                arg(&pw),
                arg(&n64),
                arg(&pp),
                arg(&pc),
                arg(&pr),
            ],
        )
    }

    /// The by-value kernel arguments of at most MULTI_MAX basis vectors of length `n`: their
    /// device addresses and (zero-padded) coefficients.
    fn multi_args(
        &self,
        what: &str,
        basis: &[CudaSlice<f64>],
        coeffs: &[f64],
        n: usize,
    ) -> Result<([u64; MULTI_MAX], [f64; MULTI_MAX])> {
        let mut ptrs = [0u64; MULTI_MAX];
        for (p, b) in ptrs.iter_mut().zip(basis) {
            self.check_len(what, b.len(), n)?;
            *p = self.ptr(b);
        }
        let mut c = [0f64; MULTI_MAX];
        let m = coeffs.len().min(MULTI_MAX);
        c[..m].copy_from_slice(&coeffs[..m]);
        Ok((ptrs, c))
    }

    /// w -= sum_j coeffs[j] basis[j] in launches of at most MULTI_MAX vectors (in j order).
    fn multi_axpy_chunks(
        &self,
        coeffs: &[f64],
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
    ) -> Result<()> {
        for (bs, cs) in basis.chunks(MULTI_MAX).zip(coeffs.chunks(MULTI_MAX)) {
            let k = bs.len().min(cs.len());
            self.multi_axpy_launch(&bs[..k], Coeffs::Host(cs), w)?;
        }
        Ok(())
    }

    /// [`Self::multi_axpy_chunks`] with the coefficients in device memory at `pc`.
    fn multi_axpy_chunks_dev(
        &self,
        pc: u64,
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
    ) -> Result<()> {
        for (i, bs) in basis.chunks(MULTI_MAX).enumerate() {
            let at = pc + (8 * i * MULTI_MAX) as u64;
            self.multi_axpy_launch(bs, Coeffs::Device(at), w)?;
        }
        Ok(())
    }

    /// GMRES's device-resident update with the coefficients at sc[coef_at..]: w -= sum_j c_j
    /// basis_j, then the k inner products basis_j . w (`mode` 1) or ||w||^2 (`mode` 2) written
    /// to sc[out_at..]. One launch for at most MULTI_MAX vectors (as the host-coefficient
    /// multi_axpy_dot / multi_axpy_norm_sq), else the update in chunks and the products after.
    fn multi_axpy_to(
        &self,
        what: &str,
        mode: i32,
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
        sc: &mut CudaSlice<f64>,
        (coef_at, out_at): (usize, usize),
    ) -> Result<()> {
        let k = basis.len();
        let pc = self.scalar_ptr(what, sc, coef_at, k)?;
        let pr = self.scalar_ptr(what, sc, out_at, if mode == 2 { 1 } else { k })?;
        let (pw, n) = (self.ptr(w), w.len());
        if mode == 1 && k == 0 {
            return Ok(());
        }
        if k == 0 || k > MULTI_MAX {
            self.multi_axpy_chunks_dev(pc, basis, w)?;
            if mode == 1 {
                return self.multi_dot_to(basis, w, sc, out_at);
            }
            // the dot kernel's norm
            let n64 = n as u64;
            return self.reduce_to(&self.k.dot, n, &[arg(&pw), arg(&pw), arg(&n64)], pr);
        }
        self.multi_launch_to(basis, Coeffs::Device(pc), mode, pw, n, pr)
    }

    /// One multi_axpy launch over at most MULTI_MAX vectors.
    fn multi_axpy_launch(
        &self,
        bs: &[CudaSlice<f64>],
        coeffs: Coeffs<'_>,
        w: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let n = w.len();
        let (host, cdev) = coeffs.args();
        let (ptrs, c) = self.multi_args("multi_axpy", bs, host, n)?;
        let (k32, n64, pw) = (bs.len() as i32, n as u64, self.ptr(w));
        self.launch_elementwise(
            &self.k.multi_axpy,
            n,
            &mut [
                arg(&ptrs),
                arg(&k32),
                arg(&c),
                arg(&cdev),
                arg(&pw),
                arg(&n64),
            ],
        )
    }

    /// Device address of `sc[at]`, checked against its length (`len` entries from there).
    pub(super) fn scalar_ptr(
        &self,
        what: &str,
        sc: &CudaSlice<f64>,
        at: usize,
        len: usize,
    ) -> Result<u64> {
        if at + len > sc.len() {
            return Err(Error::Invalid(format!(
                "cuda {what}: scalars {at}..{} of a buffer of {}",
                at + len,
                sc.len()
            )));
        }
        Ok(self.ptr(sc) + 8 * at as u64)
    }
    /// out[k] = x[idx[k]] on the device.
    pub(crate) fn gather(
        &self,
        idx: &CudaSlice<u32>,
        x: &CudaSlice<f64>,
        out: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.check_len("gather", idx.len(), out.len())?;
        let ptrs = [self.ptr(idx), self.ptr(x), self.ptr(out)];
        self.elementwise(&self.k.gather, idx.len(), &ptrs.map(Word::U64))
    }

    /// y[idx[k]] = s.alpha t[k] + s.beta y[idx[k]] on the device (a split product's rows put
    /// back; t holds the plain row sums).
    pub(crate) fn scatter_rows(
        &self,
        idx: &CudaSlice<u32>,
        t: &CudaSlice<f64>,
        y: &mut CudaSlice<f64>,
        s: crate::backend::Scale,
    ) -> Result<()> {
        self.check_len("scatter_rows", idx.len(), t.len())?;
        let [pi, pt, py] = [self.ptr(idx), self.ptr(t), self.ptr(y)].map(Word::U64);
        let words = [pi, pt, py, Word::F64(s.alpha), Word::F64(s.beta)];
        self.elementwise(&self.k.scatter_rows, idx.len(), &words)
    }

    fn check_len(&self, what: &str, got: usize, want: usize) -> Result<()> {
        if got != want {
            return Err(Error::Invalid(format!(
                "cuda {what}: vector lengths differ ({got} vs {want})"
            )));
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Vector = DeviceVec;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn describe(&self) -> String {
        format!("cuda {}", self.info)
    }
    fn zeros(&self, n: usize) -> Result<CudaSlice<f64>> {
        self.stream
            .alloc_zeros::<f64>(n)
            .doing_with(|| format!("allocating {n} f64 on the device"))
    }
    fn upload(&self, x: &[f64]) -> Result<CudaSlice<f64>> {
        self.stream
            .clone_htod(x)
            .doing("copying a vector to the device")
    }
    fn download(&self, x: &CudaSlice<f64>, out: &mut [f64]) -> Result<()> {
        self.check_len("download", out.len(), x.len())?;
        self.stream
            .memcpy_dtoh(x, out)
            .doing("copying a vector to the host")?;
        self.synchronize()
    }
    fn download_range(&self, x: &CudaSlice<f64>, start: usize, out: &mut [f64]) -> Result<()> {
        let part = crate::backend::range_in(start, out.len(), x.len())?;
        self.stream
            .memcpy_dtoh(&x.slice(part), out)
            .doing("copying part of a vector to the host")?;
        self.synchronize()
    }
    fn len(&self, x: &CudaSlice<f64>) -> usize {
        x.len()
    }
    fn copy(&self, src: &CudaSlice<f64>, dst: &mut CudaSlice<f64>) -> Result<()> {
        self.check_len("copy", src.len(), dst.len())?;
        self.stream.memcpy_dtod(src, dst).doing("device copy")
    }
    fn fill(&self, x: &mut CudaSlice<f64>, value: f64) -> Result<()> {
        let words = [Word::F64(value), Word::U64(self.ptr(x))];
        self.elementwise(&self.k.fill, x.len(), &words)
    }
    fn scale(&self, x: &mut CudaSlice<f64>, a: f64) -> Result<()> {
        let words = [Word::F64(a), Word::U64(self.ptr(x))];
        self.elementwise(&self.k.scale, x.len(), &words)
    }
    fn copy_scaled(&self, a: f64, x: &CudaSlice<f64>, y: &mut CudaSlice<f64>) -> Result<()> {
        self.check_len("copy_scaled", x.len(), y.len())?;
        let words = [Word::F64(a), Word::U64(self.ptr(x)), Word::U64(self.ptr(y))];
        self.elementwise(&self.k.copy_scaled, x.len(), &words)
    }
    fn axpby(&self, a: f64, x: &CudaSlice<f64>, b: f64, y: &mut CudaSlice<f64>) -> Result<()> {
        self.check_len("axpby", x.len(), y.len())?;
        let (px, py) = (Word::U64(self.ptr(x)), Word::U64(self.ptr(y)));
        let words = [Word::F64(a), px, Word::F64(b), py];
        self.elementwise(&self.k.axpby, x.len(), &words)
    }
    fn pointwise_mul(&self, x: &DeviceVec, y: &DeviceVec, z: &mut DeviceVec) -> Result<()> {
        self.check_len("pointwise_mul", x.len(), y.len())?;
        self.check_len("pointwise_mul", x.len(), z.len())?;
        let ptrs = [self.ptr(x), self.ptr(y), self.ptr(z)];
        self.elementwise(&self.k.pmul, x.len(), &ptrs.map(Word::U64))
    }
    fn dot(&self, x: &CudaSlice<f64>, y: &CudaSlice<f64>) -> Result<f64> {
        self.check_len("dot", x.len(), y.len())?;
        let (n, px, py) = (x.len() as u64, self.ptr(x), self.ptr(y));
        self.reduce(&self.k.dot, x.len(), &[arg(&px), arg(&py), arg(&n)])
    }
    fn norm_sq(&self, x: &CudaSlice<f64>) -> Result<f64> {
        self.dot(x, x)
    }
    fn lsqr_update(&self, k: XwStep, v: &DeviceVec, s: XwState<DeviceVec>) -> Result<f64> {
        self.lsqr_update_to(k, v, s, self.result_ptr())?;
        self.read_result()
    }
    fn lsqr_update_many(
        &self,
        ks: &[XwStep],
        v: &DeviceVec,
        states: Vec<XwState<'_, DeviceVec>>,
    ) -> Result<Vec<f64>> {
        if ks.len() != states.len() {
            return Err(Error::Invalid(format!(
                "lsqr_update_many: {} steps for {} members",
                ks.len(),
                states.len()
            )));
        }
        let mut out = vec![0.0; ks.len()];
        let mut states = states.into_iter();
        // Each member's update is `lsqr_update`'s launch (the same bits), its result in a slot
        // of the batched reductions: one wait for up to MULTI_MAX members.
        for (kc, oc) in ks.chunks(MULTI_MAX).zip(out.chunks_mut(MULTI_MAX)) {
            for (j, &k) in kc.iter().enumerate() {
                let s = states.next().expect("as many states as steps (checked)");
                self.lsqr_update_to(k, v, s, self.multi_slot(j))?;
            }
            self.read_multi(oc)?;
        }
        Ok(out)
    }
    fn multi_dot(
        &self,
        basis: &[CudaSlice<f64>],
        w: &CudaSlice<f64>,
        out: &mut [f64],
    ) -> Result<()> {
        self.check_len("multi_dot", out.len(), basis.len())?;
        // Mode 0 only reads w.
        let (pw, n) = (self.ptr(w), w.len());
        for (bs, o) in basis.chunks(MULTI_MAX).zip(out.chunks_mut(MULTI_MAX)) {
            self.multi_launch(bs, None, 0, pw, n, o)?;
        }
        Ok(())
    }
    fn multi_axpy(
        &self,
        coeffs: &[f64],
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.check_len("multi_axpy", coeffs.len(), basis.len())?;
        self.multi_axpy_chunks(coeffs, basis, w)
    }
    fn multi_axpy_measure(
        &self,
        then: Measure,
        coeffs: &[f64],
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
        out: &mut [f64],
    ) -> Result<()> {
        let (what, outs, mode) = match then {
            Measure::Dots => ("multi_axpy_dot", basis.len(), 1),
            Measure::NormSq => ("multi_axpy_norm_sq", 1, 2),
        };
        self.check_len(what, coeffs.len(), basis.len())?;
        self.check_len(what, out.len(), outs)?;
        if basis.is_empty() && then == Measure::Dots {
            return Ok(());
        }
        if basis.is_empty() || basis.len() > MULTI_MAX {
            self.multi_axpy_chunks(coeffs, basis, w)?;
            return match then {
                Measure::Dots => self.multi_dot(basis, w, out),
                Measure::NormSq => {
                    out[0] = self.norm_sq(w)?;
                    Ok(())
                }
            };
        }
        let (pw, n) = (self.ptr(w), w.len());
        self.multi_launch(basis, Some(coeffs), mode, pw, n, out)
    }
    fn allreduce_sum(&self, comm: &dyn Comm, x: &mut CudaSlice<f64>) -> Result<()> {
        if comm.size() <= 1 {
            return Ok(());
        }
        if self.nccl.all_reduce(x)? {
            return Ok(());
        }
        if self.peer.is_on() {
            return self.peer_sum(comm, x);
        }
        self.host_sum(comm, x)
    }
}

impl CudaBackend {
    /// `x` summed over the ranks through the host: copied to page-locked memory, summed by
    /// MPI ([`Comm::allreduce_sum`]), copied back (collective; waits for the device).
    pub(super) fn host_sum(&self, comm: &dyn Comm, x: &mut CudaSlice<f64>) -> Result<()> {
        let mut guard = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_none_or(|p| p.len() != x.len()) {
            // SAFETY: the buffer is fully overwritten by the device-to-host copy below before
            // it is read; flags 0 = ordinary (not write-combined) page-locked memory, which the
            // host reads fast.
            let p = unsafe { self.ctx.alloc_pinned_with_flags::<f64>(x.len(), 0) }
                .doing("allocating page-locked host memory")?;
            *guard = Some(p);
        }
        let p = guard.as_mut().expect("allocated above");
        self.stream
            .memcpy_dtoh(x, p)
            .doing("copying a vector to the host")?;
        // Event tracking is off in this backend, so the pinned slice does not wait for the
        // copy by itself: synchronise the stream before the host reads it.
        self.synchronize()?;
        let h = p.as_mut_slice().doing("waiting for the copy")?;
        comm.allreduce_sum(h)?;
        self.stream
            .memcpy_htod(p, x)
            .doing("copying a vector to the device")?;
        self.synchronize()
    }

    /// `x` summed over the ranks through the buffers they map of each other (kernels/peer.cu
    /// `peer_vec_*`; collective), where the backend's set-up turned the peer sums on and made
    /// no NCCL communicator: LSQR's sums outside its loop, and its host loop's.
    pub(super) fn peer_sum(&self, comm: &dyn Comm, x: &mut CudaSlice<f64>) -> Result<()> {
        let mut guard = self.peer_vec.lock().unwrap_or_else(|e| e.into_inner());
        let p = self.peer_buffers(comm, &mut guard, x.len(), x.len())?;
        let (pb, ranks, me) = (self.ptr(&p.bases), p.ranks as u32, p.rank as u32);
        let one = |f: &CudaFunction| self.launch(f, 1, 32, &mut [arg(&pb), arg(&ranks), arg(&me)]);
        one(&self.k.peer_vec_begin)?;
        let slot = p.own_base() + CTRL as u64;
        // SAFETY: the slot holds at least x.len() f64 (made above) and is this rank's own
        // device memory; `x` is alive until the synchronisation below; both are on this
        // backend's stream, after peer_vec_begin (no rank reads the slot until it is published).
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                slot,
                self.ptr(x),
                x.len() * 8,
                self.stream.cu_stream(),
            )
        }
        .doing("copying a vector into the sums' buffer")?;
        one(&self.k.peer_vec_publish)?;
        let (px, n) = (self.ptr(x), x.len() as u64);
        let mut args = [arg(&px), arg(&n), arg(&pb), arg(&ranks), arg(&me)];
        self.launch_elementwise(&self.k.peer_vec_sum, x.len(), &mut args)?;
        self.synchronize()?;
        let mut late = [0u64];
        // SAFETY: word 2 of this rank's control block, read after the stream finished with it.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut late, p.own_base() + 16) }
            .doing("reading the sums' state")?;
        if late[0] != 0 {
            return Err(Error::backend(
                "cuda",
                format!("a sum over the ranks: {PEER_TIMEOUT}"),
            ));
        }
        Ok(())
    }

    /// Collective: the mapped buffers in `slot`, made (again, with `make` values) where they
    /// hold fewer than `need`. Every rank sums the same lengths in the same order, so every
    /// rank makes them together. Old buffers go only once no rank's kernel can still read
    /// them: this rank's stream is synchronised, then `close` waits for every rank.
    fn peer_buffers<'g>(
        &self,
        comm: &dyn Comm,
        slot: &'g mut Option<PeerBuffers>,
        need: usize,
        make: usize,
    ) -> Result<&'g PeerBuffers> {
        if slot.as_ref().is_none_or(|p| p.values < need) {
            if let Some(old) = slot.take() {
                self.synchronize()?;
                old.close(comm)?;
            }
            *slot = Some(PeerBuffers::new(&self.stream, comm, make)?.ok_or_else(|| {
                Error::backend(
                    "cuda",
                    "the ranks' GPUs could not map each other's buffers for a sum over the ranks",
                )
            })?);
        }
        Ok(slot.as_ref().expect("made above"))
    }

    /// The device address of the word that GMRES's peer kernels set where a wait for another
    /// rank timed out (made zeroed at the first call; [`Self::check_peer_fault`] reads it).
    pub(crate) fn peer_fault(&self) -> Result<u64> {
        let mut guard = self.peer_fault.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(self.stream.alloc_zeros::<u64>(1).doing("device memory")?);
        }
        Ok(self.ptr(guard.as_ref().expect("made above")))
    }

    /// An error where a peer kernel's wait for another rank timed out (after the stream's
    /// work up to here; nothing to read where no peer kernel ran).
    fn check_peer_fault(&self) -> Result<()> {
        let guard = self.peer_fault.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = guard.as_ref() else {
            return Ok(());
        };
        let got = self
            .stream
            .clone_dtoh(f)
            .doing("reading the peer sums' state")?;
        self.synchronize()?;
        if got.first().copied().unwrap_or(0) != 0 {
            return Err(Error::backend(
                "cuda",
                format!("a sum or halo exchange over the ranks: {PEER_TIMEOUT}"),
            ));
        }
        Ok(())
    }

    /// sc[at..at + len] summed over the ranks through the GPUs' memory, on the stream
    /// (kernels/peer.cu `peer_scalars_sum`): no host round trip, no wait here.
    fn peer_scalars(
        &self,
        comm: &dyn Comm,
        sc: &mut CudaSlice<f64>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let mut guard = self.peer_sc.lock().unwrap_or_else(|e| e.into_inner());
        // two slots of `cap` values take turns
        let p = self.peer_buffers(comm, &mut guard, 2 * len, 2 * len.max(64))?;
        let fault = self.peer_fault()?;
        let (pb, ranks, me) = (self.ptr(&p.bases), p.ranks as u32, p.rank as u32);
        let (ps, n, cap) = (
            self.ptr(sc) + 8 * at as u64,
            len as u32,
            (p.values / 2) as u32,
        );
        let mut args = [
            arg(&ps),
            arg(&n),
            arg(&cap),
            arg(&pb),
            arg(&ranks),
            arg(&me),
            arg(&fault),
        ];
        self.launch(&self.k.peer_scalars_sum, 1, 256, &mut args)
    }
}

impl ScalarSlots for CudaBackend {
    fn multi_dot_to(
        &self,
        basis: &[CudaSlice<f64>],
        w: &CudaSlice<f64>,
        sc: &mut CudaSlice<f64>,
        at: usize,
    ) -> Result<()> {
        let pr = self.scalar_ptr("multi_dot_to", sc, at, basis.len())?;
        let (pw, n) = (self.ptr(w), w.len());
        for (i, bs) in basis.chunks(MULTI_MAX).enumerate() {
            let at_i = pr + (8 * i * MULTI_MAX) as u64;
            self.multi_launch_to(bs, Coeffs::Host(&[]), 0, pw, n, at_i)?;
        }
        Ok(())
    }
    fn multi_axpy_measure_to(
        &self,
        basis: &[CudaSlice<f64>],
        w: &mut CudaSlice<f64>,
        sc: &mut CudaSlice<f64>,
        at: (usize, usize),
        then: Measure,
    ) -> Result<()> {
        match then {
            Measure::Dots => self.multi_axpy_to("multi_axpy_dot_to", 1, basis, w, sc, at),
            Measure::NormSq => self.multi_axpy_to("multi_axpy_norm_sq_to", 2, basis, w, sc, at),
        }
    }
    fn copy_inv_sqrt(
        &self,
        sc: &CudaSlice<f64>,
        at: usize,
        x: &CudaSlice<f64>,
        y: &mut CudaSlice<f64>,
    ) -> Result<()> {
        self.check_len("copy_inv_sqrt", x.len(), y.len())?;
        let ps = self.scalar_ptr("copy_inv_sqrt", sc, at, 1)?;
        let ptrs = [ps, self.ptr(x), self.ptr(y)];
        self.elementwise(&self.k.copy_inv_sqrt, x.len(), &ptrs.map(Word::U64))
    }
    fn allreduce_scalars(
        &self,
        comm: &dyn Comm,
        sc: &mut CudaSlice<f64>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        self.scalar_ptr("allreduce_scalars", sc, at, len)?;
        if comm.size() <= 1 || len == 0 {
            return Ok(());
        }
        // on the stream, GPU to GPU when NCCL is set up: the cycle goes on without the host
        if self.nccl.all_reduce(&mut sc.slice_mut(at..at + len))? {
            return Ok(());
        }
        if self.peer.is_on() {
            return self.peer_scalars(comm, sc, at, len);
        }
        let mut h = vec![0.0; len];
        self.read_scalars(sc, at, &mut h)?;
        comm.allreduce_sum(&mut h)?;
        self.write_scalars(sc, at, &h)
    }
    fn read_scalars(&self, sc: &CudaSlice<f64>, at: usize, out: &mut [f64]) -> Result<()> {
        self.scalar_ptr("read_scalars", sc, at, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_dtoh(&sc.slice(at..at + out.len()), out)
            .doing("copying scalars to the host")?;
        self.synchronize()?;
        self.check_peer_fault()
    }
    fn write_scalars(&self, sc: &mut CudaSlice<f64>, at: usize, vals: &[f64]) -> Result<()> {
        self.scalar_ptr("write_scalars", sc, at, vals.len())?;
        if vals.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_htod(vals, &mut sc.slice_mut(at..at + vals.len()))
            .doing("copying scalars to the device")?;
        // the host slice may go away when this returns
        self.synchronize()
    }
    fn defers_scalars(&self) -> bool {
        true
    }
}
