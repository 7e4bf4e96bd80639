//! Checkpoint and resume of LSQR: every N iterations the full LSQR state (the scalars and the
//! vectors u, v, w, x, var) is written atomically; a resumed run continues from it and, on the
//! CPU backend, produces bit-for-bit the model of an uninterrupted run (the state is complete
//! and the CPU reductions are deterministic).
//!
//! File layout (little-endian):
//! ```text
//! magic "SEISCKPT" (8 bytes) | version u32 | header length u64 | header (JSON) |
//! u (m_local f64) | v (n f64) | w (n f64) | x (n f64) | [var (n f64)] | FNV-1a 64 of all before
//! ```
//! The JSON header holds the scalars, the LSQR parameters, the history so far, the sizes and a
//! fingerprint of the system, all of which must match on resume (serde_json is built with
//! `float_roundtrip`, so the f64 scalars read back bit for bit). With several ranks each rank
//! writes its own file (`name.rank<r>`) because u is distributed by rows.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, Operator};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::io::write_atomic;
use crate::solver::{
    lsqr_iterate, lsqr_start, IterRecord, LsqrMonitor, LsqrParams, LsqrScalars, LsqrSolution,
    LsqrVectors,
};

pub const MAGIC: &[u8; 8] = b"SEISCKPT";
pub const VERSION: u32 = 1;

/// Checkpoint settings of a run.
#[derive(Debug, Clone)]
pub struct Checkpointing {
    /// Checkpoint file (rank 0's name; other ranks add `.rank<r>`).
    pub path: PathBuf,
    /// Write every this many iterations (0: never write).
    pub every: usize,
    /// Continue from the checkpoint when there is one.
    pub resume: bool,
}

impl Checkpointing {
    /// This rank's checkpoint file.
    pub fn path_for(&self, comm: &dyn Comm) -> PathBuf {
        if comm.size() > 1 {
            let mut s = self.path.clone().into_os_string();
            s.push(format!(".rank{}", comm.rank()));
            PathBuf::from(s)
        } else {
            self.path.clone()
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    program: String,
    version: String,
    rank: usize,
    ranks: usize,
    m_local: usize,
    n: usize,
    fingerprint: String,
    params: LsqrParams,
    scalars: LsqrScalars,
    history: Vec<IterRecord>,
    has_var: bool,
}

/// 64-bit FNV-1a.
#[derive(Clone, Copy)]
pub struct Fnv(u64);
impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}
impl Fnv {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// A fingerprint of a system (this rank's rows of A and b): sizes and every stored value, so a
/// checkpoint is never resumed on a different system.
pub fn fingerprint(a: &crate::sparse::Csr, b: &[f64]) -> String {
    let mut h = Fnv::default();
    for v in [a.nrows() as u64, a.ncols() as u64, a.nnz() as u64] {
        h.update(&v.to_le_bytes());
    }
    for v in a.indptr() {
        h.update(&v.to_le_bytes());
    }
    for v in a.indices() {
        h.update(&v.to_le_bytes());
    }
    for v in a.data().iter().chain(b) {
        h.update(&v.to_bits().to_le_bytes());
    }
    format!("{:016x}", h.finish())
}

struct HashWriter<'a> {
    inner: &'a mut dyn Write,
    h: Fnv,
}
impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.h.update(&buf[..k]);
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn write_f64s(w: &mut dyn Write, v: &[f64]) -> std::io::Result<()> {
    let mut buf = [0u8; 8 * 1024];
    for chunk in v.chunks(1024) {
        for (i, x) in chunk.iter().enumerate() {
            buf[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
        }
        w.write_all(&buf[..8 * chunk.len()])?;
    }
    Ok(())
}

/// Host copies of the state vectors (sized once).
struct HostState {
    u: Vec<f64>,
    v: Vec<f64>,
    w: Vec<f64>,
    x: Vec<f64>,
    var: Option<Vec<f64>>,
}

/// The state read back from a checkpoint file.
pub struct Loaded {
    pub scalars: LsqrScalars,
    pub history: Vec<IterRecord>,
    u: Vec<f64>,
    v: Vec<f64>,
    w: Vec<f64>,
    x: Vec<f64>,
    var: Option<Vec<f64>>,
}

#[allow(clippy::too_many_arguments)]
fn write_checkpoint(
    path: &Path,
    comm: &dyn Comm,
    fp: &str,
    params: &LsqrParams,
    s: &LsqrScalars,
    history: &[IterRecord],
    h: &HostState,
) -> Result<()> {
    let header = Header {
        program: "seistomo".into(),
        version: crate::VERSION.into(),
        rank: comm.rank(),
        ranks: comm.size(),
        m_local: h.u.len(),
        n: h.x.len(),
        fingerprint: fp.to_string(),
        params: params.clone(),
        scalars: s.clone(),
        history: history.to_vec(),
        has_var: h.var.is_some(),
    };
    let json = serde_json::to_vec(&header).map_err(|e| Error::format(path, e.to_string()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    write_atomic(path, |w| {
        let mut hw = HashWriter {
            inner: w,
            h: Fnv::default(),
        };
        hw.write_all(MAGIC)?;
        hw.write_all(&VERSION.to_le_bytes())?;
        hw.write_all(&(json.len() as u64).to_le_bytes())?;
        hw.write_all(&json)?;
        for v in [&h.u, &h.v, &h.w, &h.x] {
            write_f64s(&mut hw, v)?;
        }
        if let Some(var) = &h.var {
            write_f64s(&mut hw, var)?;
        }
        let sum = hw.h.finish();
        hw.inner.write_all(&sum.to_le_bytes())
    })
}

/// Read and check a checkpoint file.
pub fn read_checkpoint(path: &Path) -> Result<(Loaded, String, LsqrParams, usize, usize)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let bad = |msg: &str| Error::format(path, format!("checkpoint: {msg}"));
    if bytes.len() < 28 || &bytes[..8] != MAGIC {
        return Err(bad("not a seistomo checkpoint (bad magic)"));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 8);
    let mut h = Fnv::default();
    h.update(body);
    if h.finish() != u64::from_le_bytes(tail.try_into().expect("8 bytes")) {
        return Err(bad("checksum mismatch (truncated or corrupted file)"));
    }
    let version = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(bad(&format!(
            "version {version}, this program reads {VERSION}"
        )));
    }
    let hlen = u64::from_le_bytes(body[12..20].try_into().expect("8 bytes")) as usize;
    if 20 + hlen > body.len() {
        return Err(bad("header length past the end of the file"));
    }
    let header: Header =
        serde_json::from_slice(&body[20..20 + hlen]).map_err(|e| bad(&format!("header: {e}")))?;
    let (m, n) = (header.m_local, header.n);
    let nvec = 3 + usize::from(header.has_var);
    if body.len() != 20 + hlen + 8 * (m + nvec * n) {
        return Err(bad("vector section has the wrong length"));
    }
    let mut off = 20 + hlen;
    let mut take = |k: usize| {
        let v: Vec<f64> = body[off..off + 8 * k]
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        off += 8 * k;
        v
    };
    let u = take(m);
    let v = take(n);
    let w = take(n);
    let x = take(n);
    let var = if header.has_var { Some(take(n)) } else { None };
    Ok((
        Loaded {
            scalars: header.scalars,
            history: header.history,
            u,
            v,
            w,
            x,
            var,
        },
        header.fingerprint,
        header.params,
        header.rank,
        header.ranks,
    ))
}

/// Wraps the caller's monitor: shifts times after a resume, keeps the history and writes
/// checkpoints.
struct CkMonitor<'a, B: Backend> {
    inner: &'a mut dyn LsqrMonitor<B>,
    path: PathBuf,
    every: usize,
    comm: &'a dyn Comm,
    fp: String,
    params: LsqrParams,
    history: Vec<IterRecord>,
    offset: f64,
    host: HostState,
}

impl<B: Backend> LsqrMonitor<B> for CkMonitor<'_, B> {
    fn record(&mut self, rec: &IterRecord) -> Result<()> {
        let mut r = *rec;
        r.seconds += self.offset;
        self.history.push(r);
        self.inner.record(&r)
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
        )
    }
}

