//! `seistomo bench`: LSQR iterations per backend, transpose strategy and value precision on a
//! synthetic straight-ray system built in memory (or a system from Matrix Market files), with
//! ms/iteration, effective bandwidth and the ratio to the bandwidth floor.
//!
//! The synthetic system is [`crate::grid::synthetic::peer_system`], the one the CuPy peer
//! (bench/peers/cupy_lsqr.py) builds. `--export-npy DIR` writes it for
//! `cupy_lsqr.py npy DIR ITERS`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;

use crate::backend::cpu::CpuCompactOperator;
use crate::backend::cpu::{CpuBackend, CpuCsrOperator};
use crate::backend::cuda::{
    CompactGpuOptions, CudaBackend, CudaCompactOperator, CudaCsrOperator, GpuLayout,
};
use crate::backend::storage::Storage;
use crate::backend::{Backend, Precision, TransposeStrategy};
use crate::grid::Rng;
use crate::io::write_atomic;
use crate::pipeline::bench::{time_ms, Timing};
use crate::sparse::GapHistogram;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Synthetic system preset: small (32x32x20, 20k rays), medium (64x64x40, 150k rays),
    /// large (128x128x80, 600k rays: ~100M nonzeros, the CuPy peer's system).
    #[arg(long, default_value = "small")]
    size: String,
    /// Grid NX,NY,NZ (overrides --size).
    #[arg(long)]
    grid: Option<String>,
    /// Number of rays (overrides --size).
    #[arg(long)]
    rays: Option<usize>,
    /// Seed of the ray generator.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Order the synthetic rays by their first cell (instead of the generator's random order):
    /// shows what row order does to the gathers of A^T u.
    #[arg(long)]
    sort_rays: bool,
    /// Reorder the system as `invert` does (src/grid/reorder.rs): none (as built), rows (sorted by
    /// their end columns) or auto (rows, and the synthetic grid's cells in Morton order). Applied
    /// before --export-npy too, so peers can be run on the same reordered system.
    #[arg(long, default_value = "none", value_parser = super::args::pick::reorder())]
    reorder: crate::grid::reorder::Reorder,
    /// Benchmark a Matrix Market system instead: A (with --reg/--reg-weight/--rhs as in solve).
    #[arg(long)]
    matrix: Option<PathBuf>,
    /// With --matrix: right-hand side b (default b = A x for a random x).
    #[arg(long, requires = "matrix")]
    rhs: Option<PathBuf>,
    /// With --matrix: regularisation rows R, the system becomes [A; w R].
    #[arg(long, requires = "matrix")]
    reg: Option<PathBuf>,
    /// With --matrix and --reg: the weight w of the regularisation rows.
    #[arg(long, default_value_t = 1.0, requires = "reg")]
    reg_weight: f64,
    /// LSQR iterations per configuration (timed after 3 warm-up iterations).
    #[arg(long, default_value_t = 100)]
    iters: usize,
    /// Backends: auto (cuda when a usable GPU is present, else cpu), cuda, cpu, or all.
    #[arg(long, default_value = "auto", value_parser = super::args::words(&["auto", "cuda", "cpu", "all"]))]
    backend: String,
    /// Transpose strategies (comma-separated).
    #[arg(long, default_value = "csc,scatter,library", value_parser = super::args::ListOf(&["auto", "csc", "scatter", "library"]))]
    transpose: String,
    /// Value precisions (comma-separated).
    #[arg(long, default_value = "f64,f32", value_parser = super::args::ListOf(&["f64", "f32"]))]
    precision: String,
    /// Matrix storages (comma-separated): csr, compact (16-bit column deltas, grid damping
    /// rows as stencils).
    #[arg(long, default_value = "csr,compact", value_parser = super::args::ListOf(&["csr", "compact"]))]
    storage: String,
    /// LSQR loops on the GPU (comma-separated): device (scalars on the GPU, one CUDA graph per
    /// block of iterations), host (three host synchronisations per iteration).
    #[arg(long, default_value = "device", value_parser = super::args::ListOf(&["device", "host"]))]
    loops: String,
    /// Compact storage on the GPU: device layouts to time (comma-separated): auto (chosen from
    /// the matrix), rows, mixed[:T] (rows for A x, tiles of 2^T columns for A^T), tiles[:T]
    /// (tiles of 2^T columns for both products) or split[:T[:X]] (tiles of 2^X columns for A x,
    /// of 2^T for A^T).
    #[arg(long, default_value = "auto")]
    layouts: String,
    /// Write the system as DIR/{indptr,indices,data,b,shape}.npy and stop (for cupy_lsqr.py).
    #[arg(long)]
    export_npy: Option<PathBuf>,
    /// Also write the table as JSON lines to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One configuration's timings.
