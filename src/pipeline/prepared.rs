//! Prepared storage that lasts (docs/formats.md, "Prepared storage"): `seistomo prepare CONFIG`
//! runs the load and the set-up of `invert` once and writes each rank's result into the
//! dataset, `<dataset>/prepared/rank<r>-of-<n>.prep`: the rows as the operator stores them
//! (reordered, the grid's damping rows split off as a stencil), b in that order, the ordering
//! and the ray coverage. The next `invert` on that dataset with the same options reads it
//! instead of the rows and skips the load's decoding, the coverage and the set-up on the CPU.
//!
//! A file is used only when what it was made from is what the run would make it from now
//! (its `inputs`): the dataset's manifest and every file of the dataset (name, size and
//! modification time), the load options, the backend, the storage, transpose, reorder and grid
//! asked for, the rank count and this rank. Anything else (and a file of another format
//! version, or a damaged one) is not used: the run sets up from the rows and says why, once.
//! Every byte is checked (CRC32C per 16 MiB chunk) as it is read.

use std::path::{Path, PathBuf};
use std::time::{Instant, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::backend::storage::{
    self, DeviceEncoding, EncodedRows, EncodingKey, Storage, StoredMatrix, StoredRows,
};
use crate::comm::{agree, Comm};
use crate::error::{Error, Result};
use crate::grid::reorder::Ordering;
use crate::grid::stencil::{Stencil, StencilOp};
use crate::grid::{Coverage, Grid};
use crate::io::dataset::manifest::DatasetManifest;
use crate::io::dataset::LoadOptions;
use crate::io::prepared::{Reader, Writer};
use crate::partition::RowCost;
use crate::pipeline::options::{BackendChoice, SolveOptions};
use crate::pipeline::prepare::Layout;
use crate::sparse::tiled::{Tiled, TiledValues};
use crate::sparse::{Csr, Precision};

/// The meaning of the sections (bumped when the pipeline stores something else).
pub const LAYOUT_VERSION: u32 = 1;
pub use crate::io::prepared::DIR;

pub use crate::pipeline::options::UsePrepared;

/// A rank's prepared file of the dataset whose manifest is `manifest`.
pub fn file_of(manifest: &Path, rank: usize, ranks: usize) -> PathBuf {
    dataset_dir(manifest)
        .join(DIR)
        .join(format!("rank{rank}-of-{ranks}.prep"))
}

fn dataset_dir(manifest: &Path) -> PathBuf {
    let d = if manifest.is_dir() {
        manifest
    } else {
        manifest.parent().unwrap_or(Path::new("."))
    };
    if d.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        d.to_path_buf()
    }
}

/// The files the dataset's manifest names (itself, the metadata, every file in the kernel
/// folder, the vectors and the damping blocks): name, size and modification time in
/// nanoseconds. Outputs written beside them do not count.
fn dataset_files(dm: &DatasetManifest) -> Result<Vec<(String, u64, u128)>> {
    let m = &dm.m;
    let mut names: Vec<PathBuf> =
        vec![dm.path.clone(), dm.resolve(&m.metadata), dm.resolve(&m.rhs)];
    names.extend(
        [&m.weights, &m.sigma, &m.true_model]
            .into_iter()
            .flatten()
            .map(|p| dm.resolve(p)),
    );
    if let Some(d) = &m.damping {
        names.extend(d.blocks.iter().map(|p| dm.resolve(p)));
    }
    let kdir = dm.resolve(&m.kernel_dir);
    let mut kernel: Vec<PathBuf> = std::fs::read_dir(&kdir)
        .map_err(|e| Error::io(&kdir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| Error::io(&kdir, e)))
        .collect::<Result<_>>()?;
    kernel.sort();
    names.extend(kernel);
    names
        .into_iter()
        .map(|p| {
            let md = std::fs::metadata(&p).map_err(|e| Error::io(&p, e))?;
            let mtime = md
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |t| t.as_nanos());
            let rel = p
                .strip_prefix(&dm.dir)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            Ok((rel, md.len(), mtime))
        })
        .collect()
}

/// What the options say about a prepared file's content.
pub struct Asked<'a> {
    pub kind: BackendChoice,
    pub opts: &'a SolveOptions,
    pub load: &'a LoadOptions,
    pub row_cost: RowCost,
}

