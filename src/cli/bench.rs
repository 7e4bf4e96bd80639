//! `seistomo bench`: LSQR iterations per backend, storage, transpose or GPU layout, value
//! precision and loop on a synthetic straight-ray system built in memory (or a system from
//! Matrix Market files), with ms/iteration, effective bandwidth and the ratio to the bandwidth
//! floor. The measuring is `pipeline::bench`; this file parses the plan and prints the table.
//!
//! The synthetic system is [`crate::grid::synthetic::peer_system`], the one the CuPy peer
//! (bench/peers/cupy_lsqr.py) builds. `--export-npy DIR` writes it for
//! `cupy_lsqr.py npy DIR ITERS`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;

use crate::backend::storage::Storage;
use crate::io::write_atomic;
use crate::pipeline::bench::{parse_layout, BenchSystem, Plan};
use crate::pipeline::options::BackendChoice;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Synthetic system preset: small (32x32x20, 20k rays), medium (64x64x40, 150k rays),
    /// large (128x128x80, 600k rays: ~100M nonzeros, the CuPy peer's system).
    #[arg(long, default_value = "small", value_parser = super::args::words(&["small", "medium", "large"]))]
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
    /// Order the synthetic rays by their first cell (instead of the generator's random order).
    #[arg(long)]
    sort_rays: bool,
    /// Reorder the system as `invert` does: none (as built), rows (sorted by their end columns)
    /// or auto (rows, and the synthetic grid's cells in Morton order). Applied before
    /// --export-npy too, so peers can be run on the same reordered system.
    #[arg(long, default_value = "none", value_parser = super::args::pick::reorder())]
    reorder: crate::grid::reorder::Reorder,
    /// Benchmark a Matrix Market system instead (with --rhs/--reg/--reg-weight as in solve).
    #[arg(long)]
    matrix: Option<PathBuf>,
    #[command(flatten)]
    system: super::args::MtxSystemArgs,
    /// LSQR iterations per configuration (timed after 3 warm-up iterations).
    #[arg(long, default_value_t = 100)]
    iters: usize,
    /// Backends: auto (cuda when a usable GPU is present, else cpu), cuda, cpu, or all.
    #[arg(long, default_value = "auto", value_parser = super::args::words(&["auto", "cuda", "cpu", "all"]))]
    backend: String,
    /// Transpose strategies of CSR storage (comma-separated).
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
    /// or split[:T[:X]] (tiles of 2^X columns for A x, of 2^T for A^T).
    #[arg(long, default_value = "auto")]
    layouts: String,
    /// Instead of LSQR: time a sum of this many f64 values over the ranks of an MPI job (run
    /// under mpirun, one rank per GPU) by every path it can take: the other GPUs' memory
    /// (peer), NCCL's all-reduce and the host (MPI), `--iters` sums each; prints the median,
    /// the fastest and nccl-tests' algbw and busbw. 1310720 is LSQR's A^T u on the 128 x 128 x
    /// 80 grid.
    #[arg(long, value_name = "VALUES")]
    pub sums: Option<usize>,
    /// Write the system as DIR/{indptr,indices,data,b,shape}.npy and stop (for cupy_lsqr.py).
    #[arg(long)]
    export_npy: Option<PathBuf>,
    /// Also write the table as JSON lines to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    tune: super::args::TuneArgs,
}

fn list<T: std::str::FromStr<Err = String>>(s: &str) -> anyhow::Result<Vec<T>> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().parse::<T>().map_err(anyhow::Error::msg))
        .collect()
}

