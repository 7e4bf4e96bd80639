//! GMRES on the GPU for square systems: this rank's rows on the device, the halo exchange for
//! several ranks, and block ILU(0) with Jacobi-sweep triangular solves (Ma et al. 2021).
//!
//! - [`CudaSquareOperator`]: y = alpha A x + beta y for this rank's rows. With several ranks,
//!   the x entries other ranks need are gathered on the device, copied to the host, exchanged
//!   with one all-to-all over [`Comm`], and copied behind the local entries of an extended
//!   vector [x_local, ghosts] that the local CSR product reads (columns renumbered as in
//!   [`crate::comm::halo::localize`]). Where the backend sums through the GPUs' memory (ranks
//!   of one node), each rank reads its ghosts from the other ranks' mapped buffers instead
//!   ([`PeerHalo`]); with NCCL they go GPU to GPU. With the exchange through the host, the rows
//!   split in two ([`SplitRows`]): rows without ghost columns are multiplied while MPI moves
//!   the ghosts, the others after they arrive.
//!   On one product per application (no overlap split) the rows may be stored as row patterns
//!   ([`crate::sparse::patterns`]: a table of column-offset lists, a 16-bit pattern number per
//!   row and the values in slices of 32 rows) instead of CSR: `storage` compact or auto.
//! - [`CudaIluSweeps`]: the ILU(0) factors of this rank's block (factorised on the host by
//!   [`BlockIlu0`]) on the device; each application runs a fixed number of Jacobi sweeps on
//!   L y = r and U z = y, a thread per row, in the same arithmetic order as the CPU's
//!   [`BlockIlu0::solve`] (bitwise equal without FMA contraction).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};

use super::backend::{CudaBackend, DeviceVec};
use super::error::Doing;
use super::operator::CudaCsrOperator;
use super::patterns::{Cols, DevPatterns};
use super::peer::PeerBuffers;
use super::util::{arg, up, Word};
use crate::backend::cpu::square::DistSquareOperator;
use crate::backend::precond::{BlockIlu0, Preconditioner, TriSolve};
use crate::backend::storage::Storage;
use crate::backend::{Backend, Operator, Precision, ScalarSlots, Scale, TransposeStrategy};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::sparse::patterns::{PatternLimits, RowPatterns};
use crate::sparse::Csr;

/// Device buffers of the halo exchange.
struct Halo {
    /// Local indices of the entries to send, grouped by destination rank.
    idx: Option<CudaSlice<u32>>,
    send_dev: Option<CudaSlice<f64>>,
    send_host: Vec<f64>,
    recv_host: Vec<f64>,
    /// [x_local, ghosts] (one value where the row patterns' overlap reads x and the ghosts
    /// where they lie).
    ext: CudaSlice<f64>,
    /// Row sums of the interior and boundary rows (split products only).
    t_interior: Option<CudaSlice<f64>>,
    t_boundary: Option<CudaSlice<f64>>,
    /// Row patterns with NCCL or peer memory: the halo travels on a stream of its own while
    /// the interior rows are multiplied.
    overlap: Option<PatternOverlap>,
    /// The halo through the other GPUs' memory, where the backend sums that way.
    peer: Option<PeerHalo>,
}

/// The halo through the other GPUs' memory (CUDA IPC; kernels/peer.cu `peer_halo_*`): each
/// rank gathers the values the others need into its own buffer, which they have mapped, and
/// reads its ghosts from theirs. No NCCL kernel, no host copy.
struct PeerHalo {
    bufs: PeerBuffers,
    /// Four words per rank this rank receives from, in rank order: its rank, where this
    /// rank's values start in its buffer, where they go among the ghosts, how many.
    table: CudaSlice<u64>,
    senders: u32,
    nsend: u64,
    nrecv: u64,
    /// The ranks that read this rank's values, and those it reads from (bit r for rank r;
    /// ranks from 64 on are always waited for).
    readers: u64,
    from: u64,
}

