//! Models: the grid, and (later) the HDF5/XDMF model files, reference models and plots.

pub mod grid;

pub use grid::Grid;
