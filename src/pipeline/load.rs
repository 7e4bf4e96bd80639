//! Loading a dataset in a job of several ranks (Huang et al. 2012): rank 0 reads the metadata
//! and broadcasts it, every rank computes the same nonzero partition and reads its own rows,
//! through memory maps or the communicator's MPI-IO ([`crate::io::rowio`]).

use std::path::Path;
use std::time::Instant;

use crate::comm::{agree, Comm};
use crate::error::{Error, Result};
use crate::io::dataset::kernel_rows::parse_metadata;
use crate::io::dataset::manifest::DatasetManifest;
use crate::io::dataset::{LoadOptions, LoadStats, OpenDataset};
use crate::io::rowio::{IoPath, RangeReader};
use crate::sparse::System;

/// Open a dataset in a job of several ranks the way Huang et al. load: rank 0 alone reads
/// the metadata file (row nonzero counts and where each row lives) and broadcasts it; every
/// rank then computes the same greedy nonzero partition from it. Collective: every rank must
/// call it; an error on any rank (manifest or metadata) reaches every rank.
pub fn open_dataset_on(path: &Path, opts: &LoadOptions, comm: &dyn Comm) -> Result<OpenDataset> {
    let manifest = agree(comm, DatasetManifest::load(path))?;
    let meta_path = manifest.resolve(&manifest.m.metadata);
    let mine = if comm.rank() == 0 {
        std::fs::read(&meta_path).map_err(|e| Error::io(&meta_path, e))
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
/// maps or through `comm`'s MPI-IO reads, as `opts.io` says (`Auto`: MPI-IO on several ranks,
/// memory maps in one). The statistics say which path was taken.
pub fn load_dataset_comm(
    path: &Path,
    comm: &dyn Comm,
    opts: &LoadOptions,
) -> Result<(System, LoadStats)> {
    let t = Instant::now();
    let ds = if comm.size() > 1 {
        open_dataset_on(path, opts, comm)?
    } else {
        OpenDataset::open(path, opts)?
    };
    let reader = RangeReader::new(comm.reader()).with_max_gap(opts.io_max_gap);
    let via = match opts.io.resolve(comm.size()) {
        IoPath::Mmap => None,
        IoPath::MpiIo => Some(&reader),
    };
    let (sys, mut stats) = ds.load_via(comm.rank(), comm.size(), opts.progress, via)?;
    stats.seconds = t.elapsed().as_secs_f64();
    Ok((sys, stats))
}
