//! PNG quicklooks with plotters (bitmap backend, an embedded DejaVu Sans font through ab_glyph:
//! no system fonts, no Python). Map slices at a depth, vertical sections, cell maps, true vs
//! recovered panels, convergence and L-curve plots. Perturbations use a diverging red-white-blue
//! scale centred on zero (red = slow, blue = fast, the seismological habit).

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::error::{Error, Result};
use crate::grid::Grid;
use crate::model::hdf5::ModelFile;
use crate::solver::IterRecord;

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            // The embedded font is valid; a failure would only lose the labels.
            let _ = plotters::style::register_font("sans-serif", style, FONT);
        }
    });
}

fn perr(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::format(path, format!("plot: {e}"))
}

/// Draw into a temporary PNG beside `path` and rename it into place.
fn with_png<F>(path: &Path, size: (u32, u32), draw: F) -> Result<()>
where
    F: FnOnce(&DrawingArea<BitMapBackend, Shift>) -> Result<()>,
{
    register_font();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp: PathBuf = path.with_file_name(format!(".{stem}.tmp{}.png", std::process::id()));
    let r = (|| {
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| perr(path, e))?;
        draw(&root)?;
        root.present().map_err(|e| perr(path, e))
    })();
    crate::io::replace_with_temp(&tmp, path, r)
}

/// A colour scale.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub lo: f64,
    pub hi: f64,
    pub diverging: bool,
}

const RDBU: [(u8, u8, u8); 7] = [
    (178, 24, 43),
    (239, 138, 98),
    (253, 219, 199),
    (247, 247, 247),
    (209, 229, 240),
    (103, 169, 207),
    (33, 102, 172),
];
const VIRIDIS: [(u8, u8, u8); 6] = [
    (68, 1, 84),
    (65, 68, 135),
    (42, 120, 142),
    (34, 168, 132),
    (122, 209, 81),
    (253, 231, 37),
];

fn ramp(stops: &[(u8, u8, u8)], t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0) * (stops.len() - 1) as f64;
    let i = (t.floor() as usize).min(stops.len() - 2);
    let f = t - i as f64;
    let (a, b) = (stops[i], stops[i + 1]);
    let mix = |x: u8, y: u8| (x as f64 + (y as f64 - x as f64) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

impl Scale {
    /// A scale for `values`: diverging and symmetric about 0, or sequential over the range
    /// (2nd to 98th percentile, so a few extreme cells do not wash out the picture).
    pub fn for_values(values: &[f64], diverging: bool) -> Scale {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Scale {
                lo: -1.0,
                hi: 1.0,
                diverging,
            };
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        if diverging {
            let m = q(0.02).abs().max(q(0.98).abs());
            let m = if m > 0.0 { m } else { 1.0 };
            Scale {
                lo: -m,
                hi: m,
                diverging,
            }
        } else {
            let (lo, hi) = (q(0.02), q(0.98));
            let (lo, hi) = if hi > lo {
                (lo, hi)
            } else {
                (lo - 0.5, lo + 0.5)
            };
            Scale { lo, hi, diverging }
        }
    }
    pub fn color(&self, v: f64) -> RGBColor {
        if !v.is_finite() {
            return RGBColor(160, 160, 160);
        }
        let t = (v - self.lo) / (self.hi - self.lo);
        if self.diverging {
            ramp(&RDBU, t)
        } else {
            ramp(&VIRIDIS, t)
        }
    }
}

/// A coloured rectangle of a map or section.
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    pub x0: f64,
    pub x1: f64,
    pub y0: f64,
    pub y1: f64,
    pub value: f64,
}

/// One panel of a heat map.
pub struct Panel<'a> {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub cells: &'a [Cell],
    /// Plot y downwards (depth sections).
    pub y_down: bool,
    /// Pixels per unit of x over pixels per unit of y: 1 draws to scale, cos(latitude) for
    /// longitude against latitude, 1/E for a section with vertical exaggeration E.
    pub aspect: f64,
}

