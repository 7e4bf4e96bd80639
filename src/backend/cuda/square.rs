//! GMRES on the GPU for square systems: this rank's rows on the device, the halo exchange for
//! several ranks, and block ILU(0) with Jacobi-sweep triangular solves (Ma et al. 2021).
//!
//! - [`CudaSquareOperator`]: y = alpha A x + beta y for this rank's rows. With several ranks,
//!   the x entries other ranks need are gathered on the device, copied to the host, exchanged
//!   with one all-to-all over [`Comm`], and copied behind the local entries of an extended
//!   vector [x_local, ghosts] that the local CSR product reads (columns renumbered as in
//!   [`crate::comm::halo::localize`]).
//! - [`CudaIluSweeps`]: the ILU(0) factors of this rank's block (factorised on the host by
//!   [`BlockIlu0`]) on the device; each application runs a fixed number of Jacobi sweeps on
//!   L y = r and U z = y, a thread per row, in the same arithmetic order as the CPU's
//!   [`BlockIlu0::solve`] (bitwise equal without FMA contraction).

use std::sync::Mutex;

use cudarc::driver::CudaSlice;

use super::operator::up;
use super::{arg, cuda_err, CudaBackend, CudaCsrOperator, DeviceVec};
use crate::backend::cpu::square::DistSquareOperator;
use crate::backend::precond::{BlockIlu0, Preconditioner, TriSolve};
use crate::backend::{Backend, Operator, Precision, Scale, TransposeStrategy};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::sparse::Csr;

/// Device buffers of the halo exchange.
struct Halo {
    /// Local indices of the entries to send, grouped by destination rank.
    idx: Option<CudaSlice<u32>>,
    send_dev: Option<CudaSlice<f64>>,
    send_host: Vec<f64>,
    recv_host: Vec<f64>,
    /// [x_local, ghosts].
    ext: CudaSlice<f64>,
}

/// This rank's rows of a square matrix on the GPU, with the halo exchange built in: `apply`
/// takes and returns device vectors of this rank's n_local entries.
pub struct CudaSquareOperator<'c> {
    op: CudaCsrOperator,
    n_local: usize,
    comm: &'c dyn Comm,
    send_counts: Vec<usize>,
    recv_counts: Vec<usize>,
    halo: Option<Mutex<Halo>>,
}

impl<'c> CudaSquareOperator<'c> {
    /// Upload the local matrix of `cpu` (owned columns first, then ghosts) and its halo plan.
    pub fn new(
        be: &CudaBackend,
        cpu: &DistSquareOperator<'_>,
        comm: &'c dyn Comm,
        precision: Precision,
    ) -> Result<Self> {
        let a = cpu.local_matrix();
        let plan = cpu.plan();
        let n = plan.n_local;
        // GMRES never applies A^T: the scatter strategy keeps no second copy.
        let op = CudaCsrOperator::new(be, a, TransposeStrategy::Scatter, precision)?;
        let send_counts: Vec<usize> = plan.send_idx.iter().map(|s| s.len()).collect();
        let halo = if comm.size() > 1 {
            let flat: Vec<u32> = plan.send_idx.iter().flatten().copied().collect();
            let (idx, send_dev) = if flat.is_empty() {
                (None, None)
            } else {
                let idx = be
                    .stream
                    .clone_htod(&flat)
                    .map_err(cuda_err("copying the halo indices to the device"))?;
                (Some(idx), Some(be.zeros(flat.len())?))
            };
            Some(Mutex::new(Halo {
                idx,
                send_dev,
                send_host: vec![0.0; flat.len()],
                recv_host: vec![0.0; plan.recv_volume()],
                ext: be.zeros(a.ncols().max(1))?,
            }))
        } else {
            None
        };
        Ok(CudaSquareOperator {
            op,
            n_local: n,
            comm,
            send_counts,
            recv_counts: plan.recv_counts.clone(),
            halo,
        })
    }

