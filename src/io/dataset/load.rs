//! Loading a dataset: open it (manifest, metadata, damping block headers), partition its rows
//! over ranks, and read one rank's share into a [`System`], through memory maps or byte-range
//! reads; the global row order of a rank (docs/formats.md, docs/datasets.md).

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::grid::Stencil;
use crate::io::dataset::damping::{DampingBlock, RowsOut};
use crate::io::dataset::kernel_rows::{read_kernel_rows, read_metadata, MetaEntry, Metadata, Tail};
use crate::io::dataset::manifest::DatasetManifest;
use crate::io::dataset::vectors::{read_vector, read_vector_rows, VectorKind};
use crate::io::rowio::{IoChoice, IoPath, RangeReader};
use crate::partition::{partition, Damping, Partition, RowCost};
use crate::sparse::par::split_parts;
use crate::sparse::Csr;
use crate::sparse::System;

/// Regularisation generated from the dataset's grid at load (see [`crate::grid::regularisation`]):
/// FMTOMO's damping ε / tomoDD's DAMP is `norm`; first-derivative (flattening) and
/// second-derivative (smoothing, FMTOMO's η, tomoDD's SMOOTH) weights per axis x, y, z.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Regularisation {
    pub norm: f64,
    pub first: [f64; 3],
    pub second: [f64; 3],
}

impl Regularisation {
    pub fn is_empty(&self) -> bool {
        self.norm == 0.0 && self.first == [0.0; 3] && self.second == [0.0; 3]
    }
}

/// Options of a load.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Show a progress bar (on a terminal).
    pub progress: bool,
    /// Override the manifest's damping weight λ.
    pub damping_weight: Option<f64>,
    /// Damping rows generated from the grid, appended after the stored damping blocks.
    pub regularisation: Option<Regularisation>,
    /// How rows are read: memory maps or MPI-IO byte ranges (`Auto`: MPI-IO across nodes).
    pub io: IoChoice,
    /// Byte-range reads: records at most this many bytes apart are read as one (`[tuning]
    /// io_max_gap`; 0: only touching records); `None`: [`crate::io::rowio::MAX_GAP`].
    pub io_max_gap: Option<u64>,
    /// What a row costs, for balancing ranks ([`RowCost`]); `None`: [`RowCost::CSR`].
    pub row_cost: Option<RowCost>,
}

/// What a load read and how fast.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LoadStats {
    pub rows: usize,
    pub nnz: usize,
    pub bytes: u64,
    pub seconds: f64,
    /// The kernel rows alone (row files / packs decoded into the CSR).
    pub kernel_bytes: u64,
    pub kernel_seconds: f64,
    /// How the rows were read.
    pub io: IoPath,
    /// Read calls of the MPI-IO path (0 for memory maps).
    pub read_calls: u64,
    /// This rank's cost in the partition ([`crate::partition::RowCost`] units).
    pub cost: u64,
}

impl LoadStats {
    /// Throughput in GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// A dataset opened for loading: manifest, metadata, damping block headers, generated rows.
pub struct OpenDataset {
    pub manifest: DatasetManifest,
    pub meta: Metadata,
    pub blocks: Vec<DampingBlock>,
    /// Rows generated from the grid (after the stored damping rows).
    pub generated: Option<Csr>,
    pub damping_weight: f64,
    /// What a row costs, for the partition over ranks.
    pub row_cost: RowCost,
}

impl OpenDataset {
    /// Open and check the manifest, the metadata and every damping block header.
    pub fn open(path: &Path, opts: &LoadOptions) -> Result<OpenDataset> {
        let manifest = DatasetManifest::load(path)?;
        let meta = read_metadata(&manifest)?;
        Self::from_parts(manifest, meta, opts)
    }

