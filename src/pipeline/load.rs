//! Stage 1, load: each rank gets its rows of the system (Huang et al. 2012). A dataset: rank 0
//! reads the metadata and broadcasts it, every rank computes the same nonzero partition and
//! reads its own rows through memory maps or MPI-IO ([`crate::io::rowio`]); the manifest is read
//! once and its grid and true model travel with the rows. Matrix Market files: rank 0 reads the
//! whole system and sends each rank a nonzero-balanced block of rows.

use std::path::Path;
use std::time::Instant;

use crate::comm::{agree, distribute_system, Comm};
use crate::error::Result;
use crate::grid::Grid;
use crate::io::dataset::kernel_rows::parse_metadata;
use crate::io::dataset::manifest::DatasetManifest;
use crate::io::dataset::{LoadOptions, LoadStats, OpenDataset};
use crate::io::rowio::{IoPath, RangeReader};
use crate::partition::blocks::RowPartition;
use crate::partition::RowCost;
use crate::pipeline::options::SystemSource;
use crate::settings::tuning::Tuning;
use crate::sparse::System;

/// What the load stage hands on: this rank's rows and what the source says about its unknowns.
pub struct Loaded {
    /// This rank's rows of [A; b] (kernel rows first).
    pub system: System,
    /// The grid whose cells the unknowns are, when a dataset's manifest has one.
    pub grid: Option<Grid>,
    /// The true model of a synthetic dataset.
    pub true_model: Option<Vec<f64>>,
    /// How the dataset's rows were read ("mmap", "mpiio"; empty for Matrix Market input).
    pub io: String,
    /// Wall-clock seconds of the load on this rank (distribution included).
    pub seconds: f64,
    /// This rank's cost in the load plan (bytes an iteration moves; 0 where rows were split by
    /// nonzeros).
    pub cost: u64,
}

/// Load this rank's rows of `source`. Collective: every rank calls it; an error on any rank
/// reaches every rank (as [`crate::Error::Rank`] where it was one rank's). A dataset's rows are
/// balanced over ranks by `row_cost`; `tuning` may coalesce its reads further apart
/// (`io_max_gap`).
pub fn load(
    source: &SystemSource,
    comm: &dyn Comm,
    tuning: &Tuning,
    row_cost: RowCost,
) -> Result<Loaded> {
    let t = Instant::now();
    let mut loaded = match source {
        SystemSource::Dataset { path, options, .. } => {
            let options = LoadOptions {
                io_max_gap: tuning.io_max_gap.or(options.io_max_gap),
                row_cost: Some(options.row_cost.unwrap_or(row_cost)),
                ..options.clone()
            };
            agree(comm, load_dataset(path, comm, &options))?
        }
        SystemSource::Mtx { .. } => Loaded {
            system: distribute_system(comm, || load_mtx(source), RowPartition::by_nnz_midpoints)?,
            grid: None,
            true_model: None,
            io: String::new(),
            seconds: 0.0,
            cost: 0,
        },
    };
    loaded.seconds = t.elapsed().as_secs_f64();
    Ok(loaded)
}

/// The whole system of a Matrix Market source (one process).
pub fn load_mtx(source: &SystemSource) -> Result<System> {
    match source {
        SystemSource::Mtx {
            matrix,
            rhs,
            reg,
            reg_weight,
        } => {
            let s =
                crate::io::mtx::load_system(matrix, rhs.as_deref(), reg.as_deref(), *reg_weight)?;
            // Non-finite values (duplicate entries that summed to infinity, b = A 1 beyond
            // f64, R times its weight) are named with their file here, not met inside LSQR.
            let k = s.kernel_rows;
            let fin = crate::io::finite::check_matrix;
            fin(matrix, "matrix", &s.a, 0..k, false)?;
            if let Some(r) = reg {
                fin(r, "reg (times reg_weight)", &s.a, k..s.a.nrows(), false)?;
            }
            let b_from = rhs.as_deref().unwrap_or(matrix);
            let what = if rhs.is_some() { "b" } else { "b = A 1" };
            crate::io::finite::check_vector(b_from, what, &s.b[..k])?;
            Ok(s)
        }
        SystemSource::Dataset { path, options, .. } => {
            crate::io::load_dataset_with(path, 0, 1, options).map(|(s, _)| s)
        }
    }
}

/// This rank's rows of a dataset, its grid and true model; on rank 0 of several, a line on how
/// the rows were read.
fn load_dataset(path: &Path, comm: &dyn Comm, options: &LoadOptions) -> Result<Loaded> {
    let (system, st, manifest) = load_dataset_comm(path, comm, options)?;
    if comm.is_root() && comm.size() > 1 {
        eprintln!(
            "dataset metadata read on rank 0 and broadcast; rows read {} on every rank (rank 0: {} rows, {:.1} MiB in {:.3} s{})",
            match st.io {
                IoPath::Mmap => "through memory maps",
                IoPath::MpiIo => "through MPI-IO",
            },
            st.rows,
            st.bytes as f64 / (1u64 << 20) as f64,
            st.seconds,
            if st.read_calls > 0 {
                format!(", {} read calls", st.read_calls)
            } else {
                String::new()
            }
        );
    }
    Ok(Loaded {
        system,
        grid: manifest.m.grid.clone(),
        true_model: crate::io::dataset::true_model_of(&manifest)?,
        io: options
            .io
            .resolve(comm.size(), comm.local_size())
            .to_string(),
        seconds: 0.0,
        cost: st.cost,
    })
}

/// Open a dataset in a job of several ranks the way Huang et al. load: rank 0 alone reads
/// the metadata file (row nonzero counts and where each row lives) and broadcasts it; every
/// rank then computes the same greedy nonzero partition from it. Collective: every rank must
/// call it; an error on any rank (manifest or metadata) reaches every rank.
pub fn open_dataset_on(path: &Path, opts: &LoadOptions, comm: &dyn Comm) -> Result<OpenDataset> {
    let manifest = agree(comm, DatasetManifest::load(path))?;
    let meta_path = manifest.resolve(&manifest.m.metadata);
    let mine = if comm.rank() == 0 {
        crate::io::read_input(&meta_path, "metadata file", u64::MAX)
    } else {
        Ok(Vec::new())
    };
    let mut bytes = agree(comm, mine)?;
    comm.broadcast_bytes(0, &mut bytes)?;
    let meta = agree(comm, parse_metadata(&manifest, &bytes))?;
    drop(bytes);
    OpenDataset::from_parts(manifest, meta, opts)
}

/// Load this rank's rows of the dataset at `path` in a job described by `comm`: through memory
/// maps or through `comm`'s MPI-IO reads, as `opts.io` says (`Auto`: MPI-IO across nodes,
/// memory maps on one node). The statistics say which path was taken; the manifest comes back for
/// what it says about the unknowns.
pub fn load_dataset_comm(
    path: &Path,
    comm: &dyn Comm,
    opts: &LoadOptions,
) -> Result<(System, LoadStats, DatasetManifest)> {
    let t = Instant::now();
    let ds = if comm.size() > 1 {
        open_dataset_on(path, opts, comm)?
    } else {
        OpenDataset::open(path, opts)?
    };
    let reader = RangeReader::new(comm.reader()).with_max_gap(opts.io_max_gap);
    let via = match opts.io.resolve(comm.size(), comm.local_size()) {
        IoPath::Mmap => None,
        IoPath::MpiIo => Some(&reader),
    };
    let (sys, mut stats) = ds.load_via(comm.rank(), comm.size(), opts.progress, via)?;
    stats.seconds = t.elapsed().as_secs_f64();
    Ok((sys, stats, ds.manifest))
}
