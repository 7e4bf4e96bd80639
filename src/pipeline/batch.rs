//! A batch of LSQR solves of one system that differ by the weight of its regularisation rows, by
//! LSQR's damping or by the right-hand side: laid out once (the single solve's preparation, so
//! the same row order and sums), solved by batched LSQR on one block operator
//! (src/solver/lsqr_batch.rs), each member's solution mapped back and reported as its own solve
//! would be. `lcurve` (all weights in one run) and `invert`'s weight choice run it.

use std::time::Instant;

use crate::backend::batch::{BatchBackend, BlockOperator};
use crate::backend::storage::Storage;
use crate::backend::storage::{StoredMatrix, StoredRows};
use crate::backend::TransposeStrategy;
use crate::backend::{Backend, Operator};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::model::report::{Calibration, Fit, Outcome, Report, Seconds};
use crate::pipeline::fit::{BlockFitter, FitRows};
use crate::pipeline::operators::{choose_backend, BatchVisitor, Engine, LsqrVisitor};
use crate::pipeline::options::{BackendChoice, SolveOptions};
use crate::pipeline::prepare::{prepare, Unmap};
use crate::pipeline::solve::layout_for;
pub use crate::solver::lsqr_batch::Member;
use crate::solver::lsqr_batch::{lsqr_batch_handoff, resume, Handover, MemberEnd, MemberResult};
use crate::solver::{LsqMethod, LsqrParams};
use crate::sparse::{Csr, System};

/// A batch's matrix: [G; R] with R's rows unweighted and the row where R starts (None: no R,
/// the members differ by damping).
pub struct BatchSystem {
    pub a: Csr,
    pub reg_from: Option<usize>,
}

/// Nonzeros from which the GPU runs a batch of solves (an L-curve's weights) as one batch by
/// default (`[tuning] gpu_batch` unset). Measured on an H100 (docs/performance.md, "Batched LSQR
/// on the GPU"), the L-curve of 16 weights, 300 iterations each, f64 defaults, wall time batched
/// against one solve after another: 5.0M nonzeros 1.0 s against 4.1 s, 12.7M 1.4 against 6.3,
/// 55M 5.2 against 9.7, 101M 7.8 against 31.0; australia (1.4M nonzeros, 11 weights to
/// convergence) 4.1 against 1.7: there the batch's host loop (0.28 ms an iteration) outweighs
/// its work, the single solve's device loop takes 0.03 ms.
pub const GPU_BATCH_MIN_NNZ: usize = 4_000_000;

/// Why the solves of `opts` on a matrix of `nnz` nonzeros cannot run as one batch (None: they
/// can; then each member equals its own solve): the batch is LSQR with the explicit transpose,
/// CSR storage on the CPU (the GPU's batch stores its own column tiles with any `storage`), no
/// column scaling (its factors depend on the weight) and no x0; on the GPU, where `[tuning]
/// gpu_batch` asks for it or from [`GPU_BATCH_MIN_NNZ`] nonzeros.
pub fn batch_blocker(opts: &SolveOptions, nnz: usize) -> Option<Blocker> {
    if opts.method != LsqMethod::Lsqr {
        return Some("the batch is LSQR's (method = lsmr)".into());
    }
    if opts.col_scale {
        return Some("col_scale: the column scales differ per weight".into());
    }
    if opts.x0.is_some() {
        return Some("x0 is set".into());
    }
    if opts.operator.transpose == TransposeStrategy::Scatter {
        return Some("transpose = scatter".into());
    }
    match choose_backend(opts.operator.backend) {
        // The GPU's batch keeps its own column tiles whatever the single solve would store; it
        // runs where asked for, or by default on large matrices (GPU_BATCH_MIN_NNZ).
        Ok((BackendChoice::Cuda, _)) => match opts.operator.tuning.gpu_batch {
            Some(true) => None,
            Some(false) => Some("[tuning] gpu_batch = false".into()),
            None if nnz >= GPU_BATCH_MIN_NNZ => None,
            // (the threshold in the words from the constant itself, so the two cannot drift)
            None => Some(Blocker {
                reason: format!(
                    "on the GPU one solve after another measured faster than the batch below {}M nonzeros",
                    GPU_BATCH_MIN_NNZ / 1_000_000
                ),
                config: Some("[tuning] gpu_batch = true"),
            }),
        },
        Ok(_) if opts.operator.storage == Storage::Compact => {
            Some("storage = compact (the CPU's batch stores CSR)".into())
        }
        Err(e) => Some(e.to_string().into()),
        _ => None,
    }
}

