//! The L-curve: solve for a list of damping / regularisation weights, reusing the loaded data,
//! and choose one three ways: the corner of log ||G m - d|| against log ||L m|| by maximum
//! curvature, the minimum of generalised cross-validation (GCV) and the discrepancy principle.
//!
//! With a regularisation matrix R in the config the swept weight is the weight w of the rows
//! w R (L = R); without one it is LSQR's damping (L = I).

use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::report::Outcome;

/// How a weight is chosen from the tried ones (`[solver] weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightRule {
    /// The L-curve's corner (maximum curvature; one of the tried weights).
    Lcurve,
    /// The minimum of GCV(w) = m ||G m_w - d||^2 / (m - trace H_w)^2.
    Gcv,
    /// Where ||G m_w - d|| equals the noise norm tau sqrt(m) sigma.
    Discrepancy,
}

choice_from_str!(WeightRule, "weight rule", "lcurve" | "corner" => Self::Lcurve, "gcv" => Self::Gcv, "discrepancy" => Self::Discrepancy);

impl WeightRule {
    pub fn name(self) -> &'static str {
        match self {
            WeightRule::Lcurve => "lcurve",
            WeightRule::Gcv => "gcv",
            WeightRule::Discrepancy => "discrepancy",
        }
    }
}

/// Every rule's choice over the tried weights (report.json `weight_choice`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct WeightChoice {
    /// What the weights weigh: "reg_weight" (the rows w R) or "damp" (LSQR's damping).
    pub what: String,
    /// The rule that chose `weight` (`invert`); none in `lcurve`, which reports all three.
    pub rule: Option<WeightRule>,
    /// The weight the run used (`invert`).
    pub weight: Option<f64>,
    /// The L-curve's corner (a tried weight).
    pub corner: Option<f64>,
    /// GCV's minimum (refined by a parabola in log w through the smallest value and its
    /// neighbours).
    pub gcv: Option<f64>,
    /// The discrepancy principle's weight (interpolated in log space between tried weights).
    pub discrepancy: Option<f64>,
    /// tau sqrt(m) sigma, the residual norm the discrepancy principle aims at (none: no noise
    /// level given).
    pub noise_norm: Option<f64>,
    /// Random probes per weight of GCV's trace estimate (0: no GCV).
    pub gcv_probes: usize,
    /// The weights tried.
    pub tried: Vec<f64>,
}

/// One point of the L-curve.
pub struct LPoint {
    pub weight: f64,
    /// ||G m - d|| over the kernel rows.
    pub residual_norm: f64,
    /// ||L m||.
    pub model_norm: f64,
    /// Signed curvature of the log-log curve (NaN at the ends).
    pub curvature: f64,
    /// The estimate of trace(H_w), H_w the influence matrix of the data rows (NaN: no GCV).
    pub trace: f64,
    /// GCV(w) = m ||G m - d||^2 / (m - trace)^2 (NaN: no GCV).
    pub gcv: f64,
    pub outcome: Outcome,
}

/// GCV(w) = m r^2 / (m - t)^2 for `m` data, residual norm `r` and trace estimate `t` (NaN where
/// m - t <= 0 or t is unknown).
pub fn gcv_value(m: usize, r: f64, t: f64) -> f64 {
    let d = m as f64 - t;
    if t.is_finite() && d > 0.0 {
        m as f64 * r * r / (d * d)
    } else {
        f64::NAN
    }
}

/// The weight of minimum GCV among `(weight, gcv)` points with weight > 0: the smallest value,
/// refined where it has a neighbour on each side by the vertex of the parabola through the
/// three in (log w, log GCV) (kept within those neighbours). None without a finite value.
pub fn gcv_minimum(points: &[(f64, f64)]) -> Option<f64> {
    let mut p: Vec<(f64, f64, f64)> = points
        .iter()
        .filter(|(w, g)| *w > 0.0 && g.is_finite() && *g > 0.0)
        .map(|&(w, g)| (w, w.ln(), g.ln()))
        .collect();
    p.sort_by(|a, b| a.0.total_cmp(&b.0));
    let i = (0..p.len()).min_by(|&a, &b| p[a].2.total_cmp(&p[b].2))?;
    if i == 0 || i + 1 == p.len() {
        return Some(p[i].0);
    }
    let ((_, x0, y0), (w1, x1, y1), (_, x2, y2)) = (p[i - 1], p[i], p[i + 1]);
    // divided differences: y = y0 + d01 (x - x0) + a (x - x0)(x - x1)
    let d01 = (y1 - y0) / (x1 - x0);
    let d12 = (y2 - y1) / (x2 - x1);
    let a = (d12 - d01) / (x2 - x0);
    if a.is_nan() || a <= 0.0 {
        return Some(w1);
    }
    let v = 0.5 * (x0 + x1) - d01 / (2.0 * a);
    Some(v.clamp(x0, x2).exp())
}

