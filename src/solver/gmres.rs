//! Restarted GMRES(m) (Saad & Schultz 1986) over [`Backend`], [`Operator`] and [`Comm`], for
//! square systems A x = b whose rows (and x, b) are distributed over ranks.
//!
//! - Arnoldi by modified Gram-Schmidt (one reduction per basis vector) or by classical
//!   Gram-Schmidt applied twice (CGS2: each pass is one batch of j+1 inner products and ONE
//!   [`Comm::allreduce_sum`] of them; the update of one pass is fused with the inner products
//!   of the next, [`Backend::multi_axpy_dot`] and [`Backend::multi_axpy_norm_sq`], so a step
//!   reads the basis three times).
//! - Givens rotations and the small triangular solve on the host.
//! - Left (minimise ||M^-1 (b - A x)||) or right (A M^-1 u = b, x = M^-1 u) preconditioning.
//! - Two stopping rules: [`ConvergenceTest::Preconditioned`] (PETSc's default: the preconditioned
//!   residual norm relative to the preconditioned ||b||; with right preconditioning this is the
//!   true residual) and [`ConvergenceTest::Scipy`], SciPy 1.10's rule (the inner cycle stops on an
//!   adaptive tolerance for the preconditioned residual, every restart checks the true residual
//!   ||b - A x|| <= rtol ||b||), so that iteration counts can be compared with SciPy's `gmres`.
//!
//! Every vector lives in a [`GmresWorkspace`] allocated before the first iteration; the host
//! arrays (Hessenberg matrix, rotations, coefficients) too. Nothing here calls rayon, MPI or CUDA.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::precond::Preconditioner;
use crate::backend::{Backend, Operator, Scale};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// How the Arnoldi vectors are orthogonalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Orthog {
    /// Modified Gram-Schmidt: j+1 dependent inner products, one reduction each.
    Mgs,
    /// Classical Gram-Schmidt twice: two passes of batched inner products, one reduction each.
    Cgs2,
    /// Classical Gram-Schmidt once (PETSc's default, refinement "never"; CuPy's gmres): one
    /// batched pass of inner products and the update fused with the norm. Cheapest, but the
    /// basis loses orthogonality sooner on ill-conditioned systems.
    Cgs,
    /// CGS2 with delayed reorthogonalisation and lagged normalisation (DCGS2, Swirydowicz et
    /// al. 2020, Bielich et al. 2022): ONE reduction per inner step. Step j sends A M^-1 (or
    /// M^-1 A) of the provisional v_j and reduces, in one [`Comm::allreduce_sum`], the first
    /// CGS pass of the new vector together with the second (re-orthogonalising) pass and the
    /// norm of v_j; v_j and column j-1 of the Hessenberg matrix are corrected afterwards.
    Dcgs2,
}

/// Which side the preconditioner is applied on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrecondSide {
    Left,
    Right,
}

/// Which residual decides convergence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConvergenceTest {
    /// ||M^-1 r|| <= max(rtol ||M^-1 b||, atol) with left preconditioning, ||r|| <= max(rtol
    /// ||b||, atol) with right (PETSc's KSP default). Checked on the Arnoldi estimate inside a
    /// cycle and on the recomputed residual at each restart.
    Preconditioned,
    /// SciPy 1.10 `gmres`: the inner cycle stops when the preconditioned residual estimate is
    /// below an adaptive tolerance `ptol`; the solve stops when the true ||b - A x|| <=
    /// max(rtol ||b||, atol), checked after every cycle (left preconditioning only).
    Scipy,
}

/// Where the scalars of an Arnoldi cycle live (`solve --method gmres --arnoldi-loop`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArnoldiLoop {
    /// Device where the backend computes its scalars away from the host (a GPU) and the
    /// orthogonalisation is cgs or cgs2; host otherwise.
    #[default]
    Auto,
    /// Every inner product comes back to the host as it is computed; the stopping test runs
    /// after every step (two or three host synchronisations per step on a GPU).
    Host,
    /// The cycle's inner products and norms stay on the backend ([`Backend::multi_dot_to`]):
    /// kernels read their coefficients there, the host reads a whole cycle's scalars once and
    /// then runs the rotations and stopping tests step by step, exactly as the host loop
    /// does. Steps computed after the one where the test fires are discarded, so iterations,
    /// residuals and x are those of the host loop (bitwise on the same backend); the cost is
    /// that work, at most restart - 1 steps in the last cycle. cgs and cgs2 only.
    Device,
}

choice_from_str!(Orthog, "orthogonalisation", "mgs" => Orthog::Mgs, "cgs2" => Orthog::Cgs2, "cgs" => Orthog::Cgs, "dcgs2" => Orthog::Dcgs2);
choice_from_str!(PrecondSide, "preconditioning side", "left" => PrecondSide::Left, "right" => PrecondSide::Right);
choice_from_str!(ArnoldiLoop, "Arnoldi loop", "auto" => ArnoldiLoop::Auto, "host" => ArnoldiLoop::Host, "device" => ArnoldiLoop::Device);
choice_from_str!(ConvergenceTest, "convergence test", "preconditioned" => ConvergenceTest::Preconditioned, "scipy" => ConvergenceTest::Scipy);

