//! How a loaded LSQR system is stored for the solve: the storage choice (`[backend] storage`,
//! `--storage`), the split of grid-generated damping rows off the stored rows (applied as
//! stencils, src/grid/stencil.rs), and the reordering for locality (src/grid/reorder.rs) of what
//! stays stored.
//!
//! With `compact` storage and a known grid, the damping rows at the end of the system that are
//! exactly a grid stencil (norm damping, first or second differences: what `synth`, the
//! dataset's generated regularisation and the benchmark system append) are taken out of the
//! matrix; the remaining rows are reordered (rows sorted, cells in Morton order) and encoded
//! with 16-bit column deltas (src/sparse/compact.rs). The stencil rows keep their canonical order
//! and follow the stored rows in u. With `csr` everything stays stored, as before.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::grid::reorder::{Ordering, Reorder};
use crate::grid::{Stencil, StencilOp};
use crate::sparse::tiled::Tiled;
use crate::sparse::{CompactCsr, Csr, Precision};
use crate::ui::phases;

/// Matrix storage of a solve.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    /// Compact where the backend and transpose strategy support it, else CSR.
    #[default]
    Auto,
    /// f64/f32 values with u32 columns and u64 row offsets; every row stored.
    Csr,
    /// f32/f64 values with 16-bit column deltas; grid damping rows as stencils.
    Compact,
}

choice_from_str!(Storage, "storage", "auto" => Self::Auto, "csr" => Self::Csr, "compact" => Self::Compact);

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Csr => "csr",
            Self::Compact => "compact",
        })
    }
}

impl Storage {
    /// Resolve `Auto`: compact unless the transpose strategy asked for needs CSR (the vendor
    /// library, or atomics from the rows).
    pub fn resolve(self, csr_transpose: bool) -> Storage {
        match self {
            Storage::Auto if csr_transpose => Storage::Csr,
            Storage::Auto => Storage::Compact,
            s => s,
        }
    }
}

/// What decides a GPU encoding made ahead of the run: the device layout (only `split` is
/// made ahead), the values' precision and both tile sizes. A run uses an encoding made ahead
/// only where it would make the same one now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodingKey {
    pub precision: Precision,
    /// A^T y's tiles: 2^tile_bits columns.
    pub tile_bits: u32,
    /// A x's tiles.
    pub ax_tile_bits: u32,
}

/// The GPU's compact encoding of stored rows (the `split` device layout: column tiles of the
/// row entries for A x, of the column entries for A^T y), made by `seistomo prepare` and kept
/// in the dataset so that a run uploads it without encoding.
#[derive(Debug, Clone)]
pub struct DeviceEncoding {
    pub key: EncodingKey,
    /// A x's tiles (row half only).
    pub ax: Tiled,
    /// A^T y's tiles (column half only).
    pub at: Tiled,
}

/// A source of the rows in CSR when only their encoding is in memory (the prepared file).
pub type CsrSource = Arc<dyn Fn() -> crate::error::Result<Csr> + Send + Sync>;

/// Rows known by their GPU encoding: the shape, the encoding, the words that describe the
/// storage, and where to read the rows themselves when something needs them (a CSR fallback,
/// a checkpoint's fingerprint).
#[derive(Clone)]
pub struct EncodedRows {
    pub nrows: usize,
    pub ncols: usize,
    pub nnz: usize,
    pub encoding: Arc<DeviceEncoding>,
    /// [`StoredMatrix::describe`]'s words for the stored rows, made when they were encoded.
    pub described: String,
    pub csr: CsrSource,
}

impl std::fmt::Debug for EncodedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedRows")
            .field("nrows", &self.nrows)
            .field("ncols", &self.ncols)
            .field("nnz", &self.nnz)
            .field("key", &self.encoding.key)
            .finish_non_exhaustive()
    }
}

