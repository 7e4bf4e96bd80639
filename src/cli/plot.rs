//! `seistomo plot MODEL.h5`: PNG quicklooks of a model file, drawn to scale.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

use crate::model::hdf5::ModelFile;
use crate::model::plot::{plot_model_with, PlotStyle, View};

#[derive(Debug, Args)]
pub struct PlotArgs {
    /// Model file written by `invert` (model.h5).
    model: PathBuf,
    /// Map at this depth (grid models: the layer containing it).
    #[arg(long, allow_negative_numbers = true, conflicts_with_all = ["section", "convergence"])]
    depth: Option<f64>,
    /// Vertical section: x=VALUE or y=VALUE (grid models).
    #[arg(long, conflicts_with = "convergence")]
    section: Option<String>,
    /// Convergence plot (r1norm and arnorm against iteration).
    #[arg(long)]
    convergence: bool,
    /// Field of /model to draw (velocity, perturbation, slowness, hit_count, dws, ...).
    #[arg(long, default_value = "perturbation")]
    field: String,
    /// Put the true model beside the recovered one (synthetic runs; fields with a true_ twin:
    /// velocity, perturbation, solution).
    #[arg(long)]
    compare_true: bool,
    /// Resolution tests (`seistomo resolution`'s model.h5): each test's true and recovered
    /// model side by side, one PNG per test named after -o (OUT_TEST.png), at --depth or at the
    /// layer where the test's true model is strongest.
    #[arg(long, conflicts_with_all = ["section", "convergence", "compare_true"])]
    resolution: bool,
    /// Sections: vertical exaggeration (1: to scale, 2: depth drawn twice as tall as
    /// horizontal distance). Stated in the title when not 1.
    #[arg(long, default_value_t = 1.0)]
    exaggeration: f64,
    /// Output PNG (the name must end in .png).
    #[arg(short = 'o', long, alias = "output", default_value = "model.png")]
    out: PathBuf,
}

pub fn run(a: PlotArgs) -> anyhow::Result<()> {
    let mut paths = crate::io::outpaths::PathCheck::new();
    paths.input("model", &a.model).output("-o", &a.out);
    paths.check()?;
    let is_png = a
        .out
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !is_png {
        bail!(
            "-o {}: plot writes PNG files only; give a name ending in .png",
            a.out.display()
        );
    }
    if !(a.exaggeration.is_finite() && a.exaggeration > 0.0) {
        bail!("--exaggeration must be > 0 (got {})", a.exaggeration);
    }
    if let Some(d) = a.depth.filter(|d| !d.is_finite()) {
        bail!("--depth must be a finite number (got {d})");
    }
    let mf = ModelFile::open(&a.model)?;
    if a.resolution {
        return plot_resolution(&a, &mf);
    }
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
            .ok()
            .filter(|x: &f64| x.is_finite())
            .with_context(|| format!("--section '{s}': '{v}' is not a finite number"))?;
        View::Section { axis, at }
    } else {
        if a.depth.is_some() && mf.grid.is_none() {
            bail!(
                "{}: --depth: this is a {} model (one layer, no depths); leave --depth out",
                crate::io::tidy(&a.model).display(),
                mf.parameterisation
            );
        }
        View::Map { depth: a.depth }
    };
    if a.exaggeration != 1.0 && !matches!(view, View::Section { .. }) {
        bail!("--exaggeration applies to sections (--section) only");
    }
    let style = PlotStyle {
        exaggeration: a.exaggeration,
    };
    plot_model_with(&mf, &view, &a.field, a.compare_true, &a.out, &style)?;
    eprintln!("wrote {}", crate::io::tidy(&a.out).display());
    Ok(())
}

/// `--resolution`: one PNG per test of the file's /resolution group.
fn plot_resolution(a: &PlotArgs, mf: &ModelFile) -> anyhow::Result<()> {
    let tests = mf.resolution_tests()?;
    let shown = crate::io::tidy(&a.model);
    if tests.is_empty() {
        bail!(
            "{}: --resolution: the file has no /resolution group (seistomo resolution writes one)",
            shown.display()
        );
    }
    let Some(g) = &mf.grid else {
        bail!("{}: --resolution needs a grid model", shown.display());
    };
    let layer = match a.depth {
        None => None,
        Some(d) => {
            let k = ((d - g.origin[2]) / g.spacing[2]).floor();
            if !(k >= 0.0 && k < g.n[2] as f64) {
                bail!(
                    "--depth {d} is outside the grid ({} to {} {})",
                    g.origin[2],
                    g.origin[2] + g.n[2] as f64 * g.spacing[2],
                    g.units
                );
            }
            Some(k as usize)
        }
    };
    let stem = a.out.with_extension("");
    for (name, truth, recovered) in &tests {
        let k = layer.unwrap_or_else(|| crate::model::resolution::display_layer(g, truth));
        let out = PathBuf::from(format!("{}_{name}.png", stem.display()));
        crate::model::plot::resolution_png(&out, g, name, (truth, recovered), k)?;
        eprintln!("wrote {}", crate::io::tidy(&out).display());
    }
    Ok(())
}
