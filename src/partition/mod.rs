//! How work is split across ranks, named for what is split:
//!
//! - [`rows`]: kernel rows by nonzeros (greedy LPT, Huang et al. 2012) and damping rows in
//!   contiguous ranges: the LSQR load plan
//! - [`blocks`]: contiguous row blocks ([`graph::RowPartition`]), the one type of every contiguous
//!   split: equal rows, or about equal nonzeros
//! - [`graph`]: the rows of a square system: contiguous, by nonzeros, or a METIS graph
//!   partition turned into a symmetric permutation (GMRES)
//! - [`halo`]: the ghosts a square-system partition implies, and its communication volume
//!
//! Collective choices (rank 0 partitions, every rank gets the result) live in `comm`, above.

pub mod blocks;
pub mod graph;
pub mod halo;
pub mod rows;

pub use rows::{imbalance, lpt, partition, Damping, Partition, RowCost};