/// The discrepancy principle: the weight where the residual norm equals `target`, interpolated
/// linearly in (log w, log ||r||) between the tried weights (w > 0) that bracket it; the largest
/// such weight where the residual crosses the target more than once. None where no two tried
/// weights bracket the target (all residuals above it: the noise level is too small for these
/// weights; all below: try larger weights).
pub fn discrepancy_weight(points: &[(f64, f64)], target: f64) -> Option<f64> {
    if !(target > 0.0 && target.is_finite()) {
        return None;
    }
    let mut p: Vec<(f64, f64)> = points
        .iter()
        .filter(|(w, r)| *w > 0.0 && *r > 0.0 && r.is_finite())
        .map(|&(w, r)| (w.ln(), r.ln()))
        .collect();
    p.sort_by(|a, b| a.0.total_cmp(&b.0));
    let t = target.ln();
    p.windows(2).rev().find_map(|q| {
        let ((x0, y0), (x1, y1)) = (q[0], q[1]);
        if (y0 - t) * (y1 - t) > 0.0 {
            return None;
        }
        if y1 == y0 {
            return Some(x1.exp());
        }
        Some((x0 + (t - y0) / (y1 - y0) * (x1 - x0)).exp())
    })
}

/// Parse "0.001,0.01,0.1".
pub fn parse_list(s: &str) -> Result<Vec<f64>> {
    let k = s.split(',').count();
    if k > MAX_POINTS {
        return Err(too_many("--damping", k));
    }
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| Error::Invalid(format!("--damping: '{t}' is not a number >= 0")))
        })
        .collect()
}

/// The most weights of one L-curve (each is a whole inversion).
pub const MAX_POINTS: usize = 1000;

fn too_many(what: &str, k: usize) -> Error {
    Error::Invalid(format!(
        "{what}: {k} weights, at most {MAX_POINTS} (each weight is a whole inversion)"
    ))
}

/// Parse "1e-3:1:9": `k` weights spaced evenly in log between `a` and `b`.
pub fn parse_log_range(s: &str) -> Result<Vec<f64>> {
    let bad = || {
        Error::Invalid(format!(
            "--log-range '{s}': expected FROM:TO:COUNT, e.g. 1e-3:1:9"
        ))
    };
    let p: Vec<&str> = s.split(':').collect();
    if p.len() != 3 {
        return Err(bad());
    }
    let a: f64 = p[0].trim().parse().map_err(|_| bad())?;
    let b: f64 = p[1].trim().parse().map_err(|_| bad())?;
    let k: usize = p[2].trim().parse().map_err(|_| bad())?;
    if !(a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite()) || k < 2 {
        return Err(bad());
    }
    if k > MAX_POINTS {
        return Err(too_many(&format!("--log-range '{s}'"), k));
    }
    let (la, lb) = (a.log10(), b.log10());
    Ok((0..k)
        .map(|i| 10f64.powf(la + (lb - la) * i as f64 / (k - 1) as f64))
        .collect())
}

/// Signed Menger curvature of each interior point of a polyline (NaN at the ends). Positive
/// means a left (counter-clockwise) turn.
pub fn curvatures(pts: &[(f64, f64)]) -> Vec<f64> {
    let mut k = vec![f64::NAN; pts.len()];
    for i in 1..pts.len().saturating_sub(1) {
        let (a, b, c) = (pts[i - 1], pts[i], pts[i + 1]);
        let cross = (b.0 - a.0) * (c.1 - a.1) - (b.1 - a.1) * (c.0 - a.0);
        let d = |p: (f64, f64), q: (f64, f64)| ((p.0 - q.0).powi(2) + (p.1 - q.1).powi(2)).sqrt();
        let den = d(a, b) * d(b, c) * d(c, a);
        k[i] = if den > 0.0 { 2.0 * cross / den } else { 0.0 };
    }
    k
}