/// Largest plotting area of one panel (pixels) and the room around it (axis labels, margins,
/// title), used to size a panel to its data.
const PANEL_MAX: (f64, f64) = (560.0, 500.0);
const PANEL_PAD: (u32, u32) = (84, 100);

/// The data extent of a panel: (x0, x1, y0, y1).
fn extent(cells: &[Cell]) -> (f64, f64, f64, f64) {
    let lo = |f: fn(&Cell) -> f64| cells.iter().map(f).fold(f64::NAN, f64::min);
    let hi = |f: fn(&Cell) -> f64| cells.iter().map(f).fold(f64::NAN, f64::max);
    (lo(|c| c.x0), hi(|c| c.x1), lo(|c| c.y0), hi(|c| c.y1))
}

/// Pixel size of a panel drawing `p` to scale within `PANEL_MAX` (at least 120 px a side).
fn panel_pixels(p: &Panel) -> (u32, u32) {
    let (xa, xb, ya, yb) = extent(p.cells);
    let (dx, dy) = (xb - xa, yb - ya);
    if !(dx > 0.0 && dy > 0.0 && p.aspect > 0.0) {
        return (
            PANEL_MAX.0 as u32 + PANEL_PAD.0,
            PANEL_MAX.1 as u32 + PANEL_PAD.1,
        );
    }
    let py = (PANEL_MAX.1 / dy).min(PANEL_MAX.0 / (p.aspect * dx));
    let (w, h) = (p.aspect * py * dx, py * dy);
    (
        w.max(120.0).round() as u32 + PANEL_PAD.0,
        h.max(120.0).round() as u32 + PANEL_PAD.1,
    )
}

/// Widen the x or the y range about its centre so that the plotting area of `pw` x `ph`
/// pixels shows both axes at the panel's scale.
pub fn fit_ranges(
    (xa, xb): (f64, f64),
    (ya, yb): (f64, f64),
    (pw, ph): (f64, f64),
    aspect: f64,
) -> ((f64, f64), (f64, f64)) {
    let (dx, dy) = (xb - xa, yb - ya);
    if !(dx > 0.0 && dy > 0.0 && pw > 0.0 && ph > 0.0 && aspect > 0.0) {
        return ((xa, xb), (ya, yb));
    }
    // x pixels per unit must be `aspect` times y pixels per unit.
    let want_dx = pw * dy / (aspect * ph);
    if want_dx > dx {
        let pad = 0.5 * (want_dx - dx);
        ((xa - pad, xb + pad), (ya, yb))
    } else {
        let want_dy = aspect * ph * dx / pw;
        let pad = 0.5 * (want_dy - dy);
        ((xa, xb), (ya - pad, yb + pad))
    }
}

fn draw_panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    path: &Path,
    p: &Panel,
    scale: &Scale,
) -> Result<()> {
    let e = |x: &dyn std::fmt::Display| perr(path, x);
    let (xa, xb, ya, yb) = extent(p.cells);
    if !(xa < xb && ya < yb) {
        return Err(perr(path, "nothing to draw (empty slice)"));
    }
    let sgn = if p.y_down { -1.0 } else { 1.0 };
    let (yl, yh) = if p.y_down { (-yb, -ya) } else { (ya, yb) };
    let builder = || {
        let mut b = ChartBuilder::on(area);
        b.caption(&p.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60);
        b
    };
    // Build once to learn the plotting area's pixels, then again with the ranges widened so
    // that both axes are drawn at the panel's scale (the caption is drawn the same twice).
    let probe = builder()
        .build_cartesian_2d(xa..xb, yl..yh)
        .map_err(|x| e(&x))?;
    let (pw, ph) = probe.plotting_area().dim_in_pixel();
    let ((xa, xb), (yl, yh)) = fit_ranges((xa, xb), (yl, yh), (pw as f64, ph as f64), p.aspect);
    let mut chart = builder()
        .build_cartesian_2d(xa..xb, yl..yh)
        .map_err(|x| e(&x))?;
    let yfmt = move |v: &f64| {
        let y = sgn * v;
        format!("{}", if y == 0.0 { 0.0 } else { y })
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .y_label_formatter(&yfmt)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|x| e(&x))?;
    chart
        .draw_series(p.cells.iter().map(|c| {
            Rectangle::new(
                [(c.x0, sgn * c.y0), (c.x1, sgn * c.y1)],
                scale.color(c.value).filled(),
            )
        }))
        .map_err(|x| e(&x))?;
    Ok(())
}