/// Rows as read and the ordering that the operator applies to them where it is made (on the
/// GPU, which reorders and encodes the uploaded rows: src/backend/cuda/encode.rs); reordered on
/// the host only if something asks for them in CSR. `ordering.rows` is always a permutation
/// (what [`prepare`] leaves this way).
#[derive(Debug, Clone)]
pub struct ReorderedRows {
    /// The rows in their original order and columns (shared with the thread that computes
    /// the ray coverage from them while the GPU builds its operator and solves).
    pub rows: Arc<Csr>,
    /// New row i is `rows`' row `ordering.rows[i]`; old column j becomes `ordering.cols[j]`.
    pub ordering: Ordering,
    /// Where the run left the ray coverage of its first rows to whoever holds these rows last
    /// ([`Deferred::coverage`]): how many rows are kernel rows.
    pub coverage_rows: Option<usize>,
}

impl ReorderedRows {
    /// The ray coverage the run left to these rows, if it did ([`Self::coverage_rows`]).
    pub fn coverage(&self) -> Option<crate::grid::Coverage> {
        self.coverage_rows
            .map(|k| crate::grid::Coverage::from_kernel_rows(&self.rows, k))
    }

    /// The rows in the new order on the host ([`Ordering::apply`]'s matrix; a copy where the
    /// rows are shared).
    pub fn apply(self) -> Csr {
        let o = &self.ordering;
        let (r, c) = (o.rows.as_deref(), o.cols.as_deref());
        phases::time("permute", || match Arc::try_unwrap(self.rows) {
            Ok(rows) => rows.permuted(r, c),
            Err(shared) => shared.permuted_copy(r, c),
        })
    }

    /// The ray coverage the run left to these rows ([`Self::coverage_rows`]), started on a
    /// thread of its own that shares the rows (and drops its share when done).
    pub fn coverage_beside(&self) -> Option<crate::grid::PendingCoverage> {
        let (k, rows) = (self.coverage_rows?, Arc::clone(&self.rows));
        Some(crate::grid::PendingCoverage::spawn(move || {
            let t = std::time::Instant::now();
            let c = crate::grid::Coverage::from_kernel_rows(&rows, k);
            phases::trace(format_args!(
                "coverage computed beside the set-up and the solve in {:.3} s",
                t.elapsed().as_secs_f64()
            ));
            // the last share frees them (in pieces, off this thread), else the other one will
            if let Ok(rows) = Arc::try_unwrap(rows) {
                crate::sparse::par::drop_in_background(rows);
            }
            Some(c)
        }))
    }
}

/// What a GPU run leaves undone in [`prepare`]: compact rows left as read for the GPU to
/// reorder where it encodes them (`permute`, [`StoredRows::Reordered`]), and with them the ray
/// coverage of the kernel rows (`coverage`), computed from the rows as read once the GPU holds
/// them, while it reorders, encodes and solves (pipeline/operators.rs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deferred {
    pub permute: bool,
    pub coverage: bool,
}

impl Deferred {
    /// Whether [`prepare`] leaves the rows of a system of `storage`, reordered as `reorder`
    /// says, as read ([`StoredRows::Reordered`]): compact storage with a row order. (A run that
    /// defers its coverage checks this first: only such rows carry it.)
    pub fn leaves_rows(&self, storage: Storage, reorder: Reorder) -> bool {
        self.permute && storage.resolve(false) == Storage::Compact && reorder != Reorder::None
    }
}

/// The stored rows: in memory as CSR, as their GPU encoding read from prepared storage (the
/// CSR rows then read only if asked for), or as read with the ordering still to apply.
#[derive(Debug, Clone)]
pub enum StoredRows {
    Csr(Csr),
    Encoded(Box<EncodedRows>),
    Reordered(Box<ReorderedRows>),
}

impl crate::sparse::par::GiveBack for StoredRows {
    /// The CSR rows' pages, or the encoding's where this value holds it alone (an encoding
    /// shared with a clone is left to the last owner's drop).
    fn give_back(&mut self) {
        match self {
            Self::Csr(a) => a.give_back(),
            Self::Reordered(r) => {
                if let Some(rows) = Arc::get_mut(&mut r.rows) {
                    rows.give_back();
                }
            }
            Self::Encoded(e) => {
                if let Some(enc) = Arc::get_mut(&mut e.encoding) {
                    enc.ax.give_back();
                    enc.at.give_back();
                }
            }
        }
    }
}

