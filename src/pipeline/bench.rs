//! What `seistomo bench` measures: LSQR and its products per operator, the host's copy
//! bandwidth, and the bytes of one iteration at the bandwidth floor of each storage (the CLI
//! chooses the configurations and prints the table).

use std::time::Instant;

use rayon::prelude::*;

use crate::backend::storage::Prepared;
use crate::backend::{Backend, Operator, Precision, Scale};
use crate::comm::SerialComm;
use crate::solver::{lsqr_iterate, lsqr_start, LsqrParams, NoMonitor};
use crate::sparse::CompactCsr;

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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median wall time (ms) of `f` followed by `sync`.
pub fn time_ms(
    reps: usize,
    sync: &dyn Fn() -> crate::Result<()>,
    mut f: impl FnMut() -> crate::Result<()>,
) -> crate::Result<f64> {
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

/// Timings of one operator: the products alone, a short warm-up solve (which captures the
/// device loop's graph), then `iters` more iterations continuing the same solve.
pub struct Timing {
    pub ms_iter: f64,
    pub ax_ms: f64,
    pub aty_ms: f64,
    pub first_block_ms: f64,
    pub r1norm: f64,
    pub x: Vec<f64>,
}

/// Time LSQR with operator `op` on `be`: the products alone (median of 20), a short warm-up
/// solve, then `iters` more iterations of the same solve.
pub fn time_lsqr<B: Backend, O: Operator<B>>(
    be: &B,
    op: &O,
    b: &[f64],
    iters: usize,
    sync: &dyn Fn() -> crate::Result<()>,
) -> crate::Result<Timing> {
    let (m, n) = (op.nrows(), op.ncols());
    let comm = SerialComm;
    let bd = be.upload(b)?;
    // Products alone.
    let mut y = be.zeros(m)?;
    let mut x = be.zeros(n)?;
    be.fill(&mut x, 0.5)?;
    let ax = time_ms(20, sync, || op.apply(be, Scale::SET, &x, &mut y))?;
    let aty = time_ms(20, sync, || op.apply_t(be, Scale::SET, &y, &mut x))?;
    drop((x, y));
    let warm = 3;
    let params = LsqrParams {
        atol: 0.0,
        btol: 0.0,
        conlim: 0.0,
        iter_lim: Some(warm),
        ..Default::default()
    };
    let (mut s, mut v) = lsqr_start(be, op, &comm, &bd, None, &params)?;
    sync()?;
    let t = Instant::now();
    lsqr_iterate(be, op, &comm, &params, &mut s, &mut v, &mut NoMonitor)?;
    sync()?;
    let first_block_ms = t.elapsed().as_secs_f64() * 1e3;
    let params = LsqrParams {
        iter_lim: Some(warm + iters),
        ..params
    };
    s.istop = 0;
    sync()?;
    let t = Instant::now();
    let info = lsqr_iterate(be, op, &comm, &params, &mut s, &mut v, &mut NoMonitor)?;
    sync()?;
    let ms = t.elapsed().as_secs_f64() * 1e3 / (info.itn - warm).max(1) as f64;
    let xh = be.to_host(&v.x)?;
    Ok(Timing {
        ms_iter: ms,
        ax_ms: ax,
        aty_ms: aty,
        first_block_ms,
        r1norm: info.norms.r1norm,
        x: xh,
    })
}

/// Bytes of one SpMV pass over `rows` x `cols` with `nnz` nonzeros, counted as the CuPy peer
/// does (values + 4-byte column indices + 4-byte row offsets + read x + write y).
pub fn pass_bytes(rows: usize, cols: usize, nnz: usize, precision: Precision) -> f64 {
    (nnz * (4 + precision.bytes()) + (rows + 1) * 4 + cols * 8 + rows * 8) as f64
}

/// The general-format floor: one A and one A^T pass of CSR plus 10 vector passes over m + n.
pub fn csr_floor_bytes(m: usize, n: usize, nnz: usize, p: Precision) -> f64 {
    pass_bytes(m, n, nnz, p) + pass_bytes(n, m, nnz, p) + 10.0 * 8.0 * (m + n) as f64
}

/// The vector traffic of the fused LSQR loop: u read + written by A v and read by A^T u; v read
/// by A v, read + written by A^T u; x, w, v read and x, w written by the update: 3 m + 8 n.
pub fn vector_bytes(p: &Prepared) -> f64 {
    (3 * p.nrows() as u64 + 8 * p.ncols() as u64) as f64 * 8.0
}

/// The floor of the compact loop with rows in 16-bit-delta form (both copies once).
pub fn compact_floor_bytes(p: &Prepared, entries: (u64, u64), prec: Precision) -> f64 {
    let (ms, n) = (p.stored.nrows(), p.ncols());
    (CompactCsr::bytes_for(ms, entries.0, prec) + CompactCsr::bytes_for(n, entries.1, prec)) as f64
        + vector_bytes(p)
}
