//! Spreading a least-squares system over ranks by rows, and agreeing on errors.
//!
//! The row assignment is a plain function `(row nnz, ranks) -> Assignment`, so the paper's
//! greedy LPT over kernel row files (src/partition/rows.rs) can replace the contiguous split here
//! without touching the transport: [`distribute_system`] takes the assignment rule as an
//! argument.

use std::ops::Range;

use super::Comm;
use crate::error::{Error, Result};
use crate::sparse::Csr;
use crate::sparse::System;

/// For each rank, the global row ranges it owns, in increasing order. Together the ranges of all
/// ranks cover every row exactly once. A rank may own nothing.
pub type Assignment = Vec<Vec<Range<usize>>>;

/// Split rows into `nranks` contiguous blocks of about equal nonzero count (rank r gets the rows
/// whose nonzero midpoint lies in [r T / P, (r+1) T / P), T = total nonzeros), so each rank is
/// within one row's nonzeros of T / P. Ranks get rows in order; with more ranks than rows (or one
/// huge row) some ranks get none.
pub fn contiguous_nnz_split(row_nnz: &[u64], nranks: usize) -> Assignment {
    let nranks = nranks.max(1);
    let total: u128 = row_nnz.iter().map(|&c| c as u128).sum();
    let mut out = vec![Vec::new(); nranks];
    let mut start = 0usize;
    let mut prefix: u128 = 0;
    let mut row = 0usize;
    for (r, ranges) in out.iter_mut().enumerate() {
        let end = if r + 1 == nranks {
            row_nnz.len()
        } else {
            // Rows whose nonzeros start before the target go to this rank.
            let target = total * (r as u128 + 1) / nranks as u128;
            while row < row_nnz.len() && prefix + (row_nnz[row] as u128) / 2 < target {
                prefix += row_nnz[row] as u128;
                row += 1;
            }
            row
        };
        if end > start {
            ranges.push(start..end);
        }
        start = end;
    }
    out
}

