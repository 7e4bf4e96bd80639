//! Progress by default: on a terminal, indicatif bars on stderr; otherwise (CI, batch jobs,
//! mpirun with output to a file) one plain line every 10 s; `--quiet` for neither. Under MPI
//! only rank 0 shows progress. The mode is set once per process by the command line
//! ([`configure`]); library users get bars on a terminal and lines otherwise.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Bars,
    Lines,
    Quiet,
}

/// 0: not configured (detect), 1 bars, 2 lines, 3 quiet.
static MODE: AtomicU8 = AtomicU8::new(0);

/// Interval of the plain lines.
pub const LINE_EVERY: Duration = Duration::from_secs(10);

/// Set the mode for this process: quiet when asked or not rank 0, else bars on a terminal
/// and lines otherwise.
pub fn configure(quiet: bool, root: bool) {
    let m = if quiet || !root {
        Mode::Quiet
    } else if std::io::stderr().is_terminal() {
        Mode::Bars
    } else {
        Mode::Lines
    };
    set_mode(m);
}

/// Set the mode explicitly.
pub fn set_mode(m: Mode) {
    MODE.store(
        match m {
            Mode::Bars => 1,
            Mode::Lines => 2,
            Mode::Quiet => 3,
        },
        Ordering::Relaxed,
    );
}

/// The mode in effect.
pub fn mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        1 => Mode::Bars,
        2 => Mode::Lines,
        3 => Mode::Quiet,
        _ if std::io::stderr().is_terminal() => Mode::Bars,
        _ => Mode::Lines,
    }
}

/// A counted task (`len` units: rays, nonzeros, ...) labelled `what`: a bar with rate and ETA
/// (the work is known, so the ETA is honest), a line every 10 s, or nothing.
pub fn counted(len: u64, what: &str) -> ProgressBar {
    let pb = match mode() {
        Mode::Quiet => return ProgressBar::hidden(),
        Mode::Bars => ProgressBar::new(len),
        Mode::Lines => ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden()),
    };
    let style = ProgressStyle::with_template(
        "{msg:>10} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} (eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_message(what.to_string());
    lines(&pb, what);
    pb
}

/// An open-ended task (iterations of a solver): position and a message the caller keeps
/// current (norms, rate, an ETA only where one is honest).
pub fn open_ended(what: &str) -> ProgressBar {
    let pb = match mode() {
        Mode::Quiet => return ProgressBar::hidden(),
        Mode::Bars => ProgressBar::new_spinner(),
        Mode::Lines => ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden()),
    };
    let style = ProgressStyle::with_template("{spinner} {prefix} [{elapsed_precise}] {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    pb.set_style(style);
    pb.set_prefix(what.to_string());
    pb.enable_steady_tick(Duration::from_millis(200));
    lines(&pb, what);
    pb
}

/// In line mode, a thread that prints the task's state every [`LINE_EVERY`] until it is
/// finished or dropped (short tasks print nothing).
fn lines(pb: &ProgressBar, what: &str) {
    if mode() != Mode::Lines {
        return;
    }
    let weak = pb.downgrade();
    let what = what.to_string();
    let start = Instant::now();
    let spawned = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || {
            let mut next = start + LINE_EVERY;
            loop {
                std::thread::sleep(Duration::from_millis(250));
                let Some(pb) = weak.upgrade() else { return };
                if pb.is_finished() {
                    return;
                }
                if Instant::now() < next {
                    continue;
                }
                next += LINE_EVERY;
                let secs = start.elapsed().as_secs();
                let line = match pb.length() {
                    Some(len) if len > 0 => {
                        let pos = pb.position();
                        let pct = 100.0 * pos as f64 / len as f64;
                        let eta = pb.eta().as_secs();
                        format!(
                            "[{secs} s] {what}: {pos}/{len} ({pct:.0} %), {:.3e}/s, eta {eta} s",
                            pb.per_sec()
                        )
                    }
                    _ => format!("[{secs} s] {what}: {}", pb.message()),
                };
                eprintln!("{line}");
            }
        });
    // No thread, no lines: progress is never worth an error.
    drop(spawned);
}

/// The ETA of an iterative solve from the trend of its stopping test: `test` values (the
/// quantity the solver compares with `tol`) over recent iterations, `secs_per_iter` measured.
/// None unless the last `window` values fall steadily in log scale and the projected
/// iterations fit under `iters_left` (the iteration limit): no ETA rather than a made-up one.
pub fn eta_from_trend(
    test: &[f64],
    tol: f64,
    secs_per_iter: f64,
    iters_left: usize,
) -> Option<Duration> {
    const WINDOW: usize = 20;
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if test.len() < WINDOW || !positive(tol) || !positive(secs_per_iter) {
        return None;
    }
    let w = &test[test.len() - WINDOW..];
    if w.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
        return None;
    }
    let (first, last) = (w[0].ln(), w[WINDOW - 1].ln());
    let slope = (last - first) / (WINDOW - 1) as f64;
    // Steady: falling on average and in at least 3/4 of the steps.
    let falling = w.windows(2).filter(|p| p[1] < p[0]).count();
    if !slope.is_finite() || slope >= 0.0 || falling * 4 < (WINDOW - 1) * 3 {
        return None;
    }
    let need = ((tol.ln() - last) / slope).max(0.0);
    if !need.is_finite() || need > iters_left as f64 {
        return None;
    }
    Some(Duration::from_secs_f64(need * secs_per_iter))
}

/// Progress of `len` units of work on stderr (src/progress.rs: a bar on a terminal, a line
/// every 10 s otherwise, nothing with --quiet, on ranks other than 0 or when `show` is false).
pub fn bar(len: u64, what: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    counted(len, what)
}

/// An ETA as a bar shows it: "eta 12 s", "eta <1 s" or "no eta yet".
pub fn eta_text(eta: Option<Duration>) -> String {
    match eta {
        Some(d) if d.as_secs_f64() < 1.0 => "eta <1 s".to_string(),
        Some(d) => format!("eta {:.0} s", d.as_secs_f64()),
        None => "no eta yet".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_only_for_a_steady_fall() {
        let geometric: Vec<f64> = (0..30).map(|i| 0.5f64.powi(i)).collect();
        // 2^-29 now, 1e-12 ~ 2^-39.9: about 11 more iterations at 0.1 s.
        let eta = eta_from_trend(&geometric, 1e-12, 0.1, 1000).unwrap();
        assert!((eta.as_secs_f64() - 1.09).abs() < 0.05, "{eta:?}");
        // Beyond the iteration limit: none.
        assert!(eta_from_trend(&geometric, 1e-12, 0.1, 5).is_none());
        // Stagnating or erratic: none.
        let flat = vec![1e-3; 30];
        assert!(eta_from_trend(&flat, 1e-8, 0.1, 1000).is_none());
        let zigzag: Vec<f64> = (0..30)
            .map(|i| if i % 2 == 0 { 1e-3 } else { 1e-2 })
            .collect();
        assert!(eta_from_trend(&zigzag, 1e-8, 0.1, 1000).is_none());
        assert!(eta_from_trend(&geometric[..5], 1e-12, 0.1, 1000).is_none());
    }
}
