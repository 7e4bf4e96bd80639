//! `seistomo plot MODEL.h5`: PNG quicklooks of a model file.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

use crate::model::hdf5::ModelFile;
use crate::model::plot::{plot_model, View};

#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Model file written by `invert` (model.h5).
    model: PathBuf,
    /// Map at this depth (grid models: the layer containing it).
    #[arg(long, allow_negative_numbers = true)]
    depth: Option<f64>,
    /// Vertical section: x=VALUE or y=VALUE (grid models).
    #[arg(long)]
    section: Option<String>,
    /// Convergence plot (r1norm and arnorm against iteration).
    #[arg(long)]
    convergence: bool,
    /// Field of /model to draw (velocity, perturbation, slowness, hit_count, dws, ...).
    /// Default: perturbation.
    #[arg(long, default_value = "perturbation")]
    field: String,
    /// Put the true model beside the recovered one (synthetic runs).
    #[arg(long)]
    compare_true: bool,
    /// Output PNG.
    #[arg(short = 'o', long, default_value = "model.png")]
    output: PathBuf,
}

pub fn run(a: PlotArgs) -> anyhow::Result<()> {
    let mut paths = crate::io::outpaths::PathCheck::new();
    paths.input("model", &a.model).output("-o", &a.output);
    paths.check()?;
    let mf = ModelFile::open(&a.model)?;
    let view = if a.convergence {
        View::Convergence
    } else if let Some(s) = &a.section {
        let (axis, v) = s
            .split_once('=')
            .with_context(|| format!("--section '{s}': expected x=VALUE or y=VALUE"))?;
        let axis = match axis.trim() {
            "x" => 0,
            "y" => 1,
            other => bail!("--section '{s}': axis '{other}' is not x or y"),
        };
        let at: f64 = v
            .trim()
            .parse()
            .with_context(|| format!("--section '{s}': '{v}' is not a number"))?;
        View::Section { axis, at }
    } else {
        View::Map { depth: a.depth }
    };
    plot_model(&mf, &view, &a.field, a.compare_true, &a.output)?;
    eprintln!("wrote {}", a.output.display());
    Ok(())
}