    /// The exchange: ext = [x, the ghosts other ranks own].
    fn exchange(&self, be: &CudaBackend, x: &CudaSlice<f64>, h: &mut Halo) -> Result<()> {
        let n = self.n_local;
        if let (Some(idx), Some(send)) = (&h.idx, &mut h.send_dev) {
            be.gather(idx, x, send)?;
        }
        // GPU to GPU when NCCL is set up: no host copies.
        be.stream
            .memcpy_dtod(x, &mut h.ext.slice_mut(..n))
            .map_err(cuda_err("device copy"))?;
        if be.nccl_exchange(
            h.send_dev.as_ref(),
            &self.send_counts,
            &mut h.ext,
            n,
            &self.recv_counts,
        )? {
            return Ok(());
        }
        if let Some(send) = &h.send_dev {
            be.stream
                .memcpy_dtoh(send, &mut h.send_host[..])
                .map_err(cuda_err("copying the halo to the host"))?;
            be.synchronize()?;
        }
        let mut sends = Vec::with_capacity(self.send_counts.len());
        let mut off = 0;
        for &c in &self.send_counts {
            sends.push(h.send_host[off..off + c].to_vec());
            off += c;
        }
        let recv = self.comm.alltoallv(&sends)?;
        let mut off = 0;
        for (r, (got, &want)) in recv.iter().zip(&self.recv_counts).enumerate() {
            if got.len() != want {
                return Err(Error::Comm(format!(
                    "halo exchange: rank {r} sent {} values, expected {want}",
                    got.len()
                )));
            }
            h.recv_host[off..off + want].copy_from_slice(got);
            off += want;
        }
        if !h.recv_host.is_empty() {
            be.stream
                .memcpy_htod(&h.recv_host[..], &mut h.ext.slice_mut(n..n + off))
                .map_err(cuda_err("copying the halo to the device"))?;
        }
        Ok(())
    }
}

impl Operator<CudaBackend> for CudaSquareOperator<'_> {
    fn nrows(&self) -> usize {
        self.n_local
    }
    fn ncols(&self) -> usize {
        self.n_local
    }
    fn apply(&self, be: &CudaBackend, s: Scale, x: &DeviceVec, y: &mut DeviceVec) -> Result<()> {
        if x.len() != self.n_local || y.len() != self.n_local {
            return Err(Error::Invalid(format!(
                "cuda square operator: vectors of {} and {} for {} local rows",
                x.len(),
                y.len(),
                self.n_local
            )));
        }
        match &self.halo {
            None => self.op.apply(be, Scale::new(s.alpha, s.beta), x, y),
            Some(h) => {
                let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
                self.exchange(be, x, &mut h)?;
                if self.op.ncols() == self.n_local {
                    self.op.apply(be, Scale::new(s.alpha, s.beta), x, y)
                } else {
                    self.op.apply(be, Scale::new(s.alpha, s.beta), &h.ext, y)
                }
            }
        }
    }
    fn apply_t(
        &self,
        _be: &CudaBackend,
        _s: Scale,
        _y: &DeviceVec,
        _x: &mut DeviceVec,
    ) -> Result<()> {
        Err(Error::Invalid(
            "the distributed square operator has no transpose product (GMRES does not need one)"
                .into(),
        ))
    }
}

/// A triangular factor without its diagonal, on the device.
struct DevTri {
    ptr: CudaSlice<u64>,
    col: CudaSlice<u32>,
    val: CudaSlice<f64>,
}

impl DevTri {
    fn upload(be: &CudaBackend, t: &Csr) -> Result<Self> {
        // `up` pads an empty array to one element (never read): no zero-byte allocations.
        Ok(DevTri {
            ptr: up(be, t.indptr())?,
            col: up(be, t.indices())?,
            val: up(be, t.data())?,
        })
    }
}

/// Block ILU(0) with Jacobi-sweep triangular solves on the device.
pub struct CudaIluSweeps {
    n: usize,
    l: DevTri,
    u: DevTri,
    inv_diag: CudaSlice<f64>,
    sweeps: usize,
    y: CudaSlice<f64>,
    y2: CudaSlice<f64>,
    tmp: CudaSlice<f64>,
}

