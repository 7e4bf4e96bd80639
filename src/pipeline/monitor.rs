//! What a solve shows while it runs and keeps afterwards: the iteration history, progress lines
//! every N iterations when asked for (`--progress N`), else a bar (a plain line every 10 s when
//! stderr is not a terminal; nothing with `--quiet` or off rank 0). One [`IterationReporter`]
//! draws for LSQR ([`LsqrProgress`]) and GMRES ([`GmresProgress`]); each adds its own line.
//!
//! While a monitor lives, SIGINT, SIGTERM and SIGHUP are caught ([`SignalGuard`]) instead of
//! ending the process at once: the monitor ends the solve at the next iteration with an error
//! naming the signal (and, through the checkpointing driver, where the last checkpoint is).
//! Not under an MPI launcher, which forwards signals to the ranks and ends them itself (ranks
//! stopping at different iterations would wait for each other).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::solver::gmres::{GmresHistory, GmresMonitor, GmresRecord};
use crate::solver::{IterRecord, LsqrMonitor, LsqrParams};
use crate::ui::progress;

/// A progress bar redrawn at most every 100 ms (formatting a message every iteration would cost
/// a few percent of a 0.03 ms GPU iteration), and lines every `every` iterations.
pub struct IterationReporter {
    bar: Option<indicatif::ProgressBar>,
    shown: Option<Instant>,
    every: usize,
    t0: Instant,
}

impl IterationReporter {
    /// A reporter for solver `name` on a rank (`root`: rank 0, the one that shows anything);
    /// `every` > 0 prints a line every `every` iterations instead of the bar.
    pub fn new(name: &'static str, root: bool, every: usize) -> Self {
        let bar = (root && every == 0 && progress::mode() != progress::Mode::Quiet)
            .then(|| progress::open_ended(name));
        IterationReporter {
            bar,
            shown: None,
            every: if root { every } else { 0 },
            t0: Instant::now(),
        }
    }

    /// Whether iteration `itn` gets a progress line.
    pub fn line_due(&self, itn: usize) -> bool {
        self.every > 0 && itn % self.every == 0
    }

    /// Redraw the bar at `position` with the message `msg` makes, when one is shown and the
    /// last redraw is 100 ms old.
    pub fn draw(&mut self, position: usize, msg: impl FnOnce(f64) -> String) {
        let Some(pb) = &self.bar else {
            return;
        };
        if self
            .shown
            .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        self.shown = Some(Instant::now());
        pb.set_position(position as u64);
        pb.set_message(msg(self.t0.elapsed().as_secs_f64()));
    }

    /// Clear the bar (before anything else is printed).
    pub fn clear(&mut self) {
        if let Some(pb) = self.bar.take() {
            pb.finish_and_clear();
        }
    }
}

impl Drop for IterationReporter {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The signal caught while a [`SignalGuard`] was installed (0: none).
static CAUGHT: AtomicI32 = AtomicI32::new(0);
/// Installed guards and the dispositions they replaced.
static GUARDS: Mutex<(usize, Vec<(libc::c_int, libc::sigaction)>)> = Mutex::new((0, Vec::new()));
/// The signals that end a solve cleanly.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_stop_signal(sig: libc::c_int) {
    // Async-signal-safe: one atomic store. A second signal before the monitor looks ends the
    // process the default way (the disposition is reset by SA_RESETHAND).
    CAUGHT.store(sig, Ordering::Relaxed);
}

/// Catches SIGINT, SIGTERM and SIGHUP while it lives (the dispositions before are restored when
/// the last guard drops); none under an MPI launcher.
pub struct SignalGuard {
    active: bool,
}

impl SignalGuard {
    pub fn install() -> SignalGuard {
        if crate::settings::launch::launched_by_mpi() {
            return SignalGuard { active: false };
        }
        let mut g = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 == 0 {
            CAUGHT.store(0, Ordering::Relaxed);
            g.1.clear();
            for sig in STOP_SIGNALS {
                // SAFETY: sigaction(2) with a zeroed struct whose handler is an extern "C" fn
                // that only stores to an atomic; `old` is a valid out-pointer.
                unsafe {
                    let mut new: libc::sigaction = std::mem::zeroed();
                    new.sa_sigaction = on_stop_signal as *const () as usize;
                    new.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
                    libc::sigemptyset(&mut new.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, &new, &mut old) == 0 {
                        g.1.push((sig, old));
                    }
                }
            }
        }
        g.0 += 1;
        SignalGuard { active: true }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        let mut g = GUARDS.lock().unwrap_or_else(|e| e.into_inner());
        g.0 -= 1;
        if g.0 == 0 {
            for (sig, old) in g.1.drain(..) {
                // SAFETY: restores a disposition sigaction(2) returned above.
                unsafe {
                    libc::sigaction(sig, &old, std::ptr::null_mut());
                }
            }
        }
    }
}

/// Err (the solve stops, the progress line cleared) where a signal asked for it.
fn stop_if_signalled(shown: &mut IterationReporter, itn: usize) -> Result<()> {
    match caught_signal() {
        Some(sig) => {
            shown.clear();
            Err(stopped_by(sig, itn, ""))
        }
        None => Ok(()),
    }
}

/// The signal that asked the solve to stop, if one did.
pub fn caught_signal() -> Option<i32> {
    match CAUGHT.load(Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}

/// How a stop signal is named in messages.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT (Ctrl-C)",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP (the terminal closed)",
        _ => "a signal",
    }
}

/// The error that ends a solve stopped by a signal at iteration `itn` (`what`: the rest of the
/// line, e.g. where the checkpoint is).
pub fn stopped_by(sig: i32, itn: usize, what: &str) -> Error {
    Error::Invalid(format!(
        "stopped by {} at iteration {itn}: no outputs were written{what}",
        signal_name(sig)
    ))
}