/// What this rank's prepared file of `manifest` must have been made from.
fn inputs(dm: &DatasetManifest, a: &Asked, comm: &dyn Comm) -> Result<Value> {
    let files: Vec<Value> = dataset_files(dm)?
        .into_iter()
        .map(|(n, len, t)| json!([n, len, t.to_string()]))
        .collect();
    let l = a.load;
    let o = &a.opts.operator;
    Ok(json!({
        "layout_version": LAYOUT_VERSION,
        "files": files,
        "load": format!("damping_weight {:?} regularisation {:?} row_cost {:?}",
            l.damping_weight, l.regularisation, l.row_cost.unwrap_or(a.row_cost)),
        "backend": format!("{:?}", a.kind),
        "storage": format!("{:?}", o.storage),
        "transpose": format!("{:?}", o.transpose),
        "reorder": format!("{:?}", a.opts.reorder),
        "grid": a.opts.grid,
        "col_scale": a.opts.col_scale,
        "ranks": comm.size(),
        "rank": comm.rank(),
    }))
}

/// What differs between two `inputs`, in words (the most telling difference first).
fn differs(was: &Value, now: &Value) -> Option<String> {
    const ORDER: [&str; 11] = [
        "layout_version",
        "files",
        "storage",
        "backend",
        "transpose",
        "reorder",
        "grid",
        "col_scale",
        "ranks",
        "rank",
        "load",
    ];
    let mut keys: Vec<&str> = now.as_object()?.keys().map(String::as_str).collect();
    keys.sort_by_key(|k| ORDER.iter().position(|o| o == k).unwrap_or(ORDER.len()));
    let k = keys.into_iter().find(|k| was.get(k) != now.get(k))?;
    Some(match k {
        "files" => "the dataset's files changed since it was written".into(),
        "layout_version" => "it was written by another seistomo version".into(),
        "load" => "it was made with other load options (damping weight, regularisation, or the row costs of another storage)".into(),
        _ => format!("it was made with another {k}"),
    })
}

/// One rank's prepared system, read back.
pub struct Reused {
    /// The stored matrix, b and the ordering, as [`storage::prepare`] made them.
    pub prepared: storage::Prepared,
    /// This rank's ray coverage (before the sum over ranks).
    pub coverage: Coverage,
    pub kernel_rows: usize,
    /// Nonzeros of this rank's rows as loaded (stencil rows included).
    pub loaded_nnz: usize,
    /// The layout it was made with.
    pub storage: Storage,
    pub grid: Option<[usize; 3]>,
    /// The dataset's grid and true model.
    pub dataset_grid: Option<Grid>,
    pub true_model: Option<Vec<f64>>,
    pub path: PathBuf,
    pub seconds: f64,
}

/// Why a run did not reuse prepared storage (None: it did, or there was none to use).
pub type NotUsed = Option<String>;

/// This rank's prepared system of the dataset `manifest`, when every rank has a valid one
/// (collective). `Ok((None, why))` otherwise, `why` saying why a file that exists was not used.
pub fn reuse(manifest: &Path, a: &Asked, comm: &dyn Comm) -> Result<(Option<Reused>, NotUsed)> {
    let t = Instant::now();
    let path = file_of(manifest, comm.rank(), comm.size());
    type Usable = std::result::Result<(Reader, DatasetManifest), Option<String>>;
    let mine: Result<Usable> = (|| {
        if !path.exists() {
            return Ok(Err(None));
        }
        let r = match Reader::open(&path) {
            Ok(r) => r,
            Err(e) => return Ok(Err(Some(e.to_string()))),
        };
        let dm = DatasetManifest::load(manifest)?;
        let now = inputs(&dm, a, comm)?;
        Ok(match differs(&r.header.inputs, &now) {
            None => Ok((r, dm)),
            Some(why) => Err(Some(format!("{}: {why}", crate::io::tidy(&path).display()))),
        })
    })();
    let mine = agree(comm, mine)?;
    let ok = comm.allreduce_scalar(if mine.is_ok() { 0.0 } else { 1.0 })? == 0.0;
    let (reader, dm) = match (mine, ok) {
        (Ok(r), true) => r,
        (Err(why), _) => return Ok((None, why)),
        (Ok(_), false) => {
            return Ok((
                None,
                Some("another rank's prepared file is not usable".into()),
            ))
        }
    };
    // The GPU encoding in the file is read instead of the rows where this run would make the
    // same one.
    let want = crate::pipeline::operators::wanted_encoding(a.kind, &a.opts.operator);
    let read = agree(comm, read_back(reader, &dm, want));
    match read {
        Ok(mut r) => {
            r.seconds = t.elapsed().as_secs_f64();
            Ok((Some(r), None))
        }
        Err(e) => Ok((None, Some(e.to_string()))),
    }
}

