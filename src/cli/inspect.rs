//! `seistomo inspect DATASET`: sizes, nnz-per-row histogram, memory per backend, partition
//! imbalance; optionally a timed load.

use std::path::PathBuf;

use clap::Args;

use crate::io::dataset::binfmt::Precision;
use crate::io::dataset::manifest::Layout;
use crate::io::dataset::{OpenDataset, Regularisation};
use crate::io::rowio::IoChoice;
use crate::io::LoadOptions;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Dataset (dataset.toml or its directory).
    dataset: PathBuf,
    /// Rank counts to report the partition imbalance for (comma-separated).
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    ranks: Vec<usize>,
    /// Also load the dataset (as rank 0 of 1, or each rank of --load-ranks in turn) and report
    /// the throughput.
    #[arg(long)]
    load: bool,
    /// With --load: load every rank of this many ranks, one after the other.
    #[arg(long, default_value_t = 1)]
    load_ranks: usize,
    /// Norm damping generated from the grid (as a run config's [dataset] would add).
    #[arg(long, default_value_t = 0.0)]
    norm_damping: f64,
    /// First-difference (flattening) weights along x,y,z generated from the grid.
    #[arg(long, default_value = "0,0,0", value_parser = super::args::triple::<f64>)]
    flattening: [f64; 3],
    /// Second-difference (smoothing) weights along x,y,z generated from the grid.
    #[arg(long, default_value = "0,0,0", value_parser = super::args::triple::<f64>)]
    smoothing: [f64; 3],
    /// With --load: read rows through memory maps (mmap) or as byte ranges (mpiio: positioned
    /// reads in this single process, the code path MPI ranks use).
    #[arg(long, default_value = "mmap", value_parser = super::args::pick::io())]
    io: IoChoice,
}

/// println! that stops quietly on a closed pipe (`inspect | head`).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

fn gib(bytes: f64) -> String {
    if bytes >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
    }
}

/// The most ranks `inspect` computes a partition for.
const MAX_RANKS: usize = 1 << 20;

pub fn run(a: InspectArgs) -> anyhow::Result<()> {
    for (what, r) in a
        .ranks
        .iter()
        .map(|&r| ("--ranks", r))
        .chain([("--load-ranks", a.load_ranks)])
    {
        if !(1..=MAX_RANKS).contains(&r) {
            anyhow::bail!("{what}: rank counts must be in 1..={MAX_RANKS} (got {r})");
        }
    }
    let weights = [a.norm_damping]
        .into_iter()
        .chain(a.flattening)
        .chain(a.smoothing);
    if let Some(w) = weights.into_iter().find(|w| !(w.is_finite() && *w >= 0.0)) {
        anyhow::bail!(
            "--norm-damping, --flattening and --smoothing must be finite and >= 0 (got {w})"
        );
    }
    let opts = LoadOptions {
        progress: true,
        damping_weight: None,
        regularisation: Some(Regularisation {
            norm: a.norm_damping,
            first: a.flattening,
            second: a.smoothing,
        }),
        io: a.io,
        io_max_gap: None,
        row_cost: None,
    };
    let ds = OpenDataset::open(&a.dataset, &opts)?;
    say_format(&ds);
    say_sizes(&ds);
    say_histogram(&ds);
    let mem = Memory::of(&ds);
    mem.say();
    say!(
        "partition (LPT on each row's cost, the bytes an iteration moves for it, over damping ranges; imbalance = max/mean cost):"
    );
    // each kernel row's nonzeros, by row
    let mut row_nnz = vec![0u64; ds.kernel_rows() as usize];
    for e in &ds.meta.entries {
        row_nnz[e.row as usize] = e.nnz;
    }
    for &r in &a.ranks {
        let p = ds.partition(r);
        // the most nonzeros a rank holds (kernel rows and its damping range)
        let mx = (0..r)
            .map(|k| {
                p.kernel[k]
                    .iter()
                    .map(|&i| row_nnz[i as usize])
                    .sum::<u64>()
                    + ds.damping_range_nnz(p.damping_range(k))
            })
            .max()
            .unwrap_or(0);
        say!(
            "  {r:>4} ranks  imbalance {:.9}  max {mx} nnz/rank  per-rank memory ~{}",
            p.imbalance(),
            gib((mem.csr + mem.csc) * mx as f64 / mem.nnz.max(1.0) + 8.0 * 5.0 * mem.n)
        );
    }
    if a.load {
        timed_loads(&ds, a.load_ranks, a.io)?;
    }
    Ok(())
}

/// The dataset's name, description, format and grid.
fn say_format(ds: &OpenDataset) {
    let m = &ds.manifest.m;
    say!("dataset      {} ({})", ds.manifest.path.display(), m.name);
    if !m.description.is_empty() {
        say!("description  {}", m.description);
    }
    say!(
        "format       version {}, layout {}, precision {}, {} kernel files",
        m.version,
        match m.layout {
            Layout::PerRow => "per-row",
            Layout::Packed => "packed",
        },
        match m.precision {
            Precision::F32 => "f32",
            Precision::F64 => "f64",
        },
        ds.meta.files
    );
    if let Some(g) = &m.grid {
        say!(
            "grid         {} x {} x {} cells, origin {:?}, spacing {:?} {}",
            g.n[0],
            g.n[1],
            g.n[2],
            g.origin,
            g.spacing,
            g.units
        );
    }
}

