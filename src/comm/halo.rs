//! Distributed sparse products for square systems (GMRES): rows of A, and the entries of x and b,
//! are split into contiguous blocks, one per rank. Each rank receives only the x entries its rows
//! reference ("ghosts"), packed into one compressed buffer placed right after its own entries;
//! its local columns are renumbered (owned columns 0..n_local, ghosts n_local..) so that the
//! received values are used in place by the local CSR product (Khodja et al. 2014).
//!
//! Set-up: [`localize`] renumbers a rank's rows (pure function); [`build_halo`] asks every owner
//! for its ghosts with one [`Comm::alltoallv_u64`]; [`plan_all`] does the same for P simulated
//! ranks at once (pure; used for tests and for the communication volume of a partition). The
//! pure half lives in `partition/halo.rs` (re-exported here); this file holds the collective.
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::partition::blocks::RowPartition;
pub use crate::partition::halo::{
    comm_volume, localize, plan_all, CommVolume, HaloPlan, LocalRows,
};

/// Build this rank's halo plan: ask each owner for the ghosts (one all-to-all of indices).
pub fn build_halo(comm: &dyn Comm, local: &LocalRows, part: &RowPartition) -> Result<HaloPlan> {
    let p = comm.size();
    if part.parts() != p {
        return Err(Error::Invalid(format!(
            "partition has {} parts but the job has {p} ranks",
            part.parts()
        )));
    }
    let mut req: Vec<Vec<u64>> = vec![Vec::new(); p];
    for &g in &local.ghosts {
        req[part.owner(g as usize)].push(g);
    }
    let asked = comm.alltoallv_u64(&req)?;
    let own = part.range(comm.rank());
    let mut send_idx = Vec::with_capacity(p);
    for (r, list) in asked.iter().enumerate() {
        let mut s = Vec::with_capacity(list.len());
        for &g in list {
            if !own.contains(&(g as usize)) {
                return Err(Error::Comm(format!(
                    "rank {r} asked rank {} for x[{g}], which it does not own",
                    comm.rank()
                )));
            }
            s.push((g as usize - own.start) as u32);
        }
        send_idx.push(s);
    }
    Ok(HaloPlan {
        n_local: own.len(),
        send_idx,
        recv_counts: local.recv_counts.clone(),
    })
}