/// Why solves cannot run as one batch ([`batch_blocker`]): the reason, and the config setting
/// that runs the batch anyway where one does. Shown as "reason (setting runs it)".
#[derive(Debug, Clone, PartialEq)]
pub struct Blocker {
    pub reason: String,
    /// A run config's setting that lifts it (None: nothing does).
    pub config: Option<&'static str>,
}

impl From<&str> for Blocker {
    fn from(reason: &str) -> Blocker {
        Blocker {
            reason: reason.into(),
            config: None,
        }
    }
}

impl From<String> for Blocker {
    fn from(reason: String) -> Blocker {
        Blocker {
            reason,
            config: None,
        }
    }
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)?;
        match self.config {
            Some(c) => write!(f, " ({c} runs it)"),
            None => Ok(()),
        }
    }
}

/// Solve the members of a batch: `rhs[j]` is member j's right-hand side (all rows, the system's
/// order), `members[j]` its weight and damping; `opts` as a single solve's (its damp is each
/// member's). `finished(group)` gets each member's `(j, outcome)` as it stops, the members that
/// stopped together (or were waiting together) in one group: x in the original columns and a
/// report as its own solve's, with the batch's times.
pub fn solve_batch(
    sys: BatchSystem,
    rhs: &[&[f64]],
    members: &[Member],
    opts: &SolveOptions,
    comm: &dyn Comm,
    finished: &mut (dyn FnMut(Vec<(usize, Outcome)>) + Send),
) -> Result<()> {
    let setup_started = Instant::now();
    crate::ui::phases::take();
    if let Some(why) = batch_blocker(opts, sys.a.nnz()) {
        return Err(Error::Invalid(format!("no batched solve: {why}")));
    }
    let BatchSystem { a, reg_from } = sys;
    let m = a.nrows();
    if rhs.len() != members.len() || rhs.iter().any(|b| b.len() != m) {
        return Err(Error::Invalid(format!(
            "a batch of {} members needs as many right-hand sides of {m} values",
            members.len()
        )));
    }
    let (kind, _) = choose_backend(opts.operator.backend)?;
    let engine = Engine::start(
        kind,
        comm,
        (opts.operator.allreduce, false),
        &opts.operator.tuning,
    )?;
    let gpu = kind == BackendChoice::Cuda;
    let layout = layout_for(opts, &engine, a.nnz());
    if layout.storage != Storage::Csr && !gpu {
        return Err(Error::Invalid(
            "no batched solve: storage is not CSR".into(),
        ));
    }
    // The batch lays the rows out as a CSR solve does (the same row and cell order).
    let layout = crate::pipeline::prepare::Layout {
        storage: Storage::Csr,
        ..layout
    };
    let kernel_rows = reg_from.unwrap_or(m);
    let b0 = rhs.first().map_or_else(|| vec![0.0; m], |b| b.to_vec());
    let p = prepare(
        System {
            a,
            b: b0,
            kernel_rows,
        },
        &layout,
        comm,
    )?;
    let old = |i: usize| p.unmap.ordering.rows.as_ref().map_or(i, |r| r[i]);
    let rows = p.matrix.rows.into_csr()?;
    let weighted = reg_from.map(|g| (0..rows.nrows()).map(|i| old(i) >= g).collect());
    let rhs: Vec<Vec<f64>> = {
        use rayon::prelude::*;
        rhs.par_iter()
            .map(|b| (0..m).map(|i| b[old(i)]).collect())
            .collect()
    };
    let (n, nnz) = (rows.ncols(), p.nnz);
    // the members' fits on the block operator (one process: its rows are all the rows)
    let fit = if opts.fit && comm.size() == 1 {
        FitRows::new(rows.nrows(), kernel_rows, old)
    } else {
        None
    };
    let v = Run {
        rhs: &rhs,
        members,
        params: &opts.params,
        unmap: &p.unmap,
        comm,
        engine: &engine,
        spec: &opts.operator,
        handoff: if gpu { 0 } else { HANDOFF },
        fit: fit.as_ref(),
        facts: Facts {
            m: p.m,
            n,
            nnz,
            k: members.len(),
            tuning: &opts.operator.tuning,
            setup_started,
        },
        finished,
    };
    engine.batch(comm, rows, weighted, opts.operator.precision, v)
}

