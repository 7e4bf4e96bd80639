//! `seistomo verify`: check every byte of a dataset without solving: the manifest, the metadata,
//! every kernel row (row files or packs, their tables), every damping row and every vector
//! file, with their checksums in format version 2. Rows are read in batches, so the memory used
//! stays bounded whatever the dataset's size.

use std::path::Path;
use std::time::Instant;

use crate::error::Result;
use crate::io::dataset::kernel_rows::{check_pack_file, read_kernel_rows, Tail};
use crate::io::dataset::load::{LoadOptions, OpenDataset};
use crate::io::dataset::manifest::{pack_file_name, Layout};
use crate::io::dataset::vectors::{read_vector, VectorKind};

/// What [`verify_dataset`] checked.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Format version (1: no checksums).
    pub version: u32,
    /// The dataset id that every file carries (version 3; 0 before).
    pub id: u64,
    /// Files read.
    pub files: u64,
    pub kernel_rows: u64,
    pub kernel_nnz: u64,
    pub damping_rows: u64,
    pub damping_nnz: u64,
    /// Bytes read and checked.
    pub bytes: u64,
    pub seconds: f64,
}

/// Nonzeros per batch of rows read by the verifier.
const BATCH_NNZ: u64 = 1 << 24;

/// Check the whole dataset at `path` (a dataset.toml or its directory). The first problem is
/// the error (one line naming the file and the row).
pub fn verify_dataset(path: &Path, progress: bool) -> Result<VerifyReport> {
    let t = Instant::now();
    let ds = OpenDataset::open(path, &LoadOptions::default())?;
    let dm = &ds.manifest;
    let mut rep = VerifyReport {
        version: dm.m.version,
        id: dm.id,
        kernel_rows: ds.meta.rows,
        kernel_nnz: ds.meta.nnz,
        damping_rows: dm.damping_rows(),
        damping_nnz: dm.damping_nnz(),
        ..Default::default()
    };
    let meta_path = dm.resolve(&dm.m.metadata);
    rep.files += 2;
    rep.bytes += std::fs::metadata(&dm.path).map_or(0, |m| m.len());
    rep.bytes += std::fs::metadata(&meta_path).map_or(0, |m| m.len());
    // Every pack's header and row table, also of packs no entry points into.
    if ds.meta.layout == Layout::Packed {
        let kdir = dm.resolve(&dm.m.kernel_dir);
        for p in 0..ds.meta.files {
            check_pack_file(dm, &kdir.join(pack_file_name(p)), p)?;
        }
        rep.files += ds.meta.files;
    } else {
        rep.files += ds.meta.rows;
    }
    // Kernel rows in batches of about BATCH_NNZ nonzeros, in metadata order.
    let pb = crate::ui::progress::bar(ds.meta.nnz, "verifying", progress);
    let entries = &ds.meta.entries;
    let mut start = 0;
    while start < entries.len() {
        let (mut end, mut nnz) = (start, 0u64);
        while end < entries.len() && (end == start || nnz + entries[end].nnz <= BATCH_NNZ) {
            nnz += entries[end].nnz;
            end += 1;
        }
        let (_, _, _, bytes) = read_kernel_rows(
            dm,
            &ds.meta,
            &entries[start..end],
            None,
            false,
            Tail::default(),
        )?;
        rep.bytes += bytes;
        pb.inc(nnz);
        start = end;
    }
    pb.finish_and_clear();
    // Damping rows, block by block, in batches.
    let ncols = ds.columns();
    for blk in &ds.blocks {
        rep.files += 1;
        let mut r0 = 0;
        while r0 < blk.rows {
            let r1 = (r0 + BATCH_NNZ / 4).min(blk.rows);
            let (mut ip, mut ix, mut dv) = (vec![0u64], Vec::new(), Vec::new());
            rep.bytes += blk.read_rows(r0..r1, 1.0, ncols, &mut ip, &mut ix, &mut dv)?;
            r0 = r1;
        }
    }
    // Vector files.
    let m = Some(ds.meta.rows);
    let mut vectors = vec![(dm.resolve(&dm.m.rhs), VectorKind::Rhs, m)];
    if let Some(w) = &dm.m.weights {
        vectors.push((dm.resolve(w), VectorKind::Weights, m));
    }
    if let Some(s) = &dm.m.sigma {
        vectors.push((dm.resolve(s), VectorKind::Sigma, m));
    }
    if let Some(x) = &dm.m.true_model {
        vectors.push((dm.resolve(x), VectorKind::Model, Some(dm.m.columns)));
    }
    for (p, kind, len) in vectors {
        rep.bytes += read_vector(&p, kind, len, dm.tag())?.1;
        rep.files += 1;
    }
    rep.seconds = t.elapsed().as_secs_f64();
    Ok(rep)
}