fn draw_colorbar(
    area: &DrawingArea<BitMapBackend, Shift>,
    path: &Path,
    scale: &Scale,
    label: &str,
) -> Result<()> {
    let e = |x: &dyn std::fmt::Display| perr(path, x);
    let span = scale.hi - scale.lo;
    let mut chart = ChartBuilder::on(area)
        .margin_top(40)
        .margin_bottom(52)
        .margin_right(8)
        .y_label_area_size(62)
        .caption(label, ("sans-serif", 13))
        .build_cartesian_2d(0.0..1.0, scale.lo..scale.hi)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_labels(7)
        .y_label_formatter(&|v| tick(*v, span))
        .label_style(("sans-serif", 12))
        .draw()
        .map_err(|x| e(&x))?;
    let k = 200;
    let step = (scale.hi - scale.lo) / k as f64;
    chart
        .draw_series((0..k).map(|i| {
            let v0 = scale.lo + i as f64 * step;
            Rectangle::new(
                [(0.0, v0), (1.0, v0 + step)],
                scale.color(v0 + 0.5 * step).filled(),
            )
        }))
        .map_err(|x| e(&x))?;
    Ok(())
}

/// A tick label with as many decimals as a range of `span` needs.
pub fn tick(v: f64, span: f64) -> String {
    if !(1e-3..1e6).contains(&span) {
        return format!("{v:.2e}");
    }
    let decimals = (2.0 - span.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{v:.decimals$}")
}

/// Heat-map panels side by side sharing one colour scale, with a colour bar. Each panel is
/// sized to its data (equal distance per pixel on both axes, or the panel's `aspect`).
pub fn heatmap_png(path: &Path, panels: &[Panel], scale: &Scale, bar_label: &str) -> Result<()> {
    let (pw, ph) = panels
        .iter()
        .map(panel_pixels)
        .fold((0, 0), |(w, h), (a, b)| (w.max(a), h.max(b)));
    let n = panels.len().max(1) as u32;
    let w = pw * n + 110;
    let h = ph.max(340);
    with_png(path, (w, h), |root| {
        let (left, bar) = root.split_horizontally(w - 110);
        let (top, _) = left.split_vertically(ph);
        let areas = top.split_evenly((1, n as usize));
        for (a, p) in areas.iter().zip(panels) {
            draw_panel(a, path, p, scale)?;
        }
        draw_colorbar(&bar, path, scale, bar_label)
    })
}

/// The cells of depth layer `k` of a grid model `v` (map view).
fn layer_cells(g: &Grid, v: &[f64], k: usize) -> Vec<Cell> {
    let edge = |a: usize, i: usize| g.origin[a] + i as f64 * g.spacing[a];
    let mut cells = Vec::with_capacity(g.n[0] * g.n[1]);
    for j in 0..g.n[1] {
        for i in 0..g.n[0] {
            cells.push(Cell {
                x0: edge(0, i),
                x1: edge(0, i + 1),
                y0: edge(1, j),
                y1: edge(1, j + 1),
                value: v[g.index(i, j, k)],
            });
        }
    }
    cells
}

/// A resolution test side by side: its true and its recovered model at depth layer `k`, one
/// colour scale (diverging, symmetric about 0).
pub fn resolution_png(
    path: &Path,
    g: &Grid,
    name: &str,
    (truth, recovered): (&[f64], &[f64]),
    k: usize,
) -> Result<()> {
    let depth = g.origin[2] + (k as f64 + 0.5) * g.spacing[2];
    let at = format!(" ({} = {:.4} {}, layer {k})", g.axes[2], depth, g.units);
    let (t, r) = (layer_cells(g, truth, k), layer_cells(g, recovered, k));
    let all: Vec<f64> = t.iter().chain(&r).map(|c| c.value).collect();
    let scale = Scale::for_values(&all, true);
    let panel = |title: String, cells| Panel {
        title,
        x_label: format!("{} ({})", g.axes[0], g.units),
        y_label: format!("{} ({})", g.axes[1], g.units),
        cells,
        y_down: false,
        aspect: 1.0,
    };
    let panels = [
        panel(format!("{name}: true{at}"), &t[..]),
        panel(format!("{name}: recovered"), &r[..]),
    ];
    heatmap_png(path, &panels, &scale, "model (as x)")
}

/// Log-scale convergence plot: r1norm and arnorm (relative to their first values) against
/// iteration.
pub fn convergence_png(path: &Path, h: &[IterRecord], title: &str) -> Result<()> {
    let e = |x: &dyn std::fmt::Display| perr(path, x);
    if h.is_empty() {
        return Err(perr(path, "no convergence history"));
    }
    let rel = |f: fn(&IterRecord) -> f64| -> Vec<(f64, f64)> {
        let v0 = f(&h[0]).abs();
        let v0 = if v0 > 0.0 { v0 } else { 1.0 };
        h.iter()
            .map(|r| (r.itn as f64, (f(r).abs() / v0).max(1e-300)))
            .collect()
    };
    let r1 = rel(|r| r.r1norm);
    let ar = rel(|r| r.arnorm);
    let lo = r1
        .iter()
        .chain(&ar)
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min);
    let hi = r1.iter().chain(&ar).map(|p| p.1).fold(0.0, f64::max);
    let (lo, hi) = (lo.max(1e-300) * 0.5, hi.max(lo) * 2.0);
    let xmax = (h[h.len() - 1].itn as f64).max(1.0);
    with_png(path, (820, 520), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 18))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..xmax, (lo..hi).log_scale())
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("iteration")
            .y_desc("relative to iteration 0")
            .y_label_formatter(&|v| format!("{v:.0e}"))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|x| e(&x))?;
        chart
            .draw_series(LineSeries::new(r1, BLUE.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label("r1norm = ||b - Ax||")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(ar, RED.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label("arnorm = ||A^T r||")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|x| e(&x))?;
        Ok(())
    })
}

