//! The dataset format (docs/formats.md): a directory holding a manifest (`dataset.toml`), the
//! kernel rows (a metadata file, then row files or packs), damping blocks and vectors; version 2
//! checksums every section with CRC32C, version 1 (no checksums) is still read.
//!
//! - [`binfmt`] (magics, the common prefix, row records, checked little-endian reads)
//! - [`manifest`] (`dataset.toml`)
//! - [`kernel_rows`] (the metadata file, row files and packs)
//! - [`damping`] (damping block files), [`vectors`] (b, weights, σ, true model)
//! - [`load`] (open a dataset, load one rank's rows), [`mod@write`] (write one), [`verify`] (check
//!   every byte)

pub mod binfmt;
pub mod damping;
pub mod kernel_rows;
pub mod load;
pub mod manifest;
pub mod vectors;
pub mod verify;
pub mod write;

pub use load::{
    global_row_order, load_dataset, load_dataset_with, read_true_model, true_model_of, LoadOptions,
    LoadStats, OpenDataset, Regularisation,
};
pub use write::{write_dataset, DatasetSpec, SpecSources};
