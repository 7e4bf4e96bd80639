//! Spreading rows over ranks: a least-squares system that rank 0 loaded whole
//! ([`distribute_system`]), and the partition of a square system every rank holds
//! ([`partition_square_on`]). The splits themselves are pure functions of `partition`
//! ([`RowPartition`], METIS); here they become collectives.
//!
//! Ranks that read their own rows (the per-rank dataset load with its greedy LPT plan,
//! `pipeline::load`) do not come here.

use std::ops::Range;

use super::{agree, agree_on, Comm};
use crate::error::{Error, Result};
use crate::partition::blocks::RowPartition;
use crate::partition::graph::{
    metis_parts, partition_square, permutation_from_parts, PartitionMethod, SquarePartition,
};
use crate::sparse::Csr;
use crate::sparse::System;

/// The rows of `sys` in `range` (global indices), with their right-hand side values; the
/// kernel/damping split is carried over.
fn take_rows(sys: &System, range: Range<usize>) -> System {
    let rows: Vec<usize> = range.collect();
    let a = sys.a.select_rows(&rows);
    let b = rows.iter().map(|&i| sys.b[i]).collect();
    let kernel_rows = rows.iter().filter(|&&i| i < sys.kernel_rows).count();
    System { a, b, kernel_rows }
}

/// Collective: rank 0 runs `load` (the whole system), splits its rows into contiguous blocks
/// with `assign` (the system's row offsets and the rank count, e.g.
/// [`RowPartition::by_nnz_midpoints`]) and sends each rank its rows; every rank returns its
/// part. Other ranks never call `load`. Errors of rank 0's load reach every rank (through
/// [`agree`]). On one rank this is `load()`.
pub fn distribute_system(
    comm: &dyn Comm,
    load: impl FnOnce() -> Result<System>,
    assign: impl FnOnce(&[u64], usize) -> RowPartition,
) -> Result<System> {
    let (rank, size) = (comm.rank(), comm.size());
    if size == 1 {
        return load();
    }
    let loaded = if rank == 0 {
        load().map(Some)
    } else {
        Ok(None)
    };
    let loaded = agree(comm, loaded)?;
    // Rank 0 packs one message pair per rank: u64 [ncols, kernel rows, nrows, row lengths..,
    // column indices..] and f64 [values.., rhs..].
    let (send_u, send_f, mine) = match &loaded {
        Some(sys) => {
            let blocks = assign(sys.a.indptr(), size);
            let checked = blocks.check(sys.a.nrows(), size);
            let mut send_u = vec![Vec::new(); size];
            let mut send_f = vec![Vec::new(); size];
            let mut mine = None;
            if checked.is_ok() {
                for r in 0..size {
                    let part = take_rows(sys, blocks.range(r));
                    if r == 0 {
                        mine = Some(part);
                        continue;
                    }
                    let pi = part.a.indptr();
                    let mut u = Vec::with_capacity(3 + part.a.nrows() + part.a.nnz());
                    u.extend([
                        part.a.ncols() as u64,
                        part.kernel_rows as u64,
                        part.a.nrows() as u64,
                    ]);
                    u.extend(pi.windows(2).map(|w| w[1] - w[0]));
                    u.extend(part.a.indices().iter().map(|&c| c as u64));
                    let mut f = Vec::with_capacity(part.a.nnz() + part.b.len());
                    f.extend_from_slice(part.a.data());
                    f.extend_from_slice(&part.b);
                    send_u[r] = u;
                    send_f[r] = f;
                }
            }
            agree(comm, checked)?;
            (send_u, send_f, mine)
        }
        None => {
            agree(comm, Ok(()))?;
            (vec![Vec::new(); size], vec![Vec::new(); size], None)
        }
    };
    drop(loaded);
    let recv_u = comm.alltoallv_u64(&send_u)?;
    drop(send_u);
    let recv_f = comm.alltoallv(&send_f)?;
    drop(send_f);
    if let Some(mine) = mine {
        return Ok(mine);
    }
    unpack(&recv_u[0], &recv_f[0])
}