/// L-curve plot (log-log ||r|| against ||L m||), labelled points, the corner marked.
pub fn lcurve_png(
    path: &Path,
    points: &[(f64, f64, f64)],
    corner: Option<usize>,
    l_label: &str,
) -> Result<()> {
    let e = |x: &dyn std::fmt::Display| perr(path, x);
    let pos: Vec<(f64, f64, f64)> = points
        .iter()
        .copied()
        .filter(|p| p.1 > 0.0 && p.2 > 0.0 && p.1.is_finite() && p.2.is_finite())
        .collect();
    if pos.is_empty() {
        return Err(perr(path, "no positive norms to plot"));
    }
    let span = |f: fn(&(f64, f64, f64)) -> f64| {
        let lo = pos.iter().map(f).fold(f64::INFINITY, f64::min);
        let hi = pos.iter().map(f).fold(0.0, f64::max);
        (lo / 1.5, hi * 1.5)
    };
    let (x0, x1) = span(|p| p.1);
    let (y0, y1) = span(|p| p.2);
    with_png(path, (820, 620), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("L-curve", ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(80)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("data residual ||G m - d||")
            .y_desc(l_label)
            .x_label_formatter(&|v| format!("{v:.2e}"))
            .y_label_formatter(&|v| format!("{v:.2e}"))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(|x| e(&x))?;
        chart
            .draw_series(LineSeries::new(
                pos.iter().map(|p| (p.1, p.2)),
                BLUE.stroke_width(2),
            ))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(pos.iter().map(|p| {
                EmptyElement::at((p.1, p.2))
                    + Circle::new((0, 0), 4, BLUE.filled())
                    + Text::new(
                        format!("{:.2e}", p.0),
                        (8, -2),
                        ("sans-serif", 12).into_font(),
                    )
            }))
            .map_err(|x| e(&x))?;
        if let Some(c) = corner.and_then(|c| points.get(c)) {
            if c.1 > 0.0 && c.2 > 0.0 {
                chart
                    .draw_series([Circle::new((c.1, c.2), 10, RED.stroke_width(3))])
                    .map_err(|x| e(&x))?
                    .label(format!("corner: weight {:.4e}", c.0))
                    .legend(|(x, y)| Circle::new((x + 8, y), 6, RED.stroke_width(3)));
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperRight)
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .label_font(("sans-serif", 14))
                    .draw()
                    .map_err(|x| e(&x))?;
            }
        }
        Ok(())
    })
}

