//! Compute backends. A [`Backend`] owns vectors (host memory for the CPU backend, device memory
//! for CUDA) and the vector kernels the solvers need; an [`Operator`] applies a matrix held by
//! that backend. Solvers are written once over these two traits.

pub mod batch;
pub mod cpu;
pub mod cuda;
pub mod lsmr;
pub mod lsqr;
pub mod precond;
pub mod storage;

use crate::comm::Comm;
use crate::error::{Error, Result};
pub use crate::sparse::Precision;

/// Vector storage and the vector kernels the Krylov solvers use. Reductions (`dot`, `norm_sq`)
/// are local to this rank; the solver sums them over ranks through [`Comm`] where a vector is
/// distributed.
pub trait Backend: Send + Sync {
    /// A vector of f64 owned by this backend.
    type Vector: Send;

    /// Short name: "cpu" or "cuda".
    fn name(&self) -> &'static str;
    /// One line for logs and reports (device, threads).
    fn describe(&self) -> String;

    fn zeros(&self, n: usize) -> Result<Self::Vector>;
    fn upload(&self, x: &[f64]) -> Result<Self::Vector>;
    fn download(&self, x: &Self::Vector, out: &mut [f64]) -> Result<()>;
    fn len(&self, x: &Self::Vector) -> usize;
    /// out = x[start..start + out.len()] (the default copies all of x to the host first).
    fn download_range(&self, x: &Self::Vector, start: usize, out: &mut [f64]) -> Result<()> {
        copy_range(&self.to_host(x)?, start, out)
    }
    /// A host copy of `x`.
    fn to_host(&self, x: &Self::Vector) -> Result<Vec<f64>> {
        let mut h = vec![0.0; self.len(x)];
        self.download(x, &mut h)?;
        Ok(h)
    }

    /// dst = src
    fn copy(&self, src: &Self::Vector, dst: &mut Self::Vector) -> Result<()>;
    /// x = value
    fn fill(&self, x: &mut Self::Vector, value: f64) -> Result<()>;
    /// x = a x
    fn scale(&self, x: &mut Self::Vector, a: f64) -> Result<()>;
    /// y = a x (y's old values are never read, so NaN there does not propagate)
    fn copy_scaled(&self, a: f64, x: &Self::Vector, y: &mut Self::Vector) -> Result<()> {
        self.copy(x, y)?;
        self.scale(y, a)
    }
    /// y = a x + b y
    fn axpby(&self, a: f64, x: &Self::Vector, b: f64, y: &mut Self::Vector) -> Result<()>;
    /// z = x .* y (element-wise)
    fn pointwise_mul(&self, x: &Self::Vector, y: &Self::Vector, z: &mut Self::Vector)
        -> Result<()>;
    /// Local x . y
    fn dot(&self, x: &Self::Vector, y: &Self::Vector) -> Result<f64>;
    /// Local sum of squares of x.
    fn norm_sq(&self, x: &Self::Vector) -> Result<f64>;

    /// LSQR's fused step (Paige & Saunders' update of x and w), in one pass: returns
    /// `||w inv_rho||^2` of the old w (= ||d_k||^2); `var += (w inv_rho)^2` when given;
    /// `x += t1 w`; `w = v + t2 w`.
    fn lsqr_update(&self, k: XwStep, v: &Self::Vector, s: XwState<Self::Vector>) -> Result<f64>;

    /// [`Self::lsqr_update`] of several members that share v (LSQR for several dampings of
    /// one system, src/solver/lsqr_damps.rs): member j's x, w (var) with `ks[j]`; returns
    /// each ||d_k||^2, each the bits `lsqr_update` gives. A GPU waits once for all of them.
    fn lsqr_update_many(
        &self,
        ks: &[XwStep],
        v: &Self::Vector,
        states: Vec<XwState<'_, Self::Vector>>,
    ) -> Result<Vec<f64>> {
        ks.iter()
            .zip(states)
            .map(|(&k, s)| self.lsqr_update(k, v, s))
            .collect()
    }

    /// `out[j] = basis[j] . w` for every j (classical Gram-Schmidt's batched inner products).
    fn multi_dot(&self, basis: &[Self::Vector], w: &Self::Vector, out: &mut [f64]) -> Result<()> {
        for (o, b) in out.iter_mut().zip(basis) {
            *o = self.dot(b, w)?;
        }
        Ok(())
    }
    /// `w -= sum_j coeffs[j] basis[j]`
    fn multi_axpy(
        &self,
        coeffs: &[f64],
        basis: &[Self::Vector],
        w: &mut Self::Vector,
    ) -> Result<()> {
        for (&c, b) in coeffs.iter().zip(basis) {
            self.axpby(-c, b, 1.0, w)?;
        }
        Ok(())
    }

