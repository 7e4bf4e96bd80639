//! LSQR with checkpoints: the solver's loop wrapped by a monitor that writes the state every
//! `every` iterations (file format: [`crate::model::checkpoint`]) and resumes from one.

use std::path::PathBuf;

use crate::backend::{Backend, Operator};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::model::checkpoint::{
    read_checkpoint, write_checkpoint, Checkpointing, HostState, Loaded,
};
use crate::solver::{
    download_solution, lsqr_iterate, lsqr_start, IterRecord, LsqrMonitor, LsqrParams, LsqrScalars,
    LsqrSolution, LsqrVectors,
};

/// Wraps the caller's monitor: shifts times after a resume, keeps the history and writes
/// checkpoints.
struct CkMonitor<'a, B: Backend> {
    inner: &'a mut dyn LsqrMonitor<B>,
    ck: &'a Checkpointing,
    path: PathBuf,
    every: usize,
    comm: &'a dyn Comm,
    fp: String,
    params: LsqrParams,
    history: Vec<IterRecord>,
    offset: f64,
    host: HostState,
    /// The iteration of the last checkpoint written or resumed from.
    last: Option<usize>,
}

impl<B: Backend> LsqrMonitor<B> for CkMonitor<'_, B> {
    fn record(&mut self, rec: &IterRecord) -> Result<()> {
        let mut r = *rec;
        r.seconds += self.offset;
        self.history.push(r);
        let done = self.inner.record(&r);
        // Stopped by a signal: say where the last checkpoint is.
        match (done, crate::pipeline::monitor::caught_signal()) {
            (Err(_), Some(sig)) => {
                let at = match self.last {
                    Some(itn) => format!(
                        "; the last checkpoint is {} (iteration {itn}): run again with --resume to continue from it",
                        crate::io::tidy(&self.path).display()
                    ),
                    None if self.every > 0 => format!(
                        "; no checkpoint yet (the first was due at iteration {})",
                        self.every
                    ),
                    None => String::new(),
                };
                Err(crate::pipeline::monitor::stopped_by(sig, r.itn, &at))
            }
            (done, _) => done,
        }
    }
    fn checkpoint_every(&self) -> usize {
        self.every
    }
    fn state(&mut self, be: &B, s: &LsqrScalars, v: &LsqrVectors<B::Vector>) -> Result<()> {
        self.inner.state(be, s, v)?;
        if self.every == 0 || s.istop != 0 || s.itn % self.every != 0 {
            return Ok(());
        }
        be.download(&v.u, &mut self.host.u)?;
        be.download(&v.v, &mut self.host.v)?;
        be.download(&v.w, &mut self.host.w)?;
        be.download(&v.x, &mut self.host.x)?;
        if let (Some(d), Some(h)) = (&v.var, self.host.var.as_mut()) {
            be.download(d, h)?;
        }
        write_checkpoint(
            &self.path,
            self.comm,
            &self.fp,
            &self.params,
            s,
            &self.history,
            &self.host,
        )?;
        // This run wrote it: the end of the run may remove it (src/pipeline/model.rs).
        self.ck.claim(&self.path);
        self.last = Some(s.itn);
        Ok(())
    }
}

/// What [`lsqr_checkpointed`] returns besides the solution.
pub struct RunHistory {
    /// The history from iteration 0, including what came before a resume.
    pub history: Vec<IterRecord>,
    /// The iteration the run resumed from (None: started from the beginning).
    pub resumed_from: Option<usize>,
}