/// What `seistomo plot` draws.
#[derive(Debug, Clone)]
pub enum View {
    /// Map at the grid layer containing this depth (grid models) or the cell map (cell models).
    Map {
        depth: Option<f64>,
    },
    /// Vertical section at x = value (axis 0) or y = value (axis 1).
    Section {
        axis: usize,
        at: f64,
    },
    Convergence,
}

fn is_diverging(field: &str) -> bool {
    field.contains("perturbation")
}

fn field_label(mf: &ModelFile, field: &str) -> String {
    match field {
        "perturbation" | "true_perturbation" => "dv/v (%)".into(),
        "velocity" | "true_velocity" | "reference_velocity" => format!("v ({})", mf.velocity_unit),
        _ => field.to_string(),
    }
}

/// How `seistomo plot` draws beyond the view.
#[derive(Debug, Clone)]
pub struct PlotStyle {
    /// Vertical exaggeration of sections (1: to scale).
    pub exaggeration: f64,
}

impl Default for PlotStyle {
    fn default() -> Self {
        PlotStyle { exaggeration: 1.0 }
    }
}

/// Draw a view of a model file to scale. `compare_true` puts the true model beside the
/// recovered one (synthetic runs).
pub fn plot_model(
    mf: &ModelFile,
    view: &View,
    field: &str,
    compare_true: bool,
    out: &Path,
) -> Result<()> {
    plot_model_with(mf, view, field, compare_true, out, &PlotStyle::default())
}

