//! The operator factory: the one place that turns "which backend x storage x precision x
//! layout" into concrete backends and operators. Everything above it (the stages, the CLI,
//! `bench`, the Python module) names an [`OperatorSpec`] and gets its work done by a visitor
//! that is generic over the backend and the operator: it never names `CpuCsrOperator`,
//! `CudaCompactOperator` or any other concrete type.
//!
//! - [`Engine`]: a started backend (the CPU, or one GPU of this rank with its allreduce path).
//! - [`Engine::lsqr`]: LSQR's operator for a stored matrix (CSR, or compact rows with the grid
//!   stencils), handed to an [`LsqrVisitor`].
//! - [`Engine::square`]: a square system's operator with its halo and preconditioner, handed to
//!   a [`SquareVisitor`] (GMRES).
//! - [`choose_backend`], [`resolve_storage`], [`use_device_loop`]: the automatic choices, with
//!   the reasons they give.

use std::time::Instant;

use crate::backend::batch::{BatchBackend, BlockOperator};
use crate::backend::cpu::square::DistSquareOperator;
use crate::backend::cpu::{
    on_pool, CpuBackend, CpuBlockOperator, CpuCompactOperator, CpuCsrOperator,
};
use crate::backend::cuda::{
    encoding_key, peer_first, CudaBackend, CudaBlockOperator, CudaCompactOperator, CudaCsrOperator,
    CudaIluSweeps, CudaSquareOperator, EarlyNccl, Prestart,
};
use crate::backend::precond::Preconditioner;
use crate::backend::storage::{
    describe_compact, DeviceCsr, DeviceEncoding, EncodingKey, Storage, StoredMatrix, StoredRows,
};
use crate::backend::{
    AllreducePath, Backend, LsqrLoop, Operator, Precision, ScalarSlots, TransposeStrategy,
};
use crate::comm::halo::CommVolume;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::partition::graph::RowPartition;
use crate::partition::RowCost;
use crate::pipeline::options::{BackendChoice, OperatorSpec};
use crate::settings::tuning::Tuning;
use crate::solver::dist_square::{square_precond, PrecondCounts, SquarePrecond};
use crate::sparse::Csr;
use crate::ui::phases;

/// On the GPU, `storage = "auto"` picks compact storage from this many stored nonzeros on one
/// rank: below it the products are latency-bound and CSR through cuSPARSE measured faster
/// (australia, docs/gpu.md).
const GPU_COMPACT_MIN_NNZ: usize = 1_000_000;

/// Whether a usable CUDA GPU is here: the device in words, or why not (never panics).
pub fn gpu_here() -> std::result::Result<String, String> {
    crate::backend::cuda::probe().map(|d| d.to_string())
}

/// A backend and why it was chosen ([`choose_backend`]).
type Chosen = (BackendChoice, String);

/// A run's backend chosen ([`choose_backend`]) on another thread while the run reads its
/// system: the CUDA driver's start (0.14-0.24 s on an H100 machine) is most of that choice. On
/// a GPU the same thread then makes this rank's context and compiles its kernels
/// ([`CudaBackend::prestart_after`]; [`Engine::start`] finds them made). Dropping it waits for
/// that thread.
pub struct BackendProbe {
    answer: std::sync::mpsc::Receiver<Result<Chosen>>,
    /// The answer once received; an error kept as (backend, message) to be given again.
    got: Option<std::result::Result<Chosen, (&'static str, String)>>,
    /// Several ranks: where the NCCL communicator to make ahead goes to the thread (dropped
    /// before the thread is waited for).
    early: Option<std::sync::mpsc::Sender<Option<EarlyNccl>>>,
    _prestart: Prestart,
}

impl BackendProbe {
    /// Start choosing among `choice` (`cpu`: chosen at once, no thread).
    pub fn start(choice: BackendChoice, comm: &dyn Comm, tuning: &Tuning) -> BackendProbe {
        let (tx, answer) = std::sync::mpsc::channel();
        let (early, early_rx) = std::sync::mpsc::channel::<Option<EarlyNccl>>();
        let several = comm.size() > 1 && choice != BackendChoice::Cpu;
        let prestart = if choice == BackendChoice::Cpu {
            let _ = tx.send(choose_backend(choice));
            Prestart::none()
        } else {
            let local = (comm.size() > 1).then(|| comm.local_rank());
            let first = move || {
                let chosen = choose_backend(choice);
                let cuda = matches!(chosen, Ok((BackendChoice::Cuda, _)));
                let _ = tx.send(chosen);
                // (An error here is met again, and reported, by the backend's own start.)
                cuda.then(|| CudaBackend::ordinal_of(local).ok().map(|(o, _)| o))
                    .flatten()
            };
            let then = move |ctx: &_| {
                if several {
                    if let Ok(Some(e)) = early_rx.recv() {
                        crate::ui::phases::trace(format_args!("nccl: context made, connecting"));
                        e.make(ctx);
                        crate::ui::phases::trace(format_args!("nccl: connected"));
                    }
                }
            };
            CudaBackend::prestart_after(first, tuning.nvrtc_defines.clone(), then)
        };
        BackendProbe {
            answer,
            got: None,
            early: several.then_some(early),
            _prestart: prestart,
        }
    }