/// GMRES settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GmresParams {
    /// Krylov subspace dimension m of GMRES(m).
    pub restart: usize,
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance (on the same residual as rtol).
    pub atol: f64,
    /// Limit on the total number of inner (Arnoldi) iterations.
    pub max_iter: usize,
    /// Optional limit on the number of cycles (SciPy 1.10's `maxiter` counts cycles).
    pub max_cycles: Option<usize>,
    pub orthog: Orthog,
    pub side: PrecondSide,
    pub test: ConvergenceTest,
    /// Where a cycle's scalars live (results are the same either way).
    #[serde(default)]
    pub arnoldi_loop: ArnoldiLoop,
}

impl Default for GmresParams {
    fn default() -> Self {
        GmresParams {
            restart: 16,
            rtol: 1e-10,
            atol: 0.0,
            max_iter: 10_000,
            max_cycles: None,
            orthog: Orthog::Mgs,
            side: PrecondSide::Left,
            test: ConvergenceTest::Preconditioned,
            arnoldi_loop: ArnoldiLoop::Auto,
        }
    }
}

impl GmresParams {
    fn check(&self) -> Result<()> {
        if self.restart == 0 {
            return Err(Error::Invalid("GMRES restart must be at least 1".into()));
        }
        let ok = |v: f64| v >= 0.0 && v.is_finite();
        if !(ok(self.rtol) && ok(self.atol)) {
            return Err(Error::Invalid(format!(
                "GMRES tolerances must be finite and >= 0 (rtol {}, atol {})",
                self.rtol, self.atol
            )));
        }
        if self.arnoldi_loop == ArnoldiLoop::Device
            && !matches!(self.orthog, Orthog::Cgs | Orthog::Cgs2)
        {
            return Err(Error::Invalid(format!(
                "the device Arnoldi loop runs classical Gram-Schmidt (--orthog cgs or cgs2), not {}",
                format!("{:?}", self.orthog).to_lowercase()
            )));
        }
        if self.test == ConvergenceTest::Scipy && self.side == PrecondSide::Right {
            return Err(Error::Invalid(
                "the scipy convergence test is defined for left preconditioning only".into(),
            ));
        }
        Ok(())
    }
}

/// One line of the convergence history. Iteration 0 is the initial residual.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct GmresRecord {
    /// Total inner iterations so far.
    pub iteration: usize,
    /// Cycle number (0-based).
    pub cycle: usize,
    /// Residual norm the stopping rule looks at (the Arnoldi estimate inside a cycle; the
    /// recomputed one at iteration 0): preconditioned with left preconditioning.
    pub resnorm: f64,
    /// resnorm divided by its value for x = 0 (||M^-1 b|| or ||b||).
    pub relres: f64,
    /// Seconds since the solve started.
    pub seconds: f64,
}

/// Called with every iteration's record, from iteration 0. An error stops the solve. `Send`: a
/// one-rank CPU solve runs on a rayon worker (`backend::cpu::on_pool`).
pub trait GmresMonitor: Send {
    fn record(&mut self, rec: &GmresRecord) -> Result<()>;
}

/// A monitor that does nothing.
pub struct NoGmresMonitor;
impl GmresMonitor for NoGmresMonitor {
    fn record(&mut self, _rec: &GmresRecord) -> Result<()> {
        Ok(())
    }
}

/// A monitor that keeps the history in memory (reserve capacity up front to avoid growth).
#[derive(Default)]
pub struct GmresHistory(pub Vec<GmresRecord>);
impl GmresMonitor for GmresHistory {
    fn record(&mut self, rec: &GmresRecord) -> Result<()> {
        self.0.push(*rec);
        Ok(())
    }
}

/// How a GMRES solve stopped (also the outcome keys of its report.json).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GmresStop {
    pub converged: bool,
    /// Why the solve stopped, in words.
    pub reason: String,
    /// Total inner (Arnoldi) iterations: one operator and one preconditioner application each.
    pub iterations: usize,
    /// Cycles that were followed by a restart (cycles run - 1).
    pub restarts: usize,
    /// True relative residual ||b - A x|| / ||b|| of the returned x.
    pub relres: f64,
    /// The residual the stopping rule used, relative (preconditioned with left preconditioning).
    pub precond_relres: f64,
}

/// The outcome of a GMRES solve.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GmresInfo {
    #[serde(flatten)]
    pub stop: GmresStop,
    pub bnorm: f64,
    pub seconds: f64,
    pub ms_per_iter: f64,
    /// The Arnoldi loop that ran (host or device).
    pub arnoldi_loop: ArnoldiLoop,
}

