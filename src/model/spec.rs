//! What the unknowns of a system mean, so that a solution vector can be written as a velocity
//! model: the parameterisation (a regular [`Grid`], a table of cells, or a bare vector), what the
//! solution vector holds (slowness, or a slowness perturbation from a reference), the reference
//! model, and (synthetic runs) the true model.
//!
//! The `[model]` table of a run config describes this for Matrix Market systems; dataset readers
//! build a [`ModelSpec`] directly.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::grid::Grid;
use crate::io::open_text;

/// What the solution vector x holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknowns {
    /// x is the slowness itself (australia: phase slowness per cell).
    Slowness,
    /// x is the slowness perturbation s - s_ref from the reference model (linearised travel-time
    /// tomography: d = travel-time residuals).
    SlownessPerturbation,
}

impl Unknowns {
    pub fn as_str(self) -> &'static str {
        match self {
            Unknowns::Slowness => "slowness",
            Unknowns::SlownessPerturbation => "slowness_perturbation",
        }
    }
}

choice_from_str!(Unknowns, "value", "slowness" => Unknowns::Slowness, "slowness_perturbation" | "perturbation" => Unknowns::SlownessPerturbation);

/// The reference velocity model.
#[derive(Debug, Clone, PartialEq)]
pub enum Reference {
    /// One velocity everywhere.
    Constant(f64),
    /// A 1-D profile: (depth, velocity) points, linearly interpolated at each cell centre's
    /// depth (grid axis 2), constant beyond the ends.
    Profile(Vec<(f64, f64)>),
    /// The mean slowness of the recovered model (only when x is the slowness itself).
    Mean,
}

impl Reference {
    /// The reference a model table (or Python's `write_model`) gives: `reference` (a velocity
    /// or "mean") or `reference_profile` ((depth, velocity) points, depths increasing), not
    /// both; neither is the mean. The error names the key.
    pub fn from_raw(
        reference: Option<&RawReference>,
        profile: Option<&[[f64; 2]]>,
    ) -> std::result::Result<Reference, String> {
        Ok(match (reference, profile) {
            (Some(_), Some(_)) => {
                return Err("give reference or reference_profile, not both".into())
            }
            (None, None) => Reference::Mean,
            (Some(RawReference::Velocity(v)), None) => {
                if !(v.is_finite() && *v > 0.0) {
                    return Err(format!("reference must be > 0 (got {v})"));
                }
                Reference::Constant(*v)
            }
            (Some(RawReference::Word(w)), None) if w == "mean" => Reference::Mean,
            (Some(RawReference::Word(w)), None) => {
                return Err(format!(
                    "reference: '{w}' is neither a velocity nor \"mean\""
                ))
            }
            (None, Some(p)) => {
                if p.is_empty() {
                    return Err("reference_profile is empty".into());
                }
                for (i, [z, v]) in p.iter().enumerate() {
                    if !(z.is_finite() && v.is_finite() && *v > 0.0) {
                        return Err(format!(
                            "reference_profile point {i}: need finite depth and velocity > 0"
                        ));
                    }
                    if i > 0 && *z <= p[i - 1][0] {
                        return Err(format!(
                            "reference_profile depths must increase (point {i})"
                        ));
                    }
                }
                Reference::Profile(p.iter().map(|[z, v]| (*z, *v)).collect())
            }
        })
    }
}

/// Cell table of a non-grid parameterisation: the bounds of each cell.
#[derive(Debug, Clone, PartialEq)]
pub struct CellTable {
    /// Column names, e.g. ["lat_min", "lat_max", "lon_min", "lon_max"].
    pub columns: Vec<String>,
    pub units: String,
    /// One row per unknown.
    pub rows: Vec<Vec<f64>>,
}

