//! The ghosts a row partition of a square system implies (pure functions, no communication):
//! each rank's rows with renumbered columns (owned columns 0..n_local, ghosts n_local..), what
//! every rank sends and receives per product, and the communication volume of a partition.
//! `comm::halo::build_halo` asks the owners for the ghosts of a real job.

use crate::error::{Error, Result};
use crate::partition::blocks::RowPartition;
use crate::sparse::Csr;

/// A rank's rows with renumbered columns and what it receives.
#[derive(Debug, Clone)]
pub struct LocalRows {
    /// n_local x (n_local + ghosts.len()).
    pub a: Csr,
    /// Global index of each ghost column, sorted (hence grouped by owner rank).
    pub ghosts: Vec<u64>,
    /// Ghost counts received from each rank.
    pub recv_counts: Vec<usize>,
}

/// Renumber the columns of `rows` (this rank's rows, global column indices) for `rank`.
pub fn localize(rows: &Csr, part: &RowPartition, rank: usize) -> Result<LocalRows> {
    let own = part.range(rank);
    let nl = own.len();
    if rows.nrows() != nl || rows.ncols() != *part.bounds.last().unwrap_or(&0) {
        return Err(Error::Invalid(format!(
            "rank {rank}: {} x {} local rows do not match the partition ({nl} rows of {})",
            rows.nrows(),
            rows.ncols(),
            part.bounds.last().unwrap_or(&0)
        )));
    }
    let mut ghosts: Vec<u64> = rows
        .indices()
        .iter()
        .map(|&c| c as usize)
        .filter(|c| !own.contains(c))
        .map(|c| c as u64)
        .collect();
    ghosts.sort_unstable();
    ghosts.dedup();
    let mut recv_counts = vec![0usize; part.parts()];
    for &g in &ghosts {
        recv_counts[part.owner(g as usize)] += 1;
    }
    let ncols = nl + ghosts.len();
    let mut indptr = Vec::with_capacity(nl + 1);
    let mut idx = Vec::with_capacity(rows.nnz());
    let mut val = Vec::with_capacity(rows.nnz());
    let mut pairs: Vec<(u32, f64)> = Vec::new();
    indptr.push(0u64);
    for i in 0..nl {
        let (c, v) = rows.row(i);
        pairs.clear();
        for (&j, &x) in c.iter().zip(v) {
            let j = j as usize;
            let lj = if own.contains(&j) {
                j - own.start
            } else {
                nl + ghosts.binary_search(&(j as u64)).unwrap_or(0)
            };
            pairs.push((lj as u32, x));
        }
        pairs.sort_unstable_by_key(|p| p.0);
        for &(j, x) in &pairs {
            idx.push(j);
            val.push(x);
        }
        indptr.push(idx.len() as u64);
    }
    let a = Csr::try_new(nl, ncols, indptr, idx, val)?;
    Ok(LocalRows {
        a,
        ghosts,
        recv_counts,
    })
}

/// The halo exchange of one rank.
#[derive(Debug, Clone)]
pub struct HaloPlan {
    pub n_local: usize,
    /// Local indices of the x entries to send to each rank.
    pub send_idx: Vec<Vec<u32>>,
    /// Entries received from each rank (in the order of the ghost columns).
    pub recv_counts: Vec<usize>,
}

impl HaloPlan {
    /// Values this rank receives per product.
    pub fn recv_volume(&self) -> usize {
        self.recv_counts.iter().sum()
    }
    /// Ranks this rank receives from.
    pub fn recv_messages(&self) -> usize {
        self.recv_counts.iter().filter(|&&c| c > 0).count()
    }
}

/// Set-up for P simulated ranks of the whole matrix `a` (pure; no communication).
pub fn plan_all(a: &Csr, part: &RowPartition) -> Result<Vec<(LocalRows, HaloPlan)>> {
    let p = part.parts();
    let locals = (0..p)
        .map(|r| {
            let rows: Vec<usize> = part.range(r).collect();
            localize(&a.select_rows(&rows), part, r)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::with_capacity(p);
    for (r, l) in locals.iter().enumerate() {
        let own = part.range(r);
        let send_idx = locals
            .iter()
            .map(|other| {
                other
                    .ghosts
                    .iter()
                    .filter(|&&g| own.contains(&(g as usize)))
                    .map(|&g| (g as usize - own.start) as u32)
                    .collect()
            })
            .collect();
        out.push((
            l.clone(),
            HaloPlan {
                n_local: own.len(),
                send_idx,
                recv_counts: l.recv_counts.clone(),
            },
        ));
    }
    Ok(out)
}

/// Communication of one distributed product for a partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CommVolume {
    pub parts: usize,
    /// Values received per product, summed over ranks.
    pub total_values: usize,
    /// The largest count one rank receives.
    pub max_values: usize,
    /// Point-to-point messages per product.
    pub messages: usize,
    /// Largest and smallest nonzeros held by one rank.
    pub max_nnz: usize,
    pub min_nnz: usize,
}

/// Communication volume of a partition of `a`.
pub fn comm_volume(a: &Csr, part: &RowPartition) -> Result<CommVolume> {
    let plans = plan_all(a, part)?;
    let nnz: Vec<usize> = plans.iter().map(|(l, _)| l.a.nnz()).collect();
    Ok(CommVolume {
        parts: part.parts(),
        total_values: plans.iter().map(|(_, h)| h.recv_volume()).sum(),
        max_values: plans
            .iter()
            .map(|(_, h)| h.recv_volume())
            .max()
            .unwrap_or(0),
        messages: plans.iter().map(|(_, h)| h.recv_messages()).sum(),
        max_nnz: nnz.iter().copied().max().unwrap_or(0),
        min_nnz: nnz.iter().copied().min().unwrap_or(0),
    })
}
