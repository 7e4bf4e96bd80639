//! Console output that never panics. `println!`/`eprintln!` of std panic when the stream is a
//! pipe whose reader has gone (`seistomo invert cfg 2>&1 | head -1`: EPIPE, exit 101). This crate
//! shadows both macros (lib.rs declares this module first, with `#[macro_use]`), so every message
//! of the library goes through [`out`] / [`err`]: a write error (a closed pipe, a full disk behind
//! a redirect) is ignored and the run carries on, writing its outputs and exiting normally.
//! Stdout write errors are remembered ([`stdout_closed`]) so that a command whose only product is
//! stdout can stop early. A program that embeds the library may take the text instead
//! ([`set_sink`]: the Python module hands it to Python's `sys.stdout` and `sys.stderr`).

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Which of the two streams a piece of console text was meant for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
}

/// Where console text goes instead of the process's stdout and stderr: called with the stream
/// and the text (a line with its newline, or `print!`'s text as it is).
pub type Sink = Box<dyn Fn(Stream, &str) + Send + Sync>;

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

/// Send all console text to `sink` from now on (None: back to stdout and stderr).
pub fn set_sink(sink: Option<Sink>) {
    *SINK.write().unwrap_or_else(|e| e.into_inner()) = sink;
}

/// Hand `text` to the sink where there is one (true), else leave it to the caller (false).
fn to_sink(stream: Stream, text: impl FnOnce() -> String) -> bool {
    let guard = SINK.read().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref() {
        Some(sink) => {
            sink(stream, &text());
            true
        }
        None => false,
    }
}

/// `println!` that ignores write errors (see the module docs).
#[macro_export]
#[doc(hidden)]
macro_rules! __seistomo_println {
    () => { $crate::ui::console::out(format_args!("")) };
    ($($t:tt)*) => { $crate::ui::console::out(format_args!($($t)*)) };
}

/// `eprintln!` that ignores write errors (see the module docs).
#[macro_export]
#[doc(hidden)]
macro_rules! __seistomo_eprintln {
    () => { $crate::ui::console::err(format_args!("")) };
    ($($t:tt)*) => { $crate::ui::console::err(format_args!($($t)*)) };
}

// The crate-wide shadows of std's macros (textual scope: every module declared after this one).
#[allow(unused_macros)]
macro_rules! println {
    ($($t:tt)*) => { $crate::__seistomo_println!($($t)*) };
}
#[allow(unused_macros)]
macro_rules! print {
    ($($t:tt)*) => { $crate::ui::console::out_raw(format_args!($($t)*)) };
}
#[allow(unused_macros)]
macro_rules! eprintln {
    ($($t:tt)*) => { $crate::__seistomo_eprintln!($($t)*) };
}

/// One line on stdout; errors are ignored (and remembered).
pub fn out(args: Arguments) {
    if to_sink(Stream::Out, || format!("{args}\n")) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if writeln!(o, "{args}").and_then(|()| o.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Text on stdout (no newline added); errors are ignored (and remembered).
pub fn out_raw(args: Arguments) {
    if to_sink(Stream::Out, || args.to_string()) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if o.write_fmt(args).and_then(|()| o.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// One line on stderr, written with one call; errors are ignored.
pub fn err(args: Arguments) {
    let line = format!("{args}\n");
    if to_sink(Stream::Err, || line.clone()) {
        return;
    }
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Whether a write to stdout has failed (its reader has gone).
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}