    /// Several ranks (collective; every rank calls it, a no-op on one rank or the CPU): NCCL's
    /// id exchanged now and the communicator made on the probe's thread once the context is
    /// there, beside the read of the rows; [`Engine::start`]'s allreduce set-up takes it.
    /// Nothing where the job's sums on the GPUs (`device_sums`: LSQR's device loop) will go
    /// through the GPUs' memory instead ([`peer_first`]).
    pub fn start_nccl(
        &mut self,
        comm: &dyn Comm,
        tuning: &Tuning,
        (path, device_sums): (AllreducePath, bool),
    ) -> Result<()> {
        let Some(tx) = self.early.take() else {
            return Ok(());
        };
        let made = if peer_first(comm, path, device_sums)? {
            None
        } else {
            EarlyNccl::start(comm, path, tuning.nccl_max_ctas)?
        };
        let _ = tx.send(made);
        Ok(())
    }

    /// Stop waiting for the thread that makes the GPU's context (and NCCL's communicator) when
    /// this value is dropped: a run that ends in an error before its backend is made, where
    /// that thread may wait for ranks that will not come. The process's exit ends it.
    pub fn detach(&mut self) {
        self._prestart.detach();
    }

    /// The backend and why (waits for the choice the first time; the wait is the `probe`
    /// phase).
    pub fn kind(&mut self) -> Result<Chosen> {
        let got = self.got.get_or_insert_with(|| {
            let t = Instant::now();
            let r = self.answer.recv().unwrap_or_else(|_| {
                Err(Error::backend(
                    "cuda",
                    "the backend probe ended without an answer",
                ))
            });
            phases::record("probe", t.elapsed().as_secs_f64());
            r.map_err(|e| match e {
                Error::Backend { backend, msg } => (backend, msg),
                other => ("cuda", other.to_string()),
            })
        });
        got.clone()
            .map_err(|(backend, msg)| Error::backend(backend, msg))
    }
}

/// Collective: every rank's backend the same, else the same one-line error on every rank,
/// naming the first rank without a GPU among ranks with one (`why`: this rank's reason). A
/// job cannot mix them: the GPU ranks would wait for NCCL, or in its sums, for ranks that
/// never come.
pub fn same_backend_everywhere(comm: &dyn Comm, kind: BackendChoice, why: &str) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let gpu = kind == BackendChoice::Cuda;
    let mixed = crate::comm::on_any_rank(comm, gpu)? && !crate::comm::on_every_rank(comm, gpu)?;
    let mine = if mixed && !gpu {
        Err(crate::Error::Invalid(format!(
            "the other ranks run on GPUs but this one on the CPU ({why}); give every rank a \
             usable GPU, or run them all on the CPU ([backend] kind = \"cpu\")"
        )))
    } else {
        Ok(())
    };
    crate::comm::agree(comm, mine)
}

/// A rank started by a launcher, before MPI's start: CUDA's start and this rank's GPU context
/// made on a thread of their own ([`crate::backend::cuda::head_start`]); [`Engine::start`]
/// lets go of it.
pub fn gpu_head_start(local_rank: usize) {
    crate::backend::cuda::head_start(local_rank);
}

/// The backend a run is likely to get, before the probe answers: the one asked for, `auto`
/// CUDA where its libraries are here (several ranks balance their rows by the cost on it
/// before the probe has answered; a wrong guess only balances them less well).
pub fn likely_backend(asked: BackendChoice) -> BackendChoice {
    match asked {
        BackendChoice::Auto if crate::backend::cuda::missing_libraries().is_empty() => {
            BackendChoice::Cuda
        }
        BackendChoice::Auto => BackendChoice::Cpu,
        k => k,
    }
}

/// Resolve `Auto` and check that the chosen backend can run here; the string says why.
pub fn choose_backend(choice: BackendChoice) -> Result<(BackendChoice, String)> {
    match choice {
        BackendChoice::Cpu => Ok((BackendChoice::Cpu, "cpu requested".into())),
        BackendChoice::Cuda => match crate::backend::cuda::probe() {
            Ok(dev) => Ok((BackendChoice::Cuda, format!("cuda requested: {dev}"))),
            Err(why) => Err(Error::backend(
                "cuda",
                format!("no usable CUDA GPU ({why}); use --backend cpu"),
            )),
        },
        BackendChoice::Auto => match crate::backend::cuda::probe() {
            Ok(dev) => Ok((BackendChoice::Cuda, format!("auto: CUDA usable, {dev}"))),
            Err(why) => Ok((
                BackendChoice::Cpu,
                format!("auto: no usable CUDA GPU ({why}), using the CPU"),
            )),
        },
    }
}

/// The storage a run uses. On the GPU `auto` is compact where a rank holds >= 1M stored
/// nonzeros (measured faster there, docs/gpu.md; on several ranks each rank's grid damping rows
/// are stencils of their own) and CSR for small, latency-bound ones. On the CPU `auto` is CSR: decoding 16-bit deltas measured slower than CSR on australia's
/// cache-resident products, and out of cache compact's A^T y measured about twice CSR's
/// (docs/performance.md). `auto` with `transpose = "library"` or `"scatter"` is CSR (compact
/// builds its own explicit transpose).
pub fn resolve_storage(
    kind: BackendChoice,
    storage: Storage,
    transpose: TransposeStrategy,
    nnz: usize,
) -> Storage {
    match (kind, storage) {
        (BackendChoice::Cuda, Storage::Auto) if nnz < GPU_COMPACT_MIN_NNZ => Storage::Csr,
        (BackendChoice::Cpu | BackendChoice::Auto, Storage::Auto) => Storage::Csr,
        (_, s) => s.resolve(matches!(
            transpose,
            TransposeStrategy::Library | TransposeStrategy::Scatter
        )),
    }
}