/// `seistomo bench --sums VALUES`: the sums over the ranks, path by path (every rank
/// calls it; rank 0 prints).
pub fn run_sums(a: &BenchArgs, values: usize, comm: &dyn crate::comm::Comm) -> anyhow::Result<()> {
    let mut paths = crate::io::outpaths::PathCheck::new();
    paths.output_opt("--json", a.json.as_deref());
    paths.check()?;
    if comm.size() < 2 {
        bail!("--sums times sums over the ranks of an MPI job: run it under mpirun with two ranks or more (one per GPU)");
    }
    let (rows, skipped) = crate::pipeline::operators::time_sums(comm, values, a.iters)?;
    if !comm.is_root() {
        return Ok(());
    }
    let mb = 8.0 * values as f64 / 1e6;
    println!(
        "sum of {values} f64 ({mb:.1} MB) over {} ranks, {} sums each (median / fastest ms, algbw / busbw GB/s):",
        comm.size(),
        a.iters.max(1)
    );
    println!("| path | median ms | fastest ms | algbw GB/s | busbw GB/s |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.4} | {:.4} | {:.1} | {:.1} |",
            r.path, r.median_ms, r.min_ms, r.algbw_gbs, r.busbw_gbs
        );
    }
    for s in &skipped {
        println!("not timed: {s}");
    }
    if let Some(p) = &a.json {
        let mut text = String::new();
        for r in &rows {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        write_atomic(p, |w| w.write_all(text.as_bytes()))?;
    }
    Ok(())
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let mut paths = crate::io::outpaths::PathCheck::new();
    paths
        .input_opt("--matrix", a.matrix.as_deref())
        .input_opt("--rhs", a.system.rhs.as_deref())
        .input_opt("--reg", a.system.reg.as_deref())
        .output_opt("--json", a.json.as_deref());
    if let Some(d) = &a.export_npy {
        paths.output_dir("--export-npy", d);
    }
    paths.check()?;
    let t = Instant::now();
    let sys = system(&a)?;
    eprintln!(
        "system: {}: {} x {}, {} nonzeros (built in {:.1} s)",
        sys.what,
        sys.a.nrows(),
        sys.a.ncols(),
        sys.a.nnz(),
        t.elapsed().as_secs_f64()
    );
    if let Some(dir) = &a.export_npy {
        // The system as CSR storage holds it (every row stored, reordered as `invert` would):
        // what peers are run on.
        let p = sys.prepared(Storage::Csr, a.reorder);
        if !p.ordering.is_identity() {
            eprintln!("reordered: {}", p.ordering.what);
        }
        p.matrix
            .rows
            .with_csr(|a| crate::io::npy::export_system(dir, a, &p.b))??;
        eprintln!(
            "wrote {}/{{indptr,indices,data,b,shape}}.npy",
            dir.display()
        );
        return Ok(());
    }
    let tuning = a.tune.over(&Default::default())?;
    let plan = Plan {
        backends: backends(&a.backend),
        storages: list(&a.storage)?,
        precisions: list(&a.precision)?,
        transposes: list(&a.transpose)?,
        loops: list(&a.loops)?,
        layouts: a
            .layouts
            .split(',')
            .map(|t| parse_layout(t.trim(), &tuning))
            .collect::<crate::Result<_>>()?,
        reorder: a.reorder,
        iters: a.iters,
        tuning,
    };
    let table = crate::pipeline::bench::run(&plan, &sys)?;
    print!("{}", table.text(&sys, a.iters));
    if let Some(p) = &a.json {
        let mut json = String::new();
        for r in &table.rows {
            json.push_str(&serde_json::to_string(r)?);
            json.push('\n');
        }
        write_atomic(p, |w| w.write_all(json.as_bytes()))?;
    }
    Ok(())
}

/// The synthetic preset (or --grid/--rays), or the Matrix Market system of --matrix.
fn system(a: &BenchArgs) -> anyhow::Result<BenchSystem> {
    if let Some(p) = &a.matrix {
        return Ok(BenchSystem::mtx(
            a.system.parts().load(p)?,
            p.display().to_string(),
        ));
    }
    let (mut g, mut rays) = match a.size.as_str() {
        "small" => ([32, 32, 20], 20_000),
        "medium" => ([64, 64, 40], 150_000),
        _ => ([128, 128, 80], 600_000),
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
        g = [v[0], v[1], v[2]];
    }
    rays = a.rays.unwrap_or(rays);
    Ok(BenchSystem::synthetic(g, rays, a.seed, a.sort_rays))
}

/// The backends of `--backend` (auto: the GPU when one is usable, else the CPU, saying why).
fn backends(s: &str) -> Vec<BackendChoice> {
    match s {
        "all" => vec![BackendChoice::Cuda, BackendChoice::Cpu],
        "cuda" => vec![BackendChoice::Cuda],
        "cpu" => vec![BackendChoice::Cpu],
        _ => match crate::pipeline::operators::gpu_here() {
            Ok(_) => vec![BackendChoice::Cuda],
            Err(why) => {
                eprintln!("backend auto: no usable CUDA GPU ({why}); timing the CPU");
                vec![BackendChoice::Cpu]
            }
        },
    }
}
