//! What `seistomo bench` measures: LSQR and its products per operator configuration (a
//! [`Plan`] of backends x storages x precisions x transposes or GPU layouts x loops, each
//! operator built by the factory, [`super::operators`]), the copy bandwidth of the memory each
//! backend reads, and the bytes of one iteration at the bandwidth floor of each storage. The
//! CLI parses the plan and prints the [`Table`].

use serde::Serialize;

use crate::backend::storage::{self, Storage};
use crate::backend::{Backend, LsqrLoop, Operator, Precision, Scale, TransposeStrategy};
use crate::comm::SerialComm;
use crate::error::{Error, Result};
use crate::grid::reorder::Reorder;
use crate::grid::Rng;
use crate::pipeline::operators::{Built, Engine, LsqrVisitor};
use crate::pipeline::options::{BackendChoice, OperatorSpec};
use crate::pipeline::timing::{last_level_cache_bytes, time_lsqr_blocks, time_ms};
use crate::settings::tuning::{GpuLayout, Tuning};
use crate::sparse::{Csr, GapHistogram};

/// Timings of one operator: the products alone, a short warm-up solve (which captures the
/// device loop's graph), then `iters` more iterations continuing the same solve.
pub struct Timing {
    pub ms_iter: f64,
    pub ax_ms: f64,
    pub aty_ms: f64,
    pub first_block_ms: f64,
    pub r1norm: f64,
    pub x: Vec<f64>,
}

/// Time LSQR with operator `op` on `be`: the products alone (median of 20), a short warm-up
/// solve, then `iters` more iterations of the same solve.
pub fn time_lsqr<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    b: &[f64],
    iters: usize,
    sync: &dyn Fn() -> Result<()>,
) -> Result<Timing> {
    let (m, n) = (op.nrows(), op.ncols());
    let bd = be.upload(b)?;
    // Products alone.
    let mut y = be.zeros(m)?;
    let mut x = be.zeros(n)?;
    be.fill(&mut x, 0.5)?;
    let ax = time_ms(20, sync, || op.apply(be, Scale::SET, &x, &mut y))?;
    let aty = time_ms(20, sync, || op.apply_t(be, Scale::SET, &y, &mut x))?;
    drop((x, y));
    let run = time_lsqr_blocks(be, op, &bd, 3, &[iters], sync)?;
    let (info, v) = (run.info, run.vectors);
    let (ms, first_block_ms) = (run.ms_per_iter[0], run.first_block_ms);
    let xh = be.to_host(&v.x)?;
    Ok(Timing {
        ms_iter: ms,
        ax_ms: ax,
        aty_ms: aty,
        first_block_ms,
        r1norm: info.norms.r1norm,
        x: xh,
    })
}

/// Bytes of one SpMV pass over `rows` x `cols` with `nnz` nonzeros, counted as the CuPy peer
/// does (values + 4-byte column indices + 4-byte row offsets + read x + write y).
pub fn pass_bytes(rows: usize, cols: usize, nnz: usize, precision: Precision) -> f64 {
    (nnz * (4 + precision.bytes()) + (rows + 1) * 4 + cols * 8 + rows * 8) as f64
}

/// The general-format floor: one A and one A^T pass of CSR plus 10 vector passes over m + n.
pub fn csr_floor_bytes(m: usize, n: usize, nnz: usize, p: Precision) -> f64 {
    pass_bytes(m, n, nnz, p) + pass_bytes(n, m, nnz, p) + 10.0 * 8.0 * (m + n) as f64
}

/// The vector traffic of the fused LSQR loop on an m x n system: u read + written by A v and
/// read by A^T u; v read by A v, read + written by A^T u; x, w, v read and x, w written by the
/// update: 3 m + 8 n.
pub fn vector_bytes(m: usize, n: usize) -> f64 {
    (3 * m as u64 + 8 * n as u64) as f64 * 8.0
}

