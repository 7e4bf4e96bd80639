//! The pipeline: what a command does between parsing its arguments and printing. Load a system
//! (each rank its own rows), choose backend and storage, run LSQR (with checkpoints) or GMRES,
//! write the model and the outputs. The CLI calls this room; it calls everything below.
//!
//! - [`config`]: TOML run configs -> [`config::RunConfig`]
//! - [`solve`]: one LSQR solve of a loaded system ([`SolveOptions`], [`solve_system`])
//! - [`distributed`]: the per-rank LSQR job of `invert` (load, model, solve, gather, write)
//! - [`outputs`]: solution, report.json, history.csv as one publication

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod distributed;
pub mod gmres;
pub mod lcurve;
pub mod load;
pub mod model;
pub mod outputs;
pub mod solve;

pub use outputs::*;
pub use solve::*;
