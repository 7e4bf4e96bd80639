//! `solve --method gmres`: the run itself is [`crate::pipeline::square::solve_square`]; this
//! file prints its summary.

use anyhow::Context;

use crate::comm::Comm;
use crate::pipeline::square::{solve_square, GmresJob, GmresReport};
use crate::solver::gmres::{ConvergenceTest, PrecondSide};

/// Solve, write the outputs and print the summary on rank 0; returns the report there.
pub fn run(c: GmresJob, comm: &dyn Comm) -> anyhow::Result<Option<GmresReport>> {
    let Some(report) =
        solve_square(&c, comm).with_context(|| format!("GMRES on {}", c.matrix.display()))?
    else {
        return Ok(None);
    };
    let r = &report;
    eprintln!(
        "gmres({}) {} {} on {}: {} after {} iterations ({} restarts); relres {:.3e} (stopping residual {:.3e}); solve {:.3} s ({:.4} ms/iter)",
        r.restart,
        r.precond,
        match r.side {
            PrecondSide::Left => "left",
            PrecondSide::Right => "right",
        },
        r.backend,
        match (r.stop.converged, r.convergence_test) {
            // The report's words: PETSc's rule never looks at the true residual.
            (true, ConvergenceTest::PreconditionedOnly) => {
                "converged by the preconditioned residual alone (--stop petsc: the true residual was not checked)"
            }
            (true, _) => "converged",
            (false, _) => "NOT converged",
        },
        r.stop.iterations,
        r.stop.restarts,
        r.stop.relres,
        r.stop.precond_relres,
        r.seconds.solve,
        r.ms_per_iter
    );
    if comm.size() > 1 {
        let h = &r.halo;
        eprintln!(
            "partition {} on {} ranks: {} x values received per product (at most {} by one rank), {} messages; nonzeros per rank {} to {}",
            r.partition, h.parts, h.total_values, h.max_values, h.messages, h.min_nnz, h.max_nnz
        );
    }
    if !r.stop.converged {
        eprintln!(
            "seistomo: warning: GMRES did not converge: {} (report says converged=false; exit status 0)",
            r.stop.reason
        );
    }
    Ok(Some(report))
}