impl StoredRows {
    pub fn nrows(&self) -> usize {
        match self {
            Self::Csr(a) => a.nrows(),
            Self::Encoded(e) => e.nrows,
            Self::Reordered(r) => r.rows.nrows(),
        }
    }
    pub fn ncols(&self) -> usize {
        match self {
            Self::Csr(a) => a.ncols(),
            Self::Encoded(e) => e.ncols,
            Self::Reordered(r) => r.rows.ncols(),
        }
    }
    pub fn nnz(&self) -> usize {
        match self {
            Self::Csr(a) => a.nnz(),
            Self::Encoded(e) => e.nnz,
            Self::Reordered(r) => r.rows.nnz(),
        }
    }
    /// The rows in CSR if they are in memory in their order.
    pub fn as_csr(&self) -> Option<&Csr> {
        match self {
            Self::Csr(a) => Some(a),
            Self::Encoded(_) | Self::Reordered(_) => None,
        }
    }
    /// The rows in CSR, read from their source where only the encoding is in memory (the
    /// encoding is then dropped), or reordered on the host where they are as read.
    pub fn csr(&mut self) -> crate::error::Result<&mut Csr> {
        match self {
            Self::Encoded(e) => *self = Self::Csr((e.csr)()?),
            Self::Reordered(_) => {
                if let Self::Reordered(r) = std::mem::replace(self, Self::Csr(Csr::zeros(0, 0))) {
                    *self = Self::Csr(r.apply());
                }
            }
            Self::Csr(_) => {}
        }
        match self {
            Self::Csr(a) => Ok(a),
            _ => unreachable!("replaced above"),
        }
    }
    /// [`Self::csr`], by value.
    pub fn into_csr(self) -> crate::error::Result<Csr> {
        match self {
            Self::Csr(a) => Ok(a),
            Self::Encoded(e) => (e.csr)(),
            Self::Reordered(r) => Ok(r.apply()),
        }
    }
    /// The ray coverage the run left to these rows ([`Deferred::coverage`]), if it did.
    pub fn left_coverage(&self) -> Option<crate::grid::Coverage> {
        match self {
            Self::Reordered(r) => r.coverage(),
            _ => None,
        }
    }
    /// `f` of the rows in CSR, read (or reordered) for the call where they are not in memory in
    /// their order (the encoding or the rows as read stay).
    pub fn with_csr<R>(&self, f: impl FnOnce(&Csr) -> R) -> crate::error::Result<R> {
        match self {
            Self::Csr(a) => Ok(f(a)),
            Self::Encoded(e) => Ok(f(&(e.csr)()?)),
            Self::Reordered(r) => {
                let o = &r.ordering;
                Ok(f(&r
                    .rows
                    .permuted_copy(o.rows.as_deref(), o.cols.as_deref())))
            }
        }
    }
}

/// A rank's matrix as an operator will store it: the stored rows (reordered), the stencil rows
/// after them, and the storage (`Csr` or `Compact`, never `Auto`).
#[derive(Debug, Clone)]
pub struct StoredMatrix {
    pub rows: StoredRows,
    pub stencil: Option<StencilOp>,
    pub storage: Storage,
}

impl StoredMatrix {
    /// Rows of the whole system (stored + stencil).
    pub fn nrows(&self) -> usize {
        self.rows.nrows() + self.stencil.as_ref().map_or(0, |s| s.nrows())
    }
    pub fn ncols(&self) -> usize {
        self.rows.ncols()
    }
    /// Nonzeros of the whole system (the stencil's counted as if stored).
    pub fn nnz(&self) -> usize {
        self.rows.nnz() + self.stencil.as_ref().map_or(0, |s| s.stencil().nnz())
    }