/// What a row costs on `kind` with `storage` asked for, for balancing ranks: compact storage
/// and its stencils where it will be used (the GPU unless CSR is asked for; the CPU when
/// compact is), else CSR.
pub fn row_cost(kind: BackendChoice, storage: Storage) -> RowCost {
    match (kind, storage) {
        (_, Storage::Csr) => RowCost::CSR,
        (BackendChoice::Cuda, _) => RowCost::COMPACT_GPU,
        (_, Storage::Compact) => RowCost::COMPACT_CPU,
        _ => RowCost::CSR,
    }
}

/// Whether the GPU runs LSQR's device loop: `auto` = yes, with either storage (CSR with the
/// explicit transpose; a CSR operator with another transpose runs the host loop). On several
/// ranks the loop needs the vectors summed by NCCL (inside its graph); where they go through
/// the host (`allreduce = "host"`, or no libnccl) the host loop runs (`cuda_lsqr` decides).
/// Measured on an H100 (docs/performance.md): australia 0.030 ms/iter against 0.065 with the
/// host loop, the 100.7M system 1.01 against 1.09 ms.
pub fn use_device_loop(lsqr_loop: LsqrLoop) -> bool {
    match lsqr_loop {
        LsqrLoop::Device | LsqrLoop::Auto => true,
        LsqrLoop::Host => false,
    }
}

/// Whether a solve with `opts` runs LSQR's device loop where the GPU has one (several ranks:
/// LSMR runs the host loop).
pub fn lsqr_device_loop(opts: &crate::pipeline::options::SolveOptions) -> bool {
    opts.method == crate::solver::LsqMethod::Lsqr && use_device_loop(opts.operator.lsqr_loop)
}

/// What the factory built, in words and numbers (reports, `bench`).
#[derive(Debug, Clone, Default)]
pub struct Built {
    /// "cpu" or "cuda".
    pub backend: &'static str,
    /// The backend in one line (device, threads).
    pub backend_detail: String,
    /// How A^T y is computed (and the value precision on the GPU; the allreduce path on
    /// several ranks).
    pub transpose: String,
    /// The storage actually used: `Csr` or `Compact` (a GPU that cannot hold the compact
    /// storage falls back to CSR).
    pub storage: Storage,
    /// Why `auto` chose it, where a probe decided (empty otherwise).
    pub storage_reason: String,
    /// Value precision of the stored matrix.
    pub precision: Precision,
    /// Whether LSQR runs the backend's device loop.
    pub device_loop: bool,
    /// The layout in a short tag: the transpose strategy (CSR), "rows" (CPU compact), or the
    /// GPU's compact layout ("rows", "mixed:9", "split:9:12", ...).
    pub layout: String,
    /// Bytes the matrix passes of one LSQR iteration read (A x and A^T y), where the storage
    /// knows them (compact); None: plain CSR, counted by the caller.
    pub pass_bytes: Option<u64>,
    /// Bytes per stored nonzero of the A x pass.
    pub bytes_per_nnz: f64,
    /// Seconds spent building the operator (encoding, transposes, uploads).
    pub seconds: f64,
    /// The ray coverage the run left to the rows ([`crate::backend::storage::Deferred`]),
    /// being computed from them while the solve runs.
    pub coverage: Option<crate::grid::PendingCoverage>,
}

/// Work on LSQR's operator, whatever backend and storage it is (a closure cannot be generic).
pub trait LsqrVisitor {
    type Output;
    fn visit<B: Backend, O: Operator<B>>(self, be: &B, op: &O) -> Result<Self::Output>;
}

/// What the square factory built besides the operator.
#[derive(Debug, Clone)]
pub struct SquareBuilt {
    /// The halo exchange of one product, over all ranks.
    pub halo: CommVolume,
    /// How the rows are stored: "csr", or the GPU's row patterns described.
    pub storage: String,
    /// When the set-up started (the halo, the local matrix, the preconditioner).
    pub t0: Instant,
}

/// Work on a square system's operator and preconditioner (GMRES).
pub trait SquareVisitor {
    type Output;
    fn visit<B: ScalarSlots + 'static, O: Operator<B>>(
        self,
        be: &B,
        op: &O,
        pc: (Box<dyn Preconditioner<B>>, PrecondCounts),
        built: SquareBuilt,
    ) -> Result<Self::Output>
    where
        B::Vector: 'static;
}

/// One rank's share of a square system: `rows` are this rank's rows of the matrix (global
/// column indices, rows `part.range(comm.rank())`), `b` and `x0` this rank's entries.
#[derive(Clone, Copy)]
pub struct SquareSystem<'a> {
    pub rows: &'a Csr,
    pub part: &'a RowPartition,
    pub b: &'a [f64],
    pub x0: Option<&'a [f64]>,
}

/// A started backend: the CPU, or this rank's GPU with its allreduce path set up.
pub enum Engine {
    Cpu {
        be: CpuBackend,
        /// Drive solves from a worker of rayon's pool ([`on_pool`]); the Python module drives
        /// them from its own thread, where Ctrl-C is seen.
        pool: bool,
    },
    Cuda {
        be: Box<CudaBackend>,
        /// The allreduce (LSQR) or halo (GMRES) path between ranks, in words.
        path: String,
    },
}