/// How the unknowns are laid out in space.
#[derive(Debug, Clone, PartialEq)]
pub enum Parameterisation {
    /// Regular grid; unknown i + nx (j + ny k) is cell (i, j, k).
    Grid(Grid),
    /// A list of cells (2-D lat/lon boxes for australia).
    Cells(CellTable),
    /// No geometry known: the vector only.
    Vector,
}

/// Everything needed to turn a solution vector into a model file.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub param: Parameterisation,
    pub unknowns: Unknowns,
    /// Unit of slowness, e.g. "s/km"; velocity is in the inverse unit.
    pub slowness_unit: String,
    pub reference: Reference,
    /// Synthetic runs: the true model, in the same quantity as x.
    pub true_model: Option<Vec<f64>>,
}

impl ModelSpec {
    /// A bare vector of slowness with the mean as reference.
    pub fn vector() -> ModelSpec {
        ModelSpec {
            param: Parameterisation::Vector,
            unknowns: Unknowns::Slowness,
            slowness_unit: "s/km".into(),
            reference: Reference::Mean,
            true_model: None,
        }
    }
    /// The velocity unit that goes with the slowness unit ("s/km" -> "km/s").
    pub fn velocity_unit(&self) -> String {
        match self.slowness_unit.split_once('/') {
            Some((a, b)) => format!("{b}/{a}"),
            None => format!("1/({})", self.slowness_unit),
        }
    }
    /// Check the spec against the number of unknowns.
    pub fn check(&self, n: usize) -> Result<()> {
        self.check_from(n, &SpecSources::default())
    }

    /// [`ModelSpec::check`], the errors naming the file each part came from (where known).
    pub fn check_from(&self, n: usize, src: &SpecSources) -> Result<()> {
        let named = |from: Option<&Path>, msg: String| match from {
            Some(p) => Error::format(p, msg),
            None => Error::Invalid(msg),
        };
        if let Parameterisation::Grid(g) = &self.param {
            g.check().map_err(|e| named(src.grid, e))?;
        }
        let count = match &self.param {
            Parameterisation::Grid(g) => Some((g.ncells(), "grid cells", src.grid)),
            Parameterisation::Cells(c) => Some((c.rows.len(), "cells", src.cells)),
            Parameterisation::Vector => None,
        };
        if let Some((c, what, from)) = count {
            if c != n {
                return Err(named(
                    from,
                    format!("the model has {c} {what} but the system has {n} unknowns"),
                ));
            }
        }
        if let Some(t) = &self.true_model {
            if t.len() != n {
                return Err(named(
                    src.true_model,
                    format!(
                        "the true model has {} values but the system has {n} unknowns",
                        t.len()
                    ),
                ));
            }
        }
        if self.unknowns == Unknowns::SlownessPerturbation && self.reference == Reference::Mean {
            return Err(Error::Invalid(
                "unknowns = slowness_perturbation needs a reference model (reference_velocity or reference_profile)".into(),
            ));
        }
        Ok(())
    }
}

/// Where the parts of a [`ModelSpec`] came from, for errors that name the file.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpecSources<'a> {
    /// The file that gave the grid (a config's `[model] grid`, a dataset's manifest).
    pub grid: Option<&'a Path>,
    /// The cell table.
    pub cells: Option<&'a Path>,
    /// The true model's file.
    pub true_model: Option<&'a Path>,
}

/// `reference = 3.5` or `reference = "mean"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawReference {
    Velocity(f64),
    Word(String),
}

/// The `[model]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// "slowness" (default) or "slowness_perturbation".
    pub unknowns: Option<String>,
    /// Unit of slowness (default "s/km").
    pub slowness_unit: Option<String>,
    /// Constant reference velocity, or "mean" (default for unknowns = "slowness").
    pub reference: Option<RawReference>,
    /// 1-D reference: [[depth, velocity], ...] in increasing depth.
    pub reference_profile: Option<Vec<[f64; 2]>>,
    /// Regular grid of the unknowns.
    pub grid: Option<Grid>,
    /// Cell table file (one line per unknown, whitespace-separated bounds; '#' comments).
    pub cells: Option<PathBuf>,
    /// Column names of the cell table.
    pub cell_columns: Option<Vec<String>>,
    /// Unit of the cell bounds (default "degrees").
    pub cell_units: Option<String>,
    /// True model (synthetic runs): one value per unknown, same quantity as the solution.
    pub true_model: Option<PathBuf>,
}