fn meta_usize(m: &Value, k: &str, path: &Path) -> Result<usize> {
    m[k].as_u64()
        .map(|v| v as usize)
        .ok_or_else(|| Error::format(path, format!("meta: no '{k}'")))
}

/// The stored rows in CSR, read from the file.
fn read_rows(r: &Reader, (nrows, ncols): (usize, usize)) -> Result<Csr> {
    use crate::io::prepared::bytes_of_mut as b;
    let (mut ip, mut ci, mut v) = (
        r.empty::<u64>("indptr")?,
        r.empty::<u32>("indices")?,
        r.empty::<f64>("values")?,
    );
    r.fill(vec![
        ("indptr", b(&mut ip)),
        ("indices", b(&mut ci)),
        ("values", b(&mut v)),
    ])?;
    Csr::try_new(nrows, ncols, ip, ci, v)
        .map_err(|e| Error::format(r.path(), format!("stored rows: {e}")))
}

/// The arrays of an opened file into the prepared system: the rows' GPU encoding where the
/// file has one made with `want`'s key (the CSR rows then read only if asked for), else the
/// rows.
fn read_back(r: Reader, dm: &DatasetManifest, want: Option<EncodingKey>) -> Result<Reused> {
    let r = std::sync::Arc::new(r);
    let path = r.path().to_path_buf();
    let m = &r.header.meta;
    let (nrows, ncols) = (
        meta_usize(m, "nrows", &path)?,
        meta_usize(m, "ncols", &path)?,
    );
    let storage: Storage = serde_json::from_value(m["storage"].clone())
        .map_err(|e| Error::format(&path, format!("meta: storage: {e}")))?;
    let encoded = match m.get("encoding").filter(|e| !e.is_null()) {
        Some(e) if want.is_some() => {
            let key: EncodingKey = serde_json::from_value(e["key"].clone())
                .map_err(|e| Error::format(&path, format!("meta: encoding: {e}")))?;
            (Some(key) == want).then_some(e)
        }
        _ => None,
    };
    let rows = match encoded {
        Some(e) => {
            let encoding = read_encoding(&r, e)?;
            let nnz = meta_usize(m, "stored_nnz", &path)?;
            if encoding.ax.nrows != nrows || encoding.ax.ncols != ncols || encoding.ax.nnz != nnz {
                return Err(Error::format(&path, "the encoding does not fit the rows"));
            }
            let rd = r.clone();
            StoredRows::Encoded(Box::new(EncodedRows {
                nrows,
                ncols,
                nnz,
                encoding: std::sync::Arc::new(encoding),
                described: e["described"].as_str().unwrap_or_default().to_string(),
                csr: std::sync::Arc::new(move || read_rows(&rd, (nrows, ncols))),
            }))
        }
        None => StoredRows::Csr(read_rows(&r, (nrows, ncols))?),
    };
    let stencil = match m.get("stencil").filter(|s| !s.is_null()) {
        None => None,
        Some(s) => {
            let st: Stencil = serde_json::from_value(s.clone())
                .map_err(|e| Error::format(&path, format!("meta: stencil: {e}")))?;
            let perm = r
                .section("stencil_perm")
                .map(|_| r.read::<u32>("stencil_perm"))
                .transpose()?;
            Some(StencilOp::new(st, perm))
        }
    };
    let ordering = Ordering {
        rows: r
            .section("row_order")
            .map(|_| r.read::<u64>("row_order"))
            .transpose()?
            .map(|v| v.into_iter().map(|i| i as usize).collect()),
        cols: r
            .section("col_order")
            .map(|_| r.read::<u32>("col_order"))
            .transpose()?,
        what: m["ordering"].as_str().unwrap_or_default().to_string(),
    };
    let b: Vec<f64> = r.read("b")?;
    let coverage = Coverage {
        hit_count: r.read("hit_count")?,
        dws: r.read("dws")?,
    };
    let stencil_rows = stencil.as_ref().map_or(0, |s| s.nrows());
    if b.len() != nrows + stencil_rows || coverage.dws.len() != ncols {
        return Err(Error::format(
            &path,
            "b or the coverage does not fit the rows",
        ));
    }
    Ok(Reused {
        prepared: storage::Prepared {
            matrix: StoredMatrix {
                rows,
                stencil,
                storage,
            },
            b,
            ordering,
        },
        coverage,
        kernel_rows: meta_usize(m, "kernel_rows", &path)?,
        loaded_nnz: meta_usize(m, "loaded_nnz", &path)?,
        storage,
        grid: serde_json::from_value(m["grid"].clone()).unwrap_or(None),
        dataset_grid: dm.m.grid.clone(),
        true_model: crate::io::dataset::true_model_of(dm)?,
        path,
        seconds: 0.0,
    })
}

