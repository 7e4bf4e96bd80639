//! How work is split across ranks, named for what is split:
//!
//! - [`rows`]: kernel rows by nonzeros (greedy LPT, Huang et al. 2012) and damping rows in
//!   contiguous ranges: the LSQR load plan
//! - [`graph`]: the rows of a square system: contiguous, by nonzeros, or a METIS graph
//!   partition turned into a symmetric permutation (GMRES)

pub mod graph;
pub mod rows;

pub use rows::{damping_ranges, imbalance, lpt, partition, Partition};
