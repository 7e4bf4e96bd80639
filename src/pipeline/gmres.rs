//! Distributed GMRES on square systems: the partition agreed by all ranks, then the solve of
//! one rank's rows on the CPU or the GPU (the same preconditioner set-up and solver for both).

use crate::backend::cpu::square::DistSquareOperator;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaIluSweeps, CudaSquareOperator};
use crate::backend::Precision;
use crate::comm::{agree, Comm};
use crate::error::{Error, Result};
use crate::partition::graph::{
    metis_parts, partition_square, permutation_from_parts, PartitionMethod, RowPartition,
    SquarePartition,
};
use crate::solver::dist_square::{square_precond, SquarePrecond, SquareSolve};
use crate::solver::gmres::{gmres, GmresMonitor, GmresParams};
use crate::sparse::Csr;

/// GMRES on the CPU for one rank of a job: `rows` are this rank's rows of the square matrix
/// (global column indices, rows `part.range(comm.rank())`), `b` and `x0` this rank's entries.
/// Every rank calls it; the same code runs on one rank with [`crate::comm::SerialComm`].
#[allow(clippy::too_many_arguments)]
pub fn gmres_square_cpu(
    comm: &dyn Comm,
    rows: &Csr,
    part: &RowPartition,
    b: &[f64],
    x0: Option<&[f64]>,
    precond: SquarePrecond,
    params: &GmresParams,
    monitor: &mut dyn GmresMonitor,
) -> Result<SquareSolve> {
    let t0 = std::time::Instant::now();
    let be = CpuBackend::new();
    let op = DistSquareOperator::distributed(rows, part, comm)?;
    let halo = op.comm_volume()?;
    let row0 = part.range(comm.rank()).start;
    let (mut pc, counts) = square_precond(&be, comm, &op, row0, precond, |f| Ok(Box::new(f)))?;
    let setup_seconds = t0.elapsed().as_secs_f64();
    let sol = gmres(&be, &op, pc.as_mut(), comm, b, x0, params, monitor)?;
    Ok(SquareSolve {
        x_local: sol.x,
        info: sol.info,
        precond: pc.name(),
        jacobi_zero_diagonals: counts.zero_diagonals,
        ilu_replaced_pivots: counts.replaced_pivots,
        ilu_inserted_diagonals: counts.inserted_diagonals,
        setup_seconds,
        halo,
    })
}

/// GMRES on the GPU for one rank of a job: `rows` are this rank's rows of the square matrix
/// (global column indices, rows `part.range(comm.rank())`), `b` and `x0` this rank's entries.
/// Every rank calls it. Matrix values are stored in `precision`; vectors are f64.
#[allow(clippy::too_many_arguments)]
pub fn gmres_square_cuda(
    be: &CudaBackend,
    comm: &dyn Comm,
    rows: &Csr,
    part: &RowPartition,
    b: &[f64],
    x0: Option<&[f64]>,
    precond: SquarePrecond,
    precision: Precision,
    params: &GmresParams,
    monitor: &mut dyn GmresMonitor,
) -> Result<SquareSolve> {
    let t0 = std::time::Instant::now();
    let cpu = DistSquareOperator::distributed(rows, part, comm)?;
    let halo = cpu.comm_volume()?;
    let row0 = part.range(comm.rank()).start;
    let (mut pc, counts) = square_precond(be, comm, &cpu, row0, precond, |f| {
        Ok(Box::new(CudaIluSweeps::new(be, &f)?))
    })?;
    let op = CudaSquareOperator::new(be, &cpu, comm, precision)?;
    drop(cpu);
    be.synchronize()?;
    let setup_seconds = t0.elapsed().as_secs_f64();
    let sol = gmres(be, &op, pc.as_mut(), comm, b, x0, params, monitor)?;
    Ok(SquareSolve {
        x_local: sol.x,
        info: sol.info,
        precond: pc.name(),
        jacobi_zero_diagonals: counts.zero_diagonals,
        ilu_replaced_pivots: counts.replaced_pivots,
        ilu_inserted_diagonals: counts.inserted_diagonals,
        setup_seconds,
        halo,
    })
}

/// [`partition_square`] for the ranks of `comm`, every rank holding the whole matrix: METIS runs
/// on rank 0 alone and its parts are broadcast, so that all ranks use the same partition; an
/// error on rank 0 becomes an error on every rank. Collective.
pub fn partition_square_on(
    comm: &dyn Comm,
    a: &Csr,
    method: PartitionMethod,
) -> Result<SquarePartition> {
    let p = comm.size();
    if method != PartitionMethod::Metis || p == 1 {
        return partition_square(a, method, p);
    }
    let mine = if comm.is_root() {
        metis_parts(a, p)
    } else {
        Ok(Vec::new())
    };
    let parts = agree(comm, mine)?;
    let mut bytes: Vec<u8> = parts.iter().flat_map(|v| v.to_le_bytes()).collect();
    comm.broadcast_bytes(0, &mut bytes)?;
    if bytes.len() != 4 * a.nrows() {
        return Err(Error::Comm(format!(
            "METIS partition broadcast: {} bytes for {} rows",
            bytes.len(),
            a.nrows()
        )));
    }
    let parts: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (perm, part) = permutation_from_parts(&parts, p)?;
    Ok(SquarePartition { method, perm, part })
}