/// The vectors and host arrays of GMRES(m), sized once for n local rows.
pub struct GmresWorkspace<B: Backend> {
    m: usize,
    n: usize,
    /// Krylov basis V_0..V_m.
    v: Vec<B::Vector>,
    /// Arnoldi work vector.
    w: B::Vector,
    /// Residual b - A x.
    r: B::Vector,
    /// Temporary (A v before a left preconditioner, M^-1 v before A with a right one).
    t: B::Vector,
    /// Hessenberg matrix, column-major (m+1) x m.
    h: Vec<f64>,
    cs: Vec<f64>,
    sn: Vec<f64>,
    g: Vec<f64>,
    y: Vec<f64>,
    /// 2 (m+1) coefficients.
    coef: Vec<f64>,
    /// DCGS2: the Hessenberg matrix before the rotations (column j-1 is corrected at step j).
    hraw: Vec<f64>,
    /// DCGS2: g[j] before rotation j (rotation j is redone at step j+1).
    gsave: Vec<f64>,
    /// DCGS2: the 2 (m+1) + 1 numbers of a step's single reduction.
    red: Vec<f64>,
    /// Device Arnoldi loop: per step [V^T w (m+1) | CGS2's second pass (m+1) | ||w||^2] on the
    /// backend, and their host copy.
    sc: B::Vector,
    sc_host: Vec<f64>,
}

/// Entries per step in the device Arnoldi loop's scalars (see [`GmresWorkspace`]).
fn sc_stride(m: usize) -> usize {
    2 * (m + 1) + 1
}

impl<B: Backend> GmresWorkspace<B> {
    /// Allocate everything GMRES(m) needs for vectors of `n` local entries.
    pub fn new(be: &B, n: usize, m: usize) -> Result<Self> {
        let m = m.max(1);
        let v = (0..=m).map(|_| be.zeros(n)).collect::<Result<Vec<_>>>()?;
        Ok(GmresWorkspace {
            m,
            n,
            v,
            w: be.zeros(n)?,
            r: be.zeros(n)?,
            t: be.zeros(n)?,
            h: vec![0.0; (m + 1) * m],
            cs: vec![0.0; m],
            sn: vec![0.0; m],
            g: vec![0.0; m + 1],
            y: vec![0.0; m],
            // two columns of coefficients: CGS2's two passes
            coef: vec![0.0; 2 * (m + 1)],
            hraw: vec![0.0; (m + 1) * m],
            gsave: vec![0.0; m + 1],
            red: vec![0.0; 2 * (m + 1) + 1],
            sc: be.zeros(m * sc_stride(m))?,
            sc_host: vec![0.0; m * sc_stride(m)],
        })
    }
}

/// Global 2-norm of a row-distributed vector.
fn gnorm<B: Backend>(be: &B, comm: &dyn Comm, x: &B::Vector) -> Result<f64> {
    Ok(comm.allreduce_scalar(be.norm_sq(x)?)?.max(0.0).sqrt())
}

/// A Givens rotation (c, s) with c a + s b = r, -s a + c b = 0.
fn givens(a: f64, b: f64) -> (f64, f64) {
    if b == 0.0 {
        (1.0, 0.0)
    } else if b.abs() > a.abs() {
        let t = a / b;
        let s = 1.0 / (1.0 + t * t).sqrt();
        (s * t, s)
    } else {
        let t = b / a;
        let c = 1.0 / (1.0 + t * t).sqrt();
        (c, c * t)
    }
}

/// Apply rotations 0..j to column `col` (entries 0..=j+1), compute rotation j from it and
/// apply it to g[j], g[j+1].
fn rotate_column(col: &mut [f64], cs: &mut [f64], sn: &mut [f64], g: &mut [f64], j: usize) {
    for i in 0..j {
        let (a, bb) = (col[i], col[i + 1]);
        col[i] = cs[i] * a + sn[i] * bb;
        col[i + 1] = -sn[i] * a + cs[i] * bb;
    }
    let (c, s) = givens(col[j], col[j + 1]);
    cs[j] = c;
    sn[j] = s;
    col[j] = c * col[j] + s * col[j + 1];
    col[j + 1] = 0.0;
    g[j + 1] = -s * g[j];
    g[j] *= c;
}

/// Solve the leading k x k upper-triangular part of H y = g; trailing zero diagonals (from a
/// breakdown) give zero components, as SciPy's UPDATE does.
fn solve_upper(h: &[f64], ld: usize, g: &[f64], y: &mut [f64], k: usize) {
    let mut kk = k;
    while kk > 0 && h[(kk - 1) * ld + kk - 1] == 0.0 {
        y[kk - 1] = 0.0;
        kk -= 1;
    }
    for i in (0..kk).rev() {
        let mut s = g[i];
        for j in i + 1..kk {
            s -= h[j * ld + i] * y[j];
        }
        let d = h[i * ld + i];
        y[i] = if d != 0.0 { s / d } else { 0.0 };
    }
}

