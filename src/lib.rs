//! seistomo: large seismic tomography inversions (damped least squares by LSQR, square systems
//! by GMRES) on CPUs and GPUs, in one process or across MPI ranks.
//!
//! Layout: [`sparse`] (CSR/CSC, Matrix Market), [`io`] (files), [`comm`] (ranks),
//! [`backend`] (CPU and CUDA kernels), [`solver`] (LSQR, GMRES), [`config`] (TOML runs),
//! [`run`] (the pipeline shared by the CLI commands), [`cli`] (subcommands).

// First: shadows println!/eprintln! for every module below with versions that never panic on a
// closed pipe (src/console.rs).
#[macro_use]
pub mod console;
// Second: choice_from_str! for every module below (src/error.rs).
#[macro_use]
pub mod error;

pub mod backend;
pub mod cli;
pub mod comm;
pub mod grid;
pub mod io;
pub mod model;
pub mod partition;
pub mod pipeline;
pub mod progress;
pub mod solver;
pub mod sparse;
pub mod testproblems;

pub use error::{Error, Result};

/// Program version, for reports and model files.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