/// `plot_model` with a style (section exaggeration).
pub fn plot_model_with(
    mf: &ModelFile,
    view: &View,
    field: &str,
    compare_true: bool,
    out: &Path,
    style: &PlotStyle,
) -> Result<()> {
    if let View::Convergence = view {
        let title = format!(
            "LSQR convergence: istop {} after {} iterations",
            mf.istop,
            mf.history.last().map(|r| r.itn).unwrap_or(0)
        );
        return convergence_png(out, &mf.history, &title);
    }
    let mut names = vec![field.to_string()];
    if compare_true {
        let t = if field.starts_with("true_") {
            field.to_string()
        } else {
            format!("true_{field}")
        };
        if !mf.has_field(&t) {
            let synthetic = mf.has_field("true_solution") || mf.has_field("true_velocity");
            let msg = if synthetic {
                format!(
                    "--compare-true: a synthetic run, but there is no /model/{t} (the true model has velocity, perturbation and solution only)"
                )
            } else {
                format!("--compare-true: no /model/{t}: not a synthetic run")
            };
            return Err(Error::format(&mf.path, msg));
        }
        names.insert(0, t);
    }
    let mut layers: Vec<(String, Vec<Cell>)> = Vec::new();
    for name in &names {
        if !mf.has_field(name) {
            return Err(Error::format(&mf.path, format!("no field /model/{name}")));
        }
        let (v, _) = mf.field(name)?;
        let (cells, where_) = cells_of(mf, &v, view)?;
        layers.push((format!("{name}{where_}"), cells));
    }
    let all: Vec<f64> = layers
        .iter()
        .flat_map(|l| l.1.iter().map(|c| c.value))
        .collect();
    let scale = Scale::for_values(&all, is_diverging(field));
    let (xl, yl, down) = axis_labels(mf, view);
    let aspect = panel_aspect(
        mf,
        view,
        layers.first().map(|l| &l.1[..]).unwrap_or(&[]),
        style,
    );
    let ve = match view {
        View::Section { .. } if style.exaggeration != 1.0 => {
            format!(" (vertical exaggeration {}x)", style.exaggeration)
        }
        _ => String::new(),
    };
    let panels: Vec<Panel> = layers
        .iter()
        .map(|(t, c)| Panel {
            title: format!("{t}{ve}"),
            x_label: xl.clone(),
            y_label: yl.clone(),
            cells: c,
            y_down: down,
            aspect,
        })
        .collect();
    heatmap_png(out, &panels, &scale, &field_label(mf, field))
}

/// Whether a grid's axes are in degrees (longitude, latitude).
fn degrees(units: &str) -> bool {
    let u = units.trim().to_ascii_lowercase();
    u.starts_with("deg") || u == "°"
}

/// Pixels per unit of x over pixels per unit of y for a view: maps in degrees of longitude
/// and latitude are narrowed by cos(mid latitude) (equal distance per pixel at the middle of
/// the map); sections are stretched vertically by the exaggeration.
fn panel_aspect(mf: &ModelFile, view: &View, cells: &[Cell], style: &PlotStyle) -> f64 {
    let geographic = match &mf.grid {
        Some(g) => degrees(&g.units),
        None => mf.cell_columns.iter().any(|c| c.starts_with("lon")),
    };
    match view {
        View::Section { axis, .. } => {
            // A section along longitude (x = const cuts along y = latitude) keeps latitude
            // degrees; one along latitude has longitude degrees, narrowed by cos(latitude).
            let k = if geographic && *axis == 1 {
                mf.grid
                    .as_ref()
                    .map(|g| {
                        let mid = g.origin[1] + 0.5 * g.n[1] as f64 * g.spacing[1];
                        mid.to_radians().cos().abs().max(0.05)
                    })
                    .unwrap_or(1.0)
            } else {
                1.0
            };
            k / style.exaggeration
        }
        _ if geographic && !cells.is_empty() => {
            let (_, _, ya, yb) = extent(cells);
            (0.5 * (ya + yb)).to_radians().cos().abs().max(0.05)
        }
        _ => 1.0,
    }
}

fn axis_labels(mf: &ModelFile, view: &View) -> (String, String, bool) {
    if let Some(g) = &mf.grid {
        let lab = |a: usize| format!("{} ({})", g.axes[a], g.units);
        match view {
            View::Section { axis, .. } => (lab(1 - axis), lab(2), true),
            _ => (lab(0), lab(1), false),
        }
    } else {
        let lon = mf.cell_columns.iter().any(|c| c.starts_with("lon"));
        if lon {
            ("longitude (deg)".into(), "latitude (deg)".into(), false)
        } else {
            ("column 2-3".into(), "column 0-1".into(), false)
        }
    }
}