/// w = M^-1 A x (left) or A M^-1 x (right); a diagonal M^-1 on the left is folded into the
/// product's rows ([`Operator::apply_scaled_rows`]). `t` is scratch.
fn precond_product<B, O, P>(
    be: &B,
    op: &O,
    pc: &mut P,
    left: bool,
    x: &B::Vector,
    t: &mut B::Vector,
    w: &mut B::Vector,
) -> Result<()>
where
    B: Backend,
    O: Operator<B>,
    P: Preconditioner<B> + ?Sized,
{
    if left {
        if let Some(d) = pc.diagonal() {
            return op.apply_scaled_rows(be, x, d.scale(), t, w);
        }
        op.apply(be, Scale::SET, x, t)?;
        pc.apply(be, t, w)
    } else {
        pc.apply(be, x, t)?;
        op.apply(be, Scale::SET, t, w)
    }
}

/// The vectors a device Arnoldi cycle works on: the basis, w, the preconditioner's scratch, and
/// the scalars kept on the backend.
struct CycleWork<'a, V> {
    v: &'a mut [V],
    w: &'a mut V,
    t: &'a mut V,
    sc: &'a mut V,
}

/// Launch `steps` Arnoldi steps of classical Gram-Schmidt (once, or twice for `Orthog::Cgs2`)
/// with every scalar kept on the backend (`ArnoldiLoop::Device`): step j writes V^T w at
/// sc[j * stride], CGS2's second pass at sc[j * stride + m + 1] and ||w||^2 at
/// sc[j * stride + 2 (m + 1)], and v_{j+1} = w / ||w||. Nothing here waits for the device
/// (except a host allreduce on several ranks without NCCL).
fn device_cycle<B, O, P>(
    be: &B,
    (op, pc): (&O, &mut P),
    comm: &dyn Comm,
    left: bool,
    orthog: Orthog,
    work: CycleWork<'_, B::Vector>,
    steps: usize,
) -> Result<()>
where
    B: Backend,
    O: Operator<B>,
    P: Preconditioner<B> + ?Sized,
{
    let CycleWork {
        v,
        mut w,
        mut t,
        sc,
    } = work;
    let ld = v.len(); // m + 1
    let stride = sc_stride(ld - 1);
    // With a diagonal M^-1 on the left, v_j (j >= 1) is normalised by the product that reads
    // it (Operator::apply_normalized_scaled_rows): `pending` is the scalar slot of ||w||^2
    // while w still holds v_j unnormalised. The same numbers as a pass of its own.
    let fuse = left && pc.diagonal().is_some();
    let mut pending: Option<usize> = None;
    for j in 0..steps {
        let (vl, vr) = v.split_at_mut(j + 1);
        match (pending.take(), pc.diagonal()) {
            (Some(at), Some(d)) => {
                op.apply_normalized_scaled_rows(be, (&*sc, at), w, &mut vl[j], d.scale(), t)?;
                std::mem::swap(&mut w, &mut t);
            }
            (None, _) => precond_product(be, op, pc, left, &vl[j], t, w)?,
            (Some(_), None) => return Err(Error::Invalid(
                "GMRES device loop: a vector left unnormalised without a diagonal preconditioner"
                    .into(),
            )),
        }
        let (c, nsq) = (j * stride, j * stride + 2 * ld);
        be.multi_dot_to(vl, w, sc, c)?;
        be.allreduce_scalars(comm, sc, c, j + 1)?;
        let last = if orthog == Orthog::Cgs2 {
            be.multi_axpy_dot_to(vl, w, sc, c, c + ld)?;
            be.allreduce_scalars(comm, sc, c + ld, j + 1)?;
            c + ld
        } else {
            c
        };
        be.multi_axpy_norm_sq_to(vl, w, sc, last, nsq)?;
        be.allreduce_scalars(comm, sc, nsq, 1)?;
        if fuse && j + 1 < steps {
            pending = Some(nsq);
        } else {
            be.copy_inv_sqrt(sc, nsq, w, &mut vr[0])?;
        }
    }
    Ok(())
}

/// The Givens state of a cycle: rotations so far, the rotated right-hand side g, and g[j]
/// before rotation j (DCGS2 redoes a rotation).
struct Rotations<'a> {
    cs: &'a mut [f64],
    sn: &'a mut [f64],
    g: &'a mut [f64],
    gsave: &'a mut [f64],
}

/// The host's end of Arnoldi step j (both loops), once column j of H (entries 0..=j) and the
/// new vector's norm `hn` are known: the non-finite check, the breakdown test (H[j+1, j] = hn,
/// or 0 and `hraw_next` = 0 on breakdown), rotation j. Returns the residual estimate |g[j+1]|
/// and whether the Krylov space broke down (then the new vector is not used).
fn end_step(
    col: &mut [f64],
    hraw_next: &mut f64,
    hn: f64,
    j: usize,
    its: usize,
    rot: Rotations<'_>,
) -> Result<(f64, bool)> {
    let colnorm = (col[..=j].iter().map(|a| a * a).sum::<f64>() + hn * hn).sqrt();
    if !hn.is_finite() || !colnorm.is_finite() {
        return Err(Error::Invalid(format!(
            "GMRES: Arnoldi vector became non-finite at iteration {its} (operator or preconditioner produces NaN/Inf)"
        )));
    }
    let breakdown = hn <= f64::EPSILON * colnorm;
    if breakdown {
        col[j + 1] = 0.0;
        *hraw_next = 0.0;
    } else {
        col[j + 1] = hn;
    }
    rot.gsave[j] = rot.g[j];
    rotate_column(col, rot.cs, rot.sn, rot.g, j);
    Ok((rot.g[j + 1].abs(), breakdown))
}