    /// `w -= sum_j coeffs[j] basis[j]`, then `then` of the updated w into `out`, in one pass
    /// over the basis: `Dots`, `out[j] = basis[j] . w` for every j (CGS2's first update fused
    /// with its second pass of inner products); `NormSq`, `out[0]` = the local sum of squares of w
    /// (the next basis vector's norm).
    fn multi_axpy_measure(
        &self,
        then: Measure,
        coeffs: &[f64],
        basis: &[Self::Vector],
        w: &mut Self::Vector,
        out: &mut [f64],
    ) -> Result<()> {
        self.multi_axpy(coeffs, basis, w)?;
        match then {
            Measure::Dots => self.multi_dot(basis, w, out),
            Measure::NormSq => {
                out[0] = self.norm_sq(w)?;
                Ok(())
            }
        }
    }

    /// Sum a vector over all ranks in place (the one vector reduction of a distributed LSQR
    /// iteration). The CPU backend hands the slice to `comm`; a GPU backend may stage it through
    /// pinned host memory or reduce GPU to GPU.
    fn allreduce_sum(&self, comm: &dyn Comm, x: &mut Self::Vector) -> Result<()>;
}

/// What [`Backend::multi_axpy_measure`] writes of the updated w.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// `basis[j] . w` for every j (CGS2's first update fused with its second pass).
    Dots,
    /// The local sum of squares of w (the next basis vector's norm).
    NormSq,
}

/// Scalars kept on the backend: GMRES's device-resident Arnoldi cycle (src/solver/gmres,
/// `ArnoldiLoop::Device`) keeps its inner products and norms in a vector `sc` of this backend
/// (device memory on a GPU): kernels read their coefficients from there, nothing waits for the
/// host, and the host reads the cycle's scalars once. The defaults round-trip through the host
/// (correct for any backend); the CPU and CUDA backends work in place. An extension of the
/// BLAS-1 core ([`Backend`]) that the solvers needing it ask for.
pub trait ScalarSlots: Backend {
    /// `sc[at..at + k] = basis[j] . w` (local), k = basis.len(): [`Backend::multi_dot`]'s values.
    fn multi_dot_to(
        &self,
        basis: &[Self::Vector],
        w: &Self::Vector,
        sc: &mut Self::Vector,
        at: usize,
    ) -> Result<()> {
        let mut c = vec![0.0; basis.len()];
        self.multi_dot(basis, w, &mut c)?;
        self.write_scalars(sc, at, &c)
    }
    /// `w -= sum_j sc[coef_at + j] basis[j]`, then `then` of the updated w into `sc[out_at..]`:
    /// [`Backend::multi_axpy_measure`] with its coefficients and results in `sc`.
    fn multi_axpy_measure_to(
        &self,
        basis: &[Self::Vector],
        w: &mut Self::Vector,
        sc: &mut Self::Vector,
        (coef_at, out_at): (usize, usize),
        then: Measure,
    ) -> Result<()> {
        let k = basis.len();
        let mut c = vec![0.0; k];
        self.read_scalars(sc, coef_at, &mut c)?;
        let mut out = vec![0.0; if then == Measure::Dots { k } else { 1 }];
        self.multi_axpy_measure(then, &c, basis, w, &mut out)?;
        self.write_scalars(sc, out_at, &out)
    }
    /// `y = x / sqrt(max(sc[at], 0))`, the scale computed as `1.0 / sc[at].max(0.0).sqrt()`.
    fn copy_inv_sqrt(
        &self,
        sc: &Self::Vector,
        at: usize,
        x: &Self::Vector,
        y: &mut Self::Vector,
    ) -> Result<()> {
        let mut s = [0.0];
        self.read_scalars(sc, at, &mut s)?;
        self.copy_scaled(1.0 / s[0].max(0.0).sqrt(), x, y)
    }
    /// Sum sc[at..at + len] over all ranks, in place ([`Comm::allreduce_sum`]'s values).
    fn allreduce_scalars(
        &self,
        comm: &dyn Comm,
        sc: &mut Self::Vector,
        at: usize,
        len: usize,
    ) -> Result<()> {
        if comm.size() <= 1 {
            return Ok(());
        }
        let mut h = vec![0.0; len];
        self.read_scalars(sc, at, &mut h)?;
        comm.allreduce_sum(&mut h)?;
        self.write_scalars(sc, at, &h)
    }
    /// out = sc[at..at + out.len()] (waits for the work queued before).
    fn read_scalars(&self, sc: &Self::Vector, at: usize, out: &mut [f64]) -> Result<()> {
        let h = self.to_host(sc)?;
        out.copy_from_slice(&h[at..at + out.len()]);
        Ok(())
    }
    /// sc[at..at + vals.len()] = vals.
    fn write_scalars(&self, sc: &mut Self::Vector, at: usize, vals: &[f64]) -> Result<()> {
        let mut h = self.to_host(sc)?;
        h[at..at + vals.len()].copy_from_slice(vals);
        *sc = self.upload(&h)?;
        Ok(())
    }
    /// Whether solvers should keep their scalars on this backend ([`ScalarSlots::multi_dot_to`]
    /// and friends) rather than read each one as it is computed: true where reading one waits
    /// for a device (a GPU), false where scalars are computed on the host anyway.
    fn defers_scalars(&self) -> bool {
        false
    }
}