/// Bit r of a rank mask for each rank with a nonzero count.
fn rank_mask(counts: &[usize]) -> u64 {
    counts
        .iter()
        .enumerate()
        .filter(|&(r, &c)| c > 0 && r < 64)
        .fold(0, |m, (r, _)| m | 1u64 << r)
}

impl PeerHalo {
    /// Collective: the buffers and the table of where each rank's ghosts lie; an error where
    /// the GPUs cannot map each other's buffers (the backend found that they could).
    fn new(be: &CudaBackend, comm: &dyn Comm, send: &[usize], recv: &[usize]) -> Result<Self> {
        // where each rank's values start in this rank's buffer, sent to it
        let mut starts = Vec::with_capacity(send.len());
        let mut off = 0u64;
        for &c in send {
            starts.push(vec![off]);
            off += c as u64;
        }
        let got = comm.alltoallv_u64(&starts)?;
        let (mut table, mut at, mut senders) = (Vec::new(), 0u64, 0u32);
        for (r, &c) in recv.iter().enumerate() {
            if c > 0 {
                let from =
                    got.get(r).and_then(|g| g.first()).copied().ok_or_else(|| {
                        Error::Comm(format!("halo set-up: rank {r} sent no offset"))
                    })?;
                table.extend([r as u64, from, at, c as u64]);
                senders += 1;
            }
            at += c as u64;
        }
        let bufs = PeerBuffers::new(&be.stream, comm, off as usize)?.ok_or_else(|| {
            Error::backend(
                "cuda",
                "the ranks' GPUs could not map each other's buffers for the halo exchange",
            )
        })?;
        table.resize(table.len().max(4), 0);
        Ok(PeerHalo {
            bufs,
            table: up(be, &table)?,
            senders,
            nsend: off,
            nrecv: at,
            readers: rank_mask(send),
            from: rank_mask(recv),
        })
    }

    /// One exchange on `stream`: x[idx] published from this rank's buffer, the ghosts (at
    /// device address `ghosts`) read from the others'. Waits on the device only.
    fn exchange(
        &self,
        be: &CudaBackend,
        stream: &CudaStream,
        (x, idx): (&CudaSlice<f64>, Option<&CudaSlice<u32>>),
        ghosts: u64,
    ) -> Result<()> {
        let fault = be.peer_fault()?;
        let (pb, ranks, me) = (
            be.ptr(&self.bufs.bases),
            self.bufs.ranks as u32,
            self.bufs.rank as u32,
        );
        let (px, pi) = (be.ptr(x), idx.map_or(0, |i| be.ptr(i)));
        let mut args = [
            arg(&px),
            arg(&pi),
            arg(&self.nsend),
            arg(&pb),
            arg(&ranks),
            arg(&me),
            arg(&self.readers),
            arg(&fault),
        ];
        be.launch_on(stream, &be.k.peer_halo_publish, (1, 1024, 0), &mut args)?;
        let pt = be.ptr(&self.table);
        let grid = self.nrecv.div_ceil(256).clamp(1, 1024) as u32;
        let mut args = [
            arg(&ghosts),
            arg(&self.nrecv),
            arg(&pt),
            arg(&self.senders),
            arg(&pb),
            arg(&ranks),
            arg(&me),
            arg(&self.from),
            arg(&fault),
        ];
        be.launch_on(stream, &be.k.peer_halo_pull, (grid, 256, 0), &mut args)
    }
}

/// The overlap of a row-pattern product with its halo exchange (NCCL or peer memory): the
/// gather (NCCL) or x (peer) is recorded (`sent`), the exchange runs on `side` into `ghosts`
/// (recorded: `arrived`) while the `interior` rows (no ghost column) are multiplied on the
/// backend's stream; the rows before and after them read the ghosts from `ghosts` once it has
/// arrived. No copy of x either way.
struct PatternOverlap {
    interior: Range<usize>,
    ghosts: CudaSlice<f64>,
    side: Arc<CudaStream>,
    sent: CudaEvent,
    arrived: CudaEvent,
}