/// Solve A x = b by GMRES(m). `b` and `x` hold this rank's rows; `x` is the starting guess on
/// entry and the iterate on return. `ws` must come from [`GmresWorkspace::new`] with the same
/// backend, the operator's local size and `params.restart`.
#[allow(clippy::too_many_arguments)]
pub fn gmres_solve<B, O, P>(
    be: &B,
    op: &O,
    pc: &mut P,
    comm: &dyn Comm,
    b: &B::Vector,
    x: &mut B::Vector,
    params: &GmresParams,
    ws: &mut GmresWorkspace<B>,
    monitor: &mut dyn GmresMonitor,
) -> Result<GmresInfo>
where
    B: Backend,
    O: Operator<B>,
    P: Preconditioner<B> + ?Sized,
{
    params.check()?;
    let n = op.nrows();
    if op.ncols() != n {
        return Err(Error::Invalid(format!(
            "GMRES needs a square (locally square) operator; got {} x {}",
            n,
            op.ncols()
        )));
    }
    if be.len(b) != n || be.len(x) != n {
        return Err(Error::Invalid(format!(
            "GMRES: b has {} and x has {} entries but the operator has {n} local rows",
            be.len(b),
            be.len(x)
        )));
    }
    if ws.n != n || ws.m != params.restart {
        return Err(Error::Invalid(format!(
            "GMRES workspace sized for n = {}, m = {} but the solve has n = {n}, m = {}",
            ws.n, ws.m, params.restart
        )));
    }
    let t0 = Instant::now();
    let m = params.restart;
    let ld = m + 1;
    let left = params.side == PrecondSide::Left;
    let scipy = params.test == ConvergenceTest::Scipy;
    let GmresWorkspace {
        v,
        w,
        r,
        t,
        h,
        cs,
        sn,
        g,
        y,
        coef,
        hraw,
        gsave,
        red,
        sc,
        sc_host,
        ..
    } = ws;
    let deferred = match params.arnoldi_loop {
        ArnoldiLoop::Host => false,
        ArnoldiLoop::Device => true,
        ArnoldiLoop::Auto => {
            be.defers_scalars() && matches!(params.orthog, Orthog::Cgs | Orthog::Cgs2)
        }
    };
    let arnoldi_loop = if deferred {
        ArnoldiLoop::Device
    } else {
        ArnoldiLoop::Host
    };

    let bnorm = gnorm(be, comm, b)?;
    let finish = |converged: bool,
                  reason: String,
                  its: usize,
                  cycles: usize,
                  rnorm: f64,
                  prel: f64|
     -> GmresInfo {
        let seconds = t0.elapsed().as_secs_f64();
        GmresInfo {
            stop: GmresStop {
                converged,
                reason,
                iterations: its,
                restarts: cycles.saturating_sub(1),
                relres: if bnorm > 0.0 { rnorm / bnorm } else { 0.0 },
                precond_relres: prel,
            },
            bnorm,
            seconds,
            ms_per_iter: if its > 0 {
                1e3 * seconds / its as f64
            } else {
                0.0
            },
            arnoldi_loop,
        }
    };
    if bnorm == 0.0 {
        be.fill(x, 0.0)?;
        monitor.record(&GmresRecord {
            iteration: 0,
            cycle: 0,
            resnorm: 0.0,
            relres: 0.0,
            seconds: 0.0,
        })?;
        return Ok(finish(
            true,
            "b = 0: x = 0 is the exact solution".into(),
            0,
            0,
            0.0,
            0.0,
        ));
    }
    // Norm of the preconditioned right-hand side (the residual of x = 0).
    let pbnorm = if left {
        pc.apply(be, b, t)?;
        gnorm(be, comm, t)?
    } else {
        bnorm
    };
    if !pbnorm.is_finite() || pbnorm == 0.0 {
        return Err(Error::Invalid(format!(
            "GMRES: the preconditioned right-hand side has norm {pbnorm} (singular or invalid preconditioner)"
        )));
    }
    // One line of history inside a cycle (`cycles` counts the current one).
    let record = |monitor: &mut dyn GmresMonitor, its, cycles: usize, est: f64, seconds| {
        monitor.record(&GmresRecord {
            iteration: its,
            cycle: cycles - 1,
            resnorm: est,
            relres: est / pbnorm,
            seconds,
        })
    };
    let true_tol = params.atol.max(params.rtol * bnorm);
    let pc_tol = params.atol.max(params.rtol * pbnorm);

    // r = b - A x, V_0 = M^-1 r (left) or r; returns (||r||, ||V_0||).
    let residual = |be: &B,
                    pc: &mut P,
                    x: &B::Vector,
                    r: &mut B::Vector,
                    v0: &mut B::Vector|
     -> Result<(f64, f64)> {
        be.copy(b, r)?;
        op.apply(be, Scale::new(-1.0, 1.0), x, r)?;
        let rn = gnorm(be, comm, r)?;
        if left {
            pc.apply(be, r, v0)?;
            Ok((rn, gnorm(be, comm, v0)?))
        } else {
            be.copy(r, v0)?;
            Ok((rn, rn))
        }
    };

    let (mut rnorm, mut beta) = residual(be, pc, x, r, &mut v[0])?;
    monitor.record(&GmresRecord {
        iteration: 0,
        cycle: 0,
        resnorm: beta,
        relres: beta / pbnorm,
        seconds: t0.elapsed().as_secs_f64(),
    })?;
    let converged_now = |rnorm: f64, beta: f64| {
        if scipy {
            rnorm <= true_tol
        } else {
            beta <= pc_tol
        }
    };
    if converged_now(rnorm, beta) {
        return Ok(finish(
            true,
            "the initial guess already satisfies the tolerance".into(),
            0,
            0,
            rnorm,
            beta / pbnorm,
        ));
    }
    // SciPy 1.10's adaptive inner tolerance.
    let mut ptol_factor = 1.0f64;
    let mut ptol = pbnorm * (true_tol / bnorm).min(1.0);

    let mut its = 0usize;
    let mut cycles = 0usize;
    loop {
        if !(beta.is_finite() && rnorm.is_finite()) {
            return Err(Error::Invalid(format!(
                "GMRES: residual became non-finite after {its} iterations (operator or preconditioner produces NaN/Inf)"
            )));
        }
        cycles += 1;
        be.scale(&mut v[0], 1.0 / beta)?;
        g.fill(0.0);
        g[0] = beta;
        let inner_tol = if scipy { ptol } else { pc_tol };
        let mut k = 0usize; // columns of H built in this cycle
        let mut breakdown = false;
        let mut est = beta;
        if deferred {
            // The whole cycle on the backend, then its scalars to the host once.
            let steps = m.min(params.max_iter - its);
            let stride = sc_stride(m);
            let work = CycleWork {
                v: &mut v[..],
                w: &mut *w,
                t: &mut *t,
                sc: &mut *sc,
            };
            device_cycle(be, (op, &mut *pc), comm, left, params.orthog, work, steps)?;
            be.read_scalars(sc, 0, &mut sc_host[..steps * stride])?;
            let seconds = t0.elapsed().as_secs_f64();
            // The host loop's decisions, step by step, on the same numbers.
            for j in 0..steps {
                its += 1;
                let r = &sc_host[j * stride..(j + 1) * stride];
                let col = &mut h[j * ld..(j + 1) * ld];
                if params.orthog == Orthog::Cgs2 {
                    for i in 0..=j {
                        col[i] = r[i] + r[ld + i];
                    }
                } else {
                    col[..=j].copy_from_slice(&r[..=j]);
                }
                let hn = r[2 * ld].max(0.0).sqrt();
                let rot = Rotations { cs, sn, g, gsave };
                (est, breakdown) = end_step(col, &mut hraw[j * ld + j + 1], hn, j, its, rot)?;
                k = j + 1;
                record(monitor, its, cycles, est, seconds)?;
                if est <= inner_tol || breakdown {
                    break;
                }
            }
        } else {
            while k < m && its < params.max_iter {
                let j = k;
                // w = M^-1 A v_j (left) or A M^-1 v_j (right); DCGS2 writes it into v_{j+1}
                // (orthogonalised and normalised in place), so that one batched pass over
                // v_0..v_{j+1} gives V^T w and ||w||^2 together.
                let dc = params.orthog == Orthog::Dcgs2;
                {
                    let (vl, vr) = v.split_at_mut(j + 1);
                    let dst = if dc { &mut vr[0] } else { &mut *w };
                    precond_product(be, op, pc, left, &vl[j], t, dst)?;
                }
                its += 1;
                let (hprev, hcur) = h.split_at_mut(j * ld);
                let col = &mut hcur[..ld];
                // the new vector is scaled by 1 / (hn * wfac) into v_{j+1}
                let mut wfac = 1.0;
                let hn = match params.orthog {
                    Orthog::Mgs => {
                        for i in 0..=j {
                            let hij = comm.allreduce_scalar(be.dot(&v[i], w)?)?;
                            be.axpby(-hij, &v[i], 1.0, w)?;
                            col[i] = hij;
                        }
                        gnorm(be, comm, w)?
                    }
                    Orthog::Cgs => {
                        // Two passes over the basis: c = V^T w; [w -= V c, ||w||^2].
                        let c = &mut coef[..=j];
                        be.multi_dot(&v[..=j], w, c)?;
                        comm.allreduce_sum(c)?;
                        col[..=j].copy_from_slice(c);
                        comm.allreduce_scalar(be.multi_axpy_norm_sq(c, &v[..=j], w)?)?
                            .max(0.0)
                            .sqrt()
                    }
                    Orthog::Cgs2 => {
                        // Three passes over the basis, one reduction each: c = V^T w;
                        // [w -= V c, c2 = V^T w]; [w -= V c2, ||w||^2].
                        let (c, c2) = coef.split_at_mut(ld);
                        let (c, c2) = (&mut c[..=j], &mut c2[..=j]);
                        be.multi_dot(&v[..=j], w, c)?;
                        comm.allreduce_sum(c)?;
                        be.multi_axpy_dot(c, &v[..=j], w, c2)?;
                        comm.allreduce_sum(c2)?;
                        for i in 0..=j {
                            col[i] = c[i] + c2[i];
                        }
                        comm.allreduce_scalar(be.multi_axpy_norm_sq(c2, &v[..=j], w)?)?
                            .max(0.0)
                            .sqrt()
                    }
                    Orthog::Dcgs2 => {
                        // v_{j+1} = z = Op(p) with p = v_j provisional (once orthogonalised,
                        // normalised by a Pythagorean norm) for j >= 1; v_0 is final. One
                        // reduction of [V_0..j^T z, z.z, V_0..j-1^T p, p.p].
                        let nr = if j == 0 { 2 } else { 2 * j + 3 };
                        let red = &mut red[..nr];
                        be.multi_dot(&v[..=j + 1], &v[j + 1], &mut red[..=j + 1])?;
                        if j > 0 {
                            be.multi_dot(&v[..=j], &v[j], &mut red[j + 2..])?;
                        }
                        comm.allreduce_sum(red)?;
                        let (a, rest) = red.split_at(j + 1);
                        let zz = rest[0];
                        let d = if j > 0 { &rest[1..=j] } else { &rest[..0] };
                        let mut s = 1.0;
                        if j > 0 {
                            // Re-orthogonalise and normalise v_j: v_j = (p - V d) / s.
                            let pp = rest[j + 1];
                            let s2 = pp - d.iter().map(|x| x * x).sum::<f64>();
                            let (vl, vr) = v.split_at_mut(j);
                            be.multi_axpy(d, vl, &mut vr[0])?;
                            s = if s2 >= 0.25 * pp && s2 > 0.0 {
                                s2.sqrt()
                            } else {
                                // p was mostly inside span(V): the Pythagorean norm cancelled;
                                // one extra reduction (near breakdown only).
                                gnorm(be, comm, &vr[0])?
                            };
                            if !(s.is_finite() && s > 0.0) {
                                return Err(Error::Invalid(format!(
                                "GMRES: Arnoldi vector became non-finite or zero at iteration {its} (operator or preconditioner produces NaN/Inf)"
                            )));
                            }
                            be.scale(&mut vr[0], 1.0 / s)?;
                            // Column j-1: Op(v_{j-1}) = V c + eta p = V (c + eta d) + eta s v_j.
                            let hc = &mut hraw[(j - 1) * ld..j * ld];
                            let eta = hc[j];
                            for i in 0..j {
                                hc[i] += eta * d[i];
                            }
                            hc[j] = eta * s;
                            let pcol = &mut hprev[(j - 1) * ld..j * ld];
                            pcol[..=j].copy_from_slice(&hc[..=j]);
                            g[j - 1] = gsave[j - 1];
                            rotate_column(pcol, cs, sn, g, j - 1);
                        }
                        // Op(v_j) = (z - Op(V d)) / s = (z - V e) / s with e = H[0..=j, 0..j] d.
                        let (e, c) = coef.split_at_mut(ld);
                        let (e, c) = (&mut e[..=j], &mut c[..=j]);
                        for (i, ei) in e.iter_mut().enumerate() {
                            *ei = (i.saturating_sub(1)..j)
                                .map(|k| hraw[k * ld + i] * d[k])
                                .sum();
                        }
                        let ad: f64 = a[..j].iter().zip(d).map(|(x, y)| x * y).sum();
                        let vjz = (a[j] - ad) / s;
                        for i in 0..j {
                            c[i] = (a[i] - e[i]) / s;
                        }
                        c[j] = (vjz - e[j]) / s;
                        let ae: f64 = a[..j].iter().zip(&e[..j]).map(|(x, y)| x * y).sum();
                        let ee: f64 = e.iter().map(|x| x * x).sum();
                        let ww = (zz - 2.0 * (ae + vjz * e[j]) + ee) / (s * s);
                        let eta2 = ww - c.iter().map(|x| x * x).sum::<f64>();
                        col[..=j].copy_from_slice(c);
                        // v_{j+1} = z - V (e + s c) = s (Op(v_j) - V c)
                        for (ei, ci) in e.iter_mut().zip(c.iter()) {
                            *ei += s * *ci;
                        }
                        let (vl, vr) = v.split_at_mut(j + 1);
                        be.multi_axpy(e, vl, &mut vr[0])?;
                        wfac = s;
                        let eta = if eta2 > 1e-10 * ww {
                            eta2.sqrt()
                        } else {
                            // cancellation in the Pythagorean norm: one extra reduction
                            gnorm(be, comm, &vr[0])? / s
                        };
                        let hc = &mut hraw[j * ld..(j + 1) * ld];
                        hc[..=j].copy_from_slice(c);
                        hc[j + 1] = eta;
                        eta
                    }
                };
                let rot = Rotations { cs, sn, g, gsave };
                (est, breakdown) = end_step(col, &mut hraw[j * ld + j + 1], hn, j, its, rot)?;
                if !breakdown {
                    if dc {
                        be.scale(&mut v[j + 1], 1.0 / (hn * wfac))?;
                    } else {
                        be.copy_scaled(1.0 / hn, w, &mut v[j + 1])?;
                    }
                }
                k = j + 1;
                record(monitor, its, cycles, est, t0.elapsed().as_secs_f64())?;
                if est <= inner_tol || breakdown {
                    break;
                }
            }
        }
        // x += V y (left) or M^-1 V y (right)
        if k > 0 {
            solve_upper(h, ld, g, y, k);
            for (c, yi) in coef[..k].iter_mut().zip(&y[..k]) {
                *c = -yi;
            }
            if left {
                be.multi_axpy(&coef[..k], &v[..k], x)?;
            } else {
                be.fill(t, 0.0)?;
                be.multi_axpy(&coef[..k], &v[..k], t)?;
                pc.apply(be, t, w)?;
                be.axpby(1.0, w, 1.0, x)?;
            }
        }
        let (rn, bt) = residual(be, pc, x, r, &mut v[0])?;
        rnorm = rn;
        beta = bt;
        if converged_now(rnorm, beta) {
            let reason = if breakdown {
                "happy breakdown: the Krylov space is invariant and the residual meets the tolerance"
            } else if scipy {
                "true residual ||b - A x|| <= rtol ||b||"
            } else if left {
                "preconditioned residual ||M^-1 (b - A x)|| <= rtol ||M^-1 b||"
            } else {
                "residual ||b - A x|| <= rtol ||b||"
            };
            return Ok(finish(
                true,
                reason.into(),
                its,
                cycles,
                rnorm,
                beta / pbnorm,
            ));
        }
        if breakdown {
            return Ok(finish(
                false,
                format!(
                    "breakdown: the Krylov space became invariant at iteration {its} but the residual is still above the tolerance (singular or ill-conditioned operator/preconditioner)"
                ),
                its,
                cycles,
                rnorm,
                beta / pbnorm,
            ));
        }
        if its >= params.max_iter {
            return Ok(finish(
                false,
                format!("iteration limit: {its} iterations without reaching the tolerance"),
                its,
                cycles,
                rnorm,
                beta / pbnorm,
            ));
        }
        if params.max_cycles.is_some_and(|mc| cycles >= mc) {
            return Ok(finish(
                false,
                format!(
                    "cycle limit: {cycles} cycles of GMRES({m}) ({its} iterations) without reaching the tolerance"
                ),
                its,
                cycles,
                rnorm,
                beta / pbnorm,
            ));
        }
        if scipy {
            if est > ptol {
                ptol_factor = (1.5 * ptol_factor).min(1.0);
            } else {
                ptol_factor = (0.25 * ptol_factor).max(1e-16);
            }
            ptol = if rnorm != 0.0 {
                est * ptol_factor.min(true_tol / rnorm)
            } else {
                est * ptol_factor
            };
        }
    }
}

