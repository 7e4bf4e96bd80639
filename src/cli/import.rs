//! `seistomo import`: a dataset from Matrix Market / text files.

use std::path::PathBuf;

use clap::Args;

use crate::grid::Grid;
use crate::io::dataset::binfmt::Precision;
use crate::io::dataset::manifest::Layout;
use crate::pipeline::config::ModelHints;
use crate::pipeline::import::{import, ImportJob};

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Kernel matrix G (Matrix Market, .gz allowed).
    #[arg(long)]
    matrix: PathBuf,
    /// Data vector d (Matrix Market array or text, one value per line). Default: b = G 1.
    #[arg(long)]
    rhs: Option<PathBuf>,
    /// Regularisation / damping matrix R (stored as damping blocks).
    #[arg(long)]
    reg: Option<PathBuf>,
    /// Weight λ of the damping rows: the system is [G; λ R] x = [d; 0].
    #[arg(long, default_value_t = 1.0, requires = "reg")]
    lambda: f64,
    /// Per-row data weights (one per kernel row).
    #[arg(long, conflicts_with = "sigma")]
    weights: Option<PathBuf>,
    /// Per-row data standard deviations (rows are divided by them).
    #[arg(long)]
    sigma: Option<PathBuf>,
    /// Model grid cells along x,y,z (optional; must match the columns): maps and sections of a
    /// 3-D grid, column i + nx*(j + ny*k).
    #[arg(long, value_parser = super::args::triple::<usize>, conflicts_with = "cells")]
    grid: Option<[usize; 3]>,
    /// With --grid: cell size along x,y,z (km).
    #[arg(long, default_value = "1,1,1", value_parser = super::args::triple::<f64>)]
    spacing: [f64; 3],
    /// With --grid: corner of cell (0,0,0) along x,y,z (km).
    #[arg(long, default_value = "0,0,0", value_parser = super::args::triple::<f64>)]
    origin: [f64; 3],
    /// Output dataset directory (must not exist or be empty).
    #[arg(short = 'o', long)]
    out: PathBuf,
    /// Kernel layout: many rows per pack file, or one file per row.
    #[arg(long, default_value = "packed", value_parser = super::args::pick::layout())]
    layout: Layout,
    /// Value precision of the kernel and damping files.
    #[arg(long, default_value = "f64", value_parser = super::args::pick::file_precision())]
    precision: Precision,
    /// Number of damping block files.
    #[arg(long, default_value_t = 4)]
    damping_blocks: usize,
    /// Target pack file size (MiB).
    #[arg(long, default_value_t = 64)]
    pack_mib: u64,
    /// Dataset name.
    #[arg(long)]
    name: Option<String>,
    /// Cell table for maps: one line per column, lat_min lat_max lon_min lon_max (degrees);
    /// named by the run config written beside the dataset.
    #[arg(long)]
    cells: Option<PathBuf>,
    /// What the columns are, for the model file: the slowness itself or a perturbation of a
    /// reference (then give --reference).
    #[arg(long, default_value = "slowness", value_parser = super::args::words(&["slowness", "slowness_perturbation"]))]
    unknowns: String,
    /// Unit of the unknowns (d per unit of G: travel times in s over lengths in km give s/km;
    /// path-averaged slowness in s/m gives s/m); velocities are written in its inverse.
    #[arg(long, default_value = "s/km")]
    slowness_unit: String,
    /// Reference velocity (in the inverse of --slowness-unit) or "mean" (the mean slowness;
    /// not with slowness_perturbation).
    #[arg(long, default_value = "mean")]
    reference: String,
}

pub fn run(a: ImportArgs) -> anyhow::Result<()> {
    let reference = match a.reference.as_str() {
        "mean" => None,
        v => match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Some(x),
            _ => anyhow::bail!("--reference '{v}': expected a velocity > 0 or \"mean\""),
        },
    };
    if a.unknowns == "slowness_perturbation" && reference.is_none() {
        anyhow::bail!("--unknowns slowness_perturbation needs --reference VELOCITY (the background the perturbations are relative to)");
    }
    if a.slowness_unit.trim().is_empty() {
        anyhow::bail!("--slowness-unit is empty (e.g. s/km)");
    }
    let job = ImportJob {
        matrix: &a.matrix,
        rhs: a.rhs.as_deref(),
        reg: a.reg.as_deref(),
        lambda: a.lambda,
        weights: a.weights.as_deref(),
        sigma: a.sigma.as_deref(),
        grid: a.grid.map(|n| Grid::new(n, a.origin, a.spacing)),
        out: &a.out,
        layout: a.layout,
        precision: a.precision,
        damping_blocks: a.damping_blocks,
        pack_bytes: a.pack_mib.max(1) << 20,
        name: a.name.clone(),
        cells: a.cells.as_deref(),
        model: ModelHints {
            unknowns: Some(a.unknowns.clone()),
            slowness_unit: Some(a.slowness_unit.trim().to_string()),
            reference,
            cells: None,
        },
    };
    let s = import(&job)?;
    eprintln!(
        "import: {} x {} kernel, {} nonzeros{}; written to {}",
        s.nrows,
        s.ncols,
        s.nnz,
        s.damping_rows
            .map(|r| format!(", {r} damping rows (lambda {})", a.lambda))
            .unwrap_or_default(),
        s.manifest.display()
    );
    eprintln!(
        "run config written to {} (edit it to change the solver, the outputs, units or maps)",
        s.run_config.display()
    );
    eprintln!(
        "next: seistomo invert {}",
        crate::io::tidy(&a.out).display()
    );
    Ok(())
}