struct Row {
    backend: String,
    storage: String,
    /// The transpose strategy (csr) or the device layout (compact: rows or tiles).
    transpose: String,
    precision: String,
    lsqr_loop: String,
    ms_iter: f64,
    ax_ms: f64,
    aty_ms: f64,
    /// Bytes of one LSQR iteration at the floor of this storage, and of f64 CSR.
    floor_bytes: f64,
    bytes_per_nnz: f64,
    first_block_ms: f64,
    r1norm: f64,
    x: Vec<f64>,
}

fn list<T: std::str::FromStr<Err = String>>(s: &str) -> anyhow::Result<Vec<T>> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().parse::<T>().map_err(anyhow::Error::msg))
        .collect()
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let mut paths = crate::io::outpaths::PathCheck::new();
    paths
        .input_opt("--matrix", a.matrix.as_deref())
        .input_opt("--rhs", a.rhs.as_deref())
        .input_opt("--reg", a.reg.as_deref())
        .output_opt("--json", a.json.as_deref());
    if let Some(d) = &a.export_npy {
        paths.output_dir("--export-npy", d);
    }
    paths.check()?;
    let t = Instant::now();
    let (mat, b, what, grid, kernel_rows) = match &a.matrix {
        Some(p) => {
            let sys =
                crate::io::mtx::load_system(p, a.rhs.as_deref(), a.reg.as_deref(), a.reg_weight)?;
            (
                sys.a,
                sys.b,
                format!("{}", p.display()),
                None,
                sys.kernel_rows,
            )
        }
        None => {
            let (mut g, mut rays) = match a.size.as_str() {
                "small" => ((32, 32, 20), 20_000),
                "medium" => ((64, 64, 40), 150_000),
                "large" => ((128, 128, 80), 600_000),
                s => bail!("--size {s}: expected small, medium or large"),
            };
            if let Some(gs) = &a.grid {
                let v: Vec<usize> = gs
                    .split(',')
                    .map(|t| t.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("--grid {gs}: expected NX,NY,NZ"))?;
                if v.len() != 3 || v.iter().any(|&d| d < 2) {
                    bail!("--grid {gs}: expected three sizes >= 2");
                }
                g = (v[0], v[1], v[2]);
            }
            if let Some(r) = a.rays {
                rays = r;
            }
            let mat = crate::grid::synthetic::peer_system(g.0, g.1, g.2, rays, a.seed, a.sort_rays);
            let mut rng = Rng::new(a.seed + 1);
            let xt: Vec<f64> = (0..mat.ncols()).map(|_| rng.uniform()).collect();
            let b = mat.matvec(&xt);
            (
                mat,
                b,
                format!("straight rays {}x{}x{}, {rays} rays", g.0, g.1, g.2),
                Some([g.0, g.1, g.2]),
                rays,
            )
        }
    };
    let (m, n, nnz) = (mat.nrows(), mat.ncols(), mat.nnz());
    eprintln!(
        "system: {what}: {m} x {n}, {nnz} nonzeros (built in {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    if let Some(dir) = &a.export_npy {
        // The system as CSR storage holds it (every row stored, reordered as `invert` would):
        // what peers are run on.
        let p = crate::backend::storage::prepare(
            mat,
            b,
            kernel_rows,
            grid,
            Storage::Csr,
            a.reorder,
            true,
        );
        if !p.ordering.is_identity() {
            eprintln!("reordered: {}", p.ordering.what);
        }
        crate::io::npy::export_system(dir, &p.stored, &p.b)?;
        eprintln!(
            "wrote {}/{{indptr,indices,data,b,shape}}.npy",
            dir.display()
        );
        return Ok(());
    }
    let layouts = a
        .layouts
        .split(',')
        .map(|t| parse_layout(t.trim()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let strategies: Vec<TransposeStrategy> = list(&a.transpose)?;
    let precisions: Vec<Precision> = list(&a.precision)?;
    let storages: Vec<Storage> = list(&a.storage)?;
    let loops: Vec<String> = a.loops.split(',').map(|s| s.trim().to_string()).collect();
    if let Some(l) = loops.iter().find(|l| *l != "device" && *l != "host") {
        bail!("--loops {l}: expected device or host");
    }
    let backends: Vec<&str> = match a.backend.as_str() {
        "all" => vec!["cuda", "cpu"],
        "cuda" | "gpu" => vec!["cuda"],
        "cpu" => vec!["cpu"],
        "auto" => match crate::backend::cuda::probe() {
            Ok(_) => vec!["cuda"],
            Err(why) => {
                eprintln!("backend auto: no usable CUDA GPU ({why}); timing the CPU");
                vec!["cpu"]
            }
        },
        s => bail!("--backend {s}: expected auto, cuda, cpu or all"),
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut copy_gbps = f64::NAN;
    let mut host_gbps = f64::NAN;
    let mut device = String::new();
    if backends.contains(&"cpu") {
        let (desc, gbps) = crate::pipeline::bench::host_copy_bandwidth();
        eprintln!("host: {desc}");
        device = desc;
        host_gbps = gbps;
    }
    let cuda = if backends.contains(&"cuda") {
        let be = CudaBackend::new(0)?;
        let d = be.describe();
        eprintln!("device: {d}");
        device = if device.is_empty() {
            d
        } else {
            format!("{d}; {device}")
        };
        // Device copy bandwidth (read + write), 256 MiB each way.
        let len = 32usize << 20;
        let src = be.zeros(len)?;
        let mut dst = be.zeros(len)?;
        let sync = || be.synchronize();
        let ms = time_ms(10, &sync, || be.copy(&src, &mut dst))?;
        copy_gbps = 2.0 * (len * 8) as f64 / (ms * 1e-3) / 1e9;
        Some(be)
    } else {
        None
    };
    let csr_floor = |p: Precision| crate::pipeline::bench::csr_floor_bytes(m, n, nnz, p);
    for &storage in &storages {
        let p = crate::backend::storage::prepare(
            mat.clone(),
            b.clone(),
            kernel_rows,
            grid,
            storage,
            a.reorder,
            true,
        );
        eprintln!("{storage}: {}", p.describe(Precision::F32));
        if storage == Storage::Compact {
            let h = GapHistogram::of(&p.stored);
            eprintln!(
                "column steps of the stored rows ({} steps, {:.4} % escape, {} fillers):\n{}",
                h.steps,
                100.0 * h.escape_fraction(),
                h.fillers,
                h.table()
            );
            let ht = GapHistogram::of(&p.stored.transpose());
            eprintln!(
                "row steps of the transpose ({} steps, {:.4} % escape, {} fillers):\n{}",
                ht.steps,
                100.0 * ht.escape_fraction(),
                ht.fillers,
                ht.table()
            );
        }
        for &bk in &backends {
            let mut push = |t: Timing, tr: String, prec: Precision, lp: &str, fb: f64, bpn: f64| {
                rows.push(Row {
                    backend: bk.into(),
                    storage: storage.to_string(),
                    transpose: tr,
                    precision: prec.to_string(),
                    lsqr_loop: lp.into(),
                    ms_iter: t.ms_iter,
                    ax_ms: t.ax_ms,
                    aty_ms: t.aty_ms,
                    floor_bytes: fb,
                    bytes_per_nnz: bpn,
                    first_block_ms: t.first_block_ms,
                    r1norm: t.r1norm,
                    x: p.ordering.to_old(&t.x),
                })
            };
            if bk == "cuda" {
                let be = cuda.as_ref().expect("set up above");
                let sync = || be.synchronize();
                for &prec in &precisions {
                    if storage == Storage::Compact {
                        for lo in &layouts {
                            let op = match CudaCompactOperator::with_options(
                                be,
                                &p.stored,
                                p.stencil.as_ref(),
                                prec,
                                lo,
                            ) {
                                Ok(op) => op,
                                Err(e) => {
                                    eprintln!("cuda compact {prec}: skipped: {e}");
                                    continue;
                                }
                            };
                            let (pa, pt) = op.pass_bytes();
                            let fb = (pa + pt) as f64 + crate::pipeline::bench::vector_bytes(&p);
                            let bpn = pa as f64 / p.stored.nnz().max(1) as f64;
                            eprintln!("cuda compact {prec}: layout {}", op.layout());
                            for lp in &loops {
                                op.set_device_loop(lp == "device");
                                let tm = crate::pipeline::bench::time_lsqr(
                                    be, &op, &p.b, a.iters, &sync,
                                )?;
                                eprintln!(
                                "cuda compact {prec} {lp} loop: {:.4} ms/iter (A x {:.4} ms, A^T y {:.4} ms)",
                                tm.ms_iter, tm.ax_ms, tm.aty_ms
                            );
                                push(tm, layout_tag(lo, &op), prec, lp, fb, bpn);
                            }
                        }
                    } else {
                        for &s in &strategies {
                            if s == TransposeStrategy::Library && prec != Precision::F64 {
                                continue;
                            }
                            let op = match CudaCsrOperator::new(be, &p.stored, s, prec) {
                                Ok(op) => op,
                                Err(e) => {
                                    eprintln!("cuda {s} {prec}: skipped: {e}");
                                    continue;
                                }
                            };
                            for lp in &loops {
                                if lp == "device" && s != TransposeStrategy::Csc && loops.len() > 1
                                {
                                    continue; // only the explicit transpose has a device loop
                                }
                                op.set_device_loop(lp == "device");
                                let lp = if s == TransposeStrategy::Csc {
                                    lp.as_str()
                                } else {
                                    "host"
                                };
                                let tm = crate::pipeline::bench::time_lsqr(
                                    be, &op, &p.b, a.iters, &sync,
                                )?;
                                eprintln!(
                                    "cuda csr {s} {prec} {lp} loop: {:.4} ms/iter (A x {:.4} ms, A^T y {:.4} ms)",
                                    tm.ms_iter, tm.ax_ms, tm.aty_ms
                                );
                                push(
                                    tm,
                                    s.to_string(),
                                    prec,
                                    lp,
                                    csr_floor(prec),
                                    (prec.bytes() + 4) as f64,
                                );
                            }
                        }
                    }
                }
            } else {
                let be = CpuBackend::new();
                let sync = || Ok(());
                if storage == Storage::Compact {
                    for &prec in &precisions {
                        let op = CpuCompactOperator::new(&p.stored, p.stencil.clone(), prec);
                        let fb = crate::pipeline::bench::compact_floor_bytes(
                            &p,
                            (
                                op.stored().entries() as u64,
                                op.transposed().entries() as u64,
                            ),
                            prec,
                        );
                        let bpn = op.stored().bytes() as f64 / p.stored.nnz().max(1) as f64;
                        let tm = crate::backend::cpu::on_pool(&crate::comm::SerialComm, || {
                            crate::pipeline::bench::time_lsqr(&be, &op, &p.b, a.iters, &sync)
                        })?;
                        eprintln!("cpu compact {prec}: {:.4} ms/iter", tm.ms_iter);
                        push(tm, "rows".into(), prec, "host", fb, bpn);
                    }
                } else {
                    for &s in &strategies {
                        if s == TransposeStrategy::Library {
                            continue;
                        }
                        let op = CpuCsrOperator::new(p.stored.clone(), s);
                        let tm = crate::backend::cpu::on_pool(&crate::comm::SerialComm, || {
                            crate::pipeline::bench::time_lsqr(&be, &op, &p.b, a.iters, &sync)
                        })?;
                        eprintln!("cpu csr {s} f64: {:.4} ms/iter", tm.ms_iter);
                        push(
                            tm,
                            s.to_string(),
                            Precision::F64,
                            "host",
                            csr_floor(Precision::F64),
                            12.0,
                        );
                    }
                }
            }
        }
    }
    // Floors at the measured copy bandwidth of the memory each backend reads: the GPU's, or
    // the host's (all threads copying) for the CPU.
    let gbps_of = |backend: &str| {
        if backend == "cpu" {
            host_gbps
        } else {
            copy_gbps
        }
    };
    let ms_at = |bytes: f64, gbps: f64| bytes / (gbps * 1e9) * 1e3;
    let reference = rows.first().map(|r| r.x.clone());
    let mut out = String::new();
    out.push_str(&format!(
        "# seistomo bench: {what}: {m} x {n}, {nnz} nnz; {} LSQR iterations\n# device: {device}\n",
        a.iters,
    ));
    for (name, gbps) in [("GPU", copy_gbps), ("host", host_gbps)] {
        if gbps.is_finite() {
            out.push_str(&format!(
                "# {name} copy bandwidth {gbps:.1} GB/s; general f64-CSR floor {:.4} ms (f32 values {:.4} ms)\n",
                ms_at(csr_floor(Precision::F64), gbps),
                ms_at(csr_floor(Precision::F32), gbps),
            ));
        }
    }
    if host_gbps.is_finite() {
        if let Some(llc) = crate::pipeline::bench::last_level_cache_bytes() {
            let matrix = (nnz * 12 + (m + 1) * 4) as f64;
            if matrix < llc as f64 {
                out.push_str(&format!(
                    "# the f64 CSR matrix ({:.1} MB) fits the host's {:.0} MiB last-level cache: the host floor assumes main memory, so CPU times below it are expected\n",
                    matrix / 1e6,
                    llc as f64 / (1u64 << 20) as f64
                ));
            }
        }
    }
    out.push_str(&format!(
        "{:<6} {:<8} {:<10} {:<5} {:<6} {:>9} {:>8} {:>8} {:>6} {:>9} {:>8} {:>9} {:>10} {:>14} {:>9}\n",
        "backend",
        "storage",
        "layout",
        "prec",
        "loop",
        "ms/iter",
        "Ax ms",
        "ATy ms",
        "B/nnz",
        "floor ms",
        "fl/time",
        "csr/time",
        "1st blk ms",
        "r1norm",
        "dx/x"
    ));
    let mut json = String::new();
    for r in &rows {
        let gbps = gbps_of(&r.backend);
        let floor_ms = ms_at(r.floor_bytes, gbps);
        let csr_ms = ms_at(csr_floor(Precision::F64), gbps);
        let dx = match &reference {
            Some(x0) => {
                let num: f64 = r.x.iter().zip(x0).map(|(a, b)| (a - b) * (a - b)).sum();
                let den: f64 = x0.iter().map(|a| a * a).sum();
                (num / den.max(f64::MIN_POSITIVE)).sqrt()
            }
            None => 0.0,
        };
        out.push_str(&format!(
            "{:<7} {:<8} {:<10} {:<5} {:<6} {:>9.4} {:>8.4} {:>8.4} {:>6.2} {:>9.4} {:>8.3} {:>9.3} {:>10.2} {:>14.8e} {:>9.2e}\n",
            r.backend,
            r.storage,
            r.transpose,
            r.precision,
            r.lsqr_loop,
            r.ms_iter,
            r.ax_ms,
            r.aty_ms,
            r.bytes_per_nnz,
            floor_ms,
            floor_ms / r.ms_iter,
            csr_ms / r.ms_iter,
            r.first_block_ms,
            r.r1norm,
            dx
        ));
        json.push_str(&format!(
            "{{\"system\":\"{what}\",\"m\":{m},\"n\":{n},\"nnz\":{nnz},\"backend\":\"{}\",\"storage\":\"{}\",\"transpose\":\"{}\",\"precision\":\"{}\",\"loop\":\"{}\",\"ms_per_iter\":{},\"ax_ms\":{},\"aty_ms\":{},\"bytes_per_nnz\":{},\"copy_GBps\":{},\"floor_ms\":{},\"csr_f64_floor_ms\":{},\"first_block_ms\":{},\"r1norm\":{},\"dx_rel\":{}}}\n",
            r.backend, r.storage, r.transpose, r.precision, r.lsqr_loop, r.ms_iter, r.ax_ms, r.aty_ms,
            r.bytes_per_nnz, gbps, floor_ms, csr_ms, r.first_block_ms, r.r1norm, dx
        ));
    }
    print!("{out}");
    if let Some(p) = &a.json {
        write_atomic(p, |w| w.write_all(json.as_bytes()))?;
    }
    Ok(())
}

/// One item of `--layouts`: auto | rows | mixed[:T] | tiles[:T] | split[:T[:X]] (T: tile bits
/// of A^T, X: of A x).
fn parse_layout(t: &str) -> anyhow::Result<CompactGpuOptions> {
    let mut parts = t.split(':');
    let kind = parts.next().unwrap_or("");
    let bits: Vec<&str> = parts.collect();
    let (layout, most) = match kind {
        "auto" => (None, 0),
        "rows" => (Some(GpuLayout::Rows), 0),
        "mixed" => (Some(GpuLayout::Mixed), 1),
        "tiles" => (Some(GpuLayout::Tiles), 1),
        "split" => (Some(GpuLayout::Split), 2),
        _ => bail!("--layouts {t}: expected auto, rows, mixed[:T], tiles[:T] or split[:T[:X]]"),
    };
    if bits.len() > most {
        bail!("--layouts {t}: expected auto, rows, mixed[:T], tiles[:T] or split[:T[:X]]");
    }
    let parse = |b: &str| match b.parse::<u32>() {
        Ok(b) if (4..=12).contains(&b) => Ok(b),
        _ => bail!("--layouts {t}: tile bits {b} not in 4..=12"),
    };
    Ok(CompactGpuOptions {
        layout,
        tile_bits: bits.first().map(|b| parse(b)).transpose()?,
        ax_tile_bits: bits.get(1).map(|b| parse(b)).transpose()?,
        ..Default::default()
    })
}

/// The table's name of a compact layout: rows, mixed:T or tiles:T.
fn layout_tag(o: &CompactGpuOptions, op: &CudaCompactOperator) -> String {
    let desc = op.layout();
    let kind = desc.split([' ', ':']).next().unwrap_or("").to_string();
    match (o.tile_bits, o.ax_tile_bits) {
        (Some(t), Some(x)) if kind == "split" => format!("{kind}:{t}:{x}"),
        (Some(t), _) if kind != "rows" => format!("{kind}:{t}"),
        _ => kind,
    }
}