/// A benchmark system: [A; b] with what it is, and the grid when it is a synthetic one.
pub struct BenchSystem {
    pub what: String,
    pub a: Csr,
    pub b: Vec<f64>,
    pub grid: Option<[usize; 3]>,
    pub kernel_rows: usize,
}

impl BenchSystem {
    /// The synthetic straight-ray system the CuPy peer builds
    /// ([`crate::grid::synthetic::peer_system`]), b = A x for a random x.
    pub fn synthetic(g: [usize; 3], rays: usize, seed: u64, sort_rays: bool) -> BenchSystem {
        let a = crate::grid::synthetic::peer_system(g[0], g[1], g[2], rays, seed, sort_rays);
        let mut rng = Rng::new(seed + 1);
        let xt: Vec<f64> = (0..a.ncols()).map(|_| rng.uniform()).collect();
        let b = a.matvec(&xt);
        BenchSystem {
            what: format!("straight rays {}x{}x{}, {rays} rays", g[0], g[1], g[2]),
            a,
            b,
            grid: Some(g),
            kernel_rows: rays,
        }
    }

    /// A Matrix Market system, as `solve` loads it.
    pub fn mtx(sys: crate::sparse::System, what: String) -> BenchSystem {
        BenchSystem {
            what,
            a: sys.a,
            b: sys.b,
            grid: None,
            kernel_rows: sys.kernel_rows,
        }
    }

    /// The system laid out as `invert` would with `storage` and `reorder` (stencils allowed).
    pub fn prepared(&self, storage: Storage, reorder: Reorder) -> storage::Prepared {
        storage::prepare(
            self.a.clone(),
            self.b.clone(),
            self.kernel_rows,
            self.grid,
            storage,
            reorder,
            true,
            Default::default(),
        )
    }
}

/// What `bench` times: every combination of these (the GPU's compact storage by `layouts`, CSR
/// by `transposes`; the CPU's CSR in f64 only), each over `iters` LSQR iterations.
#[derive(Debug, Clone)]
pub struct Plan {
    pub backends: Vec<BackendChoice>,
    pub storages: Vec<Storage>,
    pub precisions: Vec<Precision>,
    pub transposes: Vec<TransposeStrategy>,
    /// Device or host (the GPU's LSQR loop).
    pub loops: Vec<LsqrLoop>,
    /// The GPU's compact layouts: `gpu_layout`, `tile_bits`, `ax_tile_bits` of each (None:
    /// chosen from the matrix) over `tuning`.
    pub layouts: Vec<Tuning>,
    pub reorder: Reorder,
    pub iters: usize,
    /// The other tuning knobs.
    pub tuning: Tuning,
}

/// A `--layouts` item: `auto | rows | mixed[:T] | tiles[:T] | split[:T[:X]]` (T: tile bits of
/// A^T, X: of A x), as tuning knobs over `base`.
pub fn parse_layout(t: &str, base: &Tuning) -> Result<Tuning> {
    let bad = || {
        Error::Invalid(format!(
            "--layouts {t}: expected auto, rows, mixed[:T], tiles[:T] or split[:T[:X]] (T, X: tile bits 4..=12)"
        ))
    };
    let mut parts = t.split(':');
    let kind = parts.next().unwrap_or("");
    let bits: Vec<&str> = parts.collect();
    let (layout, most) = match kind {
        "auto" => (None, 0),
        "rows" => (Some(GpuLayout::Rows), 0),
        "mixed" => (Some(GpuLayout::Mixed), 1),
        "tiles" => (Some(GpuLayout::Tiles), 1),
        "split" => (Some(GpuLayout::Split), 2),
        _ => return Err(bad()),
    };
    if bits.len() > most {
        return Err(bad());
    }
    let mut o = base.clone();
    o.gpu_layout = layout;
    for (key, b) in ["tile_bits", "ax_tile_bits"].iter().zip(&bits) {
        o.set(key, b).map_err(|_| bad())?;
    }
    Ok(o)
}