    /// The storage in words, with bytes per nonzero, for reports and logs.
    pub fn describe(&self, precision: Precision) -> String {
        self.words(precision, false)
    }

    /// [`Self::describe`] for a GPU run: compact rows held in CSR are encoded at its set-up
    /// (the tiles the GPU's kernels read, not the host's column deltas), so their words come
    /// without [`describe_compact`]'s pass over them (0.018 s at 101M nonzeros, on a prepared
    /// run's way to its first iteration).
    pub fn describe_for_gpu(&self, precision: Precision) -> String {
        self.words(precision, true)
    }

    fn words(&self, precision: Precision, gpu: bool) -> String {
        match self.storage {
            Storage::Csr => describe_csr(precision),
            _ => {
                let mut s = match &self.rows {
                    StoredRows::Csr(_) if gpu => format!(
                        "compact ({precision} values, 16-bit column indices; encoded at set-up)"
                    ),
                    StoredRows::Csr(a) => describe_compact(a, precision),
                    StoredRows::Encoded(e) => e.described.clone(),
                    StoredRows::Reordered(_) => format!(
                        "compact ({precision} values, 16-bit column indices; reordered and encoded on the GPU)"
                    ),
                };
                if let Some(st) = &self.stencil {
                    s.push_str(&format!(
                        " + stencil damping ({} rows, {} blocks on the {}x{}x{} grid)",
                        st.nrows(),
                        st.blocks().len(),
                        st.stencil().n[0],
                        st.stencil().n[1],
                        st.stencil().n[2]
                    ));
                }
                s
            }
        }
    }

    /// A short tag of what is not in `rows` (for checkpoint fingerprints).
    pub fn stencil_tag(&self) -> String {
        match &self.stencil {
            None => format!("storage={}", self.storage),
            Some(st) => format!("storage={};stencil={:?}", self.storage, st.stencil()),
        }
    }
}

/// Compact storage of `rows` in words: bytes per stored nonzero and the escaped steps.
pub fn describe_compact(rows: &Csr, precision: Precision) -> String {
    let _s = phases::span("describe");
    let h = crate::sparse::GapHistogram::of(rows);
    let entries = rows.nnz() as u64 + h.fillers;
    let bytes = CompactCsr::bytes_for(rows.nrows(), entries, precision);
    format!(
        "compact ({precision} values, 16-bit column deltas: {:.2} B/stored nonzero, {:.3} % of steps escaped)",
        bytes as f64 / rows.nnz().max(1) as f64,
        100.0 * h.escape_fraction()
    )
}

/// CSR storage in words, with bytes per nonzero.
pub fn describe_csr(precision: Precision) -> String {
    format!(
        "csr ({precision} values, u32 columns: {} B/nonzero)",
        precision.bytes() + 4
    )
}

/// A system ready for an operator: its matrix as stored, the right-hand side in that row order,
/// and the ordering to map solutions back.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub matrix: StoredMatrix,
    pub b: Vec<f64>,
    pub ordering: Ordering,
}

