//! Choosing the regularisation weight from the tried ones: the rules besides the L-curve's
//! corner (src/model/lcurve.rs): the minimum of generalised cross-validation (GCV) and the
//! discrepancy principle, and what report.json says of the choice.

use serde::Serialize;

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
}