    /// Check the damping block headers and set up the generated rows.
    pub fn from_parts(
        manifest: DatasetManifest,
        meta: Metadata,
        opts: &LoadOptions,
    ) -> Result<OpenDataset> {
        let mut blocks = Vec::new();
        if let Some(d) = &manifest.m.damping {
            // The blocks opened (and checked) on rayon's threads, then each one's first row
            // against the blocks before it, in order: the first block's error is reported.
            let opened: Vec<Result<DampingBlock>> = d
                .blocks
                .par_iter()
                .enumerate()
                .map(|(i, b)| {
                    DampingBlock::open(
                        &manifest.resolve(b),
                        i as u64,
                        None,
                        manifest.m.columns,
                        manifest.m.precision,
                        manifest.tag(),
                    )
                })
                .collect();
            let mut first = 0u64;
            let mut nnz = 0u64;
            for blk in opened {
                let blk = blk?;
                DampingBlock::check_first_row(&blk.path, blk.first_row, first)?;
                first += blk.rows;
                nnz += blk.nnz;
                blocks.push(blk);
            }
            if first != d.rows || nnz != d.nnz {
                return Err(Error::format(
                    &manifest.path,
                    format!(
                        "[damping] says {} rows and {} nonzeros but the blocks hold {first} and {nnz}",
                        d.rows, d.nnz
                    ),
                ));
            }
        }
        let damping_weight = opts
            .damping_weight
            .unwrap_or_else(|| manifest.m.damping.as_ref().map_or(1.0, |d| d.weight));
        let generated = match opts.regularisation.filter(|r| !r.is_empty()) {
            None => None,
            Some(r) => {
                let g = manifest.m.grid.as_ref().ok_or_else(|| {
                    Error::format(
                        &manifest.path,
                        "regularisation from the grid was asked for but the dataset has no [grid]",
                    )
                })?;
                Some(crate::grid::regularisation(g, r.norm, r.first, r.second))
            }
        };
        Ok(OpenDataset {
            manifest,
            meta,
            blocks,
            generated,
            damping_weight,
            row_cost: opts.row_cost.unwrap_or(RowCost::CSR),
        })
    }

    /// Stored plus generated damping rows.
    pub fn damping_rows(&self) -> u64 {
        self.manifest.damping_rows() + self.generated.as_ref().map_or(0, |g| g.nrows() as u64)
    }
    pub fn damping_nnz(&self) -> u64 {
        self.manifest.damping_nnz() + self.generated.as_ref().map_or(0, |g| g.nnz() as u64)
    }
    pub fn kernel_rows(&self) -> u64 {
        self.meta.rows
    }
    pub fn columns(&self) -> usize {
        self.meta.cols as usize
    }

    /// Exact nonzeros of damping rows `range` (stored blocks, then generated rows).
    pub fn damping_range_nnz(&self, range: Range<u64>) -> u64 {
        let mut total = 0;
        for blk in &self.blocks {
            let (b0, b1) = (blk.first_row, blk.first_row + blk.rows);
            let (s, e) = (range.start.max(b0), range.end.min(b1));
            if s < e {
                total += blk.range_nnz((s - b0)..(e - b0));
            }
        }
        if let Some(g) = &self.generated {
            let stored = self.manifest.damping_rows();
            let (s, e) = (range.start.max(stored), range.end.max(stored));
            if s < e {
                let ip = g.indptr();
                total += ip[(e - stored) as usize] - ip[(s - stored) as usize];
            }
        }
        total
    }

    /// The partition over `size` ranks (see [`crate::partition`]): balanced by `row_cost`, the
    /// damping rows cut at stencil-block boundaries where they are whole grid-stencil blocks.
    pub fn partition(&self, size: usize) -> Partition {
        let rows: Vec<u64> = self.meta.entries.iter().map(|e| e.row).collect();
        let nnz: Vec<u64> = self.meta.entries.iter().map(|e| e.nnz).collect();
        let exact = |r: Range<u64>| self.damping_range_nnz(r);
        let cuts = self.damping_cuts();
        let damping = Damping {
            rows: self.damping_rows(),
            nnz: self.damping_nnz(),
            range_nnz: Some(&exact),
            cuts: cuts.as_deref(),
        };
        partition(&rows, &nnz, &damping, size, self.row_cost)
    }

    /// Where the damping rows could be cut so that each piece is whole grid-stencil blocks: all
    /// of them, or the stored rows as one piece followed by generated stencil blocks (see
    /// [`crate::grid::Stencil::block_cuts`]); None without a grid or such blocks.
    pub fn damping_cuts(&self) -> Option<Vec<u64>> {
        let n = self.manifest.m.grid.as_ref()?.n;
        let stored = self.manifest.damping_rows();
        if let Some(c) = Stencil::block_cuts(n, self.damping_rows()) {
            return Some(c);
        }
        let generated = self.damping_rows() - stored;
        let c = Stencil::block_cuts(n, generated)?;
        Some(
            std::iter::once(stored)
                .filter(|&s| s > 0)
                .chain(c.into_iter().map(|e| stored + e))
                .collect(),
        )
    }

    /// Global row indices of rank `rank`'s local rows, in local order: kernel rows (0..M) in
    /// ascending order, then damping rows (M + d for damping row d).
    pub fn row_order(&self, rank: usize, size: usize) -> Vec<u64> {
        let p = self.partition(size);
        let m = self.kernel_rows();
        let mut order = p.kernel[rank].clone();
        order.extend(p.damping_range(rank).map(|d| m + d));
        order
    }

