//! The library's console text in Python: with `console_to_python(True)` (what `import seistomo`
//! does) every line the library would print goes into a queue instead of the process's stdout
//! and stderr, and `console_drain` hands the queue to Python, which writes it to `sys.stdout`
//! and `sys.stderr` (so a notebook or a redirected `sys.stdout` sees it). A queue, not a write
//! under the GIL from the solver's threads: a thread of the solve must never wait for the GIL
//! that the caller may hold while it waits for the solve. The lines are written after each
//! call, and while a call with `threads=` waits ([`flush`]).

use std::sync::Mutex;

use pyo3::prelude::*;
use seistomo::ui::console::{set_sink, Stream};

/// The lines not yet handed to Python: (for stderr, text). At most [`MAX_PENDING`] are kept.
static PENDING: Mutex<Vec<(bool, String)>> = Mutex::new(Vec::new());
/// Beyond this many waiting lines the oldest are dropped (and one line says so).
const MAX_PENDING: usize = 100_000;

fn pending() -> std::sync::MutexGuard<'static, Vec<(bool, String)>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Send the library's console text to Python (`on`) or to the process's stdout and stderr.
#[pyfunction]
pub fn console_to_python(on: bool) {
    if !on {
        set_sink(None);
        return;
    }
    set_sink(Some(Box::new(|stream, text| {
        let mut p = pending();
        if p.len() >= MAX_PENDING {
            p.drain(..MAX_PENDING / 2);
            p.insert(
                0,
                (true, "seistomo: (earlier console lines dropped)\n".into()),
            );
        }
        p.push((stream == Stream::Err, text.to_owned()));
    })));
}

/// The console text queued since the last call, in order: (for stderr, text).
#[pyfunction]
pub fn console_drain() -> Vec<(bool, String)> {
    std::mem::take(&mut *pending())
}

/// Write the queued console text to `sys.stdout` / `sys.stderr` (with the GIL held: called
/// from the waits of calls with `threads=`). Errors of the writes are ignored, as the
/// library's own console does.
pub fn flush(py: Python<'_>) {
    let lines = console_drain();
    if lines.is_empty() {
        return;
    }
    let Ok(sys) = py.import("sys") else {
        return;
    };
    for (err, text) in lines {
        if let Ok(f) = sys.getattr(if err { "stderr" } else { "stdout" }) {
            let _ = f.call_method1("write", (text,));
        }
    }
}