/// The corner: the interior point of maximum (positive) curvature of (log residual, log model
/// norm) with the weights increasing. None with fewer than 3 usable points or no left turn.
pub fn corner(points: &[(f64, f64, f64)]) -> (Option<usize>, Vec<f64>) {
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|&a, &b| points[a].0.total_cmp(&points[b].0));
    let usable: Vec<usize> = order
        .into_iter()
        .filter(|&i| points[i].1 > 0.0 && points[i].2 > 0.0)
        .collect();
    let logs: Vec<(f64, f64)> = usable
        .iter()
        .map(|&i| (points[i].1.log10(), points[i].2.log10()))
        .collect();
    let k = curvatures(&logs);
    let mut out = vec![f64::NAN; points.len()];
    let mut best: Option<(usize, f64)> = None;
    for (j, &i) in usable.iter().enumerate() {
        out[i] = k[j];
        if k[j].is_finite() && k[j] > 0.0 && best.is_none_or(|b| k[j] > b.1) {
            best = Some((i, k[j]));
        }
    }
    (best.map(|b| b.0), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcv_minimum_and_discrepancy_interpolate_in_log_space() {
        // GCV a parabola in log w with its vertex at w = 0.02: found between the samples
        let f = |w: f64| (1.0 + (w.ln() - 0.02f64.ln()).powi(2)).exp();
        let pts: Vec<(f64, f64)> = [1e-3, 1e-2, 1e-1, 1.0].iter().map(|&w| (w, f(w))).collect();
        let g = gcv_minimum(&pts).unwrap();
        assert!((g / 0.02 - 1.0).abs() < 1e-9, "{g}");
        // the minimum at an end stays there; no finite values, no minimum
        assert_eq!(gcv_minimum(&pts[2..]), Some(0.1));
        assert_eq!(gcv_minimum(&[(1.0, f64::NAN)]), None);
        // ||r|| = w^0.5: the target 0.1 is reached at w = 0.01 exactly (a line in log-log)
        let r: Vec<(f64, f64)> = [1e-4f64, 1e-3, 1e-1, 1.0]
            .iter()
            .map(|&w| (w, w.sqrt()))
            .collect();
        let d = discrepancy_weight(&r, 0.1).unwrap();
        assert!((d / 0.01 - 1.0).abs() < 1e-12, "{d}");
        assert_eq!(discrepancy_weight(&r, 10.0), None);
        assert_eq!(discrepancy_weight(&r, 1e-3), None);
        assert!(gcv_value(10, 1.0, 10.0).is_nan() && gcv_value(10, 1.0, f64::NAN).is_nan());
        assert_eq!(gcv_value(10, 2.0, 8.0), 10.0);
        assert_eq!("gcv".parse::<WeightRule>(), Ok(WeightRule::Gcv));
        assert!("best".parse::<WeightRule>().is_err());
    }

    #[test]
    fn parses_lists_and_log_ranges() {
        assert_eq!(parse_list("0.001, 0.1,1").unwrap(), vec![0.001, 0.1, 1.0]);
        assert!(parse_list("1,x").is_err());
        assert!(parse_list("-1").is_err());
        let r = parse_log_range("1e-3:1:4").unwrap();
        assert_eq!(r.len(), 4);
        assert!((r[0] - 1e-3).abs() < 1e-15 && (r[3] - 1.0).abs() < 1e-12);
        assert!((r[1] - 1e-2).abs() < 1e-14);
        assert!(parse_log_range("1:2").is_err() && parse_log_range("0:1:3").is_err());
    }

    #[test]
    fn corner_of_an_l_shape() {
        // Residual grows and model norm falls with the weight; the sharp bend is at weight 3.
        let pts = [
            (1.0, 1.00, 100.0),
            (2.0, 1.01, 30.0),
            (3.0, 1.02, 10.0),
            (4.0, 3.0, 9.5),
            (5.0, 10.0, 9.0),
        ];
        let (c, k) = corner(&pts);
        assert_eq!(c, Some(2), "curvatures {k:?}");
        assert!(k[0].is_nan() && k[4].is_nan());
        // Order of the input does not matter.
        let mut rev = pts;
        rev.reverse();
        assert_eq!(corner(&rev).0, Some(2));
        // A straight line has no corner.
        let line = [(1.0, 1.0, 100.0), (2.0, 10.0, 10.0), (3.0, 100.0, 1.0)];
        assert_eq!(corner(&line).0, None);
    }
}