    /// Load rank `rank`'s rows through memory maps.
    pub fn load(&self, rank: usize, size: usize, progress: bool) -> Result<(System, LoadStats)> {
        self.load_via(rank, size, progress, None)
    }

    /// Load rank `rank`'s rows: through memory maps when `reader` is `None`, else as byte
    /// ranges read with `reader` (MPI-IO): kernel rows, b and weights/sigma of those rows, and
    /// the columns and values of this rank's damping rows. The metadata and the damping blocks'
    /// headers and row offsets (needed by every rank for the partition) are mapped either way.
    pub fn load_via(
        &self,
        rank: usize,
        size: usize,
        progress: bool,
        reader: Option<&RangeReader>,
    ) -> Result<(System, LoadStats)> {
        if size == 0 || rank >= size {
            return Err(Error::Invalid(format!(
                "rank {rank} of {size}: rank must be < size"
            )));
        }
        let t = Instant::now();
        let dm = &self.manifest;
        let p = self.partition(size);
        // This rank's rows' metadata entries, in row order.
        let entries = &self.meta.entries;
        let local: Vec<MetaEntry> = if p.kernel[rank].len() == entries.len() {
            // every row (one rank): each entry in its row's place (rows are 0..M, each once)
            let mut local = entries.clone();
            for e in entries {
                local[e.row as usize] = *e;
            }
            local
        } else {
            let mut where_: Vec<u32> = vec![u32::MAX; self.meta.rows as usize];
            for (k, e) in entries.iter().enumerate() {
                where_[e.row as usize] = k as u32;
            }
            p.kernel[rank]
                .iter()
                .map(|&r| entries[where_[r as usize] as usize])
                .collect()
        };
        // This rank's damping rows: stored blocks, then generated rows. The stored blocks'
        // rows go into the room the kernel rows' arrays leave after them.
        let range = p.damping_range(rank);
        let stored = dm.damping_rows();
        let ncols = self.columns();
        let parts: Vec<(&DampingBlock, Range<u64>, usize)> = self
            .blocks
            .iter()
            .filter_map(|blk| {
                let (b0, b1) = (blk.first_row, blk.first_row + blk.rows);
                let (s, e) = (range.start.max(b0), range.end.min(b1));
                (s < e).then(|| {
                    let r = (s - b0)..(e - b0);
                    (blk, r.clone(), blk.range_nnz(r) as usize)
                })
            })
            .collect();
        let tail = Tail {
            rows: parts.iter().map(|p| (p.1.end - p.1.start) as usize).sum(),
            nnz: parts.iter().map(|p| p.2).sum(),
        };
        let t_k = Instant::now();
        let (mut indptr, mut indices, mut data, mut bytes) =
            read_kernel_rows(dm, &self.meta, &local, reader, progress, tail)?;
        let kernel_seconds = t_k.elapsed().as_secs_f64();
        let kernel_bytes = bytes;
        // b and weights follow their rows.
        let local_rows: Vec<u64> = local.iter().map(|e| e.row).collect();
        let m = Some(self.meta.rows);
        let tag = dm.tag();
        // This rank's values of a vector file, in local row order.
        let values = |path: &Path, kind: VectorKind| -> Result<(Vec<f64>, u64)> {
            match reader {
                None => {
                    let (all, n) = read_vector(path, kind, m, tag)?;
                    Ok((local_rows.iter().map(|&r| all[r as usize]).collect(), n))
                }
                Some(rd) => read_vector_rows(path, kind, m, &local_rows, rd, tag),
            }
        };
        let (mut b, nb) = values(&dm.resolve(&dm.m.rhs), VectorKind::Rhs)?;
        bytes += nb;
        let scale = match (&dm.m.weights, &dm.m.sigma) {
            (Some(w), _) => {
                let (w, n) = values(&dm.resolve(w), VectorKind::Weights)?;
                bytes += n;
                Some(w.into_iter().map(|w| (w, false)).collect::<Vec<_>>())
            }
            (None, Some(s)) => {
                let (s, n) = values(&dm.resolve(s), VectorKind::Sigma)?;
                bytes += n;
                Some(s.into_iter().map(|s| (s, true)).collect::<Vec<_>>())
            }
            (None, None) => None,
        };
        if let Some(scale) = scale {
            for (i, &(w, divide)) in scale.iter().enumerate() {
                let (s, e) = (indptr[i] as usize, indptr[i + 1] as usize);
                if divide {
                    data[s..e].iter_mut().for_each(|v| *v /= w);
                    b[i] /= w;
                } else {
                    data[s..e].iter_mut().for_each(|v| *v *= w);
                    b[i] *= w;
                }
            }
        }
        let kernel_rows = local.len();
        // The stored damping rows: each block decoded into its own part of the room after the
        // kernel rows, the blocks (and their pieces) on rayon's threads through maps, one after
        // another through MPI-IO.
        let (p0, n0) = (kernel_rows + 1, indices.len() - tail.nnz);
        let rows_of = |r: &Range<u64>| (r.end - r.start) as usize;
        let ptrs = split_parts(&mut indptr[p0..], parts.iter().map(|p| rows_of(&p.1)));
        let cols = split_parts(&mut indices[n0..], parts.iter().map(|p| p.2));
        let vals = split_parts(&mut data[n0..], parts.iter().map(|p| p.2));
        // each part's first entry in the whole arrays
        let bases = parts.iter().scan(n0 as u64, |b, p| {
            let at = *b;
            *b += p.2 as u64;
            Some(at)
        });
        let outs: Vec<RowsOut> = bases
            .zip(ptrs)
            .zip(cols.into_iter().zip(vals))
            .map(|((base, indptr), (indices, data))| RowsOut {
                base,
                indptr,
                indices,
                data,
            })
            .collect();
        let (weight, jobs) = (self.damping_weight, parts.into_iter().zip(outs));
        let read: Vec<Result<u64>> = match reader {
            None => jobs
                .collect::<Vec<_>>()
                .into_par_iter()
                .map(|((blk, r, _), out)| blk.read_rows_into(r, weight, ncols, None, out))
                .collect(),
            Some(rd) => jobs
                .map(|((blk, r, _), out)| blk.read_rows_into(r, weight, ncols, Some(rd), out))
                .collect(),
        };
        for r in read {
            bytes += r?;
        }
        if let Some(g) = &self.generated {
            let gr: Range<u64> = range.start.max(stored)..range.end.max(stored);
            for i in gr {
                let (c, v) = g.row((i - stored) as usize);
                indices.extend_from_slice(c);
                data.extend_from_slice(v);
                indptr.push(indices.len() as u64);
            }
        }
        let nrows = indptr.len() - 1;
        b.resize(nrows, 0.0);
        let a = Csr::from_trusted(nrows, ncols, indptr, indices, data);
        let stats = LoadStats {
            rows: a.nrows(),
            nnz: a.nnz(),
            bytes,
            seconds: t.elapsed().as_secs_f64(),
            kernel_bytes,
            kernel_seconds,
            io: if reader.is_some() {
                IoPath::MpiIo
            } else {
                IoPath::Mmap
            },
            read_calls: reader.map_or(0, |r| r.calls()),
            cost: p.load[rank],
        };
        Ok((System { a, b, kernel_rows }, stats))
    }
}

/// Load rank `rank` of `size`'s rows of the dataset at `path` (a dataset.toml or its
/// directory). The single-process case is rank 0 of 1: all rows in the original order.
pub fn load_dataset(path: &Path, rank: usize, size: usize) -> Result<System> {
    load_dataset_with(path, rank, size, &LoadOptions::default()).map(|(s, _)| s)
}

/// [`load_dataset`] with options; also returns the load statistics.
pub fn load_dataset_with(
    path: &Path,
    rank: usize,
    size: usize,
    opts: &LoadOptions,
) -> Result<(System, LoadStats)> {
    let t = Instant::now();
    let ds = OpenDataset::open(path, opts)?;
    let reader = RangeReader::serial().with_max_gap(opts.io_max_gap);
    let via = (opts.io == IoChoice::MpiIo).then_some(&reader);
    let (sys, mut stats) = ds.load_via(rank, size, opts.progress, via)?;
    stats.seconds = t.elapsed().as_secs_f64();
    Ok((sys, stats))
}

/// Global row indices of rank `rank`'s local rows (kernel rows 0..M, damping rows M + d), so a
/// result gathered from the ranks can be put back in dataset order.
pub fn global_row_order(
    path: &Path,
    rank: usize,
    size: usize,
    opts: &LoadOptions,
) -> Result<Vec<u64>> {
    Ok(OpenDataset::open(path, opts)?.row_order(rank, size))
}

/// Read a dataset's true model (synthetic datasets), if it has one.
pub fn read_true_model(path: &Path) -> Result<Option<Vec<f64>>> {
    true_model_of(&DatasetManifest::load(path)?)
}

/// The true model an opened manifest names (synthetic datasets), read and checked against its
/// columns.
pub fn true_model_of(dm: &DatasetManifest) -> Result<Option<Vec<f64>>> {
    match &dm.m.true_model {
        None => Ok(None),
        Some(p) => Ok(Some(
            read_vector(
                &dm.resolve(p),
                VectorKind::Model,
                Some(dm.m.columns),
                dm.tag(),
            )?
            .0,
        )),
    }
}