/// Split, reorder and choose the storage of one rank's system `a` x = `b`.
///
/// `damping_from`: rows from here on are damping rows (the stencil is looked for among them);
/// `grid`: the cells along x, y, z when the unknowns are a regular grid's cells; `stencils`:
/// whether this run may take damping rows out as stencils (one rank, no column scaling);
/// `deferred`: what is left to a GPU run ([`Deferred`]: compact rows left as read, with their
/// ordering, [`StoredRows::Reordered`]; b is reordered here).
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    a: Csr,
    b: Vec<f64>,
    damping_from: usize,
    grid: Option<[usize; 3]>,
    storage: Storage,
    reorder: Reorder,
    stencils: bool,
    deferred: Deferred,
) -> Prepared {
    let storage = match storage {
        Storage::Auto => Storage::Compact,
        s => s,
    };
    // The stencil rows are looked for in the tail where it lies (nothing copied); the stored
    // rows are then the head of `a`, cut off in place.
    let split = match (storage, grid) {
        (Storage::Compact, Some(n)) if stencils && damping_from < a.nrows() => {
            let _s = phases::span("stencil");
            Stencil::detect_suffix(a.row_range(damping_from..a.nrows()), n)
                .map(|(s, st)| (damping_from + s, st))
        }
        _ => None,
    };
    let (a, b, stencil, b_tail) = match split {
        Some((start, st)) => {
            let _s = phases::span("stencil");
            let mut a = a;
            a.truncate_rows(start);
            let mut b = b;
            let b_tail = b.split_off(start);
            (a, b, Some(st), b_tail)
        }
        None => (a, b, None, Vec::new()),
    };
    let ordering = phases::time("order", || Ordering::plan(&a, reorder, grid));
    let (rows, mut b) = if deferred.leaves_rows(storage, reorder) && ordering.rows.is_some() {
        let b = phases::time("permute", || ordering.apply_to_rhs(b));
        let r = ReorderedRows {
            rows: Arc::new(a),
            ordering: ordering.clone(),
            coverage_rows: deferred.coverage.then_some(damping_from),
        };
        (StoredRows::Reordered(Box::new(r)), b)
    } else {
        let (a, b) = phases::time("permute", || ordering.apply(a, b));
        (StoredRows::Csr(a), b)
    };
    let stencil = stencil.map(|st| StencilOp::new(st, ordering.cols.clone()));
    b.extend(b_tail);
    Prepared {
        matrix: StoredMatrix {
            rows,
            stencil,
            storage,
        },
        b,
        ordering,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_the_stencil_and_keeps_the_rest_stored() {
        let st = Stencil {
            n: [6, 5, 4],
            norm: 0.1,
            first: [0.5; 3],
            second: [0.0; 3],
        };
        let k = crate::testproblems::awkward_csr(50, st.ncells(), 7);
        let a = k.vstack_scaled(&st.to_csr(), 1.0).unwrap();
        let b: Vec<f64> = (0..a.nrows()).map(|i| i as f64).collect();
        // the grid known, reordered, stencils allowed
        let on_grid = |storage, deferred| {
            prepare(
                a.clone(),
                b.clone(),
                50,
                Some(st.n),
                storage,
                Reorder::Auto,
                true,
                deferred,
            )
        };
        let p = on_grid(Storage::Auto, Deferred::default());
        let m = &p.matrix;
        assert_eq!(m.storage, Storage::Compact);
        assert_eq!(m.rows.nrows(), 50);
        assert_eq!(m.nrows(), a.nrows());
        assert_eq!(m.nnz(), a.nnz());
        assert_eq!(m.stencil.as_ref().unwrap().stencil(), &st);
        assert_eq!(&p.b[50..], &b[50..]);
        assert!(m.describe(Precision::F32).contains("stencil damping"));
        // left for the GPU to reorder: the same rows wherever they are asked for in CSR
        let on = Deferred {
            permute: true,
            coverage: true,
        };
        let q = on_grid(Storage::Auto, on);
        assert!(matches!(q.matrix.rows, StoredRows::Reordered(_)));
        // the coverage left to the rows: that of the kernel rows as read
        if let StoredRows::Reordered(r) = &q.matrix.rows {
            let want = crate::grid::Coverage::from_kernel_rows(&a, 50);
            assert_eq!(r.coverage(), Some(want.clone()));
            assert_eq!(q.matrix.rows.left_coverage(), Some(want));
        }
        assert_eq!(p.matrix.rows.left_coverage(), None);
        assert!(on.leaves_rows(Storage::Auto, Reorder::Rows));
        assert!(!on.leaves_rows(Storage::Csr, Reorder::Auto));
        assert!(!on.leaves_rows(Storage::Compact, Reorder::None));
        assert_eq!(q.b, p.b);
        assert_eq!((q.matrix.nrows(), q.matrix.nnz()), (m.nrows(), m.nnz()));
        let want = m.rows.as_csr().unwrap();
        assert_eq!(q.matrix.rows.with_csr(|c| c.clone()).unwrap(), *want);
        assert!(q.matrix.rows.as_csr().is_none());
        let mut rows = q.matrix.rows.clone();
        assert_eq!(rows.csr().unwrap(), want);
        assert_eq!(q.matrix.rows.into_csr().unwrap(), *want);
        // csr storage is reordered here whatever is asked
        let q = on_grid(Storage::Csr, on);
        assert!(matches!(q.matrix.rows, StoredRows::Csr(_)));
        // csr, no grid, or not allowed: nothing split
        for (s, g, ok) in [
            (Storage::Csr, Some(st.n), true),
            (Storage::Compact, None, true),
            (Storage::Compact, Some(st.n), false),
        ] {
            let p = prepare(a.clone(), b.clone(), 50, g, s, Reorder::None, ok, on);
            assert!(p.matrix.stencil.is_none());
            assert_eq!(p.matrix.rows.as_csr(), Some(&a));
        }
    }
}

/// A CSR matrix that already lies on the GPU (another library's arrays: CuPy's
/// `cupyx.scipy.sparse.csr_matrix`), given by device addresses in the device's primary context.
/// The CUDA backend copies the entries device to device into its own storage
/// ([`crate::backend::cuda::CudaCsrOperator::from_device`]); only the row offsets are read on the
/// host (to cut the rows into warp segments). Made by [`DeviceCsr::new`], which is `unsafe`:
/// nothing here can check that an address is what its caller says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCsr {
    nrows: usize,
    ncols: usize,
    nnz: usize,
    /// Row offsets: `nrows + 1` integers of `indptr_bytes` (4 or 8) bytes, signed.
    indptr: u64,
    indptr_bytes: usize,
    /// Columns: `nnz` 32-bit integers, each row's sorted ascending, no repeats.
    indices: u64,
    /// Values: `nnz` f64 or f32.
    values: u64,
    precision: Precision,
}