impl PatternOverlap {
    fn new(be: &CudaBackend, a: &Csr, n: usize, ghosts: usize) -> Result<Self> {
        // the longest run of rows that read no ghost column
        let (mut best, mut start) = (0..0, 0);
        for r in 0..=a.nrows() {
            if r == a.nrows() || a.row(r).0.iter().any(|&c| c as usize >= n) {
                if r - start > best.len() {
                    best = start..r;
                }
                start = r + 1;
            }
        }
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let ctx = be.stream.context();
        // The halo's stream at the highest priority: its few small kernels start as soon as an
        // SM is free instead of after the interior rows' thousands of blocks.
        let (_, highest) = cudarc::driver::result::stream::get_priority_range()
            .doing("reading the streams' priorities")?;
        Ok(PatternOverlap {
            interior: best,
            ghosts: be.zeros(ghosts.max(1))?,
            side: ctx
                .new_stream_with_priority(highest)
                .doing("creating the halo's stream")?,
            sent: ctx.new_event(flags).doing("creating an event")?,
            arrived: ctx.new_event(flags).doing("creating an event")?,
        })
    }
}

/// This rank's rows split for overlapping the halo exchange with the product: interior rows
/// (no ghost column) are multiplied from x while the ghosts travel, boundary rows from
/// [x, ghosts] after; each part's row sums are put back in place by one scatter. A row's sum
/// is the same kernel's over the same nonzeros, so the split changes at most how short rows
/// share a warp (their rounding within f64 sums, not their terms).
struct SplitRows {
    interior: CudaCsrOperator,
    boundary: CudaCsrOperator,
    rows_interior: CudaSlice<u32>,
    rows_boundary: CudaSlice<u32>,
    n_interior: usize,
    n_boundary: usize,
}

/// The product of this rank's rows: one matrix (CSR or row patterns), or split for the
/// overlap.
enum Product {
    Whole(Box<CudaCsrOperator>),
    Patterns(Box<DevPatterns>),
    Split(Box<SplitRows>),
}

/// This rank's rows of a square matrix on the GPU, with the halo exchange built in: `apply`
/// takes and returns device vectors of this rank's n_local entries.
pub struct CudaSquareOperator<'c> {
    product: Product,
    n_local: usize,
    comm: &'c dyn Comm,
    send_counts: Vec<usize>,
    recv_counts: Vec<usize>,
    halo: Option<Mutex<Halo>>,
}