/// The scalars of a tiled matrix (its arrays are sections `<prefix>.<array>`).
fn tiled_meta(t: &Tiled) -> Value {
    json!({"nrows": t.nrows, "ncols": t.ncols, "nnz": t.nnz, "tile_bits": t.tile_bits})
}

/// The arrays of a tiled matrix as sections `<p>.<array>` (the halves not built: empty).
fn add_tiled<'a>(out: &mut Writer<'a>, p: &str, t: &'a Tiled) {
    let n = |k: &str| format!("{p}.{k}");
    for (k, v) in [
        ("chunk_tile", &t.chunk_tile),
        ("chunk_seg", &t.chunk_seg),
        ("tile_chunk", &t.tile_chunk),
        ("seg_row", &t.seg_row),
        ("seg_slot", &t.seg_slot),
        ("seg_pos", &t.seg_pos),
    ] {
        out.add(&n(k), v);
    }
    for (k, v) in [
        ("seg_ent", &t.seg_ent),
        ("row_seg", &t.row_seg),
        ("b_colptr", &t.b_colptr),
    ] {
        out.add(&n(k), v);
    }
    out.add(&n("a_lcol"), &t.a_lcol);
    out.add(&n("b_lseg"), &t.b_lseg);
    for (k, v) in [("a_val", &t.a_val), ("b_val", &t.b_val)] {
        match v {
            TiledValues::F64(v) => out.add(&n(k), v),
            TiledValues::F32(v) => out.add(&n(k), v),
        }
    }
}

/// A tiled matrix written by [`add_tiled`] with the scalars `m`, its arrays allocated
/// (zeroed) to their sections' lengths, for [`fill_tiled`].
fn empty_tiled(r: &Reader, p: &str, m: &Value, precision: Precision) -> Result<Tiled> {
    let path = r.path();
    let n = |k: &str| format!("{p}.{k}");
    let vals = |k: &str| -> Result<TiledValues> {
        Ok(match precision {
            Precision::F64 => TiledValues::F64(r.empty(&n(k))?),
            Precision::F32 => TiledValues::F32(r.empty(&n(k))?),
        })
    };
    let tile_bits = meta_usize(m, "tile_bits", path)? as u32;
    if !(1..=15).contains(&tile_bits) {
        return Err(Error::format(path, format!("{p}: tile_bits {tile_bits}")));
    }
    Ok(Tiled {
        nrows: meta_usize(m, "nrows", path)?,
        ncols: meta_usize(m, "ncols", path)?,
        nnz: meta_usize(m, "nnz", path)?,
        tile_bits,
        chunk_tile: r.empty(&n("chunk_tile"))?,
        chunk_seg: r.empty(&n("chunk_seg"))?,
        tile_chunk: r.empty(&n("tile_chunk"))?,
        seg_row: r.empty(&n("seg_row"))?,
        seg_slot: r.empty(&n("seg_slot"))?,
        seg_pos: r.empty(&n("seg_pos"))?,
        seg_ent: r.empty(&n("seg_ent"))?,
        row_seg: r.empty(&n("row_seg"))?,
        a_lcol: r.empty(&n("a_lcol"))?,
        a_val: vals("a_val")?,
        b_colptr: r.empty(&n("b_colptr"))?,
        b_lseg: r.empty(&n("b_lseg"))?,
        b_val: vals("b_val")?,
    })
}

/// The arrays of `t` as (section name, bytes) for [`Reader::fill`].
fn tiled_parts<'a>(p: &str, t: &'a mut Tiled) -> Vec<(String, &'a mut [u8])> {
    use crate::io::prepared::bytes_of_mut as b;
    let n = |k: &str| format!("{p}.{k}");
    let vals = |v: &'a mut TiledValues| match v {
        TiledValues::F64(v) => b(v),
        TiledValues::F32(v) => b(v),
    };
    vec![
        (n("chunk_tile"), b(&mut t.chunk_tile)),
        (n("chunk_seg"), b(&mut t.chunk_seg)),
        (n("tile_chunk"), b(&mut t.tile_chunk)),
        (n("seg_row"), b(&mut t.seg_row)),
        (n("seg_slot"), b(&mut t.seg_slot)),
        (n("seg_pos"), b(&mut t.seg_pos)),
        (n("seg_ent"), b(&mut t.seg_ent)),
        (n("row_seg"), b(&mut t.row_seg)),
        (n("a_lcol"), b(&mut t.a_lcol)),
        (n("a_val"), vals(&mut t.a_val)),
        (n("b_colptr"), b(&mut t.b_colptr)),
        (n("b_lseg"), b(&mut t.b_lseg)),
        (n("b_val"), vals(&mut t.b_val)),
    ]
}

