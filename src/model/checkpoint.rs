//! Checkpoint and resume of LSQR: every N iterations the full LSQR state (the scalars and the
//! vectors u, v, w, x, var) is written atomically; a resumed run continues from it and, on the
//! CPU backend, produces bit-for-bit the model of an uninterrupted run (the state is complete
//! and the CPU reductions are deterministic).
//!
//! File layout, version 2 (little-endian; docs/formats.md, "Checkpoint file"):
//! ```text
//! magic "SEISCKPT" (8 bytes) | version u32 = 2 | u32 0 | header length H u64 | header (JSON) |
//! u32 CRC32C of bytes 0..24+H | u32 0 |
//! then u (m_local f64), v, w, x (n f64 each), [var (n f64)], each followed by u32 CRC32C of
//! its bytes and u32 0
//! ```
//! Version 1 (still read): magic | version u32 = 1 | H u64 | header | u | v | w | x | `[var]` |
//! FNV-1a 64 of all bytes before it.
//! The JSON header holds the scalars, the LSQR parameters, the history so far, the sizes and a
//! fingerprint of the system, all of which must match on resume (serde_json is built with
//! `float_roundtrip`, so the f64 scalars read back bit for bit). With several ranks each rank
//! writes its own file (`name.rank<r>`) because u is distributed by rows.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::io::dataset::binfmt::CrcWriter;
use crate::io::{write_atomic, Fnv};
use crate::solver::{IterRecord, LsqrParams, LsqrScalars};

pub const MAGIC: &[u8; 8] = b"SEISCKPT";
pub const VERSION: u32 = 2;

/// Checkpoint settings of a run.
#[derive(Debug, Clone)]
pub struct Checkpointing {
    /// Checkpoint file (rank 0's name; other ranks add `.rank<r>`).
    pub path: PathBuf,
    /// Write every this many iterations (0: never write).
    pub every: usize,
    /// Continue from the checkpoint when there is one.
    pub resume: bool,
    /// The checkpoint files this run wrote or resumed from, as (path, device, inode): the only
    /// files the end of the run removes (a path that names something else is left alone).
    ours: std::sync::Arc<std::sync::Mutex<Vec<(PathBuf, u64, u64)>>>,
}

/// (device, inode) of the file at `path`, links not followed.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| (m.dev(), m.ino()))
}

impl Checkpointing {
    pub fn new(path: PathBuf, every: usize, resume: bool) -> Checkpointing {
        Checkpointing {
            path,
            every,
            resume,
            ours: Default::default(),
        }
    }

    /// Note that the file at `path` is this run's: it has just written it, or resumed from it.
    pub fn claim(&self, path: &Path) {
        let Some((dev, ino)) = file_id(path) else {
            return;
        };
        let mut ours = self.ours.lock().unwrap_or_else(|e| e.into_inner());
        ours.retain(|(p, ..)| p != path);
        ours.push((path.to_path_buf(), dev, ino));
    }

    /// Remove `path` when it is still the file this run wrote or resumed from ([`Self::claim`]);
    /// anything else at that name is left alone. Returns whether it was removed.
    pub fn remove_ours(&self, path: &Path) -> Result<bool> {
        let ours = self.ours.lock().unwrap_or_else(|e| e.into_inner());
        let claimed = ours
            .iter()
            .any(|(p, dev, ino)| p == path && file_id(path) == Some((*dev, *ino)));
        if claimed {
            std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
        }
        Ok(claimed)
    }

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

/// Host copies of the state vectors: u (m values: this rank's rows), v, w, x and var when
/// present (n values each).
pub struct HostState {
    pub u: Vec<f64>,
    pub v: Vec<f64>,
    pub w: Vec<f64>,
    pub x: Vec<f64>,
    pub var: Option<Vec<f64>>,
}

impl HostState {
    /// Zeros for `m` rows and `n` columns (with var when `var`), sized once.
    pub fn zeros(m: usize, n: usize, var: bool) -> HostState {
        HostState {
            u: vec![0.0; m],
            v: vec![0.0; n],
            w: vec![0.0; n],
            x: vec![0.0; n],
            var: if var { Some(vec![0.0; n]) } else { None },
        }
    }
}

/// The state read back from a checkpoint file.
pub struct Loaded {
    pub scalars: LsqrScalars,
    pub history: Vec<IterRecord>,
    pub vectors: HostState,
}

/// Write the state as a checkpoint file (atomically; `comm` gives rank and size for the header).
#[allow(clippy::too_many_arguments)]
pub fn write_checkpoint(
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
        let mut cw = CrcWriter::new(w);
        cw.write_all(MAGIC)?;
        cw.write_all(&VERSION.to_le_bytes())?;
        cw.write_all(&0u32.to_le_bytes())?;
        cw.write_all(&(json.len() as u64).to_le_bytes())?;
        cw.write_all(&json)?;
        let c = cw.take();
        cw.inner.write_all(&c.to_le_bytes())?;
        cw.inner.write_all(&0u32.to_le_bytes())?;
        let vars = h.var.iter();
        for v in [&h.u, &h.v, &h.w, &h.x].into_iter().chain(vars) {
            write_f64s(&mut cw, v)?;
            let c = cw.take();
            cw.inner.write_all(&c.to_le_bytes())?;
            cw.inner.write_all(&0u32.to_le_bytes())?;
        }
        Ok(())
    })
}