impl<'c> CudaSquareOperator<'c> {
    /// Upload the local matrix of `cpu` (owned columns first, then ghosts) and its halo plan.
    /// `storage`: csr; compact (row patterns, an error when the rows do not qualify); auto
    /// (row patterns where they qualify, else CSR). `overlap`: split the rows to overlap the
    /// halo exchange (`SplitRows`; needs several ranks and CSR storage; false: one product
    /// after the whole exchange); None: split with several ranks unless NCCL moves the halo
    /// (its exchange runs on the product's stream: nothing to overlap). Row patterns (compact,
    /// or auto where they qualify) take one product after the exchange.
    pub fn new(
        be: &CudaBackend,
        cpu: &DistSquareOperator<'_>,
        comm: &'c dyn Comm,
        (precision, storage): (Precision, Storage),
        overlap: Option<bool>,
    ) -> Result<Self> {
        let overlap = overlap.unwrap_or(comm.size() > 1 && !be.sums_on_device());
        let a = cpu.local_matrix();
        let plan = cpu.plan();
        let n = plan.n_local;
        let patterns = match storage {
            Storage::Csr => None,
            Storage::Auto if overlap && comm.size() > 1 => None,
            Storage::Auto => RowPatterns::from_csr(a, precision, PatternLimits::default()).ok(),
            Storage::Compact => Some(
                RowPatterns::from_csr(a, precision, PatternLimits::default()).map_err(|e| {
                    Error::Invalid(format!(
                        "--storage compact: this matrix cannot be stored as row patterns: {e} (use --storage csr or auto)"
                    ))
                })?,
            ),
        };
        let overlap = overlap && comm.size() > 1 && patterns.is_none();
        // GMRES never applies A^T: the scatter strategy keeps no second copy.
        let product = if let Some(p) = patterns {
            Product::Patterns(Box::new(DevPatterns::upload(be, &p)?))
        } else if overlap {
            Product::Split(Box::new(SplitRows::new(be, a, n, precision)?))
        } else {
            let op = CudaCsrOperator::new(be, a, TransposeStrategy::Scatter, precision)?;
            Product::Whole(Box::new(op))
        };
        let (n_interior, n_boundary) = match &product {
            Product::Split(sp) => (sp.n_interior, sp.n_boundary),
            _ => (0, 0),
        };
        let temp = |len: usize| (len > 0).then(|| be.zeros(len)).transpose();
        let send_counts: Vec<usize> = plan.send_idx.iter().map(|s| s.len()).collect();
        let overlap = match &product {
            Product::Patterns(_) if comm.size() > 1 && be.sums_on_device() => {
                Some(PatternOverlap::new(be, a, n, plan.recv_volume())?)
            }
            _ => None,
        };
        let halo = if comm.size() > 1 {
            let flat: Vec<u32> = plan.send_idx.iter().flatten().copied().collect();
            // Through peer memory the gather writes straight into this rank's mapped buffer
            // and the ghosts are read from the others': no send buffer, no host copies.
            let by_peer = be.peer.is_on();
            let (idx, send_dev) = if flat.is_empty() {
                (None, None)
            } else {
                let idx = be
                    .stream
                    .clone_htod(&flat)
                    .doing("copying the halo indices to the device")?;
                let send = (!by_peer).then(|| be.zeros(flat.len())).transpose()?;
                (Some(idx), send)
            };
            let host = |len: usize| vec![0.0; if by_peer { 0 } else { len }];
            Some(Mutex::new(Halo {
                idx,
                send_dev,
                send_host: host(flat.len()),
                recv_host: host(plan.recv_volume()),
                // With the overlap the ghosts land in `overlap.ghosts` and x is read where it
                // lies: no [x, ghosts] copy (n_local values a rank, 67 MB at 16.8M rows).
                ext: be.zeros(if overlap.is_some() {
                    1
                } else {
                    a.ncols().max(1)
                })?,
                t_interior: temp(n_interior)?,
                t_boundary: temp(n_boundary)?,
                overlap,
                peer: if by_peer {
                    Some(PeerHalo::new(be, comm, &send_counts, &plan.recv_counts)?)
                } else {
                    None
                },
            }))
        } else {
            None
        };
        Ok(CudaSquareOperator {
            product,
            n_local: n,
            comm,
            send_counts,
            recv_counts: plan.recv_counts.clone(),
            halo,
        })
    }

    /// How the rows are stored on the device: "csr", or the row patterns' description.
    pub fn storage(&self) -> &str {
        match &self.product {
            Product::Patterns(p) => p.describe(),
            Product::Whole(_) | Product::Split(_) => "csr",
        }
    }

    /// Call `f` with the columns this rank's rows read: x itself on one rank, or after the
    /// halo exchange [x, ghosts] (x where no row reads a ghost).
    fn with_columns<R>(
        &self,
        be: &CudaBackend,
        x: &DeviceVec,
        f: impl FnOnce(&DeviceVec) -> Result<R>,
    ) -> Result<R> {
        let Some(h) = &self.halo else {
            return f(x);
        };
        let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
        if !self.send_halo(be, x, &mut h)? {
            self.receive_halo(be, &mut h)?;
        }
        let cols = match &self.product {
            Product::Whole(op) => op.ncols(),
            Product::Patterns(p) => p.ncols,
            Product::Split(_) => {
                return Err(Error::Invalid(
                    "a split product exchanges its halo itself".into(),
                ))
            }
        };
        f(if cols == self.n_local { x } else { &h.ext })
    }