/// The rectangles of a view and a title suffix.
fn cells_of(mf: &ModelFile, v: &[f64], view: &View) -> Result<(Vec<Cell>, String)> {
    if let Some(g) = &mf.grid {
        let nz = g.n[2];
        let edge = |a: usize, i: usize| g.origin[a] + i as f64 * g.spacing[a];
        let layer = |a: usize, at: f64| -> Result<usize> {
            let k = ((at - g.origin[a]) / g.spacing[a]).floor();
            if k < 0.0 || k >= g.n[a] as f64 {
                return Err(Error::Invalid(format!(
                    "{} = {at} is outside the grid ({} to {} {})",
                    g.axes[a],
                    g.origin[a],
                    edge(a, g.n[a]),
                    g.units
                )));
            }
            Ok(k as usize)
        };
        match view {
            View::Map { depth } => {
                let d = depth.ok_or_else(|| {
                    Error::Invalid(
                        "a grid model needs --depth (or --section, --convergence)".into(),
                    )
                })?;
                let k = layer(2, d)?;
                let cells = layer_cells(g, v, k);
                let suffix = format!(
                    ", {} {} to {} {}",
                    g.axes[2],
                    edge(2, k),
                    edge(2, k + 1),
                    g.units
                );
                Ok((cells, suffix))
            }
            View::Section { axis, at } => {
                let (axis, other) = if *axis == 0 { (0, 1) } else { (1, 0) };
                let s = layer(axis, *at)?;
                let mut cells = Vec::new();
                for k in 0..nz {
                    for t in 0..g.n[other] {
                        let idx = if axis == 0 {
                            g.index(s, t, k)
                        } else {
                            g.index(t, s, k)
                        };
                        cells.push(Cell {
                            x0: edge(other, t),
                            x1: edge(other, t + 1),
                            y0: edge(2, k),
                            y1: edge(2, k + 1),
                            value: v[idx],
                        });
                    }
                }
                Ok((
                    cells,
                    format!(", section {} = {at} {}", g.axes[axis], g.units),
                ))
            }
            View::Convergence => Ok((Vec::new(), String::new())),
        }
    } else if !mf.cells.is_empty() {
        if let View::Section { .. } = view {
            return Err(Error::Invalid(
                "a cell model has no vertical sections".into(),
            ));
        }
        // Columns lat_min lat_max lon_min lon_max (or the first four in that order).
        let col = |name: &str, dflt: usize| {
            mf.cell_columns
                .iter()
                .position(|c| c == name)
                .unwrap_or(dflt)
        };
        let (a0, a1, b0, b1) = (
            col("lon_min", 2),
            col("lon_max", 3),
            col("lat_min", 0),
            col("lat_max", 1),
        );
        if mf.cells.iter().any(|r| r.len() < 4) {
            return Err(Error::format(
                &mf.path,
                "the cell table needs 4 columns to draw a map",
            ));
        }
        let cells = mf
            .cells
            .iter()
            .zip(v)
            .map(|(r, &value)| Cell {
                x0: r[a0],
                x1: r[a1],
                y0: r[b0],
                y1: r[b1],
                value,
            })
            .collect();
        Ok((cells, String::new()))
    } else {
        Err(Error::format(
            &mf.path,
            "the model has no grid or cell table: only --convergence can be drawn",
        ))
    }
}

/// One panel of a bar chart: a title and (label, value, is_seistomo) bars.
pub struct BarPanel {
    pub title: String,
    pub bars: Vec<(String, f64, bool)>,
}

