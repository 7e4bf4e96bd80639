//! seistomo: large seismic tomography inversions (damped least squares by LSQR, square systems
//! by GMRES) on CPUs and GPUs, in one process or across MPI ranks.
//!
//! Rooms, from the top (each imports only rooms below it; tests/layers.rs holds the order):
//! - [`cli`]: one file per subcommand: parse, call one pipeline function, print.
//! - [`pipeline`]: what a command runs, as typed stages: load -> prepare -> solve -> publish,
//!   around one operator factory (`pipeline::operators`).
//! - [`model`]: what goes into model files (HDF5 + XDMF, plots, report.json, checkpoints).
//! - [`solver`]: LSQR and GMRES, written once over `Backend`/`Operator`/`Comm`;
//!   [`testproblems`] beside it (test systems with known answers).
//! - [`backend`]: the CPU (rayon) and CUDA backends: vectors, operators, preconditioners.
//! - [`comm`]: ranks (serial, MPI, threads for tests), reductions, the halo of square systems.
//! - [`io`]: files: the dataset format, Matrix Market/NumPy/PETSc, MPI-IO and memory maps,
//!   publishing outputs as one set.
//! - [`partition`]: rows to ranks (contiguous, nonzero-balanced, LPT, METIS): pure functions.
//! - [`grid`]: the model grid: cells, reordering, difference operators and stencils, rays.
//! - [`sparse`]: CSR/CSC, compact and tiled storage, row patterns, the local system.
//! - [`settings`] (tuning knobs and the launch environment), [`ui`] (console and progress),
//!   [`error`]: the floor every room stands on.

// First: shadows println!/eprintln! for every module below with versions that never panic on a
// closed pipe (src/ui/console.rs).
#[macro_use]
pub mod ui;
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
pub mod settings;
pub mod solver;
pub mod sparse;
pub mod testproblems;

pub use error::{Error, Result};

/// Program version, for reports and model files.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