    /// The first half of the exchange: ext[..n] = x and the entries other ranks need gathered
    /// and copied to the host (the copy is waited for). Returns true when peer memory or NCCL
    /// did the whole exchange on the stream instead.
    fn send_halo(&self, be: &CudaBackend, x: &CudaSlice<f64>, h: &mut Halo) -> Result<bool> {
        let n = self.n_local;
        if let Some(p) = &h.peer {
            be.stream
                .memcpy_dtod(x, &mut h.ext.slice_mut(..n))
                .doing("device copy")?;
            let ghosts = be.ptr(&h.ext) + 8 * n as u64;
            p.exchange(be, &be.stream, (x, h.idx.as_ref()), ghosts)?;
            return Ok(true);
        }
        if let (Some(idx), Some(send)) = (&h.idx, &mut h.send_dev) {
            be.gather(idx, x, send)?;
        }
        be.stream
            .memcpy_dtod(x, &mut h.ext.slice_mut(..n))
            .doing("device copy")?;
        // GPU to GPU when NCCL is set up: no host copies.
        if be.nccl.exchange(
            None,
            h.send_dev.as_ref(),
            &self.send_counts,
            &mut h.ext,
            n,
            &self.recv_counts,
        )? {
            return Ok(true);
        }
        if let Some(send) = &h.send_dev {
            be.stream
                .memcpy_dtoh(send, &mut h.send_host[..])
                .doing("copying the halo to the host")?;
            be.synchronize()?;
        }
        Ok(false)
    }

    /// The second half: the all-to-all over [`Comm`] and the ghosts copied behind x in ext
    /// (queued on the stream after whatever was launched meanwhile).
    fn receive_halo(&self, be: &CudaBackend, h: &mut Halo) -> Result<()> {
        let n = self.n_local;
        let mut sends = Vec::with_capacity(self.send_counts.len());
        let mut off = 0;
        for &c in &self.send_counts {
            sends.push(h.send_host[off..off + c].to_vec());
            off += c;
        }
        let recv = self.comm.alltoallv(&sends)?;
        let mut off = 0;
        for (r, (got, &want)) in recv.iter().zip(&self.recv_counts).enumerate() {
            if got.len() != want {
                return Err(Error::Comm(format!(
                    "halo exchange: rank {r} sent {} values, expected {want}",
                    got.len()
                )));
            }
            h.recv_host[off..off + want].copy_from_slice(got);
            off += want;
        }
        if !h.recv_host.is_empty() {
            be.stream
                .memcpy_htod(&h.recv_host[..], &mut h.ext.slice_mut(n..n + off))
                .doing("copying the halo to the device")?;
        }
        Ok(())
    }