fn f64s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Read and check a checkpoint file (version 2, or version 1). Every size in it is checked
/// against the file's length before anything is allocated from it.
pub fn read_checkpoint(path: &Path) -> Result<(Loaded, String, LsqrParams, usize, usize)> {
    let bytes = crate::io::read_input(path, "checkpoint", u64::MAX)?;
    parse_checkpoint(path, &bytes)
}

/// [`read_checkpoint`] on the file's bytes (errors name `path`).
fn parse_checkpoint(
    path: &Path,
    bytes: &[u8],
) -> Result<(Loaded, String, LsqrParams, usize, usize)> {
    let bad = |msg: &str| Error::format(path, format!("checkpoint: {msg}"));
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err(bad("not a seistomo checkpoint (bad magic)"));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let (header, vectors) = match version {
        1 => read_v1(bytes, &bad)?,
        2 => read_v2(path, bytes, &bad)?,
        _ => {
            return Err(bad(&format!(
                "version {version}, this program reads 1 and {VERSION}"
            )))
        }
    };
    Ok((
        Loaded {
            scalars: header.scalars,
            history: header.history,
            vectors,
        },
        header.fingerprint,
        header.params,
        header.rank,
        header.ranks,
    ))
}

/// The vector section's bytes for `header`'s sizes: `per` extra bytes after each vector.
fn vectors_len(header: &Header, per: u128) -> u128 {
    let nvec = 3 + u128::from(header.has_var);
    8 * header.m_local as u128 + per + nvec * (8 * header.n as u128 + per)
}

fn read_v1(bytes: &[u8], bad: &dyn Fn(&str) -> Error) -> Result<(Header, HostState)> {
    if bytes.len() < 28 {
        return Err(bad("truncated (shorter than its header)"));
    }
    let (body, tail) = bytes.split_at(bytes.len() - 8);
    let mut h = Fnv::default();
    h.update(body);
    if h.finish() != u64::from_le_bytes(tail.try_into().expect("8 bytes")) {
        return Err(bad("checksum mismatch (truncated or corrupted file)"));
    }
    let hlen = u64::from_le_bytes(body[12..20].try_into().expect("8 bytes"));
    if hlen > (body.len() - 20) as u64 {
        return Err(bad("header length past the end of the file"));
    }
    let hlen = hlen as usize;
    let header: Header =
        serde_json::from_slice(&body[20..20 + hlen]).map_err(|e| bad(&format!("header: {e}")))?;
    if (body.len() - 20 - hlen) as u128 != vectors_len(&header, 0) {
        return Err(bad("vector section has the wrong length"));
    }
    let mut off = 20 + hlen;
    let mut take = |k: usize| {
        let v = f64s(&body[off..off + 8 * k]);
        off += 8 * k;
        v
    };
    let (m, n) = (header.m_local, header.n);
    let vecs = HostState {
        u: take(m),
        v: take(n),
        w: take(n),
        x: take(n),
        var: header.has_var.then(|| take(n)),
    };
    Ok((header, vecs))
}

/// The reserved u32 after a checksum must be zero: a checksum that matches beside a nonzero
/// word is a corrupted file, said as such (not as a "mismatch" of two equal numbers).
fn reserved_zero(path: &Path, what: &str, word: u32, at: usize) -> Result<()> {
    if word != 0 {
        return Err(Error::format(
            path,
            format!(
                "{what}: the reserved word after its checksum (byte {at}) is {word:08x}, not 0: the file is corrupted"
            ),
        ));
    }
    Ok(())
}

