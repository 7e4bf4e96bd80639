//! The L-curve: solve for a list of damping / regularisation weights, reusing the loaded data,
//! and choose one three ways: the corner of log ||G m - d|| against log ||L m|| by maximum
//! curvature, the minimum of generalised cross-validation (GCV) and the discrepancy principle.
//!
//! With a regularisation matrix R in the config the swept weight is the weight w of the rows
//! w R (L = R); without one it is LSQR's damping (L = I).

use crate::error::{Error, Result};
use crate::model::report::Outcome;
pub use crate::model::weight::{
    discrepancy_weight, gcv_minimum, gcv_value, WeightChoice, WeightRule,
};

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