    /// The row-pattern product y = d .* (s A x) (normalised as [`DevPatterns::spmv`] says):
    /// overlapped with the halo exchange through NCCL or peer memory where there is one
    /// ([`PatternOverlap`]), else after the whole exchange.
    fn pattern_product(
        &self,
        be: &CudaBackend,
        p: &DevPatterns,
        (s, x): (Scale, &DeviceVec),
        mut normalized: Option<(u64, &mut DeviceVec)>,
        d: Option<&DeviceVec>,
        y: &mut DeviceVec,
    ) -> Result<()> {
        let Some(h) = &self.halo else {
            return p.spmv(be, s, x, normalized, d, y);
        };
        let mut guard = h.lock().unwrap_or_else(|e| e.into_inner());
        let h = &mut *guard;
        let Some(ov) = h.overlap.as_mut() else {
            drop(guard);
            return self.with_columns(be, x, |xs| p.spmv(be, s, xs, normalized, d, y));
        };
        if let (Some(idx), Some(send)) = (&h.idx, &mut h.send_dev) {
            be.gather(idx, x, send)?;
        }
        ov.sent
            .record(&be.stream)
            .doing("recording the halo's gather")?;
        ov.side
            .wait(&ov.sent)
            .doing("waiting for the halo's gather")?;
        if let Some(p) = &h.peer {
            // (x is not written on the stream before `arrived`: the rows after the interior
            // ones wait for it)
            p.exchange(be, &ov.side, (x, h.idx.as_ref()), be.ptr(&ov.ghosts))?;
        } else {
            let (send, counts) = (h.send_dev.as_ref(), &self.send_counts);
            let by_nccl = be.nccl.exchange(
                Some(&ov.side),
                send,
                counts,
                &mut ov.ghosts,
                0,
                &self.recv_counts,
            )?;
            if !by_nccl {
                return Err(Error::backend(
                    "cuda",
                    "the halo's NCCL communicator went away",
                ));
            }
        }
        ov.arrived
            .record(&ov.side)
            .doing("recording the halo's arrival")?;
        let mut part = |cols: Cols, rows: Range<usize>| {
            let v = normalized.as_mut().map(|(nsq, v)| (*nsq, &mut **v));
            p.spmv_rows(be, s, cols, rows, v, d, y)
        };
        // Cols::Own is right here: the interior rows read no column beyond x (PatternOverlap::new)
        part(Cols::Own(x), ov.interior.clone())?;
        be.stream.wait(&ov.arrived).doing("waiting for the halo")?;
        let (i, m) = (ov.interior.clone(), self.n_local);
        part(Cols::Halo(x, &ov.ghosts), 0..i.start)?;
        part(Cols::Halo(x, &ov.ghosts), i.end..m)
    }

    /// The split product: interior rows while MPI moves the ghosts, boundary rows after.
    fn apply_split(
        &self,
        be: &CudaBackend,
        sp: &SplitRows,
        s: Scale,
        x: &DeviceVec,
        h: &mut Halo,
        y: &mut DeviceVec,
    ) -> Result<()> {
        let by_nccl = self.send_halo(be, x, h)?;
        if let Some(t) = h.t_interior.as_mut() {
            sp.interior.apply(be, Scale::SET, x, t)?;
            be.scatter_rows(&sp.rows_interior, t, y, s)?;
        }
        if !by_nccl {
            self.receive_halo(be, h)?;
        }
        if let Some(t) = h.t_boundary.as_mut() {
            sp.boundary.apply(be, Scale::SET, &h.ext, t)?;
            be.scatter_rows(&sp.rows_boundary, t, y, s)?;
        }
        Ok(())
    }
}

impl SplitRows {
    /// Split the local matrix `a` (columns: n owned, then ghosts) into interior and boundary
    /// rows and upload both parts.
    fn new(be: &CudaBackend, a: &Csr, n: usize, precision: Precision) -> Result<Self> {
        let (interior, boundary): (Vec<usize>, Vec<usize>) =
            (0..a.nrows()).partition(|&r| a.row(r).0.iter().all(|&c| (c as usize) < n));
        // Interior rows read x itself: n columns.
        let (m, _, ip, ix, v) = a.select_rows(&interior).into_parts();
        let a_int = Csr::try_new(m, n, ip, ix, v)?;
        let a_bnd = a.select_rows(&boundary);
        let op = |m: &Csr| CudaCsrOperator::new(be, m, TransposeStrategy::Scatter, precision);
        let rows = |r: &[usize]| -> Vec<u32> { r.iter().map(|&i| i as u32).collect() };
        Ok(SplitRows {
            interior: op(&a_int)?,
            boundary: op(&a_bnd)?,
            rows_interior: up(be, &rows(&interior))?,
            rows_boundary: up(be, &rows(&boundary))?,
            n_interior: interior.len(),
            n_boundary: boundary.len(),
        })
    }
}