fn read_v2(path: &Path, bytes: &[u8], bad: &dyn Fn(&str) -> Error) -> Result<(Header, HostState)> {
    use crate::io::dataset::binfmt::{checksum_error, crc};
    if bytes.len() < 24 {
        return Err(bad("truncated (shorter than its header)"));
    }
    let word = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let hlen = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if word(12) != 0 || hlen > (bytes.len() - 24).saturating_sub(8) as u64 {
        return Err(bad(&format!(
            "header length {hlen} past the end of the file ({} bytes)",
            bytes.len()
        )));
    }
    let hend = 24 + hlen as usize;
    let (stored, computed) = (word(hend), crc(&bytes[..hend]));
    if stored != computed {
        return Err(checksum_error(path, "checkpoint header", stored, computed));
    }
    reserved_zero(path, "checkpoint header", word(hend + 4), hend + 4)?;
    let header: Header =
        serde_json::from_slice(&bytes[24..hend]).map_err(|e| bad(&format!("header: {e}")))?;
    let have = (bytes.len() - hend - 8) as u128;
    let want = vectors_len(&header, 8);
    if have != want {
        return Err(bad(&format!(
            "the header's sizes (m = {}, n = {}) need {want} bytes of vectors but the file has {have}",
            header.m_local, header.n
        )));
    }
    let mut off = hend + 8;
    let mut take = |k: usize, name: &str| -> Result<Vec<f64>> {
        let body = &bytes[off..off + 8 * k];
        let (stored, computed) = (word(off + 8 * k), crc(body));
        let what = format!("checkpoint vector {name}");
        if stored != computed {
            return Err(checksum_error(path, &what, stored, computed));
        }
        reserved_zero(path, &what, word(off + 8 * k + 4), off + 8 * k + 4)?;
        off += 8 * k + 8;
        Ok(f64s(body))
    };
    let (m, n) = (header.m_local, header.n);
    let vecs = HostState {
        u: take(m, "u")?,
        v: take(n, "v")?,
        w: take(n, "w")?,
        x: take(n, "x")?,
        var: if header.has_var {
            Some(take(n, "var")?)
        } else {
            None
        },
    };
    Ok((header, vecs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{CpuBackend, CpuCsrOperator};
    use crate::backend::Backend;
    use crate::backend::TransposeStrategy;
    use crate::comm::SerialComm;
    use crate::pipeline::checkpoint::lsqr_checkpointed;
    use crate::solver::LsqrMonitor;
    use crate::solver::NoMonitor;
    use crate::testproblems::Lstp;

    /// A checkpoint file of a small run (version 2).
    fn small_checkpoint(dir: &Path) -> PathBuf {
        let p = Lstp::new(30, 20, 2, 2, 0.0);
        let a = p.to_csr();
        let b = p.apply_dense(&[1.0; 20]);
        let be = CpuBackend::new();
        let op = CpuCsrOperator::new(a.clone(), TransposeStrategy::Auto);
        let params = LsqrParams {
            iter_lim: Some(6),
            calc_var: true,
            ..Default::default()
        };
        let ck = Checkpointing::new(dir.join("ck.bin"), 2, false);
        let fp = fingerprint(&a, &b);
        lsqr_checkpointed(
            &be,
            &op,
            &SerialComm,
            (&ck, &fp),
            &b,
            None,
            &params,
            &mut NoMonitor,
        )
        .unwrap();
        ck.path
    }

    /// The same checkpoint in version 1 (FNV-1a trailer, no per-section checksums).
    fn to_v1(v2: &[u8]) -> Vec<u8> {
        let hlen = u64::from_le_bytes(v2[16..24].try_into().unwrap()) as usize;
        let hend = 24 + hlen;
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&(hlen as u64).to_le_bytes());
        out.extend_from_slice(&v2[24..hend]);
        let mut off = hend + 8;
        while off < v2.len() {
            // Each vector: its values up to the 8-byte trailer (a CRC and a zero u32).
            let mut k = off;
            loop {
                let c = u32::from_le_bytes(v2[k..k + 4].try_into().unwrap());
                if crate::io::dataset::binfmt::crc(&v2[off..k]) == c && v2[k + 4..k + 8] == [0; 4] {
                    break;
                }
                k += 8;
            }
            out.extend_from_slice(&v2[off..k]);
            off = k + 8;
        }
        let mut h = Fnv::default();
        h.update(&out);
        let sum = h.finish();
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Issue 35: a nonzero reserved word beside a checksum that matches is said as such, not
    /// as "checksum mismatch (stored X, computed X)".
    #[test]
    fn a_nonzero_reserved_word_is_named_not_a_mismatch_of_equal_sums() {
        let dir = crate::io::test_dir("ckpt-reserved");
        let path = small_checkpoint(&dir);
        let v2 = std::fs::read(&path).unwrap();
        let hend = 24 + u64::from_le_bytes(v2[16..24].try_into().unwrap()) as usize;
        for at in [hend + 4, v2.len() - 4] {
            let mut b = v2.clone();
            b[at] = 0x5a;
            std::fs::write(&path, &b).unwrap();
            let e = match read_checkpoint(&path) {
                Ok(_) => panic!("a nonzero reserved word at {at} was read"),
                Err(e) => e.to_string(),
            };
            assert!(
                e.contains("reserved word") && e.contains(&format!("byte {at}")),
                "{e}"
            );
            assert!(!e.contains("mismatch"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn version_1_reads_lying_sizes_refused_and_corruption_sweep() {
        let dir = std::env::temp_dir().join(format!("seistomo-ckv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = small_checkpoint(&dir);
        let v2 = std::fs::read(&path).unwrap();
        let (l2, fp2, ..) = read_checkpoint(&path).unwrap();
        // Version 1 still reads, to the same state.
        let v1 = to_v1(&v2);
        let p1 = dir.join("ck1.bin");
        std::fs::write(&p1, &v1).unwrap();
        let (l1, fp1, ..) = read_checkpoint(&p1).unwrap();
        let (s1, s2) = (l1.vectors, l2.vectors);
        assert_eq!((s1.x, s1.u, s1.var, fp1), (s2.x, s2.u, s2.var, fp2));
        // A header whose sizes lie (checksum rewritten): refused before allocating.
        let hlen = u64::from_le_bytes(v2[16..24].try_into().unwrap()) as usize;
        let json = String::from_utf8(v2[24..24 + hlen].to_vec()).unwrap();
        let m = json.split("\"m_local\":").nth(1).unwrap();
        let m: String = m.chars().take_while(|c| c.is_ascii_digit()).collect();
        let lying = json.replacen(
            &format!("\"m_local\":{m}"),
            "\"m_local\":1000000000000000",
            1,
        );
        let mut b = v2[..16].to_vec();
        b.extend_from_slice(&(lying.len() as u64).to_le_bytes());
        b.extend_from_slice(lying.as_bytes());
        let c = crate::io::dataset::binfmt::crc(&b);
        b.extend_from_slice(&c.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&v2[24 + hlen + 8..]);
        std::fs::write(&path, &b).unwrap();
        let e = read_checkpoint(&path).err().unwrap().to_string();
        assert!(
            e.contains("ck.bin") && e.contains("1000000000000000") && !e.contains('\n'),
            "{e}"
        );
        // Sweep: every truncation, every byte flip in the header, random flips in the body;
        // each must be an error, never a panic.
        let mut cases = 0;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for (name, pristine) in [("v2", &v2), ("v1", &v1)] {
            let header = 24 + hlen + 8;
            let mut variants: Vec<Vec<u8>> = (0..pristine.len())
                .map(|cut| pristine[..cut].to_vec())
                .collect();
            for at in 0..header {
                let mut b = pristine.clone();
                b[at] ^= 0xff;
                variants.push(b);
            }
            for _ in 0..300 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let at = header + (seed as usize) % (pristine.len() - header);
                let mut b = pristine.to_vec();
                b[at] ^= 1 << (seed % 8);
                variants.push(b);
            }
            for (k, b) in variants.iter().enumerate() {
                let r = std::panic::catch_unwind(|| parse_checkpoint(&path, b).map(|_| ()));
                match r {
                    Ok(Err(e)) => assert!(!e.to_string().contains('\n')),
                    Ok(Ok(())) => panic!("{name} case {k}: a corrupted checkpoint was accepted"),
                    Err(_) => panic!("{name} case {k}: panic"),
                }
                cases += 1;
            }
        }
        println!("checkpoint corruption sweep: {cases} cases, all refused");
        let _ = std::fs::remove_dir_all(&dir);
    }

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
        let run = |p: &LsqrParams, ck: &Checkpointing, mon: &mut dyn LsqrMonitor<CpuBackend>| {
            lsqr_checkpointed(&be, &op, &SerialComm, (ck, &fp), &b, None, p, mon)
        };
        let full = Checkpointing::new(dir.join("ck.bin"), 0, false);
        let (want, wh) = run(&params, &full, &mut NoMonitor).unwrap();
        assert!(want.info.itn > 6);
        // Stop after 5 iterations with a checkpoint every 5, then resume.
        let short = LsqrParams {
            iter_lim: Some(5),
            ..params.clone()
        };
        let ck = Checkpointing::new(dir.join("ck.bin"), 5, false);
        // iter_lim differs, so the short run's checkpoint must be refused on resume.
        let ck2 = Checkpointing {
            every: 2,
            ..ck.clone()
        };
        run(&short, &ck2, &mut NoMonitor).unwrap();
        assert!(dir.join("ck.bin").is_file());
        let res = Checkpointing {
            resume: true,
            ..ck.clone()
        };
        let e = run(&params, &res, &mut NoMonitor);
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
        let e = run(&params, &ck, &mut StopAt(7));
        assert!(e.is_err());
        let (got, gh) = run(&params, &res, &mut NoMonitor).unwrap();
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
