//! The model grid: cells of a regular nx x ny x nz box and what is computed on them. For now
//! the stencil application of grid-generated damping rows ([`stencil`]); the Grid type, cell
//! orderings, ray tracing and synthetic models join it (issue 14's grid room).

pub mod stencil;

pub use stencil::{Stencil, StencilOp};