impl Operator<CudaBackend> for CudaSquareOperator<'_> {
    fn nrows(&self) -> usize {
        self.n_local
    }
    fn ncols(&self) -> usize {
        self.n_local
    }
    fn apply(&self, be: &CudaBackend, s: Scale, x: &DeviceVec, y: &mut DeviceVec) -> Result<()> {
        if x.len() != self.n_local || y.len() != self.n_local {
            return Err(Error::Invalid(format!(
                "cuda square operator: vectors of {} and {} for {} local rows",
                x.len(),
                y.len(),
                self.n_local
            )));
        }
        match &self.product {
            Product::Split(sp) => {
                let Some(h) = &self.halo else {
                    return Err(Error::Invalid("a split product needs a halo".into()));
                };
                let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
                self.apply_split(be, sp, s, x, &mut h, y)
            }
            Product::Whole(op) => self.with_columns(be, x, |xs| op.apply(be, s, xs, y)),
            Product::Patterns(p) => self.pattern_product(be, p, (s, x), None, None, y),
        }
    }
    fn apply_scaled_rows(
        &self,
        be: &CudaBackend,
        x: &DeviceVec,
        d: Option<&DeviceVec>,
        t: &mut DeviceVec,
        y: &mut DeviceVec,
    ) -> Result<()> {
        match (&self.halo, &self.product) {
            // the scale in the product's epilogue, where the product has one
            (None, Product::Whole(op)) => match d.and_then(|d| op.apply_row_scaled(be, x, d, y)) {
                Some(done) => done,
                None => crate::backend::scaled_rows_by_pass(self, be, (x, d), (t, y)),
            },
            (_, Product::Patterns(p)) => self.pattern_product(be, p, (Scale::SET, x), None, d, y),
            _ => crate::backend::scaled_rows_by_pass(self, be, (x, d), (t, y)),
        }
    }
    fn apply_normalized_scaled_rows(
        &self,
        be: &CudaBackend,
        (sc, at): (&DeviceVec, usize),
        x: &mut DeviceVec,
        v: &mut DeviceVec,
        d: Option<&DeviceVec>,
        y: &mut DeviceVec,
    ) -> Result<()>
    where
        CudaBackend: ScalarSlots,
    {
        let Product::Patterns(p) = &self.product else {
            return crate::backend::normalized_by_pass(self, be, (sc, at), (x, v), (d, y));
        };
        // the row-pattern kernel scales x as it gathers it and writes v (one pass fewer)
        let nsq = be.scalar_ptr("normalised product", sc, at, 1)?;
        let normalized = Some((nsq, v));
        self.pattern_product(be, p, (Scale::SET, x), normalized, d, y)
    }
    fn apply_t(
        &self,
        _be: &CudaBackend,
        _s: Scale,
        _y: &DeviceVec,
        _x: &mut DeviceVec,
    ) -> Result<()> {
        Err(Error::Invalid(
            "the distributed square operator has no transpose product (GMRES does not need one)"
                .into(),
        ))
    }
}

/// A triangular factor without its diagonal, on the device.
struct DevTri {
    ptr: CudaSlice<u64>,
    col: CudaSlice<u32>,
    val: CudaSlice<f64>,
}

impl DevTri {
    fn upload(be: &CudaBackend, t: &Csr) -> Result<Self> {
        // `up` pads an empty array to one element (never read): no zero-byte allocations.
        Ok(DevTri {
            ptr: up(be, t.indptr())?,
            col: up(be, t.indices())?,
            val: up(be, t.data())?,
        })
    }
}