/// The host-side result of a GMRES solve.
#[derive(Debug, Clone)]
pub struct GmresSolution {
    pub x: Vec<f64>,
    pub info: GmresInfo,
}

/// Upload b (and x0; zero by default), allocate the workspace, solve, download x.
#[allow(clippy::too_many_arguments)]
pub fn gmres<B, O, P>(
    be: &B,
    op: &O,
    pc: &mut P,
    comm: &dyn Comm,
    b: &[f64],
    x0: Option<&[f64]>,
    params: &GmresParams,
    monitor: &mut dyn GmresMonitor,
) -> Result<GmresSolution>
where
    B: Backend,
    O: Operator<B>,
    P: Preconditioner<B> + ?Sized,
{
    let n = op.nrows();
    if b.len() != n || x0.is_some_and(|x| x.len() != n) {
        return Err(Error::Invalid(format!(
            "GMRES: b has {} entries (x0 {:?}) but the operator has {n} local rows",
            b.len(),
            x0.map(|x| x.len())
        )));
    }
    let bd = be.upload(b)?;
    let mut xd = match x0 {
        Some(x) => be.upload(x)?,
        None => be.zeros(n)?,
    };
    let mut ws = GmresWorkspace::new(be, n, params.restart)?;
    let info = gmres_solve(be, op, pc, comm, &bd, &mut xd, params, &mut ws, monitor)?;
    let mut x = vec![0.0; n];
    be.download(&xd, &mut x)?;
    Ok(GmresSolution { x, info })
}