impl Engine {
    /// Start `kind` (resolved: `Cpu` or `Cuda`) for this rank. On the GPU, `path` says how
    /// vectors cross between ranks (collective: every rank calls it); `device_sums`: the job's
    /// sums over the ranks run on the GPUs (LSQR's device loop, GMRES), which may go through
    /// the other GPUs' memory ([`peer_first`]).
    pub fn start(
        kind: BackendChoice,
        comm: &dyn Comm,
        (path, device_sums): (AllreducePath, bool),
        tuning: &Tuning,
    ) -> Result<Engine> {
        // (invert checks this as soon as the backend is known, with the probe's reason)
        same_backend_everywhere(comm, kind, "the backend chosen on this rank")?;
        let engine = phases::time_exclusive("backend", || match kind {
            BackendChoice::Cuda => {
                let be = CudaBackend::for_rank_with_defines(comm, &tuning.nvrtc_defines)?;
                let path = be.setup_allreduce(comm, path, tuning.nccl_max_ctas, device_sums)?;
                Ok(Engine::Cuda {
                    be: Box::new(be),
                    path,
                })
            }
            _ => Ok(Engine::cpu()),
        });
        // (the backend holds its own context where it is the head start's)
        crate::backend::cuda::end_head_start();
        engine
    }

    /// The CPU backend, solves driven from rayon's pool.
    pub fn cpu() -> Engine {
        Engine::Cpu {
            be: CpuBackend::new(),
            pool: true,
        }
    }

    /// The CPU backend, solves driven from the calling thread (the Python module).
    pub fn cpu_on_calling_thread() -> Engine {
        Engine::Cpu {
            be: CpuBackend::new(),
            pool: false,
        }
    }

    /// GPU `ordinal` of this process, one rank (tools, tests, the Python module).
    pub fn gpu(ordinal: usize) -> Result<Engine> {
        Engine::gpu_tuned(ordinal, &Tuning::default())
    }

    /// [`Engine::gpu`] with the kernels compiled with `tuning`'s defines.
    pub fn gpu_tuned(ordinal: usize, tuning: &Tuning) -> Result<Engine> {
        Ok(Engine::from_cuda(CudaBackend::with_defines(
            ordinal,
            &tuning.nvrtc_defines,
        )?))
    }

    /// An engine on a GPU backend made elsewhere (tests), for one rank or with its allreduce
    /// path already set up.
    pub fn from_cuda(be: CudaBackend) -> Engine {
        Engine::Cuda {
            be: Box::new(be),
            path: "none (one rank)".into(),
        }
    }

    /// The CPU backend of a CPU engine, for an operator the caller implements on it (the
    /// Python module's operators whose products call back into Python); an error on a GPU.
    pub fn cpu_backend(&self) -> Result<&CpuBackend> {
        match self {
            Engine::Cpu { be, .. } => Ok(be),
            Engine::Cuda { .. } => Err(Error::Invalid(
                "an operator given by its products runs on the CPU backend".into(),
            )),
        }
    }

    /// `Cpu` or `Cuda`.
    pub fn kind(&self) -> BackendChoice {
        match self {
            Engine::Cpu { .. } => BackendChoice::Cpu,
            Engine::Cuda { .. } => BackendChoice::Cuda,
        }
    }