/// What every member's report shares.
struct Facts<'a> {
    m: usize,
    n: usize,
    nnz: usize,
    k: usize,
    tuning: &'a crate::settings::tuning::Tuning,
    setup_started: Instant,
}

/// The batch on the block operator the factory built.
struct Run<'a, 'f> {
    rhs: &'a [Vec<f64>],
    members: &'a [Member],
    params: &'a LsqrParams,
    unmap: &'a Unmap,
    comm: &'a dyn Comm,
    /// The engine (the single solver's operators for handed-over members).
    engine: &'a Engine,
    spec: &'a crate::pipeline::options::OperatorSpec,
    /// Members left that go on alone ([`HANDOFF`] on the CPU; never on the GPU, where a batch
    /// of one or two costs less than a new operator's set-up).
    handoff: usize,
    /// Where the kernel rows are: each member's fit is made on the block operator as it stops
    /// (None: no fits).
    fit: Option<&'a FitRows>,
    facts: Facts<'a>,
    finished: &'f mut (dyn FnMut(Vec<(usize, Outcome)>) + Send),
}

impl BatchVisitor for Run<'_, '_> {
    type Output = ();
    fn visit<B: BatchBackend, O: BlockOperator<B>>(self, be: &B, op: &O) -> Result<()> {
        let started = Instant::now();
        let setup = started
            .duration_since(self.facts.setup_started)
            .as_secs_f64();
        let phases = crate::ui::phases::take();
        let refs: Vec<&[f64]> = self.rhs.iter().map(|b| b.as_slice()).collect();
        let Run {
            members,
            params,
            unmap,
            comm,
            engine,
            spec,
            handoff,
            fit,
            facts,
            finished,
            ..
        } = self;
        let describe = be.describe();
        let (backend, storage) = (be.name(), op.describe());
        let outcome = |j: usize, r: &MemberResult, fit: Option<Fit>| {
            let mut solution = r.solution.clone();
            unmap.restore(&mut solution.x, solution.var.as_mut());
            let p = LsqrParams {
                damp: members[j].damp,
                ..params.clone()
            };
            let mut report = member_report(&facts, &p, &solution.info, (setup, comm.size()));
            report.backend = backend.into();
            report.storage = storage.clone();
            report.backend_detail = describe.clone();
            report.reorder = unmap.ordering.what.clone();
            report.setup_phases = phases.clone();
            Outcome {
                solution,
                history: r.history.clone(),
                report,
                calibration: Calibration::default(),
                coverage: None,
                fit,
            }
        };
        let mut each = |group: Vec<(usize, MemberResult, Option<Fit>)>| {
            finished(
                group
                    .into_iter()
                    .map(|(j, r, f)| (j, outcome(j, &r, f)))
                    .collect(),
            );
        };
        // Each member's outcome (its x mapped back, and whatever `finished` does with it: an
        // L-curve point's norms on the host) is made on a thread of its own while the batch
        // goes on (measured: 16 members of the 101M-nonzero system spent 1.2-1.6 s of a 4.4 s
        // GPU batch in `finished` between iterations).
        let mut fitter = fit.map(BlockFitter::new);
        let (ends, mut each) = std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel::<(usize, MemberResult, Option<Fit>)>();
            let consumer = s.spawn(move || {
                // the members waiting together go as one group (an L-curve's norms take one
                // pass over the matrix for the group)
                while let Ok(first) = rx.recv() {
                    let mut group = vec![first];
                    group.extend(rx.try_iter());
                    each(group);
                }
                each
            });
            let ends = lsqr_batch_handoff(
                be,
                op,
                comm,
                (&refs, members),
                params,
                handoff,
                &mut |j, r| {
                    // its fit while the operator holds the batch's last products (a product
                    // and its rows brought back: milliseconds); a member without one (where
                    // making it failed) has its products made on the host by the caller
                    let f = fitter
                        .as_mut()
                        .and_then(|f| f.fit(be, op, (&r.solution.x, members[j].weight)).ok());
                    // the receiver lives until the sender is dropped below
                    let _ = tx.send((j, r.clone(), f));
                },
            );
            drop(tx);
            crate::ui::phases::trace(format_args!("batch iterations done"));
            if let Some(f) = &fitter {
                crate::ui::phases::trace(format_args!("fits in {:.3} s", f.seconds));
            }
            // This thread may be one of rayon's workers (the CPU batch runs on the pool), and
            // the consumer's own parallel loops need a free worker: with one thread, or
            // several batches at once, a plain join would wait for a consumer that waits for
            // this worker. So it waits working off the pool's queue.
            while !consumer.is_finished() {
                if rayon::yield_now() != Some(rayon::Yield::Executed) {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
            match consumer.join() {
                Ok(each) => (ends, each),
                Err(p) => std::panic::resume_unwind(p),
            }
        });
        crate::ui::phases::trace(format_args!("batch consumer done"));
        let ends = ends?;
        for (j, end) in ends.into_iter().enumerate() {
            if let MemberEnd::Handed(h) = end {
                let p = LsqrParams {
                    damp: members[j].damp,
                    ..params.clone()
                };
                let rows = StoredMatrix {
                    rows: StoredRows::Csr(op.member_matrix(members[j].weight)),
                    stencil: None,
                    storage: Storage::Csr,
                };
                let v = Resume {
                    h: *h,
                    params: &p,
                    comm,
                };
                let (r, _) = engine.lsqr(spec, comm, rows, false, v)?;
                each(vec![(j, r, None)]);
            }
        }
        Ok(())
    }
}

