//! `dataset.toml`: the manifest of a dataset directory (docs/formats.md).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::grid::Grid;
use crate::io::dataset::binfmt::{id_text, Precision, VERSION, VERSION_1};

/// The `format` value of every manifest.
pub const FORMAT_NAME: &str = "seistomo-dataset";

/// How kernel rows are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// One file per kernel row: `<kernel_dir>/row_<row:010>.bin`.
    PerRow,
    /// Many rows per file: `<kernel_dir>/pack_<pack:05>.bin` with a row table.
    Packed,
}

choice_from_str!(Layout, "layout", "per-row" => Layout::PerRow, "packed" => Layout::Packed);

/// The `[damping]` table: stored damping blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DampingManifest {
    /// Block files in order (their rows follow each other).
    pub blocks: Vec<PathBuf>,
    /// Total damping rows and nonzeros over all blocks.
    pub rows: u64,
    pub nnz: u64,
    /// λ: every damping value is multiplied by it at load (default 1).
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// The manifest as written in `dataset.toml`. Paths are relative to its directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Version 3: the dataset's id (16 hex digits, random at creation), which every binary file
    /// of the dataset carries in its prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_id: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Model parameters (columns of every row).
    pub columns: u64,
    pub kernel_rows: u64,
    pub kernel_nnz: u64,
    /// Value precision of kernel and damping files.
    pub precision: Precision,
    pub layout: Layout,
    pub metadata: PathBuf,
    pub kernel_dir: PathBuf,
    /// Data vector b (one value per kernel row).
    pub rhs: PathBuf,
    /// Optional per-row data weights w (row i and b_i are multiplied by w_i).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<PathBuf>,
    /// Optional per-row standard deviations σ (row i and b_i are divided by σ_i).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigma: Option<PathBuf>,
    /// Optional true model (synthetic datasets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub true_model: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damping: Option<DampingManifest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid: Option<Grid>,
}

/// A manifest read from disk, with its directory.
#[derive(Debug, Clone)]
pub struct DatasetManifest {
    /// The manifest file.
    pub path: PathBuf,
    pub dir: PathBuf,
    pub m: Manifest,
    /// The dataset id (version 3; 0 before).
    pub id: u64,
}

impl DatasetManifest {
    /// Read `path` (a dataset.toml, or a directory holding one) and check it.
    pub fn load(path: &Path) -> Result<DatasetManifest> {
        let path = if path.is_dir() {
            path.join("dataset.toml")
        } else {
            path.to_path_buf()
        };
        let text = crate::io::read_input_text(&path, "dataset manifest", crate::io::MAX_TEXT)?;
        let m: Manifest = toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                .unwrap_or(0);
            Error::parse(&path, line, e.message().replace('\n', " "))
        })?;
        let bad = |msg: String| Error::format(&path, msg);
        if m.format != FORMAT_NAME {
            return Err(bad(format!(
                "format = '{}' is not a seistomo dataset (expected '{FORMAT_NAME}')",
                m.format
            )));
        }
        if !(VERSION_1..=VERSION).contains(&m.version) {
            return Err(bad(format!(
                "dataset version {} is not supported (this build reads versions {VERSION_1} to {VERSION})",
                m.version
            )));
        }
        let id = match (&m.dataset_id, m.version >= 3) {
            (Some(t), true) => u64::from_str_radix(t, 16)
                .ok()
                .filter(|&v| t.len() == 16 && v != 0 && id_text(v) == *t)
                .ok_or_else(|| {
                    bad(format!(
                        "dataset_id = \"{t}\" is not an id (16 lower-case hex digits, not all zero)"
                    ))
                })?,
            (None, true) => {
                return Err(bad(format!(
                    "version {} needs dataset_id (the id every file of the dataset carries)",
                    m.version
                )))
            }
            (Some(_), false) => {
                return Err(bad(format!(
                    "dataset_id is a version 3 key but the dataset is version {}",
                    m.version
                )))
            }
            (None, false) => 0,
        };
        if m.columns == 0 || m.columns > u32::MAX as u64 + 1 {
            return Err(bad(format!("columns = {} must be in 1..=2^32", m.columns)));
        }
        if m.weights.is_some() && m.sigma.is_some() {
            return Err(bad("give weights or sigma, not both".into()));
        }
        if let Some(d) = &m.damping {
            if !d.weight.is_finite() || d.weight < 0.0 {
                return Err(bad(format!(
                    "[damping] weight must be finite and >= 0 (got {})",
                    d.weight
                )));
            }
        }
        if let Some(g) = &m.grid {
            g.check().map_err(|e| bad(format!("[grid] {e}")))?;
            if g.ncells() as u64 != m.columns {
                return Err(bad(format!(
                    "[grid] has {} cells but columns = {}",
                    g.ncells(),
                    m.columns
                )));
            }
        }
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(DatasetManifest { path, dir, m, id })
    }

    /// What every binary file of the dataset must say in its prefix: the format version and
    /// (version 3) the dataset id.
    pub fn tag(&self) -> (u32, u64) {
        (self.m.version, self.id)
    }

    /// A path of the manifest, resolved against its directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }

    /// Rows of the stored damping blocks.
    pub fn damping_rows(&self) -> u64 {
        self.m.damping.as_ref().map_or(0, |d| d.rows)
    }
    pub fn damping_nnz(&self) -> u64 {
        self.m.damping.as_ref().map_or(0, |d| d.nnz)
    }
}

/// The name of kernel row file `row` (per-row layout).
pub fn row_file_name(row: u64) -> String {
    format!("row_{row:010}.bin")
}

/// The name of pack file `pack`.
pub fn pack_file_name(pack: u64) -> String {
    format!("pack_{pack:05}.bin")
}