/// Columns, kernel and damping rows and nonzeros, row weights.
fn say_sizes(ds: &OpenDataset) {
    let m = &ds.manifest.m;
    let kr = ds.kernel_rows();
    let kn = ds.meta.nnz;
    let (dr, dn) = (ds.damping_rows(), ds.damping_nnz());
    let n = ds.columns() as u64;
    say!("columns      {n}");
    say!(
        "kernel       {kr} rows, {kn} nonzeros (mean {:.1}, max {}, min {} per row)",
        kn as f64 / kr.max(1) as f64,
        ds.meta.entries.first().map_or(0, |e| e.nnz),
        ds.meta.entries.last().map_or(0, |e| e.nnz)
    );
    say!(
        "damping      {dr} rows, {dn} nonzeros ({} stored in {} blocks, weight {}; {} generated from the grid)",
        ds.manifest.damping_rows(),
        ds.blocks.len(),
        ds.damping_weight,
        ds.generated.as_ref().map_or(0, |g| g.nrows())
    );
    let weights = match (&m.weights, &m.sigma) {
        (Some(_), _) => "data weights",
        (None, Some(_)) => "standard deviations",
        _ => "none",
    };
    say!("row weights  {weights}");
}

/// Histogram of kernel nnz per row in powers of two.
fn say_histogram(ds: &OpenDataset) {
    say!("nnz per kernel row:");
    let mut bins: Vec<u64> = vec![0; 65];
    for e in &ds.meta.entries {
        let b = if e.nnz == 0 {
            0
        } else {
            64 - e.nnz.leading_zeros() as usize
        };
        bins[b] += 1;
    }
    let maxc = *bins.iter().max().unwrap_or(&1);
    for (b, &c) in bins.iter().enumerate().filter(|(_, &c)| c > 0) {
        let (lo, hi) = if b == 0 {
            (0, 0)
        } else {
            (1u64 << (b - 1), (1u64 << b) - 1)
        };
        let bar = "#".repeat(((c as f64 / maxc as f64) * 40.0).ceil() as usize);
        say!("  {lo:>8} ..= {hi:<8} {c:>10}  {bar}");
    }
}

/// Memory of the whole system (f64 values, u32 columns, u64 offsets), in bytes.
struct Memory {
    csr: f64,
    csc: f64,
    vecs: f64,
    /// Columns and nonzeros.
    n: f64,
    nnz: f64,
}

impl Memory {
    fn of(ds: &OpenDataset) -> Memory {
        let rows = (ds.kernel_rows() + ds.damping_rows()) as f64;
        let nnz = (ds.meta.nnz + ds.damping_nnz()) as f64;
        let n = ds.columns() as u64 as f64;
        Memory {
            csr: 8.0 * (rows + 1.0) + 12.0 * nnz,
            csc: 8.0 * (n + 1.0) + 12.0 * nnz,
            vecs: 8.0 * (2.0 * rows + 5.0 * n),
            n,
            nnz,
        }
    }

    fn say(&self) {
        let (csr, csc, vecs) = (self.csr, self.csc, self.vecs);
        say!("memory (whole system, f64 values, u32 columns, u64 offsets):");
        say!(
            "  cpu   CSR {} + CSC copy for A^T {} + LSQR vectors {} = {}",
            gib(csr),
            gib(csc),
            gib(vecs),
            gib(csr + csc + vecs)
        );
        say!(
            "  cuda  device: CSR {} + CSR of A^T {} + vectors {} = {} (host keeps the CSR: {})",
            gib(csr),
            gib(csc),
            gib(vecs),
            gib(csr + csc + vecs),
            gib(csr)
        );
    }
}

/// Load every rank of `size` in turn and say the throughput of each (and of all).
fn timed_loads(ds: &OpenDataset, size: usize, io: IoChoice) -> anyhow::Result<()> {
    let mut tot_bytes = 0u64;
    let mut tot_s = 0.0;
    let mut loads = Vec::with_capacity(size);
    let reader = crate::io::rowio::RangeReader::serial();
    let via = (io == IoChoice::MpiIo).then_some(&reader);
    for rank in 0..size {
        let (sys, st) = ds.load_via(rank, size, true, via)?;
        loads.push(sys.a.nnz() as u64);
        tot_bytes += st.bytes;
        tot_s += st.seconds;
        say!(
            "  load rank {rank}/{size} ({}): {} rows, {} nnz, {} in {:.3} s = {:.2} GB/s (kernel rows: {} in {:.3} s = {:.2} GB/s)",
            st.io,
            sys.a.nrows(),
            sys.a.nnz(),
            gib(st.bytes as f64),
            st.seconds,
            st.gb_per_s(),
            gib(st.kernel_bytes as f64),
            st.kernel_seconds,
            st.kernel_bytes as f64 / st.kernel_seconds.max(1e-12) / 1e9
        );
    }
    if size > 1 {
        say!(
            "  loaded nnz per rank {loads:?}: imbalance {:.9}",
            crate::partition::imbalance(&loads)
        );
        say!(
            "  all ranks: {} in {:.3} s = {:.2} GB/s",
            gib(tot_bytes as f64),
            tot_s,
            tot_bytes as f64 / tot_s / 1e9
        );
    }
    Ok(())
}