    /// "cpu" or "cuda".
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Cpu { be, .. } => be.name(),
            Engine::Cuda { be, .. } => be.name(),
        }
    }

    /// The backend in one line (device, threads).
    pub fn describe(&self) -> String {
        match self {
            Engine::Cpu { be, .. } => be.describe(),
            Engine::Cuda { be, .. } => be.describe(),
        }
    }

    /// The path vectors take between ranks (GPU), in words.
    pub fn path(&self) -> Option<&str> {
        match self {
            Engine::Cpu { .. } => None,
            Engine::Cuda { path, .. } => Some(path),
        }
    }

    /// Wait for the device (a no-op on the CPU).
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Engine::Cpu { .. } => Ok(()),
            Engine::Cuda { be, .. } => be.synchronize(),
        }
    }

    /// Copy bandwidth of the memory this backend reads, GB/s (read + write): the device's
    /// (256 MiB each way, median of 10) or the host's (all threads). With the host's CPU model
    /// and threads, or the device, in words.
    pub fn copy_bandwidth(&self) -> Result<(String, f64)> {
        match self {
            Engine::Cpu { .. } => Ok(crate::pipeline::timing::host_copy_bandwidth()),
            Engine::Cuda { be, .. } => {
                let len = 32usize << 20;
                let src = be.zeros(len)?;
                let mut dst = be.zeros(len)?;
                let sync = || be.synchronize();
                let ms = crate::pipeline::timing::time_ms(10, &sync, || be.copy(&src, &mut dst))?;
                Ok((be.describe(), 2.0 * (len * 8) as f64 / (ms * 1e-3) / 1e9))
            }
        }
    }

    /// Build LSQR's operator for `m` as `spec` says (`m.storage` resolved: `Csr` or `Compact`)
    /// and hand it to `v`; returns what `v` returned and what was built. The device loop runs
    /// where `device_loop` asks and the operator has one. On the CPU the visit runs on rayon's
    /// pool (see [`on_pool`]) unless this engine drives from the calling thread.
    pub fn lsqr<V>(
        &self,
        spec: &OperatorSpec,
        comm: &dyn Comm,
        m: StoredMatrix,
        device_loop: bool,
        v: V,
    ) -> Result<(V::Output, Built)>
    where
        V: LsqrVisitor + Send,
        V::Output: Send,
    {
        let t = Instant::now();
        let StoredMatrix {
            rows,
            stencil,
            storage,
        } = m;
        let built = Built {
            backend: self.name(),
            backend_detail: self.describe(),
            storage,
            precision: spec.precision,
            ..Default::default()
        };
        let parts = (rows, stencil, built, t);
        match self {
            Engine::Cpu { be, pool } => cpu_lsqr(be, *pool, comm, spec, parts, v),
            Engine::Cuda { be, path } => cuda_lsqr(be, path, comm, spec, parts, device_loop, v),
        }
    }

    /// LSQR's operator of a CSR matrix that lies on the GPU already, `a` with its transpose
    /// `at` (CuPy's arrays; [`DeviceCsr`]), copied device to device (CSR with the explicit
    /// transpose, the values' precision; the device loop where `device_loop` asks), handed to
    /// `v`. One process only; the CPU engine refuses it.
    pub fn lsqr_device<V: LsqrVisitor>(
        &self,
        spec: &OperatorSpec,
        (a, at): (&DeviceCsr, &DeviceCsr),
        device_loop: bool,
        v: V,
    ) -> Result<(V::Output, Built)> {
        let Engine::Cuda { be, .. } = self else {
            return Err(Error::Invalid(
                "a matrix on the GPU needs the CUDA backend (backend = \"cuda\" or \"auto\" with a GPU)"
                    .into(),
            ));
        };
        let t = Instant::now();
        let op = phases::time("upload", || {
            CudaCsrOperator::from_device(be, a, at, &spec.tuning)
        })?;
        op.set_device_loop(device_loop);
        let precision = a.precision();
        let built = Built {
            backend: self.name(),
            backend_detail: self.describe(),
            storage: Storage::Csr,
            precision,
            transpose: format!("csc ({precision} values; the matrix given on the GPU)"),
            device_loop,
            layout: "csc".into(),
            bytes_per_nnz: (precision.bytes() + 4) as f64,
            seconds: t.elapsed().as_secs_f64(),
            ..Default::default()
        };
        Ok((v.visit(be.as_ref(), &op)?, built))
    }

    /// Build a square system's operator (this rank's rows with the halo) and its
    /// preconditioner, and hand both to `v`. `spec.precision` and `spec.storage` choose the
    /// GPU's storage (csr, or row patterns where the rows qualify); the CPU stores f64 CSR and
    /// runs on rayon's pool unless this engine drives from the calling thread.
    pub fn square<V>(
        &self,
        spec: &OperatorSpec,
        comm: &dyn Comm,
        sys: &SquareSystem,
        precond: SquarePrecond,
        v: V,
    ) -> Result<V::Output>
    where
        V: SquareVisitor + Send,
        V::Output: Send,
    {
        match self {
            Engine::Cpu { be, pool } => {
                if spec.precision != Precision::F64 {
                    return Err(Error::Invalid(format!(
                        "--precision {}: the CPU backend stores f64 values only",
                        spec.precision
                    )));
                }
                if spec.storage == Storage::Compact {
                    return Err(Error::Invalid(
                        "--storage compact: GMRES's compact storage (row patterns) is for the GPU; the CPU backend stores CSR".into(),
                    ));
                }
                let f = move || {
                    let t0 = Instant::now();
                    let op = DistSquareOperator::distributed(sys.rows, sys.part, comm)?;
                    let halo = op.comm_volume()?;
                    let row0 = sys.part.range(comm.rank()).start;
                    let pc = square_precond(be, comm, &op, row0, precond, |f| Ok(Box::new(f)))?;
                    let built = SquareBuilt {
                        halo,
                        storage: "csr".into(),
                        t0,
                    };
                    v.visit(be, &op, pc, built)
                };
                if *pool {
                    on_pool(comm, f)
                } else {
                    f()
                }
            }
            Engine::Cuda { be, .. } => cuda_square(be, spec, comm, sys, precond, v),
        }
    }
}

/// A square system on the GPU: the preconditioner set up from the host rows (ILU(0) factors
/// applied by Jacobi sweeps on the device), the rows stored as `spec` says.
fn cuda_square<V: SquareVisitor>(
    be: &CudaBackend,
    spec: &OperatorSpec,
    comm: &dyn Comm,
    sys: &SquareSystem,
    precond: SquarePrecond,
    v: V,
) -> Result<V::Output> {
    let t0 = Instant::now();
    let cpu = DistSquareOperator::distributed(sys.rows, sys.part, comm)?;
    let halo = cpu.comm_volume()?;
    let row0 = sys.part.range(comm.rank()).start;
    let pc = square_precond(be, comm, &cpu, row0, precond, |f| {
        Ok(Box::new(CudaIluSweeps::new(be, &f)?))
    })?;
    let op = CudaSquareOperator::new(be, &cpu, comm, (spec.precision, spec.storage), None)?;
    drop(cpu);
    be.synchronize()?;
    let built = SquareBuilt {
        halo,
        storage: op.storage().to_string(),
        t0,
    };
    v.visit(be, &op, pc, built)
}