/// Iterations per second from a time per iteration (0 when unknown).
fn rate(per_iter: f64) -> f64 {
    if per_iter > 0.0 {
        1.0 / per_iter
    } else {
        0.0
    }
}

/// LSQR's monitor: the history, and progress with the stopping tests against their
/// tolerances, the rate, and an ETA only from a steady trend of a stopping test.
pub struct LsqrProgress {
    pub history: Vec<IterRecord>,
    shown: IterationReporter,
    _signals: SignalGuard,
    first: Option<(usize, f64)>,
    test1: Vec<f64>,
    test2: Vec<f64>,
    atol: f64,
    btol: f64,
    iter_lim: usize,
}

impl LsqrProgress {
    /// The monitor of solver `name` ("lsqr" or "lsmr": the same records).
    pub fn new(
        name: &'static str,
        params: &LsqrParams,
        n: usize,
        root: bool,
        every: usize,
    ) -> Self {
        LsqrProgress {
            history: Vec::new(),
            shown: IterationReporter::new(name, root, every),
            _signals: SignalGuard::install(),
            first: None,
            test1: Vec::new(),
            test2: Vec::new(),
            atol: params.atol,
            btol: params.btol,
            iter_lim: params.iter_lim.unwrap_or(2 * n),
        }
    }

    fn bar(&mut self, r: &IterRecord) {
        let (it0, rn0) = *self.first.get_or_insert((r.itn, r.r2norm));
        let rel = if rn0 > 0.0 { r.r2norm / rn0 } else { 0.0 };
        self.test1.push(rel);
        self.test2
            .push(r.arnorm / (r.anorm * r.r2norm).max(f64::MIN_POSITIVE));
        let (test1, test2) = (&self.test1, &self.test2);
        let (atol, btol, iter_lim) = (self.atol, self.btol, self.iter_lim);
        self.shown.draw(r.itn, |secs| {
            let done = r.itn - it0;
            let per_iter = if done > 0 { secs / done as f64 } else { 0.0 };
            let left = iter_lim.saturating_sub(r.itn);
            let rtol = btol + atol * r.anorm * r.xnorm / rn0.max(f64::MIN_POSITIVE);
            let eta = [
                progress::eta_from_trend(test1, rtol, per_iter, left),
                progress::eta_from_trend(test2, atol, per_iter, left),
            ]
            .into_iter()
            .flatten()
            .min();
            let eta = progress::eta_text(eta);
            let t2 = match test2.last() {
                Some(t) if r.anorm > 0.0 => format!("{t:.1e}"),
                _ => "-".into(),
            };
            // Each stopping test, then its tolerance: LSQR stops when either reaches it.
            format!(
                "itn {}  |r| {:.4e}  |r|/|r0| {:.1e}/{:.0e}  |A'r|/(|A||r|) {t2}/{:.0e}  {:.0} it/s  {eta}",
                r.itn, r.r1norm, rel, rtol, atol, rate(per_iter),
            )
        });
    }
}

impl<B: Backend> LsqrMonitor<B> for LsqrProgress {
    fn record(&mut self, rec: &IterRecord) -> Result<()> {
        stop_if_signalled(&mut self.shown, rec.itn)?;
        if self.shown.line_due(rec.itn) {
            eprintln!(
                "  itn {:>7}  r1norm {:.6e}  arnorm {:.3e}  xnorm {:.6e}  acond {:.3e}",
                rec.itn, rec.r1norm, rec.arnorm, rec.xnorm, rec.acond
            );
        }
        self.bar(rec);
        self.history.push(*rec);
        Ok(())
    }
}

/// GMRES's monitor: the history, and progress with the relative residual against rtol, the
/// rate, and an ETA only from a steady fall of the relative residual.
pub struct GmresProgress {
    pub history: GmresHistory,
    pub shown: IterationReporter,
    _signals: SignalGuard,
    rtol: f64,
    max_iter: usize,
    relres: Vec<f64>,
}

impl GmresProgress {
    pub fn new(rtol: f64, max_iter: usize, root: bool, every: usize) -> Self {
        GmresProgress {
            history: GmresHistory(Vec::with_capacity(max_iter.min(1 << 20) + 1)),
            shown: IterationReporter::new("gmres", root, every),
            _signals: SignalGuard::install(),
            rtol,
            max_iter,
            relres: Vec::new(),
        }
    }
}

impl GmresMonitor for GmresProgress {
    fn record(&mut self, rec: &GmresRecord) -> Result<()> {
        stop_if_signalled(&mut self.shown, rec.iteration)?;
        if self.shown.line_due(rec.iteration) {
            eprintln!(
                "  it {:>7}  cycle {:>5}  resnorm {:.6e}  relres {:.3e}",
                rec.iteration, rec.cycle, rec.resnorm, rec.relres
            );
        }
        self.relres.push(rec.relres);
        let (relres, rtol, max_iter) = (&self.relres, self.rtol, self.max_iter);
        let r = *rec;
        self.shown.draw(r.iteration, |_| {
            let per_iter = if r.iteration > 0 {
                r.seconds / r.iteration as f64
            } else {
                0.0
            };
            let eta = progress::eta_from_trend(
                relres,
                rtol,
                per_iter,
                max_iter.saturating_sub(r.iteration),
            );
            format!(
                "it {}  cycle {}  relres {:.2e}/{:.0e}  {:.0} it/s  {}",
                r.iteration,
                r.cycle,
                r.relres,
                rtol,
                rate(per_iter),
                progress::eta_text(eta)
            )
        });
        self.history.record(rec)
    }
}