/// The GPU encoding a file's meta `e` describes: both halves' arrays read in one parallel
/// pass, then their tables checked against each other (the GPU indexes with them).
fn read_encoding(r: &Reader, e: &Value) -> Result<DeviceEncoding> {
    let key: EncodingKey = serde_json::from_value(e["key"].clone())
        .map_err(|err| Error::format(r.path(), format!("meta: encoding: {err}")))?;
    let mut ax = empty_tiled(r, "ax", &e["ax"], key.precision)?;
    let mut at = empty_tiled(r, "at", &e["at"], key.precision)?;
    {
        let mut parts = tiled_parts("ax", &mut ax);
        parts.extend(tiled_parts("at", &mut at));
        r.fill(
            parts
                .iter_mut()
                .map(|(n, b)| (n.as_str(), &mut **b))
                .collect(),
        )?;
    }
    for (p, t) in [("ax", &ax), ("at", &at)] {
        t.check()
            .map_err(|err| Error::format(r.path(), format!("encoding {p}: {err}")))?;
    }
    if ax.a_lcol.len() != ax.nnz
        || at.b_lseg.len() != at.nnz
        || ax.tile_bits != key.ax_tile_bits
        || at.tile_bits != key.tile_bits
    {
        return Err(Error::format(
            r.path(),
            "the encoding's halves do not fit its key",
        ));
    }
    Ok(DeviceEncoding { key, ax, at })
}

/// What a rank writes: its prepared system and coverage.
pub struct ToWrite<'a> {
    pub prepared: &'a storage::Prepared,
    pub coverage: &'a Coverage,
    pub kernel_rows: usize,
    pub loaded_nnz: usize,
    pub layout: &'a Layout,
    /// The rows' GPU encoding made ahead, and the words that describe the storage.
    pub encoding: Option<(&'a DeviceEncoding, &'a str)>,
}

/// Write this rank's prepared file of the dataset `manifest` (atomically). Returns its path
/// and size in bytes.
pub fn write(manifest: &Path, a: &Asked, w: &ToWrite, comm: &dyn Comm) -> Result<(PathBuf, u64)> {
    let path = file_of(manifest, comm.rank(), comm.size());
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let inputs = inputs(&DatasetManifest::load(manifest)?, a, comm)?;
    let p = w.prepared;
    let stencil = p.matrix.stencil.as_ref();
    let rows = p.matrix.rows.as_csr().ok_or_else(|| {
        Error::Invalid("prepare: the rows are not in memory (read from prepared storage)".into())
    })?;
    let encoding = w.encoding.map(|(e, described)| {
        json!({
            "key": e.key,
            "described": described,
            "ax": tiled_meta(&e.ax),
            "at": tiled_meta(&e.at),
        })
    });
    let meta = json!({
        "nrows": rows.nrows(),
        "ncols": rows.ncols(),
        "stored_nnz": rows.nnz(),
        "encoding": encoding,
        "storage": p.matrix.storage,
        "stencil": stencil.map(|s| *s.stencil()),
        "ordering": p.ordering.what,
        "kernel_rows": w.kernel_rows,
        "loaded_nnz": w.loaded_nnz,
        "grid": w.layout.grid,
    });
    let row_order: Option<Vec<u64>> = p
        .ordering
        .rows
        .as_ref()
        .map(|v| v.iter().map(|&i| i as u64).collect());
    let mut out = Writer::default();
    out.add("indptr", rows.indptr());
    out.add("indices", rows.indices());
    out.add("values", rows.data());
    out.add("b", &p.b);
    if let Some(v) = &row_order {
        out.add("row_order", v);
    }
    if let Some(v) = &p.ordering.cols {
        out.add("col_order", v);
    }
    if let Some(v) = stencil.and_then(|s| s.new_of_old()) {
        out.add("stencil_perm", v);
    }
    if let Some((e, _)) = w.encoding {
        add_tiled(&mut out, "ax", &e.ax);
        add_tiled(&mut out, "at", &e.at);
    }
    out.add("hit_count", &w.coverage.hit_count);
    out.add("dws", &w.coverage.dws);
    out.write(&path, inputs, meta)?;
    let bytes = std::fs::metadata(&path)
        .map_err(|e| Error::io(&path, e))?
        .len();
    Ok((path, bytes))
}