/// Members left in a CPU batch that go on alone: measured on australia (2 cores), a batch of one
/// or two costs more than their single solves (the single products' loops for runs of equal
/// short rows), from three on less.
const HANDOFF: usize = 2;

/// A handed-over member on the single solver's operator.
struct Resume<'a> {
    h: Handover,
    params: &'a LsqrParams,
    comm: &'a dyn Comm,
}

impl LsqrVisitor for Resume<'_> {
    type Output = MemberResult;
    fn visit<B: Backend, O: Operator<B>>(self, be: &B, op: &O) -> Result<MemberResult> {
        resume(be, op, self.comm, self.h, self.params)
    }
}

/// A member's report.json: as its own solve's, the solve's seconds those of the batch until
/// the member stopped.
fn member_report(
    f: &Facts,
    p: &LsqrParams,
    info: &crate::solver::LsqrInfo,
    (setup, ranks): (f64, usize),
) -> Report {
    Report {
        backend_reason: format!("batched LSQR ({} members on one pass over the matrix)", f.k),
        transpose: "csc".into(),
        lsqr_loop: "host (batched)".into(),
        allreduce: String::new(),
        tuning: f.tuning.clone(),
        ranks,
        threads: rayon::current_num_threads(),
        m: f.m,
        nnz: f.nnz,
        damp: p.damp,
        atol: p.atol,
        btol: p.btol,
        conlim: p.conlim,
        iter_lim: p.iter_lim.unwrap_or(2 * f.n),
        seconds: Seconds::new(0.0, setup, info.seconds),
        ..Report::of_solution("lsqr", f.n, info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocker_shows_the_setting_that_lifts_it_and_keeps_the_reason_alone() {
        let b = Blocker {
            reason: "below 4M nonzeros".into(),
            config: Some("[tuning] gpu_batch = true"),
        };
        assert_eq!(
            b.to_string(),
            "below 4M nonzeros ([tuning] gpu_batch = true runs it)"
        );
        assert_eq!(b.reason, "below 4M nonzeros");
        assert_eq!(Blocker::from("x0 is set").to_string(), "x0 is set");
        let mut opts = SolveOptions::new(Default::default(), BackendChoice::Cpu);
        opts.x0 = Some("x0.txt".into());
        assert_eq!(batch_blocker(&opts, 10), Some("x0 is set".into()));
    }
}
