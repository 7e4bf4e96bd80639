//! The pipeline: what a command runs between parsing its arguments and printing, as typed
//! stages around one operator factory. The CLI and the Python module call this room; it calls
//! everything below.
//!
//! The stages of an LSQR run ([`invert::run_lsqr`]), one file each:
//! 1. [`load`]: `load(source, comm) -> Loaded` (each rank its rows; the manifest read once)
//! 2. [`prepare`]: `prepare(system, &Layout, comm) -> Prepared` (storage, order, scaling)
//! 3. [`solve`]: `solve(&Engine, Prepared, &LsqrJob, comm) -> Outcome` (through [`operators`])
//! 4. [`publish`]: `publish(&OutputPaths, &mut Outcome, model)` (one output set)
//!
//! - [`options`]: what a run is asked to do ([`options::SolveOptions`], [`options::OperatorSpec`])
//! - [`operators`]: the operator factory ([`operators::Engine`]): the one place that names
//!   concrete backends and operators
//! - [`config`]: TOML run configs -> [`config::RunConfig`]
//! - [`monitor`]: progress and history of LSQR and GMRES
//! - [`checkpoint`]: LSQR with checkpoints; [`model`]: the model side of `invert`; [`fit`]: a
//!   solution's products on its operator (an L-curve's points)
//! - [`square`]: GMRES on square systems over ranks (`solve --method gmres`)
//! - [`lcurve`], [`compare`], [`mod@bench`], [`export`], [`import`]: the other commands' work;
//!   [`timing`]: medians and copy bandwidths for `bench` and the factory

pub mod batch;
pub mod bench;
pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod export;
pub mod fit;
pub mod import;
pub mod invert;
pub mod lcurve;
pub mod load;
pub mod model;
pub mod monitor;
pub mod operators;
pub mod options;
pub mod prepare;
pub mod prepared;
pub mod publish;
pub mod resolution;
pub mod solve;
pub mod square;
pub mod timing;