/// LSQR's operator on the CPU: CSR with the transpose asked for, or compact rows (f64/f32
/// values, 16-bit column deltas, grid stencils for the damping rows).
fn cpu_lsqr<V>(
    be: &CpuBackend,
    pool: bool,
    comm: &dyn Comm,
    spec: &OperatorSpec,
    (rows, stencil, mut built, t): Parts,
    v: V,
) -> Result<(V::Output, Built)>
where
    V: LsqrVisitor + Send,
    V::Output: Send,
{
    let drive = |f: Box<dyn FnOnce() -> Result<V::Output> + Send + '_>| {
        if pool {
            on_pool(comm, f)
        } else {
            f()
        }
    };
    let rows = rows.into_csr()?;
    if built.storage == Storage::Compact {
        let nnz = rows.nnz().max(1) as f64;
        let op = phases::time("encode", || {
            CpuCompactOperator::new(&rows, stencil, spec.precision)
        });
        drop(rows);
        built.transpose = "csc (compact transpose)".into();
        built.layout = "rows".into();
        built.pass_bytes = Some(op.stored().bytes() + op.transposed().bytes());
        built.bytes_per_nnz = op.stored().bytes() as f64 / nnz;
        built.seconds = t.elapsed().as_secs_f64();
        Ok((drive(Box::new(move || v.visit(be, &op)))?, built))
    } else {
        let rows = restack(rows, stencil.as_ref())?;
        let op = phases::time("transpose", || CpuCsrOperator::new(rows, spec.transpose));
        built.precision = Precision::F64;
        built.transpose = op.strategy().to_string();
        built.layout = op.strategy().to_string();
        built.bytes_per_nnz = 12.0;
        built.seconds = t.elapsed().as_secs_f64();
        Ok((drive(Box::new(move || v.visit(be, &op)))?, built))
    }
}

/// What an LSQR operator is built from: the stored rows, the stencil rows, the report so far
/// and when the building began.
type Parts = (StoredRows, Option<crate::grid::StencilOp>, Built, Instant);

/// LSQR's operator on the GPU: compact storage (falling back to CSR, with a note, where it
/// does not fit) or CSR with the transpose asked for. With `storage = "auto"` and a matrix of
/// 1M to [`PROBE_MAX_NNZ`] nonzeros (where neither storage wins by its bytes alone: australia-
/// sized systems are latency-bound, a 100M-nonzero one bandwidth-bound) both are built and one
/// product pair of each is timed; the faster stays (report.json `storage` says so).
fn cuda_lsqr<V: LsqrVisitor>(
    be: &CudaBackend,
    path: &str,
    comm: &dyn Comm,
    spec: &OperatorSpec,
    (mut rows, stencil, mut built, t): Parts,
    device_loop: bool,
    v: V,
) -> Result<(V::Output, Built)> {
    // Several ranks: the device loop where the GPUs sum over them inside it (peer memory or
    // NCCL), not through the host.
    let device_loop = device_loop && (comm.size() == 1 || be.sums_on_device());
    let mut compact = None;
    if built.storage == Storage::Compact {
        let (o, st, precision) = (&spec.tuning, stencil.as_ref(), spec.precision);
        // The coverage left to the rows as read: computed from them on a thread that shares
        // them once the GPU holds them (while it reorders, encodes and solves; beside the
        // upload the two competed for the host's memory: set-up 0.27 -> 0.32 s at 600k rays).
        let mut early = None;
        let made = match &rows {
            // Encoded ahead (prepared storage) as this run would encode it: uploaded as it is.
            StoredRows::Encoded(e) if encoding_key(precision, o) == Some(e.encoding.key) => {
                Some(CudaCompactOperator::from_encoded(be, e, st, precision, o))
            }
            // Rows as read: reordered and encoded on the GPU where it makes them.
            StoredRows::Reordered(r) => {
                let mut start = || early = r.coverage_beside();
                CudaCompactOperator::from_reordered(be, r, st, precision, o, &mut start).transpose()
            }
            _ => None,
        };
        if let (Some(c), StoredRows::Reordered(r)) = (early, &mut rows) {
            // (the rows no longer carry it)
            built.coverage = Some(c);
            r.coverage_rows = None;
        }
        // Else the rows in CSR (reordered on the host where they were not), encoded here; the
        // coverage left to the rows as read is computed first (reordering them drops them).
        let made = match made {
            Some(made) => made,
            None => {
                if built.coverage.is_none() {
                    built.coverage = left_coverage_now(&rows);
                }
                CudaCompactOperator::with_options(be, rows.csr()?, st, precision, o)
            }
        };
        match made {
            Ok(op) => compact = Some(op),
            Err(e) if comm.is_root() => eprintln!("compact storage: {e}; using csr"),
            Err(_) => {}
        }
    }
    let nnz = rows.nnz() + stencil.as_ref().map_or(0, |s| s.stencil().nnz());
    let probe = probes_storage(spec.storage, nnz);
    if let (Some(op), false) = (&compact, probe) {
        finish_compact(op, &mut built, (&spec.tuning, rows.nnz(), device_loop));
        // (the coverage was started above where the rows carried it)
        crate::sparse::par::drop_in_background(rows);
        built.seconds = t.elapsed().as_secs_f64();
        return Ok((v.visit(be, op)?, built));
    }
    // The rows are reordered on the host below: the coverage left to them first, from the rows
    // as read (unless computed above).
    if built.coverage.is_none() {
        built.coverage = left_coverage_now(&rows);
    }
    let stored_nnz = rows.nnz();
    // CSR: the stencil rows (if any were split off) go back into the matrix.
    let rows = restack(rows.into_csr()?, stencil.as_ref())?;
    let csr = phases::time("upload", || {
        CudaCsrOperator::with_tuning(be, &rows, spec.transpose, spec.precision, &spec.tuning)
    })?;
    drop(rows);
    if let Some(op) = compact {
        // One rank: a few LSQR iterations of each, in the loop the solve will run (the products
        // alone miss what the device loop fuses: measured 18 % apart on the 150k-ray system).
        // Several ranks: one product pair each (an iteration would wait on the other ranks).
        let alone = comm.size() == 1;
        op.set_device_loop(device_loop);
        csr.set_device_loop(device_loop);
        let (tc, tr) = phases::time("probe", || -> Result<(f64, f64)> {
            if alone {
                Ok((iteration_ms(be, &op)?, iteration_ms(be, &csr)?))
            } else {
                Ok((pair_ms(be, &op)?, pair_ms(be, &csr)?))
            }
        })?;
        let what = if alone {
            format!(
                "an LSQR iteration ({} loop)",
                if device_loop { "device" } else { "host" }
            )
        } else {
            "one A x + A^T y".into()
        };
        built.storage_reason =
            format!("auto: {what} took {tc:.4} ms compact, {tr:.4} ms csr on this GPU");
        if tc <= tr {
            drop(csr);
            finish_compact(&op, &mut built, (&spec.tuning, stored_nnz, device_loop));
            built.seconds = t.elapsed().as_secs_f64();
            return Ok((v.visit(be, &op)?, built));
        }
    }
    built.storage = Storage::Csr;
    csr.set_device_loop(device_loop);
    built.transpose = if comm.size() > 1 {
        format!(
            "{} ({} values); allreduce: {path}",
            csr.strategy(),
            csr.precision()
        )
    } else {
        format!("{} ({} values)", csr.strategy(), csr.precision())
    };
    built.device_loop = device_loop && csr.strategy() == TransposeStrategy::Csc;
    built.layout = csr.strategy().to_string();
    built.bytes_per_nnz = (csr.precision().bytes() + 4) as f64;
    built.seconds = t.elapsed().as_secs_f64();
    Ok((v.visit(be, &csr)?, built))
}

