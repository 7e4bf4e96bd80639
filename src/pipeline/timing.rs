//! Timing and bandwidth helpers shared by the operator factory (an engine's copy bandwidth) and
//! `bench`: the median of repeated runs, the host's copy bandwidth and last-level cache.

use std::time::Instant;

use rayon::prelude::*;

use crate::backend::{Backend, Operator};
use crate::comm::SerialComm;
use crate::error::Result;
use crate::solver::{lsqr_iterate, lsqr_start, LsqrInfo, LsqrParams, LsqrVectors, NoMonitor};

/// The host as the CPU backend sees it (CPU model, rayon threads) and its copy bandwidth
/// (GB/s, read + write, all threads copying 64 MiB arrays; median of 5).
pub fn host_copy_bandwidth() -> (String, f64) {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let threads = rayon::current_num_threads();
    let len = 8usize << 20;
    let src = vec![1.0f64; len];
    let mut dst = vec![0.0f64; len];
    let chunk = len.div_ceil(threads.max(1) * 4).max(1 << 14);
    let mut ts = Vec::new();
    for _ in 0..6 {
        let t = Instant::now();
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        ts.push(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    ts.remove(0); // first touch of dst
    let s = median(ts).max(1e-9);
    (
        format!("CPU {model}, {threads} thread(s)"),
        2.0 * (len * 8) as f64 / s / 1e9,
    )
}

/// The largest CPU cache of cpu0 (Linux sysfs), in bytes.
pub fn last_level_cache_bytes() -> Option<u64> {
    let mut best = None;
    for i in 0..8 {
        let p = format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size");
        let Ok(t) = std::fs::read_to_string(p) else {
            break;
        };
        let t = t.trim();
        let (num, mul) = match t.strip_suffix('K') {
            Some(n) => (n, 1u64 << 10),
            None => match t.strip_suffix('M') {
                Some(n) => (n, 1u64 << 20),
                None => (t, 1),
            },
        };
        if let Ok(v) = num.parse::<u64>() {
            best = best.max(Some(v * mul));
        }
    }
    best
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A timed LSQR run (see [`time_lsqr_blocks`]).
pub struct LsqrBlocks<V> {
    /// The warm-up's wall time (the device loop captures its graph in it).
    pub first_block_ms: f64,
    /// Milliseconds per iteration of each timed block.
    pub ms_per_iter: Vec<f64>,
    /// The solve's state after the last block.
    pub info: LsqrInfo,
    pub vectors: LsqrVectors<V>,
}

/// LSQR on one rank from `b` with every stopping test off: `warm` iterations, then one timed
/// run of `blocks[i]` iterations each, every run continuing the same solve.
pub fn time_lsqr_blocks<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    b: &B::Vector,
    warm: usize,
    blocks: &[usize],
    sync: &dyn Fn() -> Result<()>,
) -> Result<LsqrBlocks<B::Vector>> {
    let comm = SerialComm;
    let mut params = LsqrParams {
        atol: 0.0,
        btol: 0.0,
        conlim: 0.0,
        iter_lim: Some(warm),
        ..Default::default()
    };
    let (mut s, mut v) = lsqr_start(be, op, &comm, b, None, &params)?;
    sync()?;
    let t = Instant::now();
    let mut info = lsqr_iterate(be, op, &comm, &params, &mut s, &mut v, &mut NoMonitor)?;
    sync()?;
    let first_block_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut ms_per_iter = Vec::with_capacity(blocks.len());
    for &k in blocks {
        let done = s.itn;
        params.iter_lim = Some(done + k);
        s.istop = 0;
        sync()?;
        let t = Instant::now();
        info = lsqr_iterate(be, op, &comm, &params, &mut s, &mut v, &mut NoMonitor)?;
        sync()?;
        ms_per_iter.push(t.elapsed().as_secs_f64() * 1e3 / (info.itn - done).max(1) as f64);
    }
    Ok(LsqrBlocks {
        first_block_ms,
        ms_per_iter,
        info,
        vectors: v,
    })
}

/// Median wall time (ms) of `f` followed by `sync`.
pub fn time_ms(
    reps: usize,
    sync: &dyn Fn() -> Result<()>,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    f()?;
    sync()?;
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        sync()?;
        ts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(ts))
}