/// Block ILU(0) with Jacobi-sweep triangular solves on the device.
pub struct CudaIluSweeps {
    n: usize,
    l: DevTri,
    u: DevTri,
    inv_diag: CudaSlice<f64>,
    sweeps: usize,
    y: CudaSlice<f64>,
    y2: CudaSlice<f64>,
    tmp: CudaSlice<f64>,
}

impl CudaIluSweeps {
    /// Upload the factors of `f`, which must use Jacobi triangular solves.
    pub fn new(be: &CudaBackend, f: &BlockIlu0) -> Result<Self> {
        let (l, u, inv_diag, tri) = f.split_factors()?;
        let TriSolve::Jacobi(sweeps) = tri else {
            return Err(Error::backend(
                "cuda",
                "block ILU(0) on the GPU solves its triangular systems by Jacobi sweeps: give the sweep count (--ilu-sweeps N, e.g. 3), or use --backend cpu for exact solves",
            ));
        };
        let n = l.nrows();
        Ok(CudaIluSweeps {
            n,
            l: DevTri::upload(be, &l)?,
            u: DevTri::upload(be, &u)?,
            inv_diag: be.upload(&inv_diag)?,
            sweeps,
            y: be.zeros(n.max(1))?,
            y2: be.zeros(n.max(1))?,
            tmp: be.zeros(n.max(1))?,
        })
    }

    /// out = (rhs - T x) * (dinv or 1), a thread per row.
    #[allow(clippy::too_many_arguments)]
    fn sweep(
        be: &CudaBackend,
        n: usize,
        t: &DevTri,
        rhs: u64,
        x: u64,
        dinv: u64,
        out: u64,
    ) -> Result<()> {
        let (ptr, col, val) = (be.ptr(&t.ptr), be.ptr(&t.col), be.ptr(&t.val));
        let words = [ptr, col, val, rhs, x, dinv, out].map(Word::U64);
        be.elementwise(&be.k.tri_sweep, n, &words)
    }
}

impl Preconditioner<CudaBackend> for CudaIluSweeps {
    fn name(&self) -> String {
        format!(
            "block-ilu0 (jacobi triangular solves, {} sweeps)",
            self.sweeps
        )
    }
    fn apply(
        &mut self,
        be: &CudaBackend,
        r: &CudaSlice<f64>,
        z: &mut CudaSlice<f64>,
    ) -> Result<()> {
        let n = self.n;
        if r.len() != n || z.len() != n {
            return Err(Error::Invalid(format!(
                "cuda block ILU(0): vectors of {} and {} for {n} rows",
                r.len(),
                z.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        // L y = r: y <- r - (L - I) y from y = r, ping-ponging between y and y2.
        be.stream
            .memcpy_dtod(r, &mut self.y.slice_mut(..n))
            .doing("device copy")?;
        let pr = be.ptr(r);
        let (mut cur, mut next) = (be.ptr(&self.y), be.ptr(&self.y2));
        for _ in 0..self.sweeps {
            Self::sweep(be, n, &self.l, pr, cur, 0, next)?;
            std::mem::swap(&mut cur, &mut next);
        }
        let py = cur;
        // U z = y: z <- D^-1 (y - (U - D) z) from z = D^-1 y; start in the buffer that makes
        // the last sweep land in z.
        let (pz, pt) = (be.ptr(z), be.ptr(&self.tmp));
        let (mut a, mut b) = if self.sweeps % 2 == 0 {
            (pz, pt)
        } else {
            (pt, pz)
        };
        let pd = be.ptr(&self.inv_diag);
        // a = inv_diag .* y (the CPU's y[i] * inv_diag[i]; multiplication commutes exactly)
        be.elementwise(&be.k.pmul, n, &[pd, py, a].map(Word::U64))?;
        for _ in 0..self.sweeps {
            Self::sweep(be, n, &self.u, py, a, pd, b)?;
            std::mem::swap(&mut a, &mut b);
        }
        debug_assert_eq!(a, pz);
        Ok(())
    }
}
