//! Console output that never panics. `println!`/`eprintln!` of std panic when the stream is a
//! pipe whose reader has gone (`seistomo invert cfg 2>&1 | head -1`: EPIPE, exit 101). This crate
//! shadows both macros (lib.rs declares this module first, with `#[macro_use]`), so every message
//! of the library goes through [`out`] / [`err`]: a write error (a closed pipe, a full disk behind
//! a redirect) is ignored and the run carries on, writing its outputs and exiting normally.
//! Stdout write errors are remembered ([`stdout_closed`]) so that a command whose only product is
//! stdout can stop early.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

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
    let mut o = std::io::stdout().lock();
    if writeln!(o, "{args}").and_then(|()| o.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Text on stdout (no newline added); errors are ignored (and remembered).
pub fn out_raw(args: Arguments) {
    let mut o = std::io::stdout().lock();
    if o.write_fmt(args).and_then(|()| o.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// One line on stderr, written with one call; errors are ignored.
pub fn err(args: Arguments) {
    let line = format!("{args}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Whether a write to stdout has failed (its reader has gone).
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}