impl DeviceCsr {
    /// # Safety
    /// `indptr`, `indices` and `values` must be device addresses in the primary context of the
    /// GPU the backend runs on, of `nrows + 1` signed integers of `indptr_bytes` (4 or 8) bytes,
    /// `nnz` 32-bit column numbers and `nnz` values of `precision`, all readable and unchanged
    /// (no work still queued on them in another stream) for as long as the `DeviceCsr` is used.
    /// The offsets are checked when they are read; the columns are not (each row's must be
    /// sorted, unique and below `ncols`).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new(
        (nrows, ncols): (usize, usize),
        nnz: usize,
        (indptr, indptr_bytes): (u64, usize),
        indices: u64,
        values: u64,
        precision: Precision,
    ) -> crate::error::Result<DeviceCsr> {
        let bad = |what: String| Err(crate::error::Error::Invalid(what));
        if nrows == 0 || ncols == 0 {
            return bad(format!("a {nrows} x {ncols} matrix on the GPU is empty"));
        }
        if indptr_bytes != 4 && indptr_bytes != 8 {
            return bad(format!(
                "row offsets of {indptr_bytes} bytes: expected 32- or 64-bit integers"
            ));
        }
        if indptr == 0 || (nnz > 0 && (indices == 0 || values == 0)) {
            return bad("a null device address".into());
        }
        Ok(DeviceCsr {
            nrows,
            ncols,
            nnz,
            indptr,
            indptr_bytes,
            indices,
            values,
            precision,
        })
    }
    pub fn nrows(&self) -> usize {
        self.nrows
    }
    pub fn ncols(&self) -> usize {
        self.ncols
    }
    pub fn nnz(&self) -> usize {
        self.nnz
    }
    pub fn precision(&self) -> Precision {
        self.precision
    }
    /// (address, bytes per offset) of the row offsets.
    pub fn indptr(&self) -> (u64, usize) {
        (self.indptr, self.indptr_bytes)
    }
    pub fn indices(&self) -> u64 {
        self.indices
    }
    pub fn values(&self) -> u64 {
        self.values
    }
}
