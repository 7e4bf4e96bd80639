//! The phases of a run's set-up (backend start, kernel compilation, stencil split, row and cell
//! order, encoding, transposes, uploads): named wall-clock spans recorded where the work is done,
//! collected by the pipeline into report.json (`setup_phases`) and one line on stderr. Process
//! wide: one run at a time records (concurrent runs in one process, such as ranks as threads in
//! tests, add into the same list).

use std::sync::Mutex;
use std::time::Instant;

static PHASES: Mutex<Vec<(&'static str, f64)>> = Mutex::new(Vec::new());
static PROCESS_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Note the process's start (the CLI calls it first; later calls keep the first).
pub fn mark_process_start() {
    PROCESS_START.get_or_init(Instant::now);
}

/// Seconds since [`mark_process_start`] (0 where it was never called: library use).
pub fn since_process_start() -> f64 {
    PROCESS_START
        .get()
        .map_or(0.0, |t| t.elapsed().as_secs_f64())
}

fn phases() -> std::sync::MutexGuard<'static, Vec<(&'static str, f64)>> {
    PHASES.lock().unwrap_or_else(|p| p.into_inner())
}

static TRACE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Print every recorded span from now on (the CLI turns it on for `--trace-phases`: a
/// developer's aid for finding where a run's time goes, bench/gpu.sh `timeline`).
pub fn set_trace(on: bool) {
    TRACE.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn tracing() -> bool {
    TRACE.load(std::sync::atomic::Ordering::Relaxed)
}

/// With the trace on ([`set_trace`]): one line on stderr, stamped with the seconds since the
/// process started.
pub fn trace(what: std::fmt::Arguments) {
    if tracing() {
        eprintln!("trace {:8.3} {what}", since_process_start());
    }
}

/// Add `seconds` to phase `name` (a phase met twice adds up).
pub fn record(name: &'static str, seconds: f64) {
    trace(format_args!("{name} took {seconds:.3} s"));
    let mut p = phases();
    match p.iter_mut().find(|(n, _)| *n == name) {
        Some((_, s)) => *s += seconds,
        None => p.push((name, seconds)),
    }
}

/// A span of phase `name`, recorded when dropped.
pub struct Span {
    name: &'static str,
    t0: Instant,
}

impl Drop for Span {
    fn drop(&mut self) {
        record(self.name, self.t0.elapsed().as_secs_f64());
    }
}

/// Start a span of phase `name`.
pub fn span(name: &'static str) -> Span {
    Span {
        name,
        t0: Instant::now(),
    }
}

/// Time `f` as phase `name`.
pub fn time<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    let _s = span(name);
    f()
}

/// Time `f` as phase `name`, less the phases recorded inside it (which stand on their own).
pub fn time_exclusive<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    let total = || phases().iter().map(|(_, s)| s).sum::<f64>();
    let (t0, before) = (Instant::now(), total());
    let out = f();
    let inner = total() - before;
    record(name, (t0.elapsed().as_secs_f64() - inner).max(0.0));
    out
}

/// The phases recorded since the last call, in the order first met; the list starts empty again.
pub fn take() -> Phases {
    Phases(std::mem::take(&mut *phases()))
}

/// The phases recorded so far (the list stays).
pub fn snapshot() -> Phases {
    Phases(phases().clone())
}

/// Named seconds in the order first met; serialised as a JSON object in that order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Phases(pub Vec<(&'static str, f64)>);

impl Phases {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Phases {
    /// The sum of every phase but `except`.
    pub fn total_except(&self, except: &str) -> f64 {
        self.0
            .iter()
            .filter(|(n, _)| *n != except)
            .map(|(_, s)| s)
            .sum()
    }

    /// One line: "set-up 1.23 s: backend 0.40, order 0.31, ..." (`read` left out: it is the
    /// load's).
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .filter(|(n, _)| *n != "read")
            .map(|(n, s)| format!("{n} {s:.2}"))
            .collect();
        format!(
            "set-up {:.2} s: {}",
            self.total_except("read"),
            parts.join(", ")
        )
    }
}

impl serde::Serialize for Phases {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(n, v)| (*n, *v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_add_up_by_name_in_first_order() {
        take();
        record("b", 1.0);
        record("a", 0.5);
        record("b", 2.0);
        time_exclusive("c", || record("d", 0.0));
        let p = take().0;
        assert_eq!(p[0], ("b", 3.0));
        assert_eq!(p[1], ("a", 0.5));
        assert_eq!((p[2].0, p[3].0), ("d", "c"));
        assert!(take().0.is_empty());
        let two = Phases(vec![("b", 3.0), ("read", 1.0), ("a", 0.5)]);
        assert_eq!(two.line(), "set-up 3.50 s: b 3.00, a 0.50");
        assert_eq!(
            serde_json::to_string(&two).unwrap(),
            r#"{"b":3.0,"read":1.0,"a":0.5}"#
        );
    }
}
