//! The model grid: cells of a regular nx x ny x nz box and everything computed on them.
//!
//! - [`cells`]: [`Grid`] (cell numbering `i + nx (j + ny k)`, coordinates, extents)
//! - [`reorder`]: Morton order of the cells and the row sort, with the map back
//! - [`difference`]: norm damping and first/second differences as explicit rows
//! - [`stencil`]: the same rows recognised and applied matrix-free
//! - [`synthetic`]: straight-ray tracing, checkerboard/spike models, travel times
//! - [`coverage`]: hit count and DWS per cell
//! - [`random`]: the deterministic generator synthetic data and tests share
//!
//! Imports only `sparse`, `progress` and `error`.

pub mod cells;
pub mod coverage;
pub mod difference;
pub mod random;
pub mod reorder;
pub mod stencil;
pub mod synthetic;

pub use cells::Grid;
pub use coverage::{Coverage, PendingCoverage};
pub use difference::regularisation;
pub use random::{gaussian, Rng};
pub use stencil::{Stencil, StencilOp};