/// Where the model (and checkpoints) go, and what the model is. Files named in the `[model]`
/// table are read by [`ModelOutput::spec`] (not at config validation).
#[derive(Debug, Clone)]
pub struct ModelOutput {
    /// The config file (named in errors about what its `[model]` table says).
    pub config: PathBuf,
    /// The model file (None: not written).
    pub path: Option<PathBuf>,
    /// Write a checkpoint every this many iterations (0: never).
    pub checkpoint_every: usize,
    pub checkpoint: PathBuf,
    unknowns: Unknowns,
    slowness_unit: String,
    reference: Reference,
    grid: Option<Grid>,
    cells: Option<(PathBuf, Vec<String>, String)>,
    true_model: Option<PathBuf>,
}

impl ModelOutput {
    /// Validate the `[model]` table and the model/checkpoint keys of `[output]`.
    pub fn from_raw(
        config: &Path,
        out_dir: &Path,
        raw: Option<RawModel>,
        model: Option<String>,
        checkpoint_every: Option<i64>,
        checkpoint: Option<String>,
    ) -> Result<ModelOutput> {
        let bad = |msg: String| Error::config(config, msg);
        let base = config.parent().map(Path::to_path_buf).unwrap_or_default();
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        let existing = |key: &str, p: &Path| -> Result<PathBuf> {
            crate::io::existing_file(resolve(p)).map_err(|e| bad(format!("{key}: {e}")))
        };
        let path = match model.as_deref() {
            Some("") => None,
            Some(m) => Some(out_dir.join(m)),
            None => Some(out_dir.join("model.h5")),
        };
        let checkpoint_every = match checkpoint_every {
            None => 0,
            Some(k) if k >= 0 => k as usize,
            Some(k) => {
                return Err(bad(format!(
                    "[output] checkpoint_every must be >= 0 (got {k})"
                )))
            }
        };
        let checkpoint = checkpoint.unwrap_or_else(|| "checkpoint.bin".into());
        // The checkpoint lies in the output directory: the end of a run removes it (when this
        // run wrote it), so it must never name a file elsewhere.
        let inside = !checkpoint.is_empty()
            && Path::new(&checkpoint)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !inside || crate::io::publish::is_reserved_name(&checkpoint) {
            return Err(bad(format!(
                "[output] checkpoint = \"{checkpoint}\" must be a file name inside the output directory (no '..', no absolute path, not a name of seistomo's own)"
            )));
        }
        let checkpoint = out_dir.join(checkpoint);
        let raw = raw.unwrap_or_default();
        let unknowns = match raw.unknowns.as_deref() {
            None => Unknowns::Slowness,
            Some(u) => u
                .parse()
                .map_err(|e: String| bad(format!("[model] unknowns: {e}")))?,
        };
        let reference =
            Reference::from_raw(raw.reference.as_ref(), raw.reference_profile.as_deref())
                .map_err(|e| bad(format!("[model] {e}")))?;
        if unknowns == Unknowns::SlownessPerturbation && reference == Reference::Mean {
            return Err(bad(
                "[model] unknowns = \"slowness_perturbation\" needs reference (a velocity) or reference_profile".into(),
            ));
        }
        if raw.grid.is_some() && raw.cells.is_some() {
            return Err(bad("[model] give grid or cells, not both".into()));
        }
        if let Some(g) = &raw.grid {
            if g.n.contains(&0) || g.spacing.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
                return Err(bad(
                    "[model] grid: n must be >= 1 and spacing > 0 on every axis".into(),
                ));
            }
        }
        if matches!(reference, Reference::Profile(_)) && raw.grid.is_none() {
            return Err(bad(
                "[model] reference_profile needs a grid (its depth axis is axis 2)".into(),
            ));
        }
        let cells = match &raw.cells {
            None => None,
            Some(p) => Some((
                existing("[model] cells", p)?,
                raw.cell_columns.clone().unwrap_or_else(|| {
                    ["lat_min", "lat_max", "lon_min", "lon_max"]
                        .map(String::from)
                        .to_vec()
                }),
                raw.cell_units.clone().unwrap_or_else(|| "degrees".into()),
            )),
        };
        let true_model = raw
            .true_model
            .as_deref()
            .map(|p| existing("[model] true_model", p))
            .transpose()?;
        Ok(ModelOutput {
            config: config.to_path_buf(),
            path,
            checkpoint_every,
            checkpoint,
            unknowns,
            slowness_unit: raw.slowness_unit.unwrap_or_else(|| "s/km".into()),
            reference,
            grid: raw.grid,
            cells,
            true_model,
        })
    }

    /// The files the `[model]` table reads (cell table, true model), for the input/output
    /// clash check (src/io/outpaths.rs).
    pub fn input_files(&self) -> Vec<(&'static str, &Path)> {
        let mut v = Vec::new();
        if let Some((p, ..)) = &self.cells {
            v.push(("[model] cells", p.as_path()));
        }
        if let Some(p) = &self.true_model {
            v.push(("[model] true_model", p.as_path()));
        }
        v
    }

    /// Read the files the `[model]` table names and build the spec for `n` unknowns.
    pub fn spec(&self, n: usize) -> Result<ModelSpec> {
        let param = if let Some(g) = &self.grid {
            Parameterisation::Grid(g.clone())
        } else if let Some((p, cols, units)) = &self.cells {
            Parameterisation::Cells(read_cell_table(p, cols.clone(), units)?)
        } else {
            Parameterisation::Vector
        };
        let true_model = match &self.true_model {
            Some(p) => Some(crate::io::mtx::read_vector(p)?),
            None => None,
        };
        let spec = ModelSpec {
            param,
            unknowns: self.unknowns,
            slowness_unit: self.slowness_unit.clone(),
            reference: self.reference.clone(),
            true_model,
        };
        spec.check_from(n, &self.sources())?;
        Ok(spec)
    }

    /// Where the `[model]` table's parts come from: the config (grid), the cell table and the
    /// true model's file.
    pub fn sources(&self) -> SpecSources<'_> {
        SpecSources {
            grid: Some(&self.config),
            cells: self.cells.as_ref().map(|c| c.0.as_path()),
            true_model: self.true_model.as_deref(),
        }
    }
}

/// Read a cell table: one line per cell with `columns.len()` numbers; '#' starts a comment.
pub fn read_cell_table(path: &Path, columns: Vec<String>, units: &str) -> Result<CellTable> {
    let mut rows = Vec::new();
    let r = open_text(path)?;
    for (i, line) in std::io::BufRead::lines(r).enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        let t = line.split('#').next().unwrap_or("").trim();
        if t.is_empty() {
            continue;
        }
        let vals: Vec<f64> = t
            .split_whitespace()
            .map(|w| w.parse::<f64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::parse(path, i + 1, format!("not a number: {e}")))?;
        if vals.len() != columns.len() {
            return Err(Error::parse(
                path,
                i + 1,
                format!(
                    "{} values, expected {} ({})",
                    vals.len(),
                    columns.len(),
                    columns.join(" ")
                ),
            ));
        }
        if vals.iter().any(|v| !v.is_finite()) {
            return Err(Error::parse(path, i + 1, "value is not finite"));
        }
        rows.push(vals);
    }
    Ok(CellTable {
        columns,
        units: units.to_string(),
        rows,
    })
}
