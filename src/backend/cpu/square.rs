//! A rank's rows of a square matrix on the CPU, with the halo exchange built in
//! ([`crate::comm::halo`]): the operator of a distributed GMRES.

use std::sync::Mutex;

use rayon::prelude::*;

use crate::backend::cpu::CpuBackend;
use crate::backend::{Operator, Scale};
use crate::comm::halo::{build_halo, localize, CommVolume, HaloPlan, LocalRows};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::partition::graph::RowPartition;
use crate::sparse::Csr;

/// This rank's rows of a square matrix on the CPU, with the halo exchange built in: `apply` takes
/// and returns vectors of this rank's n_local entries.
pub struct DistSquareOperator<'c> {
    a: Csr,
    plan: HaloPlan,
    comm: &'c dyn Comm,
    /// [x_local, ghosts] and the send buffers, allocated once.
    ext: Mutex<(Vec<f64>, Vec<Vec<f64>>)>,
}

impl<'c> DistSquareOperator<'c> {
    pub fn new(local: LocalRows, plan: HaloPlan, comm: &'c dyn Comm) -> Self {
        let ncols = local.a.ncols();
        let sends = plan
            .send_idx
            .iter()
            .map(|s| Vec::with_capacity(s.len()))
            .collect();
        DistSquareOperator {
            a: local.a,
            plan,
            comm,
            ext: Mutex::new((vec![0.0; ncols], sends)),
        }
    }
    /// One rank holding the whole square matrix (no exchange).
    pub fn serial(a: Csr, comm: &'c dyn Comm) -> Result<Self> {
        if a.nrows() != a.ncols() {
            return Err(Error::Invalid(format!(
                "GMRES needs a square matrix; got {} x {}",
                a.nrows(),
                a.ncols()
            )));
        }
        let part = RowPartition::contiguous(a.nrows(), 1);
        let local = localize(&a, &part, 0)?;
        let plan = HaloPlan {
            n_local: a.nrows(),
            send_idx: vec![Vec::new()],
            recv_counts: vec![0],
        };
        Ok(Self::new(local, plan, comm))
    }
    /// Build from this rank's rows (global columns) with one index exchange.
    pub fn distributed(rows: &Csr, part: &RowPartition, comm: &'c dyn Comm) -> Result<Self> {
        let local = localize(rows, part, comm.rank())?;
        let plan = build_halo(comm, &local, part)?;
        Ok(Self::new(local, plan, comm))
    }
    /// The local matrix (owned columns first, then ghosts).
    pub fn local_matrix(&self) -> &Csr {
        &self.a
    }
    pub fn plan(&self) -> &HaloPlan {
        &self.plan
    }
    /// The communication of one product over all ranks (collective: every rank calls it).
    pub fn comm_volume(&self) -> Result<CommVolume> {
        let c = self.comm;
        let recv = self.plan.recv_volume();
        let mut sums = [recv as f64, self.plan.recv_messages() as f64];
        c.allreduce_sum(&mut sums)?;
        let nnz = self.a.nnz() as f64;
        Ok(CommVolume {
            parts: c.size(),
            total_values: sums[0].round() as usize,
            max_values: c.allreduce_max(recv as f64)?.round() as usize,
            messages: sums[1].round() as usize,
            max_nnz: c.allreduce_max(nnz)?.round() as usize,
            min_nnz: (-c.allreduce_max(-nnz)?).round() as usize,
        })
    }
    /// This rank's diagonal entries (0 where absent).
    pub fn diagonal(&self) -> Vec<f64> {
        let n = self.plan.n_local;
        (0..n)
            .map(|i| {
                let (c, v) = self.a.row(i);
                c.binary_search(&(i as u32)).map(|k| v[k]).unwrap_or(0.0)
            })
            .collect()
    }
}

impl Operator<CpuBackend> for DistSquareOperator<'_> {
    fn nrows(&self) -> usize {
        self.plan.n_local
    }
    fn ncols(&self) -> usize {
        self.plan.n_local
    }
    fn apply(&self, _be: &CpuBackend, s: Scale, x: &Vec<f64>, y: &mut Vec<f64>) -> Result<()> {
        let n = self.plan.n_local;
        assert!(x.len() == n && y.len() == n);
        let mut guard = self.ext.lock().unwrap_or_else(|e| e.into_inner());
        let (ext, sends) = &mut *guard;
        if self.a.ncols() > n {
            ext[..n].copy_from_slice(x);
        }
        if self.comm.size() > 1 {
            for (buf, idx) in sends.iter_mut().zip(&self.plan.send_idx) {
                buf.clear();
                buf.extend(idx.iter().map(|&i| x[i as usize]));
            }
            // The Comm trait returns fresh buffers: the one allocation per product.
            let recv = self.comm.alltoallv(sends)?;
            let mut off = n;
            for (r, (got, &want)) in recv.iter().zip(&self.plan.recv_counts).enumerate() {
                if got.len() != want {
                    return Err(Error::Comm(format!(
                        "halo exchange: rank {r} sent {} values, expected {want}",
                        got.len()
                    )));
                }
                ext[off..off + want].copy_from_slice(got);
                off += want;
            }
        }
        let a = &self.a;
        // Without ghosts the local columns are x itself: skip the copy.
        let ext: &[f64] = if a.ncols() == n { x } else { &ext[..] };
        let body = |(i, yi): (usize, &mut f64)| {
            let (c, v) = a.row(i);
            let mut acc = 0.0;
            for (&j, &aij) in c.iter().zip(v) {
                acc += aij * ext[j as usize];
            }
            *yi = if s.beta == 0.0 {
                s.alpha * acc
            } else {
                s.alpha * acc + s.beta * *yi
            };
        };
        if a.nnz() < 64 * 1024 {
            y.iter_mut().enumerate().for_each(body);
        } else {
            y.par_iter_mut()
                .with_min_len(4096)
                .enumerate()
                .for_each(body);
        }
        Ok(())
    }
    fn apply_t(&self, _be: &CpuBackend, _s: Scale, _y: &Vec<f64>, _x: &mut Vec<f64>) -> Result<()> {
        Err(Error::Invalid(
            "the distributed square operator has no transpose product (GMRES does not need one)"
                .into(),
        ))
    }
}