/// Check every prepared file of the dataset at `manifest` (`seistomo verify`): each read whole
/// and its checksums checked. Returns (files, bytes).
pub fn verify_all(manifest: &Path) -> Result<(u64, u64)> {
    let dir = dataset_dir(manifest).join(DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok((0, 0));
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "prep"))
        .collect();
    paths.sort();
    let mut bytes = 0;
    for p in &paths {
        bytes += Reader::open(p)?.verify()?;
    }
    Ok((paths.len() as u64, bytes))
}

/// What `seistomo prepare` wrote on this rank.
pub struct Written {
    pub path: PathBuf,
    pub bytes: u64,
    /// The storage it holds, in words.
    pub storage: String,
    pub seconds: f64,
}

/// `seistomo prepare`: load the config's dataset and lay it out as `invert` would on `kind`
/// (the backend the runs will use: `None` chooses as `invert` does), then write every rank's
/// prepared file (collective).
pub fn prepare_dataset(
    cfg: &crate::pipeline::config::RunConfig,
    kind: Option<BackendChoice>,
    comm: &dyn Comm,
) -> Result<Written> {
    use crate::pipeline::options::SystemSource;
    let t = Instant::now();
    let SystemSource::Dataset { path, options, .. } = &cfg.system else {
        return Err(Error::Invalid(
            "prepare: the config's system is not a dataset ([dataset] path); Matrix Market systems have no prepared storage".into(),
        ));
    };
    let opts = &cfg.options;
    let kind = match kind {
        Some(k) => k,
        None => crate::pipeline::operators::choose_backend(opts.operator.backend)?.0,
    };
    let row_cost = crate::pipeline::operators::row_cost(kind, opts.operator.storage);
    let loaded = crate::pipeline::load::load(&cfg.system, comm, &opts.operator.tuning, row_cost)?;
    let model = agree(
        comm,
        crate::pipeline::model::RunModel::prepare(cfg, &loaded, false),
    )?;
    let grid = model.grid().or(opts.grid);
    let sys = loaded.system;
    let (kernel_rows, loaded_nnz) = (sys.kernel_rows, sys.a.nnz());
    let layout = Layout {
        storage: crate::pipeline::operators::resolve_storage(
            kind,
            opts.operator.storage,
            opts.operator.transpose,
            loaded_nnz,
        ),
        reorder: opts.reorder,
        grid,
        col_scale: opts.col_scale,
        x0: None,
        // the file keeps the reordered rows
        deferred: Default::default(),
    };
    let stored = crate::pipeline::prepare::store(sys, &layout);
    // The GPU encoding made now where the runs would make it (compact storage on the GPU, not
    // probed against CSR, no column scaling: scaling changes the values after this file).
    let encoding = match stored.matrix.rows.as_csr() {
        Some(rows) if !layout.col_scale => {
            crate::pipeline::operators::encode_ahead(kind, &opts.operator, &stored.matrix, rows)
        }
        _ => None,
    };
    let asked = Asked {
        kind,
        opts,
        load: options,
        row_cost,
    };
    let w = ToWrite {
        prepared: &stored,
        coverage: &model.coverage,
        kernel_rows,
        loaded_nnz,
        layout: &layout,
        encoding: encoding.as_ref().map(|(e, d)| (e, d.as_str())),
    };
    let (path, bytes) = agree(comm, write(path, &asked, &w, comm))?;
    Ok(Written {
        path,
        bytes,
        storage: format!(
            "{}{}, {}{}",
            format!("{:?}", stored.matrix.storage).to_lowercase(),
            if stored.matrix.stencil.is_some() {
                " with grid stencils"
            } else {
                ""
            },
            stored.ordering.what,
            match &encoding {
                Some((e, _)) => format!(
                    "; encoded for the GPU (split tiles of 2^{} and 2^{} columns, {} values)",
                    e.key.ax_tile_bits, e.key.tile_bits, e.key.precision
                ),
                None => String::new(),
            }
        ),
        seconds: t.elapsed().as_secs_f64(),
    })
}