/// out = host[start..start + out.len()] ([`Backend::download_range`] of a host copy).
pub fn copy_range(host: &[f64], start: usize, out: &mut [f64]) -> Result<()> {
    out.copy_from_slice(&host[range_in(start, out.len(), host.len())?]);
    Ok(())
}

/// The values start..start + len of a vector of `n` ([`Backend::download_range`]'s check).
pub fn range_in(start: usize, len: usize, n: usize) -> Result<std::ops::Range<usize>> {
    match start.checked_add(len) {
        Some(end) if end <= n => Ok(start..end),
        _ => Err(Error::Invalid(format!(
            "values {start}..{} of a vector of {n}",
            start.saturating_add(len)
        ))),
    }
}

/// The scalars of one LSQR update of x and w (see [`Backend::lsqr_update`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct XwStep {
    pub t1: f64,
    pub t2: f64,
    pub inv_rho: f64,
}

/// The vectors one LSQR update writes: x, w and, when the variance is estimated, var.
pub struct XwState<'a, V> {
    pub x: &'a mut V,
    pub w: &'a mut V,
    pub var: Option<&'a mut V>,
}

/// The two scalars of a product `y = alpha A x + beta y` (BLAS's alpha and beta).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    pub alpha: f64,
    pub beta: f64,
}

impl Scale {
    /// y = A x
    pub const SET: Scale = Scale::new(1.0, 0.0);
    /// y += A x
    pub const ADD: Scale = Scale::new(1.0, 1.0);
    pub const fn new(alpha: f64, beta: f64) -> Self {
        Self { alpha, beta }
    }
}

/// A matrix applied on a backend. `nrows` is this rank's share of the rows.
pub trait Operator<B: Backend> {
    fn nrows(&self) -> usize;
    fn ncols(&self) -> usize;
    /// y = s.alpha A x + s.beta y
    fn apply(&self, backend: &B, s: Scale, x: &B::Vector, y: &mut B::Vector) -> Result<()>;
    /// x = s.alpha A^T y + s.beta x, with this rank's rows only (no reduction over ranks).
    fn apply_t(&self, backend: &B, s: Scale, y: &B::Vector, x: &mut B::Vector) -> Result<()>;
    /// y = d .* (A x), or y = A x without `d`: a diagonal (GMRES's left Jacobi preconditioner)
    /// applied to the rows of the product. The default multiplies A x (in `t`) by d in a pass
    /// of its own, [`Backend::pointwise_mul`]`(d, t, y)`; an operator may fold d into its
    /// product's epilogue instead (the same values, one pass over the vectors fewer).
    fn apply_scaled_rows(
        &self,
        backend: &B,
        x: &B::Vector,
        d: Option<&B::Vector>,
        t: &mut B::Vector,
        y: &mut B::Vector,
    ) -> Result<()> {
        scaled_rows_by_pass(self, backend, (x, d), (t, y))
    }
    /// GMRES's next basis vector normalised by the product that reads it:
    /// `v = x / sqrt(max(sc[at], 0))` (the scale as [`ScalarSlots::copy_inv_sqrt`] computes it)
    /// is written to `v`, and
    /// y = d .* (A v) as [`Self::apply_scaled_rows`]. `x` is scratch afterwards. The default
    /// normalises in a pass of its own; an operator may scale x as its product gathers it and
    /// write v from the same loads (the same numbers bit for bit, one pass fewer).
    fn apply_normalized_scaled_rows(
        &self,
        backend: &B,
        (sc, at): (&B::Vector, usize),
        x: &mut B::Vector,
        v: &mut B::Vector,
        d: Option<&B::Vector>,
        y: &mut B::Vector,
    ) -> Result<()>
    where
        B: ScalarSlots,
    {
        normalized_by_pass(self, backend, (sc, at), (x, v), (d, y))
    }
    /// A device-resident LSQR loop for this operator, if its backend has one (None: the
    /// solver's host loop runs).
    fn lsqr_device(&self) -> Option<&dyn lsqr::LsqrDevice<B>> {
        None
    }
    /// A device-resident LSMR loop for this operator (one rank), if its backend has one (None:
    /// the solver's host loop runs).
    fn lsmr_device(&self) -> Option<&dyn lsmr::LsmrDevice<B>> {
        None
    }
}