/// One configuration's timings (a row of the table and a JSON line of `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub system: String,
    pub m: usize,
    pub n: usize,
    pub nnz: usize,
    pub backend: String,
    pub storage: String,
    /// The transpose strategy (CSR) or the layout (compact).
    pub transpose: String,
    pub precision: String,
    #[serde(rename = "loop")]
    pub lsqr_loop: String,
    pub ms_per_iter: f64,
    pub ax_ms: f64,
    pub aty_ms: f64,
    pub bytes_per_nnz: f64,
    #[serde(rename = "copy_GBps")]
    pub copy_gbps: f64,
    pub floor_ms: f64,
    pub csr_f64_floor_ms: f64,
    pub first_block_ms: f64,
    pub r1norm: f64,
    /// ||x - x_first|| / ||x_first||, against the first row's solution.
    pub dx_rel: f64,
    /// Seconds the factory took to build this operator.
    pub build_s: f64,
    #[serde(skip)]
    x: Vec<f64>,
}

/// The measured table: the rows and the copy bandwidth of the memories read.
pub struct Table {
    pub rows: Vec<Row>,
    /// The device (and host) in words.
    pub device: String,
    /// GB/s of the GPU's memory and the host's (NaN where not measured).
    pub gpu_gbps: f64,
    pub host_gbps: f64,
}

/// Times LSQR on whatever operator the factory built.
struct TimeIt<'a> {
    engine: &'a Engine,
    b: &'a [f64],
    iters: usize,
}

impl LsqrVisitor for TimeIt<'_> {
    type Output = Timing;
    fn visit<B: Backend, O: Operator<B>>(self, be: &B, op: &O) -> Result<Timing> {
        let sync = || self.engine.synchronize();
        time_lsqr(be, op, self.b, self.iters, &sync)
    }
}

/// The operator specs of a plan for one backend and storage, with their loop words.
fn specs(plan: &Plan, kind: BackendChoice, storage: Storage) -> Vec<(OperatorSpec, bool)> {
    let spec = |precision, transpose, tuning: &Tuning, lp: LsqrLoop| OperatorSpec {
        backend: kind,
        storage,
        precision,
        transpose,
        lsqr_loop: lp,
        tuning: tuning.clone(),
        ..Default::default()
    };
    let device = |lp: &LsqrLoop| *lp == LsqrLoop::Device;
    let mut out = Vec::new();
    match (kind, storage) {
        (BackendChoice::Cuda, Storage::Compact) => {
            for &p in &plan.precisions {
                for lo in &plan.layouts {
                    for lp in &plan.loops {
                        out.push((spec(p, TransposeStrategy::Auto, lo, *lp), device(lp)));
                    }
                }
            }
        }
        (BackendChoice::Cuda, _) => {
            for &p in &plan.precisions {
                for &s in &plan.transposes {
                    if s == TransposeStrategy::Library && p != Precision::F64 {
                        continue;
                    }
                    for lp in &plan.loops {
                        // only the explicit transpose has a device loop
                        if device(lp) && s != TransposeStrategy::Csc && plan.loops.len() > 1 {
                            continue;
                        }
                        out.push((spec(p, s, &plan.tuning, *lp), device(lp)));
                    }
                }
            }
        }
        (_, Storage::Compact) => {
            for &p in &plan.precisions {
                let s = spec(p, TransposeStrategy::Auto, &plan.tuning, LsqrLoop::Host);
                out.push((s, false));
            }
        }
        _ => {
            for &s in &plan.transposes {
                if s != TransposeStrategy::Library {
                    let s = spec(Precision::F64, s, &plan.tuning, LsqrLoop::Host);
                    out.push((s, false));
                }
            }
        }
    }
    out
}