/// Horizontal bar charts side by side (ms/iteration of several solvers per system); seistomo's
/// bars in blue, peers' in grey, each value printed at its bar.
pub fn bars_png(path: &Path, panels: &[BarPanel], xlabel: &str) -> Result<()> {
    let e = |x: &dyn std::fmt::Display| perr(path, x);
    if panels.is_empty() || panels.iter().any(|p| p.bars.is_empty()) {
        return Err(perr(path, "nothing to draw"));
    }
    let cols = panels.len().min(2);
    let rows = panels.len().div_ceil(cols);
    with_png(path, (620 * cols as u32, 330 * rows as u32), |root| {
        for (area, p) in root.split_evenly((rows, cols)).iter().zip(panels) {
            let n = p.bars.len();
            let xmax = p.bars.iter().map(|b| b.1).fold(0.0, f64::max) * 1.9;
            let mut chart = ChartBuilder::on(area)
                .caption(&p.title, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(10)
                .build_cartesian_2d(0.0..xmax, 0.0..n as f64)
                .map_err(|x| e(&x))?;
            chart
                .configure_mesh()
                .disable_y_mesh()
                .x_desc(xlabel)
                .y_labels(0)
                .label_style(("sans-serif", 12))
                .draw()
                .map_err(|x| e(&x))?;
            for (i, (label, v, ours)) in p.bars.iter().enumerate() {
                let y0 = (n - 1 - i) as f64 + 0.15;
                let color = if *ours {
                    RGBColor(33, 102, 172)
                } else {
                    RGBColor(150, 150, 150)
                };
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0, y0), (*v, y0 + 0.7)],
                        color.filled(),
                    )))
                    .map_err(|x| e(&x))?;
                chart
                    .draw_series(std::iter::once(Text::new(
                        format!("{label}: {v:.3}"),
                        (*v + xmax * 0.01, y0 + 0.5),
                        ("sans-serif", 12),
                    )))
                    .map_err(|x| e(&x))?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diverging_scale_is_symmetric_and_white_at_zero() {
        let s = Scale::for_values(&[-1.0, 0.5, 3.0], true);
        assert_eq!(s.lo, -s.hi);
        assert_eq!(s.color(0.0), RGBColor(247, 247, 247));
        // Negative (slow) is red, positive (fast) is blue.
        let neg = s.color(s.lo);
        let pos = s.color(s.hi);
        assert!(neg.0 > neg.2 && pos.2 > pos.0);
        assert_eq!(s.color(f64::NAN), RGBColor(160, 160, 160));
    }

    #[test]
    fn ranges_are_widened_to_equal_distance_per_pixel() {
        // 24 x 8 km in a 600 x 600 px area: y widened to 24 km, centred.
        let ((x0, x1), (y0, y1)) = fit_ranges((0.0, 24.0), (0.0, 8.0), (600.0, 600.0), 1.0);
        assert_eq!((x0, x1), (0.0, 24.0));
        assert!((y0 + 8.0).abs() < 1e-12 && (y1 - 16.0).abs() < 1e-12);
        // Pixels per unit x = aspect * pixels per unit y.
        for aspect in [0.5, 0.8, 2.0] {
            let ((x0, x1), (y0, y1)) = fit_ranges((0.0, 10.0), (0.0, 10.0), (400.0, 300.0), aspect);
            let (px, py) = (400.0 / (x1 - x0), 300.0 / (y1 - y0));
            assert!((px / py - aspect).abs() < 1e-12, "{aspect}");
            assert!(x1 - x0 >= 10.0 && y1 - y0 >= 10.0);
        }
    }

    #[test]
    fn tick_labels_fit_the_range() {
        assert_eq!(tick(3300.0, 450.0), "3300");
        assert_eq!(tick(5.0, 10.0), "5.0");
        assert_eq!(tick(-2.5, 9.0), "-2.50");
        assert_eq!(tick(3.2e-4, 2e-5), "3.20e-4");
    }

    #[test]
    fn bar_chart_writes_a_png_and_rejects_nothing() {
        let dir = std::env::temp_dir().join(format!("seistomo-bars-{}", std::process::id()));
        let p = dir.join("bars.png");
        let panel = |t: &str| BarPanel {
            title: t.into(),
            bars: vec![("ours".into(), 1.0, true), ("peer".into(), 2.5, false)],
        };
        bars_png(&p, &[panel("a"), panel("b"), panel("c")], "ms").unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bars_png(&dir.join("none.png"), &[], "ms").is_err());
        assert!(!dir.join("none.png").exists());
    }
}
