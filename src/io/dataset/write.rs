//! Writing a dataset: the kernel's rows, b and the optional weights, standard deviations, true
//! model and damping blocks, with the manifest, into a hidden directory renamed into place when
//! complete (docs/formats.md).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::grid::Grid;
use crate::io::dataset::binfmt::{id_text, new_dataset_id, Precision, VERSION, VERSION_1};
use crate::io::dataset::damping::write_damping;
use crate::io::dataset::kernel_rows::write_kernel;
use crate::io::dataset::manifest::{DampingManifest, Layout, Manifest, FORMAT_NAME};
use crate::io::dataset::vectors::{write_vector, VectorKind};
use crate::sparse::Csr;

/// Everything needed to write a dataset.
pub struct DatasetSpec<'a> {
    pub name: String,
    pub description: String,
    pub kernel: &'a Csr,
    pub rhs: &'a [f64],
    pub weights: Option<&'a [f64]>,
    pub sigma: Option<&'a [f64]>,
    /// Stored damping rows (unscaled) and their weight λ.
    pub damping: Option<&'a Csr>,
    pub damping_weight: f64,
    pub damping_blocks: usize,
    pub grid: Option<Grid>,
    pub true_model: Option<&'a [f64]>,
    pub layout: Layout,
    pub precision: Precision,
    /// Target size of a pack file (packed layout).
    pub pack_bytes: u64,
    /// Format version to write: 3 (checksums and the dataset id, the default), 2 or 1.
    pub version: u32,
    /// The dataset id written into every file (version 3); None: a fresh random one.
    pub id: Option<u64>,
    /// Where the values come from (named in the errors about them): import's input files.
    pub sources: SpecSources<'a>,
}

/// The files the parts of a [`DatasetSpec`] were read from (errors about their values name
/// them; without a file, the part is named).
#[derive(Debug, Clone, Copy, Default)]
pub struct SpecSources<'a> {
    pub kernel: Option<&'a Path>,
    pub rhs: Option<&'a Path>,
    pub weights: Option<&'a Path>,
    pub sigma: Option<&'a Path>,
    pub damping: Option<&'a Path>,
    pub true_model: Option<&'a Path>,
}

impl<'a> DatasetSpec<'a> {
    /// A spec with defaults: packed, f64, 64 MiB packs, no damping or weights.
    pub fn new(kernel: &'a Csr, rhs: &'a [f64]) -> Self {
        DatasetSpec {
            name: String::new(),
            description: String::new(),
            kernel,
            rhs,
            weights: None,
            sigma: None,
            damping: None,
            damping_weight: 1.0,
            damping_blocks: 1,
            grid: None,
            true_model: None,
            layout: Layout::Packed,
            precision: Precision::F64,
            pack_bytes: 64 << 20,
            version: VERSION,
            id: None,
            sources: SpecSources::default(),
        }
    }
}