/// Run the plan on `sys`: each storage prepared once, every configuration built by the factory
/// and timed; one row each, in plan order.
pub fn run(plan: &Plan, sys: &BenchSystem) -> Result<Table> {
    let mut table = Table {
        rows: Vec::new(),
        device: String::new(),
        gpu_gbps: f64::NAN,
        host_gbps: f64::NAN,
    };
    let mut engines = Vec::new();
    for &kind in &plan.backends {
        let engine = match kind {
            BackendChoice::Cuda => Engine::gpu_tuned(0, &plan.tuning)?,
            _ => Engine::cpu(),
        };
        let (desc, gbps) = engine.copy_bandwidth()?;
        eprintln!(
            "{}: {desc}",
            if kind == BackendChoice::Cuda {
                "device"
            } else {
                "host"
            }
        );
        match kind {
            BackendChoice::Cuda => table.gpu_gbps = gbps,
            _ => table.host_gbps = gbps,
        }
        table.device = if table.device.is_empty() {
            desc
        } else {
            format!("{}; {desc}", table.device)
        };
        engines.push(engine);
    }
    for &storage in &plan.storages {
        let p = sys.prepared(storage, plan.reorder);
        eprintln!("{storage}: {}", p.matrix.describe(Precision::F32));
        if storage == Storage::Compact {
            p.matrix.rows.with_csr(note_steps)?;
        }
        for engine in &engines {
            for (spec, device_loop) in specs(plan, engine.kind(), storage) {
                let visit = TimeIt {
                    engine,
                    b: &p.b,
                    iters: plan.iters,
                };
                let m2 = p.matrix.clone();
                let (t, built) = match engine.lsqr(&spec, &SerialComm, m2, device_loop, visit) {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!(
                            "{} {storage} {}: skipped: {e}",
                            engine.name(),
                            spec.precision
                        );
                        continue;
                    }
                };
                eprintln!(
                    "{} {} {} {} {}: {:.4} ms/iter (A x {:.4} ms, A^T y {:.4} ms; built in {:.2} s)",
                    engine.name(),
                    built.storage,
                    built.layout,
                    built.precision,
                    if built.device_loop { "device" } else { "host" },
                    t.ms_iter,
                    t.ax_ms,
                    t.aty_ms,
                    built.seconds
                );
                table
                    .rows
                    .push(row(sys, &p, &t, &built, &table, engine.kind()));
            }
        }
    }
    let reference = table.rows.first().map(|r| r.x.clone());
    if let Some(x0) = reference {
        let den: f64 = x0.iter().map(|a| a * a).sum();
        for r in &mut table.rows {
            let num: f64 = r.x.iter().zip(&x0).map(|(a, b)| (a - b) * (a - b)).sum();
            r.dx_rel = (num / den.max(f64::MIN_POSITIVE)).sqrt();
        }
    }
    Ok(table)
}

/// The row of one timed configuration, with its floor at the measured bandwidth.
fn row(
    sys: &BenchSystem,
    p: &storage::Prepared,
    t: &Timing,
    built: &Built,
    table: &Table,
    kind: BackendChoice,
) -> Row {
    let (m, n, nnz) = (sys.a.nrows(), sys.a.ncols(), sys.a.nnz());
    let gbps = if kind == BackendChoice::Cuda {
        table.gpu_gbps
    } else {
        table.host_gbps
    };
    let ms_at = |bytes: f64| bytes / (gbps * 1e9) * 1e3;
    let floor_bytes = match built.pass_bytes {
        Some(b) => b as f64 + vector_bytes(p.matrix.nrows(), p.matrix.ncols()),
        None => csr_floor_bytes(m, n, nnz, built.precision),
    };
    Row {
        system: sys.what.clone(),
        m,
        n,
        nnz,
        backend: built.backend.into(),
        storage: built.storage.to_string(),
        transpose: built.layout.clone(),
        precision: built.precision.to_string(),
        lsqr_loop: if built.device_loop { "device" } else { "host" }.into(),
        ms_per_iter: t.ms_iter,
        ax_ms: t.ax_ms,
        aty_ms: t.aty_ms,
        bytes_per_nnz: built.bytes_per_nnz,
        copy_gbps: gbps,
        floor_ms: ms_at(floor_bytes),
        csr_f64_floor_ms: ms_at(csr_floor_bytes(m, n, nnz, Precision::F64)),
        first_block_ms: t.first_block_ms,
        r1norm: t.r1norm,
        dx_rel: 0.0,
        build_s: built.seconds,
        x: p.ordering.to_old(&t.x),
    }
}

