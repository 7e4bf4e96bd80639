//! What the user sees on the terminal: [`console`] (println!/eprintln! that never panic on a
//! closed pipe; the crate shadows std's macros with them) and [`progress`] (bars on a terminal,
//! plain lines otherwise, quiet on request or off rank 0) and [`phases`] (the set-up's named
//! spans, for report.json and a line on stderr).

// First: the println!/eprintln! shadows (textual scope: every module declared after this one).
#[macro_use]
pub mod console;
pub mod phases;
pub mod progress;