/// LSQR with checkpoints (and resume): [`crate::solver::lsqr()`] with `(ck, fp)`, where to
/// checkpoint and the fingerprint of the system (see `fingerprint`).
#[allow(clippy::too_many_arguments)]
pub fn lsqr_checkpointed<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    comm: &dyn Comm,
    (ck, fp): (&Checkpointing, &str),
    b: &[f64],
    x0: Option<&[f64]>,
    params: &LsqrParams,
    monitor: &mut dyn LsqrMonitor<B>,
) -> Result<(LsqrSolution, RunHistory)> {
    let path = ck.path_for(comm);
    let (m, n) = (op.nrows(), op.ncols());
    let local = || -> Result<Option<Loaded>> {
        // Something at the path that is not a regular file is refused by the reader, not
        // taken for "no checkpoint".
        if !(ck.resume && std::fs::metadata(&path).is_ok()) {
            return Ok(None);
        }
        let (l, lfp, lparams, rank, ranks) = read_checkpoint(&path)?;
        let mismatch = |what: &str| {
            Error::format(
                &path,
                format!("checkpoint was written for a different {what}; delete it to start over"),
            )
        };
        if rank != comm.rank() || ranks != comm.size() {
            return Err(mismatch("number of ranks"));
        }
        if l.vectors.u.len() != m || l.vectors.x.len() != n || lfp != fp {
            return Err(mismatch("system"));
        }
        let same = serde_json::to_string(&lparams).ok() == serde_json::to_string(params).ok();
        if !same {
            return Err(mismatch("set of solver parameters"));
        }
        // This run resumes from it: it is this job's, and removed when the run ends.
        ck.claim(&path);
        Ok(Some(l))
    };
    let resume_from = crate::comm::agree(comm, local())?;
    // Every rank resumes from the same iteration, or none does; rank 0 says which, once,
    // before the solve.
    let itn = resume_from.as_ref().map_or(0, |l| l.scalars.itn);
    let mut seen = vec![f64::from(u8::from(resume_from.is_some())), itn as f64];
    comm.allreduce_sum(&mut seen)?;
    let have = seen[0] as usize;
    let consistent = have == 0 || (have == comm.size() && itn * comm.size() == seen[1] as usize);
    crate::comm::agree(
        comm,
        if consistent {
            Ok(())
        } else {
            Err(Error::format(
                &path,
                format!(
                    "the checkpoints of the {} ranks are not from one iteration ({have} found); delete them to start over",
                    comm.size()
                ),
            ))
        },
    )?;
    // (a resume is announced below, once, before the solve goes on)
    if ck.resume && comm.is_root() && resume_from.is_none() {
        eprintln!(
            "no checkpoint at {}: starting from the beginning",
            crate::io::tidy(&ck.path).display()
        );
    }
    let (mut s, mut vecs, prefix, resumed_from) = match resume_from {
        Some(l) => {
            let h = &l.vectors;
            let vecs = LsqrVectors {
                u: be.upload(&h.u)?,
                v: be.upload(&h.v)?,
                w: be.upload(&h.w)?,
                x: be.upload(&h.x)?,
                var: h.var.as_deref().map(|v| be.upload(v)).transpose()?,
            };
            let itn = l.scalars.itn;
            // Said before the solve goes on, not after it.
            if comm.is_root() {
                eprintln!(
                    "resumed from the checkpoint at iteration {itn} ({})",
                    crate::io::tidy(&path).display()
                );
            }
            (l.scalars, vecs, l.history, Some(itn))
        }
        None => {
            let bd = be.upload(b)?;
            let x0d = x0.map(|x| be.upload(x)).transpose()?;
            let (s, v) = lsqr_start(be, op, comm, &bd, x0d.as_ref(), params)?;
            (s, v, Vec::new(), None)
        }
    };
    let offset = prefix.last().map(|r| r.seconds).unwrap_or(0.0);
    let mut mon = CkMonitor {
        inner: monitor,
        ck,
        path,
        every: ck.every,
        comm,
        fp: fp.to_string(),
        params: params.clone(),
        history: prefix,
        offset,
        host: HostState::zeros(m, n, params.calc_var),
        last: resumed_from,
    };
    let info = lsqr_iterate(be, op, comm, params, &mut s, &mut vecs, &mut mon)?;
    Ok((
        download_solution(be, &vecs, info)?,
        RunHistory {
            history: mon.history,
            resumed_from,
        },
    ))
}
