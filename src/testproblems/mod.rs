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
pub use random::{awkward_csr, random_square, runs_csr, uniform_rows, with_negative_zeros};

/// alpha p + beta y, entry by entry: the reference of a scaled product y <- alpha A x + beta y,
/// with p = A x (or A^T y) computed plainly.
pub fn axpby(alpha: f64, p: &[f64], beta: f64, y: &[f64]) -> Vec<f64> {
    p.iter().zip(y).map(|(p, y)| alpha * p + beta * y).collect()
}