/// Write a dataset directory `out` (which must not exist or be empty). Everything is written
/// into a hidden sibling directory that is renamed to `out` when complete, so an interrupted
/// write leaves no dataset behind.
pub fn write_dataset(out: &Path, spec: &DatasetSpec, progress: bool) -> Result<PathBuf> {
    check_spec(spec)?;
    if out.exists()
        && std::fs::read_dir(out)
            .map_err(|e| Error::io(out, e))?
            .next()
            .is_some()
    {
        return Err(Error::format(
            out,
            "exists and is not empty (remove it or choose another output directory)",
        ));
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "dataset".into());
    let tmp = parent.join(format!(".{name}.partial{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    if let Err(e) = write_files(&tmp, spec, progress) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // A concurrent writer of `out` may have won the race: then this one's partial directory
    // goes, and the error says why.
    let placed = (|| -> std::io::Result<()> {
        if out.exists() {
            std::fs::remove_dir(out)?;
        }
        std::fs::rename(&tmp, out)
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(Error::io(out, e));
    }
    Ok(out.join("dataset.toml"))
}

/// Error unless the parts of `spec` fit together (format version, lengths of b and the
/// weights, columns of the damping matrix, cells of the grid).
fn check_spec(spec: &DatasetSpec) -> Result<()> {
    let k = spec.kernel;
    let bad = |msg: String| Err(Error::Invalid(msg));
    let version = spec.version;
    if !(VERSION_1..=VERSION).contains(&version) {
        return bad(format!(
            "dataset format version {version} ({VERSION_1} to {VERSION})"
        ));
    }
    let one_per_row = |what: &str, v: Option<&[f64]>| match v {
        Some(v) if v.len() != k.nrows() => bad(format!(
            "{what} has {} values but the kernel has {} rows",
            v.len(),
            k.nrows()
        )),
        _ => Ok(()),
    };
    one_per_row("b", Some(spec.rhs))?;
    if spec.weights.is_some() && spec.sigma.is_some() {
        return bad("give data weights or standard deviations, not both".into());
    }
    one_per_row("weights", spec.weights)?;
    one_per_row("sigma", spec.sigma)?;
    if let Some(d) = spec.damping.filter(|d| d.ncols() != k.ncols()) {
        return bad(format!(
            "the damping matrix has {} columns but the kernel has {}",
            d.ncols(),
            k.ncols()
        ));
    }
    if let Some(g) = spec.grid.as_ref().filter(|g| g.ncells() != k.ncols()) {
        return bad(format!(
            "the grid has {} cells but the kernel has {} columns",
            g.ncells(),
            k.ncols()
        ));
    }
    check_values(spec)
}

/// Every value that goes into the dataset is finite (and, stored as f32, within f32's range),
/// weights >= 0 and standard deviations > 0: what the readers refuse is never written. Errors
/// name the input file (or the part, without one) and the entry.
fn check_values(spec: &DatasetSpec) -> Result<()> {
    use crate::io::finite::{check_matrix, check_vector};
    let src = &spec.sources;
    let name = |p: Option<&Path>, what: &str| p.map_or_else(|| PathBuf::from(what), PathBuf::from);
    let f32 = spec.precision == Precision::F32;
    let k = spec.kernel;
    let refused =
        |e: Error| Error::Invalid(format!("{e}: refused (the dataset could not be read)"));
    check_matrix(
        &name(src.kernel, "the kernel"),
        "kernel",
        k,
        0..k.nrows(),
        f32,
    )
    .map_err(refused)?;
    if let Some(d) = spec.damping {
        check_matrix(
            &name(src.damping, "the damping rows"),
            "damping",
            d,
            0..d.nrows(),
            f32,
        )
        .map_err(refused)?;
    }
    let vectors = [
        (src.rhs, "b", Some(spec.rhs)),
        (src.weights, "weights", spec.weights),
        (src.sigma, "sigma", spec.sigma),
        (src.true_model, "true model", spec.true_model),
    ];
    for (from, what, v) in vectors {
        if let Some(v) = v {
            let file = name(from, what);
            check_vector(&file, what, v).map_err(refused)?;
            let bad = match what {
                "weights" => v.iter().position(|&w| w < 0.0),
                "sigma" => v.iter().position(|&s| s <= 0.0),
                _ => None,
            };
            if let Some(i) = bad {
                return Err(refused(Error::format(
                    &file,
                    format!(
                        "{what} row {i}: value {} is not allowed (weights >= 0, sigma > 0)",
                        v[i]
                    ),
                )));
            }
        }
    }
    Ok(())
}

/// Write every file of `spec`'s dataset into the directory `dir`, the manifest last.
fn write_files(dir: &Path, spec: &DatasetSpec, progress: bool) -> Result<()> {
    let (k, version) = (spec.kernel, spec.version);
    let id = if version >= 3 {
        spec.id.unwrap_or_else(new_dataset_id)
    } else {
        0
    };
    let tag = (version, id);
    write_kernel(
        dir,
        Path::new("kernel"),
        Path::new("metadata.bin"),
        k,
        spec.layout,
        spec.precision,
        spec.pack_bytes,
        tag,
        progress,
    )?;
    let vectors = [
        ("b.bin", VectorKind::Rhs, Some(spec.rhs)),
        ("weights.bin", VectorKind::Weights, spec.weights),
        ("sigma.bin", VectorKind::Sigma, spec.sigma),
        ("true_model.bin", VectorKind::Model, spec.true_model),
    ];
    for (name, kind, v) in vectors {
        if let Some(v) = v {
            write_vector(&dir.join(name), kind, v, Precision::F64, tag)?;
        }
    }
    let damping = match spec.damping {
        Some(d) => Some(DampingManifest {
            blocks: write_damping(dir, d, spec.damping_blocks, spec.precision, tag)?,
            rows: d.nrows() as u64,
            nnz: d.nnz() as u64,
            weight: spec.damping_weight,
        }),
        None => None,
    };
    let m = Manifest {
        format: FORMAT_NAME.into(),
        version,
        dataset_id: (version >= 3).then(|| id_text(id)),
        name: spec.name.clone(),
        description: spec.description.clone(),
        columns: k.ncols() as u64,
        kernel_rows: k.nrows() as u64,
        kernel_nnz: k.nnz() as u64,
        precision: spec.precision,
        layout: spec.layout,
        metadata: "metadata.bin".into(),
        kernel_dir: "kernel".into(),
        rhs: "b.bin".into(),
        weights: spec.weights.map(|_| "weights.bin".into()),
        sigma: spec.sigma.map(|_| "sigma.bin".into()),
        true_model: spec.true_model.map(|_| "true_model.bin".into()),
        damping,
        grid: spec.grid.clone(),
    };
    let text = toml::to_string(&m).map_err(|e| Error::Invalid(format!("manifest: {e}")))?;
    crate::io::write_atomic(&dir.join("dataset.toml"), |w| w.write_all(text.as_bytes()))
}