/// The ray coverage the run left to `rows` ([`crate::backend::storage::Deferred`]), computed
/// now from the rows as read (before they are reordered on the host, which drops them).
fn left_coverage_now(rows: &StoredRows) -> Option<crate::grid::PendingCoverage> {
    rows.left_coverage()
        .map(crate::grid::PendingCoverage::ready)
}

/// The most nonzeros `storage = "auto"` probes both storages at on the GPU; above, compact
/// (measured 1.4x CSR's iteration at 100M nonzeros, docs/performance.md).
pub const PROBE_MAX_NNZ: usize = 16_000_000;

/// The key of the GPU encoding made ahead that a run on `kind` with `spec` would upload as it
/// is (None: it would not use one). Only a run whose GPU does not encode its rows itself
/// (`[tuning] gpu_encode = false`) wants one: the GPU encodes the stored rows of prepared
/// storage in about 0.025 s at 100M nonzeros, and reading those rows (12 bytes a nonzero
/// in f64) beats reading an encoding (about 24: both halves' entries and tables). Measured on
/// one H100, 2026-11-27: the iterations of a prepared 600k-ray run started at 0.40-0.42 s
/// against 0.51 s (docs/performance.md, "Time to solution").
pub fn wanted_encoding(kind: BackendChoice, spec: &OperatorSpec) -> Option<EncodingKey> {
    match kind {
        BackendChoice::Cuda if spec.tuning.gpu_encode == Some(false) => {
            encoding_key(spec.precision, &spec.tuning)
        }
        _ => None,
    }
}

/// The GPU encoding of `rows` (the stored rows of `m`, its stencil split off) that `seistomo
/// prepare` keeps, with the words describing the storage, where a run on `kind` with `spec`
/// would upload it ([`wanted_encoding`]: the GPU does not encode rows itself) and make it:
/// compact storage on the GPU, not probed against CSR, the split layout. The caller leaves it
/// out where the columns are scaled (the values change after the file).
pub fn encode_ahead(
    kind: BackendChoice,
    spec: &OperatorSpec,
    m: &StoredMatrix,
    rows: &Csr,
) -> Option<(DeviceEncoding, String)> {
    let stencil_nnz = m.stencil.as_ref().map_or(0, |s| s.stencil().nnz());
    if wanted_encoding(kind, spec).is_none()
        || m.storage != Storage::Compact
        || probes_storage(spec.storage, rows.nnz() + stencil_nnz)
    {
        return None;
    }
    let e = phases::time("encode", || {
        crate::backend::cuda::encode_ahead(rows, spec.precision, &spec.tuning)
    })?;
    Some((e, describe_compact(rows, spec.precision)))
}

/// Whether a GPU run with `storage` asked for times both storages of a rank's `nnz` nonzeros
/// (stencil rows counted) and keeps the faster.
pub fn probes_storage(storage: Storage, nnz: usize) -> bool {
    storage == Storage::Auto && nnz <= PROBE_MAX_NNZ
}

/// Milliseconds of one A x and one A^T y on the GPU (the median of 5, after one to warm up).
fn pair_ms<O: Operator<CudaBackend>>(be: &CudaBackend, op: &O) -> Result<f64> {
    let (mut x, mut y) = (be.zeros(op.ncols())?, be.zeros(op.nrows())?);
    be.fill(&mut x, 1.0)?;
    let sync = || be.synchronize();
    crate::pipeline::timing::time_ms(5, &sync, || {
        op.apply(be, crate::backend::Scale::SET, &x, &mut y)?;
        op.apply_t(be, crate::backend::Scale::SET, &y, &mut x)
    })
}

/// Milliseconds of one LSQR iteration with `op` on one rank: 3 iterations to warm up (the
/// device loop captures its graph), then the median of 3 runs of 32 more continuing the solve
/// (a whole replay of the device loop's graph at its default block size).
fn iteration_ms<O: Operator<CudaBackend>>(be: &CudaBackend, op: &O) -> Result<f64> {
    let mut b = be.zeros(op.nrows())?;
    be.fill(&mut b, 1.0)?;
    let sync = || be.synchronize();
    let run = crate::pipeline::timing::time_lsqr_blocks(be, op, &b, 3, &[32, 32, 32], &sync)?;
    Ok(crate::pipeline::timing::median(run.ms_per_iter))
}