/// Rebuild a rank's rows from the two messages of [`distribute_system`].
fn unpack(u: &[u64], f: &[f64]) -> Result<System> {
    let bad = |what: &str| Error::Comm(format!("row distribution: malformed message ({what})"));
    if u.len() < 3 {
        return Err(bad("header"));
    }
    let (ncols, kernel_rows, nrows) = (u[0] as usize, u[1] as usize, u[2] as usize);
    let lens = u.get(3..3 + nrows).ok_or_else(|| bad("row lengths"))?;
    let cols = &u[3 + nrows..];
    let nnz = cols.len();
    if f.len() != nnz + nrows {
        return Err(bad("value count"));
    }
    let mut indptr = Vec::with_capacity(nrows + 1);
    indptr.push(0u64);
    let mut acc = 0u64;
    for &l in lens {
        acc += l;
        indptr.push(acc);
    }
    let indices = cols
        .iter()
        .map(|&c| u32::try_from(c).map_err(|_| bad("column index")))
        .collect::<Result<Vec<u32>>>()?;
    let a = Csr::try_new(nrows, ncols, indptr, indices, f[..nnz].to_vec())
        .map_err(|e| Error::Comm(format!("row distribution: {e}")))?;
    Ok(System {
        a,
        b: f[nnz..].to_vec(),
        kernel_rows,
    })
}

/// [`partition_square`] for the ranks of `comm`, every rank holding the whole matrix: METIS runs
/// on rank 0 alone and its parts are handed to every rank ([`agree_on`]), so that all ranks use
/// the same partition; an error on rank 0 becomes an error on every rank. Collective.
pub fn partition_square_on(
    comm: &dyn Comm,
    a: &Csr,
    method: PartitionMethod,
) -> Result<SquarePartition> {
    let p = comm.size();
    if method != PartitionMethod::Metis || p == 1 {
        return partition_square(a, method, p);
    }
    let parts = agree_on(comm, || metis_parts(a, p))?;
    if parts.len() != a.nrows() {
        return Err(Error::Comm(format!(
            "METIS partition broadcast: {} bytes for {} rows",
            4 * parts.len(),
            a.nrows()
        )));
    }
    let (perm, part) = permutation_from_parts(&parts, p)?;
    Ok(SquarePartition { method, perm, part })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SerialComm;

    #[test]
    fn take_rows_keeps_rhs_and_kernel_split() {
        let a = Csr::try_new(
            4,
            3,
            vec![0, 1, 3, 4, 6],
            vec![0, 1, 2, 2, 0, 1],
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        )
        .unwrap();
        let sys = System {
            a,
            b: vec![10.0, 20.0, 30.0, 40.0],
            kernel_rows: 2,
        };
        let part = take_rows(&sys, 1..3);
        assert_eq!(part.b, vec![20.0, 30.0]);
        assert_eq!(part.kernel_rows, 1);
        assert_eq!(part.a.indices(), &[1, 2, 2]);
        // The packed form round-trips.
        let mut u = vec![3, 1, 2, 2, 1];
        u.extend(part.a.indices().iter().map(|&c| c as u64));
        let mut f = part.a.data().to_vec();
        f.extend_from_slice(&part.b);
        let back = unpack(&u, &f).unwrap();
        assert_eq!(back.a, part.a);
        assert_eq!(back.b, part.b);
        assert!(unpack(&u[..4], &f).is_err());
    }

    #[test]
    fn distribute_on_one_rank_passes_through() {
        let sys = distribute_system(
            &SerialComm,
            || {
                Ok(System {
                    a: Csr::zeros(2, 2),
                    b: vec![0.0; 2],
                    kernel_rows: 2,
                })
            },
            RowPartition::by_nnz_midpoints,
        )
        .unwrap();
        assert_eq!(sys.a.nrows(), 2);
    }
}