impl CudaIluSweeps {
    /// Upload the factors of `f`, which must use Jacobi triangular solves.
    pub fn new(be: &CudaBackend, f: &BlockIlu0) -> Result<Self> {
        let (l, u, inv_diag, tri) = f.split_factors()?;
        let TriSolve::Jacobi(sweeps) = tri else {
            return Err(Error::backend(
                "cuda",
                "block ILU(0) on the GPU solves its triangular systems by Jacobi sweeps: give the sweep count (--ilu-sweeps N, e.g. 3), or use --backend cpu for exact solves",
            ));
        };
        let n = l.nrows();
        Ok(CudaIluSweeps {
            n,
            l: DevTri::upload(be, &l)?,
            u: DevTri::upload(be, &u)?,
            inv_diag: be.upload(&inv_diag)?,
            sweeps,
            y: be.zeros(n.max(1))?,
            y2: be.zeros(n.max(1))?,
            tmp: be.zeros(n.max(1))?,
        })
    }

    /// out = (rhs - T x) * (dinv or 1), a thread per row.
    #[allow(clippy::too_many_arguments)]
    fn sweep(
        be: &CudaBackend,
        n: usize,
        t: &DevTri,
        rhs: u64,
        x: u64,
        dinv: u64,
        out: u64,
    ) -> Result<()> {
        let (n64, pp, pc, pv) = (n as u64, be.ptr(&t.ptr), be.ptr(&t.col), be.ptr(&t.val));
        be.launch_elementwise(
            &be.k.tri_sweep,
            n,
            &mut [
                arg(&n64),
                arg(&pp),
                arg(&pc),
                arg(&pv),
                arg(&rhs),
                arg(&x),
                arg(&dinv),
                arg(&out),
            ],
        )
    }
}

impl Preconditioner<CudaBackend> for CudaIluSweeps {
    fn name(&self) -> String {
        format!(
            "block-ilu0 (jacobi triangular solves, {} sweeps)",
            self.sweeps
        )
    }
    fn apply(
        &mut self,
        be: &CudaBackend,
        r: &CudaSlice<f64>,
        z: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let n = self.n;
        if r.len() != n || z.len() != n {
            return Err(Error::Invalid(format!(
                "cuda block ILU(0): vectors of {} and {} for {n} rows",
                r.len(),
                z.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        // L y = r: y <- r - (L - I) y from y = r, ping-ponging between y and y2.
        be.stream
            .memcpy_dtod(r, &mut self.y.slice_mut(..n))
            .map_err(cuda_err("device copy"))?;
        let pr = be.ptr(r);
        let (mut cur, mut next) = (be.ptr(&self.y), be.ptr(&self.y2));
        for _ in 0..self.sweeps {
            Self::sweep(be, n, &self.l, pr, cur, 0, next)?;
            std::mem::swap(&mut cur, &mut next);
        }
        let py = cur;
        // U z = y: z <- D^-1 (y - (U - D) z) from z = D^-1 y; start in the buffer that makes
        // the last sweep land in z.
        let (pz, pt) = (be.ptr(z), be.ptr(&self.tmp));
        let (mut a, mut b) = if self.sweeps % 2 == 0 {
            (pz, pt)
        } else {
            (pt, pz)
        };
        let (pd, n64) = (be.ptr(&self.inv_diag), n as u64);
        // a = inv_diag .* y (the CPU's y[i] * inv_diag[i]; multiplication commutes exactly)
        be.launch_elementwise(&be.k.pmul, n, &mut [arg(&n64), arg(&pd), arg(&py), arg(&a)])?;
        for _ in 0..self.sweeps {
            Self::sweep(be, n, &self.u, py, a, pd, b)?;
            std::mem::swap(&mut a, &mut b);
        }
        debug_assert_eq!(a, pz);
        Ok(())
    }
}