/// The column steps of the stored rows and the row steps of their transpose, on stderr.
fn note_steps(stored: &Csr) {
    for (what, h) in [
        ("column steps of the stored rows", GapHistogram::of(stored)),
        (
            "row steps of the transpose",
            GapHistogram::of(&stored.transpose()),
        ),
    ] {
        eprintln!(
            "{what} ({} steps, {:.4} % escape, {} fillers):\n{}",
            h.steps,
            100.0 * h.escape_fraction(),
            h.fillers,
            h.table()
        );
    }
}

/// The table as text: a header with the system, the device and the floors, then one line per
/// configuration.
impl Table {
    pub fn text(&self, sys: &BenchSystem, iters: usize) -> String {
        let t = self;
        let (m, n, nnz) = (sys.a.nrows(), sys.a.ncols(), sys.a.nnz());
        let mut out = format!(
            "# seistomo bench: {}: {m} x {n}, {nnz} nnz; {iters} LSQR iterations\n# device: {}\n",
            sys.what, t.device
        );
        let ms_at = |bytes: f64, gbps: f64| bytes / (gbps * 1e9) * 1e3;
        let floor = |p| csr_floor_bytes(m, n, nnz, p);
        for (name, gbps) in [("GPU", t.gpu_gbps), ("host", t.host_gbps)] {
            if gbps.is_finite() {
                out.push_str(&format!(
                "# {name} copy bandwidth {gbps:.1} GB/s; general f64-CSR floor {:.4} ms (f32 values {:.4} ms)\n",
                ms_at(floor(Precision::F64), gbps),
                ms_at(floor(Precision::F32), gbps),
            ));
            }
        }
        let llc = last_level_cache_bytes();
        let matrix = (nnz * 12 + (m + 1) * 4) as f64;
        if let Some(llc) = llc.filter(|&c| t.host_gbps.is_finite() && matrix < c as f64) {
            out.push_str(&format!(
            "# the f64 CSR matrix ({:.1} MB) fits the host's {:.0} MiB last-level cache: the host floor assumes main memory, so CPU times below it are expected\n",
            matrix / 1e6,
            llc as f64 / (1u64 << 20) as f64
        ));
        }
        out.push_str(&format!(
        "{:<7} {:<8} {:<10} {:<5} {:<6} {:>9} {:>8} {:>8} {:>6} {:>9} {:>8} {:>9} {:>10} {:>14} {:>9}\n",
        "backend", "storage", "layout", "prec", "loop", "ms/iter", "Ax ms", "ATy ms", "B/nnz",
        "floor ms", "fl/time", "csr/time", "1st blk ms", "r1norm", "dx/x"
    ));
        for r in &t.rows {
            out.push_str(&format!(
            "{:<7} {:<8} {:<10} {:<5} {:<6} {:>9.4} {:>8.4} {:>8.4} {:>6.2} {:>9.4} {:>8.3} {:>9.3} {:>10.2} {:>14.8e} {:>9.2e}\n",
            r.backend, r.storage, r.transpose, r.precision, r.lsqr_loop, r.ms_per_iter, r.ax_ms,
            r.aty_ms, r.bytes_per_nnz, r.floor_ms, r.floor_ms / r.ms_per_iter,
            r.csr_f64_floor_ms / r.ms_per_iter, r.first_block_ms, r.r1norm, r.dx_rel
        ));
        }
        out
    }
}
