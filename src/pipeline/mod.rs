//! The pipeline: what a command does between parsing its arguments and printing. Load a system
//! (each rank its own rows), choose backend and storage, run LSQR (with checkpoints) or GMRES,
//! write the model and the outputs. The CLI calls this room; it calls everything below.
//!
//! - [`config`]: TOML run configs -> [`config::RunConfig`]
//! - [`solve`]: one LSQR solve of a loaded system ([`SolveOptions`], [`solve_system`])
//! - [`distributed`]: the per-rank LSQR job of `invert` (load, model, solve, gather, write)
//! - [`outputs`]: solution, report.json, history.csv as one publication
//! - [`export`], [`import`]: the solved system out to Matrix Market/NumPy/PETSc; a dataset in
//! - [`lcurve`]: one inversion per weight and the corner; [`compare`]: seistomo beside its peers

pub mod bench;
pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod distributed;
pub mod export;
pub mod gmres;
pub mod import;
pub mod lcurve;
pub mod load;
pub mod model;
pub mod outputs;
pub mod solve;

pub use outputs::*;
pub use solve::*;