/// [`Operator::apply_scaled_rows`] in two steps: t = A x, then y = d .* t in a pass of its own
/// (y = A x directly without d). The default, and the fallback of operators that fold d into
/// their product where they can.
pub fn scaled_rows_by_pass<B: Backend, O: Operator<B> + ?Sized>(
    op: &O,
    backend: &B,
    (x, d): (&B::Vector, Option<&B::Vector>),
    (t, y): (&mut B::Vector, &mut B::Vector),
) -> Result<()> {
    match d {
        None => op.apply(backend, Scale::SET, x, y),
        Some(d) => {
            op.apply(backend, Scale::SET, x, t)?;
            backend.pointwise_mul(d, t, y)
        }
    }
}

/// [`Operator::apply_normalized_scaled_rows`] in two steps: `v = x / sqrt(max(sc[at], 0))` by
/// [`ScalarSlots::copy_inv_sqrt`], then [`Operator::apply_scaled_rows`] of v (x as its scratch). The
/// default, and the fallback of operators that fuse the normalisation where they can.
pub fn normalized_by_pass<B: ScalarSlots, O: Operator<B> + ?Sized>(
    op: &O,
    backend: &B,
    (sc, at): (&B::Vector, usize),
    (x, v): (&mut B::Vector, &mut B::Vector),
    (d, y): (Option<&B::Vector>, &mut B::Vector),
) -> Result<()> {
    backend.copy_inv_sqrt(sc, at, x, v)?;
    op.apply_scaled_rows(backend, v, d, x, y)
}

/// How x += A^T y is computed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransposeStrategy {
    /// Pick by memory: an explicit transpose copy when it fits, else the scatter.
    #[default]
    Auto,
    /// An explicit CSC copy of A (= CSR of A^T): a gather per column, no write conflicts.
    Csc,
    /// Scatter from the CSR rows (per-thread buffers on the CPU, atomic adds on the GPU): no
    /// second copy of the matrix.
    Scatter,
    /// The vendor library's transposed SpMV (cuSPARSE; the GPU baseline).
    Library,
}

choice_from_str!(TransposeStrategy, "transpose strategy", "auto" => Self::Auto, "csc" => Self::Csc, "scatter" | "atomic" => Self::Scatter, "library" | "cusparse" => Self::Library);

impl std::fmt::Display for TransposeStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Csc => "csc",
            Self::Scatter => "scatter",
            Self::Library => "library",
        })
    }
}

/// Where LSQR's iterations are driven on a GPU (`[backend] lsqr_loop`, `--lsqr-loop`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LsqrLoop {
    /// The device loop on one rank (CSR with the explicit transpose, or compact storage: it
    /// measured faster on small and large systems, docs/gpu.md), the host loop under MPI.
    #[default]
    Auto,
    /// The host runs the scalar recurrences: three synchronisations per iteration.
    Host,
    /// Blocks of iterations as one CUDA graph with the scalars on the GPU (one
    /// synchronisation per block; one rank, explicit transpose). See docs/gpu.md.
    Device,
}

choice_from_str!(LsqrLoop, "LSQR loop", "auto" => Self::Auto, "host" => Self::Host, "device" | "graph" => Self::Device);

/// How a multi-rank run sums A^T u over ranks (the one vector reduction per LSQR iteration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllreducePath {
    /// LSQR's device loop on ranks all on one node: as [`AllreducePath::Peer`] where the GPUs
    /// can map each other's memory. Everything else: NCCL (GPU to GPU) when every rank can
    /// load it, else the host path.
    #[default]
    Auto,
    /// Copy to page-locked host memory, MPI_Allreduce, copy back (works with any MPI).
    Host,
    /// NCCL only (an error when it cannot be loaded).
    Nccl,
    /// LSQR's device loop, and LSQR's other sums, through the other ranks' GPU memory (CUDA
    /// IPC: ranks on one node; an error where they cannot map it); no NCCL, so no NCCL start.
    /// Other solvers: as `auto`.
    Peer,
}

choice_from_str!(AllreducePath, "allreduce path", "auto" => Self::Auto, "host" | "mpi" => Self::Host, "nccl" => Self::Nccl, "peer" | "ipc" => Self::Peer);
