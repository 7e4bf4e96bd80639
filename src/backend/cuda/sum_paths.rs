//! One vector summed over the ranks by every path a job can take (the other GPUs' memory,
//! NCCL, the host), timed the way nccl-tests times an all-reduce: `seistomo bench --sums
//! VALUES` under mpirun (issue 31: each path against NCCL's own all-reduce on the same vector).
//!
//! Every path sums the same f64 vector in place, the stream synchronised after each sum; a sum
//! is timed on each rank from a barrier to its end, and the table gives the median and the
//! fastest over the repetitions, with nccl-tests' bandwidths: algbw = bytes / time, busbw =
//! algbw x 2 (P - 1) / P (what each rank's links carry in a ring all-reduce).

use std::time::Instant;

use cudarc::driver::CudaSlice;

use super::backend::CudaBackend;
use super::error::Doing;
use crate::backend::AllreducePath;
use crate::comm::{on_every_rank, Comm};
use crate::error::{Error, Result};

/// One path's times for a sum of `values` f64 over `ranks` ranks.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SumTiming {
    pub path: &'static str,
    pub values: usize,
    pub ranks: usize,
    /// Median and fastest of the timed sums on this rank, milliseconds.
    pub median_ms: f64,
    pub min_ms: f64,
    /// Bytes of the vector over the median time, GB/s (nccl-tests' algbw).
    pub algbw_gbs: f64,
    /// algbw x 2 (P - 1) / P (nccl-tests' busbw for an all-reduce).
    pub busbw_gbs: f64,
}

/// Sums before the timed ones (connections, buffers, kernels loaded).
const WARM_UP: usize = 3;

impl CudaBackend {
    /// Collective: a vector of `values` f64 summed over `comm`'s ranks `reps` times by each
    /// path: `peer` (the other GPUs' memory; ranks on one node), `nccl` (ncclAllReduce; where
    /// libnccl loads on every rank) and `host` (page-locked copies and MPI). Returns the timings
    /// and, for each path that could not run here, why. Every sum is checked: rank r fills the
    /// vector with r + 1, so every value must come back as P (P + 1) / 2.
    pub fn time_sum_paths(
        &self,
        comm: &dyn Comm,
        values: usize,
        reps: usize,
    ) -> Result<(Vec<SumTiming>, Vec<String>)> {
        let fill = vec![(comm.rank() + 1) as f64; values.max(1)];
        let mut x = self
            .stream
            .clone_htod(&fill)
            .doing("copying the vector to the device")?;
        let (mut done, mut skipped) = (Vec::new(), Vec::new());
        let one_node = on_every_rank(comm, comm.local_size() == comm.size())?;
        if one_node {
            // (the buffers are made at the first sum, collectively: where they cannot be,
            // every rank gets the same error)
            match self.time_path(comm, "peer", &mut x, &fill, reps, &|be, x| {
                be.peer_sum(comm, x)
            }) {
                Ok(t) => done.push(t),
                Err(e) => skipped.push(format!("peer: {e}")),
            }
        } else {
            skipped.push("peer: the ranks are not all on one node".to_string());
        }
        match self
            .nccl
            .setup(&self.stream, comm, AllreducePath::Nccl, None)
        {
            Ok(_) if self.nccl.ready() => {
                done.push(self.time_path(comm, "nccl", &mut x, &fill, reps, &|be, x| {
                    if be.nccl.all_reduce(x)? {
                        Ok(())
                    } else {
                        Err(Error::backend("cuda", "NCCL's communicator went away"))
                    }
                })?);
            }
            Ok(why) => skipped.push(format!("nccl: {why}")),
            Err(e) => skipped.push(format!("nccl: {e}")),
        }
        done.push(self.time_path(comm, "host", &mut x, &fill, reps, &|be, x| {
            be.host_sum(comm, x)
        })?);
        Ok((done, skipped))
    }

    /// Time `reps` sums of `x` (reset to `fill` before each) by `sum`, after [`WARM_UP`]
    /// untimed ones; check the last.
    fn time_path(
        &self,
        comm: &dyn Comm,
        path: &'static str,
        x: &mut CudaSlice<f64>,
        fill: &[f64],
        reps: usize,
        sum: &dyn Fn(&CudaBackend, &mut CudaSlice<f64>) -> Result<()>,
    ) -> Result<SumTiming> {
        let p = comm.size();
        let mut times = Vec::with_capacity(reps);
        for i in 0..WARM_UP + reps.max(1) {
            self.stream
                .memcpy_htod(fill, x)
                .doing("resetting the vector")?;
            self.synchronize()?;
            comm.barrier()?;
            let t = Instant::now();
            sum(self, x)?;
            self.synchronize()?;
            if i >= WARM_UP {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let got = self.stream.clone_dtoh(x).doing("reading the sum back")?;
        let want = (p * (p + 1) / 2) as f64;
        if let Some((i, v)) = got.iter().enumerate().find(|&(_, &v)| v != want) {
            return Err(Error::backend(
                "cuda",
                format!("the {path} sum gave {v} at value {i}, not {want}"),
            ));
        }
        times.sort_by(f64::total_cmp);
        let median_ms = times[times.len() / 2];
        let bytes = (8 * fill.len()) as f64;
        let algbw_gbs = bytes / (median_ms * 1e-3) / 1e9;
        Ok(SumTiming {
            path,
            values: fill.len(),
            ranks: p,
            median_ms,
            min_ms: times[0],
            algbw_gbs,
            busbw_gbs: algbw_gbs * 2.0 * (p as f64 - 1.0) / p as f64,
        })
    }
}