/// Fill in what a compact operator is, and start its device loop when asked.
fn finish_compact(
    op: &CudaCompactOperator,
    built: &mut Built,
    (tuning, stored_nnz, device_loop): (&Tuning, usize, bool),
) {
    op.set_device_loop(device_loop);
    let (pa, pt) = op.pass_bytes();
    built.storage = Storage::Compact;
    built.transpose = format!("csc (compact transpose, {} values)", op.precision());
    built.device_loop = device_loop;
    built.layout = layout_tag(tuning, &op.layout());
    built.pass_bytes = Some(pa + pt);
    built.bytes_per_nnz = pa as f64 / stored_nnz.max(1) as f64;
}

/// The stored rows with the stencil rows (when split off) stacked back under them, in the
/// stored rows' column order.
fn restack(rows: Csr, stencil: Option<&crate::grid::StencilOp>) -> Result<Csr> {
    match stencil {
        Some(st) => {
            let d = st.stencil().to_csr();
            let d = match st.new_of_old() {
                Some(p) => d.permute_columns(p),
                None => d,
            };
            rows.vstack_scaled(&d, 1.0)
                .map_err(|e| Error::Invalid(e.to_string()))
        }
        None => Ok(rows),
    }
}

/// The short name of a GPU compact layout: rows, mixed:T, tiles:T or split:T:X (T: A^T's tile
/// bits, X: A x's), the bits where they were asked for.
fn layout_tag(o: &Tuning, desc: &str) -> String {
    let kind = desc.split([' ', ':']).next().unwrap_or("").to_string();
    match (o.tile_bits, o.ax_tile_bits) {
        (Some(t), Some(x)) if kind == "split" => format!("{kind}:{t}:{x}"),
        (Some(t), _) if kind != "rows" => format!("{kind}:{t}"),
        _ => kind,
    }
}

/// Work on a batch's block operator (batched LSQR, src/solver/lsqr_batch.rs), whatever backend
/// it is (a closure cannot be generic).
pub trait BatchVisitor {
    type Output;
    fn visit<B: BatchBackend, O: BlockOperator<B>>(self, be: &B, op: &O) -> Result<Self::Output>;
}

impl Engine {
    /// The block operator of a batch of solves on `rows` (rows flagged in `weighted` take each
    /// member's weight), handed to `v`: the CPU's (CSR and its explicit transpose, the single
    /// CPU operator's sums; `precision` ignored) or the GPU's (block CSR, its unweighted values
    /// in `precision`).
    pub fn batch<V>(
        &self,
        comm: &dyn Comm,
        rows: Csr,
        weighted: Option<Vec<bool>>,
        precision: Precision,
        v: V,
    ) -> Result<V::Output>
    where
        V: BatchVisitor + Send,
        V::Output: Send,
    {
        match self {
            Engine::Cpu { be, pool } => {
                let op = phases::time("transpose", || CpuBlockOperator::new(rows, weighted))?;
                let f = move || v.visit(be, &op);
                if *pool {
                    on_pool(comm, f)
                } else {
                    f()
                }
            }
            Engine::Cuda { be, .. } => {
                let op = phases::time("upload", || {
                    CudaBlockOperator::new(be, rows, weighted, precision)
                })?;
                v.visit(be.as_ref(), &op)
            }
        }
    }
}

pub use crate::backend::cuda::SumTiming;

/// `seistomo bench --sums VALUES` (collective): a vector of `values` f64 summed over `comm`'s
/// ranks `reps` times by every path the job can take on its GPUs
/// ([`crate::backend::cuda::CudaBackend::time_sum_paths`]); the timings and, for each path
/// that could not run, why. Without a usable GPU, the same one-line error on every rank (and no
/// driver call where CUDA is missing).
pub fn time_sums(
    comm: &dyn crate::comm::Comm,
    values: usize,
    reps: usize,
) -> Result<(Vec<SumTiming>, Vec<String>)> {
    let be = crate::comm::agree(
        comm,
        crate::backend::cuda::probe()
            .map_err(|why| {
                Error::backend(
                    "cuda",
                    format!("--sums times the GPUs' sums, but there is no usable CUDA GPU ({why})"),
                )
            })
            .and_then(|_| crate::backend::cuda::CudaBackend::for_rank(comm)),
    )?;
    be.time_sum_paths(comm, values, reps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks on different backends get one error naming the first CPU rank; the same backend
    /// everywhere passes.
    #[test]
    fn a_job_mixing_gpu_and_cpu_ranks_is_one_error_on_every_rank() {
        let run = |kinds: Vec<BackendChoice>| -> Vec<Result<()>> {
            let comms = crate::comm::ThreadComm::create(kinds.len());
            std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .zip(&kinds)
                    .map(|(c, &k)| s.spawn(move || same_backend_everywhere(c, k, "no GPU here")))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        let (gpu, cpu) = (BackendChoice::Cuda, BackendChoice::Cpu);
        for kinds in [vec![gpu, gpu, gpu], vec![cpu, cpu]] {
            assert!(run(kinds.clone()).iter().all(|r| r.is_ok()), "{kinds:?}");
        }
        for got in run(vec![gpu, cpu, cpu]) {
            let e = got.expect_err("mixed backends").to_string();
            assert!(e.starts_with("rank 1: "), "{e}");
            assert!(e.contains("on the CPU (no GPU here)"), "{e}");
        }
    }
}