/// Check that an assignment covers rows 0..nrows exactly once.
pub fn check_assignment(a: &Assignment, nrows: usize, nranks: usize) -> Result<()> {
    if a.len() != nranks {
        return Err(Error::Invalid(format!(
            "row assignment has {} ranks, the job has {nranks}",
            a.len()
        )));
    }
    let mut seen = vec![false; nrows];
    for (rank, ranges) in a.iter().enumerate() {
        for r in ranges {
            if r.end > nrows || r.start > r.end {
                return Err(Error::Invalid(format!(
                    "row assignment: rank {rank} gets rows {r:?} of {nrows}"
                )));
            }
            for i in r.clone() {
                if std::mem::replace(&mut seen[i], true) {
                    return Err(Error::Invalid(format!(
                        "row assignment: row {i} is assigned twice"
                    )));
                }
            }
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(Error::Invalid(format!(
            "row assignment: row {i} is assigned to no rank"
        )));
    }
    Ok(())
}

/// Collective: make every rank return the same outcome. When any rank holds an error, every rank
/// returns [`Error::Rank`] with the message of the lowest failing rank (the message names the
/// file, as every file error does), so that the job can end cleanly with that one line instead
/// of hanging in the next collective. On one rank the result is returned unchanged.
pub fn agree<T>(comm: &dyn Comm, r: Result<T>) -> Result<T> {
    if comm.size() == 1 {
        return r;
    }
    let (rank, size) = (comm.rank(), comm.size());
    let mine = if r.is_err() {
        (size - rank) as f64
    } else {
        0.0
    };
    let worst = comm.allreduce_max(mine)?;
    if worst == 0.0 {
        return r;
    }
    let failed = size - worst as usize;
    let mut msg = match (&r, rank == failed) {
        (Err(e), true) => match e {
            Error::Rank { msg, .. } => msg.clone().into_bytes(),
            e => e.to_string().into_bytes(),
        },
        _ => Vec::new(),
    };
    comm.broadcast_bytes(failed, &mut msg)?;
    Err(Error::Rank {
        rank: failed,
        msg: String::from_utf8_lossy(&msg).into_owned(),
    })
}

/// The rows of `sys` in `ranges` (global indices), with their right-hand side values; the
/// kernel/damping split is carried over.
fn take_rows(sys: &System, ranges: &[Range<usize>]) -> System {
    let rows: Vec<usize> = ranges.iter().flat_map(|r| r.clone()).collect();
    let a = sys.a.select_rows(&rows);
    let b = rows.iter().map(|&i| sys.b[i]).collect();
    let kernel_rows = rows.iter().filter(|&&i| i < sys.kernel_rows).count();
    System { a, b, kernel_rows }
}

/// Collective: rank 0 runs `load` (the whole system), splits its rows with `assign` and sends
/// each rank its rows; every rank returns its part. Other ranks never call `load`. Errors of
/// rank 0's load reach every rank (through [`agree`]). On one rank this is `load()`.
pub fn distribute_system(
    comm: &dyn Comm,
    load: impl FnOnce() -> Result<System>,
    assign: impl FnOnce(&[u64], usize) -> Assignment,
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
            let ip = sys.a.indptr();
            let row_nnz: Vec<u64> = ip.windows(2).map(|w| w[1] - w[0]).collect();
            let assignment = assign(&row_nnz, size);
            let checked = check_assignment(&assignment, sys.a.nrows(), size);
            let mut send_u = vec![Vec::new(); size];
            let mut send_f = vec![Vec::new(); size];
            let mut mine = None;
            if checked.is_ok() {
                for (r, ranges) in assignment.iter().enumerate() {
                    let part = take_rows(sys, ranges);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SerialComm;

    fn nnz_of(row_nnz: &[u64], ranges: &[Range<usize>]) -> u64 {
        ranges
            .iter()
            .flat_map(|r| r.clone())
            .map(|i| row_nnz[i])
            .sum()
    }

    #[test]
    fn contiguous_split_covers_rows_and_balances_nnz() {
        let mut rng = crate::grid::Rng::new(7);
        for &(rows, ranks) in &[
            (1000usize, 1usize),
            (1000, 3),
            (997, 4),
            (10, 7),
            (3, 4),
            (0, 2),
        ] {
            let row_nnz: Vec<u64> = (0..rows).map(|_| 1 + rng.below(40)).collect();
            let a = contiguous_nnz_split(&row_nnz, ranks);
            check_assignment(&a, rows, ranks).unwrap();
            for w in a.iter().flatten().collect::<Vec<_>>().windows(2) {
                assert_eq!(w[0].end, w[1].start, "contiguous and in rank order");
            }
            let total: u64 = row_nnz.iter().sum();
            if rows >= 100 * ranks {
                for ranges in &a {
                    let share = nnz_of(&row_nnz, ranges) as f64;
                    let ideal = total as f64 / ranks as f64;
                    assert!((share - ideal).abs() <= 40.0, "share {share} vs {ideal}");
                }
            }
        }
        // More ranks than rows: some ranks own nothing, every row is owned once.
        let a = contiguous_nnz_split(&[5, 5, 5], 4);
        assert_eq!(a.iter().filter(|r| r.is_empty()).count(), 1);
        // One dominant row: its rank gets it alone.
        let a = contiguous_nnz_split(&[1, 1000, 1, 1], 2);
        check_assignment(&a, 4, 2).unwrap();
        assert!(a.iter().all(|r| !r.is_empty()));
    }

    #[test]
    fn check_assignment_rejects_gaps_and_overlaps() {
        assert!(check_assignment(&vec![vec![0..2], vec![3..4]], 4, 2).is_err());
        assert!(check_assignment(&vec![vec![0..3], vec![2..4]], 4, 2).is_err());
        assert!(check_assignment(&vec![vec![0..5]], 4, 1).is_err());
        assert!(check_assignment(&vec![vec![0..4]], 4, 2).is_err());
        check_assignment(&vec![vec![2..4], vec![0..2]], 4, 2).unwrap();
    }

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
        let part = take_rows(&sys, &[1..2, 3..4]);
        assert_eq!(part.b, vec![20.0, 40.0]);
        assert_eq!(part.kernel_rows, 1);
        assert_eq!(part.a.indices(), &[1, 2, 0, 1]);
        // The packed form round-trips.
        let mut u = vec![3, 1, 2, 2, 2];
        u.extend(part.a.indices().iter().map(|&c| c as u64));
        let mut f = part.a.data().to_vec();
        f.extend_from_slice(&part.b);
        let back = unpack(&u, &f).unwrap();
        assert_eq!(back.a, part.a);
        assert_eq!(back.b, part.b);
        assert!(unpack(&u[..4], &f).is_err());
    }

    #[test]
    fn agree_and_distribute_on_one_rank_pass_through() {
        let e: Result<()> = Err(Error::Invalid("x".into()));
        assert!(matches!(agree(&SerialComm, e), Err(Error::Invalid(_))));
        let sys = distribute_system(
            &SerialComm,
            || {
                Ok(System {
                    a: Csr::zeros(2, 2),
                    b: vec![0.0; 2],
                    kernel_rows: 2,
                })
            },
            contiguous_nnz_split,
        )
        .unwrap();
        assert_eq!(sys.a.nrows(), 2);
    }
}