/// What [`lsqr_checkpointed`] returns besides the solution.
pub struct RunHistory {
    /// The history from iteration 0, including what came before a resume.
    pub history: Vec<IterRecord>,
    /// The iteration the run resumed from (None: started from the beginning).
    pub resumed_from: Option<usize>,
}

/// LSQR with checkpoints (and resume). `fp` fingerprints the system (see [`fingerprint`]).
#[allow(clippy::too_many_arguments)]
pub fn lsqr_checkpointed<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    comm: &dyn Comm,
    b: &[f64],
    x0: Option<&[f64]>,
    params: &LsqrParams,
    ck: &Checkpointing,
    fp: &str,
    monitor: &mut dyn LsqrMonitor<B>,
) -> Result<(LsqrSolution, RunHistory)> {
    let path = ck.path_for(comm);
    let (m, n) = (op.nrows(), op.ncols());
    let local = || -> Result<Option<Loaded>> {
        if !(ck.resume && path.is_file()) {
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
        if l.u.len() != m || l.x.len() != n || lfp != fp {
            return Err(mismatch("system"));
        }
        let same = serde_json::to_string(&lparams).ok() == serde_json::to_string(params).ok();
        if !same {
            return Err(mismatch("set of solver parameters"));
        }
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
    if ck.resume && comm.is_root() {
        match &resume_from {
            Some(l) => eprintln!("resumed from the checkpoint at iteration {}", l.scalars.itn),
            None => eprintln!(
                "no checkpoint at {}: starting from the beginning",
                ck.path.display()
            ),
        }
    }
    let (mut s, mut vecs, prefix, resumed_from) = match resume_from {
        Some(l) => {
            let vecs = LsqrVectors {
                u: be.upload(&l.u)?,
                v: be.upload(&l.v)?,
                w: be.upload(&l.w)?,
                x: be.upload(&l.x)?,
                var: l.var.as_deref().map(|v| be.upload(v)).transpose()?,
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
        path,
        every: ck.every,
        comm,
        fp: fp.to_string(),
        params: params.clone(),
        history: prefix,
        offset,
        host: HostState {
            u: vec![0.0; m],
            v: vec![0.0; n],
            w: vec![0.0; n],
            x: vec![0.0; n],
            var: if params.calc_var {
                Some(vec![0.0; n])
            } else {
                None
            },
        },
    };
    let info = lsqr_iterate(be, op, comm, params, &mut s, &mut vecs, &mut mon)?;
    let mut x = vec![0.0; n];
    be.download(&vecs.x, &mut x)?;
    let var = match &vecs.var {
        Some(d) => {
            let mut h = vec![0.0; n];
            be.download(d, &mut h)?;
            Some(h)
        }
        None => None,
    };
    Ok((
        LsqrSolution { x, var, info },
        RunHistory {
            history: mon.history,
            resumed_from,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{CpuBackend, CpuCsrOperator};
    use crate::backend::TransposeStrategy;
    use crate::comm::SerialComm;
    use crate::solver::NoMonitor;
    use crate::testing::Lstp;

    #[test]
    fn resume_from_every_checkpoint_is_bitwise_identical() {
        let p = Lstp::new(60, 40, 2, 2, 0.0);
        let a = p.to_csr();
        let b = p.apply_dense(&vec![1.0; 40]);
        let be = CpuBackend::new();
        let op = CpuCsrOperator::new(a.clone(), TransposeStrategy::Auto);
        let params = LsqrParams {
            atol: 1e-14,
            btol: 1e-14,
            calc_var: true,
            ..Default::default()
        };
        let dir = std::env::temp_dir().join(format!("seistomo-ckpt-{}", std::process::id()));
        let fp = fingerprint(&a, &b);
        let full = Checkpointing {
            path: dir.join("ck.bin"),
            every: 0,
            resume: false,
        };
        let (want, wh) = lsqr_checkpointed(
            &be,
            &op,
            &SerialComm,
            &b,
            None,
            &params,
            &full,
            &fp,
            &mut NoMonitor,
        )
        .unwrap();
        assert!(want.info.itn > 6);
        // Stop after 5 iterations with a checkpoint every 5, then resume.
        let short = LsqrParams {
            iter_lim: Some(5),
            ..params.clone()
        };
        let ck = Checkpointing {
            path: dir.join("ck.bin"),
            every: 5,
            resume: false,
        };
        // iter_lim differs, so the short run's checkpoint must be refused on resume.
        let ck2 = Checkpointing {
            every: 2,
            ..ck.clone()
        };
        lsqr_checkpointed(
            &be,
            &op,
            &SerialComm,
            &b,
            None,
            &short,
            &ck2,
            &fp,
            &mut NoMonitor,
        )
        .unwrap();
        assert!(dir.join("ck.bin").is_file());
        let res = Checkpointing {
            resume: true,
            ..ck.clone()
        };
        let e = lsqr_checkpointed(
            &be,
            &op,
            &SerialComm,
            &b,
            None,
            &params,
            &res,
            &fp,
            &mut NoMonitor,
        );
        assert!(
            e.is_err(),
            "a checkpoint with other parameters was accepted"
        );
        // Now a proper interrupted run: same parameters, stopped by an error from the monitor.
        struct StopAt(usize);
        impl<B: Backend> LsqrMonitor<B> for StopAt {
            fn record(&mut self, r: &IterRecord) -> Result<()> {
                if r.itn == self.0 {
                    Err(Error::Invalid("stop".into()))
                } else {
                    Ok(())
                }
            }
        }
        let _ = std::fs::remove_file(dir.join("ck.bin"));
        let e = lsqr_checkpointed(
            &be,
            &op,
            &SerialComm,
            &b,
            None,
            &params,
            &ck,
            &fp,
            &mut StopAt(7),
        );
        assert!(e.is_err());
        let (got, gh) = lsqr_checkpointed(
            &be,
            &op,
            &SerialComm,
            &b,
            None,
            &params,
            &res,
            &fp,
            &mut NoMonitor,
        )
        .unwrap();
        assert_eq!(gh.resumed_from, Some(5));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.x), bits(&want.x));
        assert_eq!(
            bits(got.var.as_ref().unwrap()),
            bits(want.var.as_ref().unwrap())
        );
        assert_eq!(got.info.itn, want.info.itn);
        assert_eq!(gh.history.len(), wh.history.len());
        // A corrupted checkpoint is refused with the file named.
        let mut bytes = std::fs::read(dir.join("ck.bin")).unwrap();
        let k = bytes.len() / 2;
        bytes[k] ^= 1;
        std::fs::write(dir.join("ck.bin"), &bytes).unwrap();
        let e = read_checkpoint(&dir.join("ck.bin"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("ck.bin") && e.contains("checksum"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
