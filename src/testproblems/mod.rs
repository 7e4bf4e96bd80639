//! Test problems for tests, benchmarks and the `square` command; nothing in the production
//! pipeline imports this room.
//!
//! - [`lstp`]: Paige & Saunders' LSTP generator (known singular values and solutions)
//! - [`square`]: 3-D Poisson / convection-diffusion systems on the 7-point grid stencil
//! - [`random`]: random sparse matrices with awkward structure (kernel tests)

pub mod lstp;
pub mod random;
pub mod square;

pub use lstp::Lstp;
pub use random::{awkward_csr, runs_csr, with_negative_zeros};
