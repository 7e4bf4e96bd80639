//! What the user sees on the terminal: [`console`] (println!/eprintln! that never panic on a
//! closed pipe; the crate shadows std's macros with them) and [`progress`] (bars on a terminal,
//! plain lines otherwise, quiet on request or off rank 0).

// First: the println!/eprintln! shadows (textual scope: every module declared after this one).
#[macro_use]
pub mod console;
pub mod progress;
