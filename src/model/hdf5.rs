//! The model file (HDF5) and its reader. Layout (docs/model-files.md lists every item):
//!
//! ```text
//! /            attrs: format, format_version, program, version, parameterisation, unknowns, ...
//! /model       velocity, slowness, reference_velocity, perturbation, slowness_perturbation,
//!              solution, hit_count, dws, [variance_lower_bound, std_error_lower_bound],
//!              [true_velocity, true_perturbation, true_solution]; grid attrs on the group
//! /cells       bounds [n][4] (cell parameterisations)
//! /solver      attrs: every report.json key (istop, stop_reason, norms, acond, ...)
//! /history     itn, r1norm, r2norm, arnorm, anorm, acond, xnorm, seconds (iteration 0 on)
//! /run         config_toml, report_json (strings)
//! ```
//!
//! Grid fields are C-ordered datasets of shape `[nz][ny][nx]`: cell (i, j, k) is element
//! `[k][j][i]`, which is exactly the linear index i + nx (j + ny k) of the solution vector.
//! The file is built in memory and published with the run's other outputs as one set
//! (src/io/publish.rs).

use std::path::{Path, PathBuf};

use ::hdf5::types::VarLenUnicode;
use ::hdf5::{Group, H5Type, Location};

use crate::error::{Error, Result};
use crate::grid::Coverage;
use crate::grid::Grid;
use crate::model::fields::Fields;
use crate::model::report::{Outcome, Report};
use crate::model::spec::{ModelSpec, Parameterisation, Reference};
use crate::solver::IterRecord;

/// Format name and version written to the root attributes.
pub const FORMAT: &str = "seistomo-model";
pub const FORMAT_VERSION: u32 = 1;

/// What goes into a model file besides the spec.
pub struct ModelInputs<'a> {
    pub spec: &'a ModelSpec,
    pub outcome: &'a Outcome,
    /// Ray coverage of the kernel rows (None: not written).
    pub coverage: Option<&'a Coverage>,
    /// Rows of the system that are data (kernel) rows.
    pub kernel_rows: usize,
    /// The run configuration, echoed.
    pub config_text: &'a str,
    /// Resolution tests, written to /resolution/NAME (empty: no group).
    pub resolution: &'a [crate::model::resolution::TestResult],
}

fn h5err(path: &Path, e: ::hdf5::Error) -> Error {
    Error::format(path, format!("HDF5: {e}"))
}

fn vlu(path: &Path, s: &str) -> Result<VarLenUnicode> {
    s.replace('\0', " ")
        .parse::<VarLenUnicode>()
        .map_err(|e| Error::format(path, format!("HDF5 string: {e}")))
}

/// Attribute and dataset writers that name the file in their errors.
struct W<'p, 'd> {
    path: &'p Path,
    /// Where large datasets' values wait until HDF5 has laid the file out: copied into its
    /// image at their datasets' offsets afterwards, in parallel ([`W::copy_into`]; HDF5 copies
    /// them on one thread). None: every dataset is written through HDF5.
    deferred: Option<std::cell::RefCell<Vec<(u64, Payload<'d>)>>>,
}

/// A dataset's values waiting for the file's image ([`W::deferred`]).
enum Payload<'d> {
    Borrowed(&'d [u8]),
    F64(Vec<f64>),
}

impl Payload<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Borrowed(b) => b,
            Payload::F64(v) => crate::io::prepared::bytes_of(v),
        }
    }
}

/// Datasets of at least this many bytes are deferred ([`W::deferred`]).
const DEFER_MIN: usize = 1 << 20;

impl<'d> W<'_, 'd> {
    fn str_attr(&self, loc: &Location, name: &str, value: &str) -> Result<()> {
        self.scalar_attr(loc, name, vlu(self.path, value)?)
    }
    fn str_list_attr(&self, loc: &Location, name: &str, values: &[String]) -> Result<()> {
        let v: Vec<VarLenUnicode> = values
            .iter()
            .map(|s| vlu(self.path, s))
            .collect::<Result<_>>()?;
        self.vec_attr(loc, name, &v)
    }
    fn scalar_attr<T: H5Type>(&self, loc: &Location, name: &str, value: T) -> Result<()> {
        loc.new_attr::<T>()
            .create(name)
            .and_then(|a| a.write_scalar(&value))
            .map_err(|e| h5err(self.path, e))
    }
    fn vec_attr<T: H5Type>(&self, loc: &Location, name: &str, values: &[T]) -> Result<()> {
        loc.new_attr::<T>()
            .shape([values.len()])
            .create(name)
            .and_then(|a| a.write_raw(values))
            .map_err(|e| h5err(self.path, e))
    }
    /// A dataset written through HDF5 now (small ones: the history's columns).
    fn dataset<T: H5Type>(
        &self,
        g: &Group,
        name: &str,
        shape: &[usize],
        data: &[T],
        units: &str,
        description: &str,
    ) -> Result<()> {
        let ds = g
            .new_dataset::<T>()
            .shape(shape.to_vec())
            .create(name)
            .map_err(|e| h5err(self.path, e))?;
        ds.write_raw(data).map_err(|e| h5err(self.path, e))?;
        self.str_attr(&ds, "units", units)?;
        self.str_attr(&ds, "description", description)
    }

    /// A dataset of a field (one value per unknown): deferred where large ([`Self::deferred`]).
    fn field<T: H5Type + crate::io::prepared::Plain>(
        &self,
        g: &Group,
        (name, shape): (&str, &[usize]),
        data: &'d [T],
        (units, description): (&str, &str),
    ) -> Result<()> {
        self.dataset_of(g, (name, shape), data, None, (units, description))
    }

    /// [`Self::dataset`] of values made for it (kept until they are copied).
    fn dataset_owned(
        &self,
        g: &Group,
        (name, shape): (&str, &[usize]),
        data: Vec<f64>,
        (units, description): (&str, &str),
    ) -> Result<()> {
        self.dataset_of::<f64>(g, (name, shape), &[], Some(data), (units, description))
    }

    /// A dataset of `data` (or of `owned` where given). Where deferring and at least
    /// [`DEFER_MIN`] bytes: its space allocated at once and never filled (contiguous, native
    /// types: the file holds the values' bytes as they are in memory), its values copied at its
    /// offset later ([`Self::copy_into`]); else written through HDF5.
    fn dataset_of<T: H5Type + crate::io::prepared::Plain>(
        &self,
        g: &Group,
        (name, shape): (&str, &[usize]),
        data: &'d [T],
        owned: Option<Vec<f64>>,
        (units, description): (&str, &str),
    ) -> Result<()> {
        use ::hdf5::plist::dataset_create::{AllocTime, FillTime};
        let bytes = owned
            .as_ref()
            .map_or(std::mem::size_of_val(data), |v| 8 * v.len());
        let defer = self.deferred.as_ref().filter(|_| bytes >= DEFER_MIN);
        let b = g.new_dataset::<T>().shape(shape.to_vec());
        let b = if defer.is_some() {
            b.no_chunk()
                .alloc_time(Some(AllocTime::Early))
                .fill_time(FillTime::Never)
        } else {
            b
        };
        let ds = b.create(name).map_err(|e| h5err(self.path, e))?;
        match (defer, ds.offset()) {
            (Some(list), Some(at)) if ds.storage_size() == bytes as u64 => {
                let payload = match owned {
                    Some(v) => Payload::F64(v),
                    None => Payload::Borrowed(crate::io::prepared::bytes_of(data)),
                };
                list.borrow_mut().push((at, payload));
            }
            _ => match owned {
                Some(v) => ds.write_raw(&v),
                None => ds.write_raw(data),
            }
            .map_err(|e| h5err(self.path, e))?,
        }
        self.str_attr(&ds, "units", units)?;
        self.str_attr(&ds, "description", description)
    }

    /// Copy the deferred datasets' values into `image`, the closed file's bytes, at their
    /// offsets (pieces of 1 MiB on the thread pool). An offset outside the image is an error.
    fn copy_into(&self, image: &mut [u8]) -> Result<()> {
        use rayon::prelude::*;
        let Some(list) = &self.deferred else {
            return Ok(());
        };
        let list = list.borrow();
        let mut jobs: Vec<(&mut [u8], &[u8])> = Vec::new();
        // the datasets' places, in file order, cut out of the image one after another
        let mut order: Vec<(u64, &[u8])> = list.iter().map(|(at, p)| (*at, p.bytes())).collect();
        order.sort_by_key(|&(at, _)| at);
        let mut rest: &mut [u8] = image;
        let mut base = 0u64;
        for (at, src) in order {
            let skip = at.checked_sub(base).map(|k| k as usize);
            let fits = skip.is_some_and(|k| k + src.len() <= rest.len());
            if !fits {
                return Err(Error::format(
                    self.path,
                    format!("HDF5: a dataset at byte {at} lies outside the file's image"),
                ));
            }
            let k = skip.unwrap_or(0);
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(k);
            let (dst, tail) = tail.split_at_mut(src.len());
            jobs.extend(dst.chunks_mut(1 << 20).zip(src.chunks(1 << 20)));
            rest = tail;
            base = at + src.len() as u64;
        }
        jobs.into_par_iter().for_each(|(d, s)| d.copy_from_slice(s));
        Ok(())
    }
    fn str_dataset(&self, g: &Group, name: &str, text: &str) -> Result<()> {
        let v = vlu(self.path, text)?;
        g.new_dataset::<VarLenUnicode>()
            .create(name)
            .and_then(|d| d.write_scalar(&v))
            .map_err(|e| h5err(self.path, e))
    }
}

/// The XDMF sidecar of a model file: same name, extension `.xdmf`.
pub fn xdmf_path(path: &Path) -> PathBuf {
    path.with_extension("xdmf")
}

/// Write the model file (and, for grids, its XDMF sidecar) as an output set of its own
/// (src/io/publish.rs): nothing is visible unless every byte was written and synced.
pub fn write_model(path: &Path, inp: &ModelInputs) -> Result<()> {
    let mut publ = crate::io::publish::Publication::new("model");
    stage_model(&mut publ, path, inp)?;
    publ.commit()
}

/// Stage the model file and (grids) its XDMF sidecar into a run's output set. The HDF5 file is
/// built in memory ([`model_image`]) and its bytes written with checked I/O, so a full disk is
/// an error naming the file, never a crash inside HDF5 or a truncated file.
pub fn stage_model(
    publ: &mut crate::io::publish::Publication,
    path: &Path,
    inp: &ModelInputs,
) -> Result<()> {
    let image = crate::ui::phases::time("hdf5", || model_image(path, inp))?;
    crate::ui::phases::time("model.h5", || publ.write_bytes(path, &image))?;
    drop(image);
    if let Parameterisation::Grid(g) = &inp.spec.param {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = crate::model::xdmf::xdmf_text(
            &name,
            g,
            &crate::model::xdmf::grid_fields(
                inp.spec,
                inp.coverage.is_some(),
                inp.outcome.solution.var.is_some(),
            ),
        );
        publ.write_bytes(&xdmf_path(path), text.as_bytes())?;
    }
    Ok(())
}

extern "C" {
    // hdf5-sys declares it too; the crate does not re-export it.
    fn H5Fget_file_image(file_id: i64, buf_ptr: *mut std::ffi::c_void, buf_len: usize) -> isize;
}

/// The model file's bytes: the buffer of HDF5's core driver, kept when the file closed (no copy),
/// freed on drop.
pub struct ModelImage {
    ptr: *mut u8,
    len: usize,
}

impl std::ops::Deref for ModelImage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` is the core driver's buffer (allocated with libc by `image_callbacks`),
        // holding at least `len` bytes of the file written by HDF5, owned by this value
        // alone since the file closed.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for ModelImage {
    fn deref_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `deref`; `&mut self` makes this the only view of the buffer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for ModelImage {
    fn drop(&mut self) {
        // SAFETY: null or allocated with libc (`image_callbacks`), freed once, here.
        unsafe { libc::free(self.ptr.cast()) }
    }
}

/// Where the core driver's buffer goes when its file closes (the callbacks' `udata`).
struct KeptBuffer(*mut std::ffi::c_void);

mod image_callbacks {
    //! HDF5's file-image callbacks (H5Pset_file_image_callbacks) for the core driver: its
    //! buffer allocated with libc, and kept at the file's close instead of freed.
    use super::KeptBuffer;
    use hdf5_sys::h5fd::H5FD_file_image_op_t as Op;
    use libc::{c_void, size_t};

    pub extern "C" fn malloc(size: size_t, _op: Op, _udata: *mut c_void) -> *mut c_void {
        // SAFETY: plain allocation.
        unsafe { libc::malloc(size.max(1)) }
    }
    pub extern "C" fn memcpy(
        dest: *mut c_void,
        src: *const c_void,
        size: size_t,
        _op: Op,
        _udata: *mut c_void,
    ) -> *mut c_void {
        // SAFETY: HDF5 passes buffers of at least `size` bytes that do not overlap.
        unsafe { libc::memcpy(dest, src, size) }
    }
    pub extern "C" fn realloc(
        ptr: *mut c_void,
        size: size_t,
        _op: Op,
        _udata: *mut c_void,
    ) -> *mut c_void {
        // SAFETY: `ptr` is null or a buffer these callbacks allocated.
        unsafe { libc::realloc(ptr, size.max(1)) }
    }
    pub extern "C" fn free(ptr: *mut c_void, op: Op, udata: *mut c_void) -> i32 {
        if op == Op::H5FD_FILE_IMAGE_OP_FILE_CLOSE && !udata.is_null() {
            // SAFETY: `udata` is the KeptBuffer that `model_image` set and outlives the file.
            let kept = unsafe { &mut *(udata as *mut KeptBuffer) };
            if kept.0.is_null() {
                kept.0 = ptr;
                return 0;
            }
        }
        // SAFETY: `ptr` is null or a buffer these callbacks allocated.
        unsafe { libc::free(ptr) };
        0
    }
    pub extern "C" fn udata_copy(udata: *mut c_void) -> *mut c_void {
        udata // shared, not copied: `model_image` owns it
    }
    pub extern "C" fn udata_free(_udata: *mut c_void) -> i32 {
        0
    }
}

/// The complete model file as bytes: HDF5's core driver without a backing store, its buffer
/// allocated through file-image callbacks and kept when the file closes (no copy of the file),
/// every HDF5 call's error checked, every handle closed and the file closed explicitly (a close
/// error is an error).
pub fn model_image(path: &Path, inp: &ModelInputs) -> Result<ModelImage> {
    use hdf5_sys::{h5f, h5fd, h5p};
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    inp.spec.check(inp.outcome.solution.x.len())?;
    // Grow the in-memory file in one step: about 16 fields of n values, the history, the text.
    let n = inp.outcome.solution.x.len();
    let guess = 16 * 8 * n + 8 * 8 * inp.outcome.history.len() + 4 * inp.config_text.len();
    let increment = guess.clamp(1 << 20, 1 << 30);
    // HDF5's buffer and the fields' arrays: ~1.5 x the buffer, faulted in huge pages first.
    crate::backend::cpu::warm_heap(increment * 3 / 2);
    // A name that no file system has: the core driver never opens it (no backing store).
    let name = format!(
        "/nonexistent-seistomo-in-memory/{}-{}.h5",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let cname = std::ffi::CString::new(name).map_err(|e| Error::format(path, e.to_string()))?;
    // The fields derived from x (kept until their values are copied into the image), and the
    // writers: large datasets deferred, except where the netCDF view reads them back while the
    // file is written (cells: src/model/cf.rs lattice_view).
    let fields = crate::ui::phases::time("fields", || {
        Fields::derive(inp.spec, &inp.outcome.solution.x)
    });
    let w = W {
        path,
        deferred: (!matches!(inp.spec.param, Parameterisation::Cells(_)))
            .then(|| std::cell::RefCell::new(Vec::new())),
    };
    let fapl = ::hdf5::file::FileAccess::build()
        .core_options(increment, false)
        .finish()
        .map_err(|e| h5err(path, e))?;
    let mut kept = Box::new(KeptBuffer(std::ptr::null_mut()));
    let mut callbacks = h5fd::H5FD_file_image_callbacks_t {
        image_malloc: Some(image_callbacks::malloc),
        image_memcpy: Some(image_callbacks::memcpy),
        image_realloc: Some(image_callbacks::realloc),
        image_free: Some(image_callbacks::free),
        udata_copy: Some(image_callbacks::udata_copy),
        udata_free: Some(image_callbacks::udata_free),
        udata: (&mut *kept as *mut KeptBuffer).cast(),
    };
    let size = ::hdf5::sync::sync(|| -> Result<usize> {
        // SAFETY: `fapl` is a live file-access list; `callbacks` is read during the call;
        // `kept` (its udata) outlives every copy of the list and the file, which are all
        // closed before this function returns.
        if unsafe { h5p::H5Pset_file_image_callbacks(fapl.id(), &mut callbacks) } < 0 {
            return Err(Error::format(
                path,
                "HDF5: could not set the file-image callbacks",
            ));
        }
        // SAFETY: a valid name and lists; the identifier returned is owned by `f` below.
        let id = unsafe {
            h5f::H5Fcreate(
                cname.as_ptr(),
                h5f::H5F_ACC_TRUNC,
                h5p::H5P_DEFAULT,
                fapl.id(),
            )
        };
        if id < 0 {
            return Err(Error::format(
                path,
                "HDF5: could not create the in-memory file",
            ));
        }
        // SAFETY: `id` is a new file identifier (reference count 1), owned by `f` from here.
        let f: ::hdf5::File = unsafe { ::hdf5::from_id(id) }.map_err(|e| h5err(path, e))?;
        write_model_to(&f, &w, inp, &fields)?;
        f.flush().map_err(|e| h5err(path, e))?;
        // SAFETY: `id` is the open file `f`; a null buffer with length 0 asks for the size.
        let size = unsafe { H5Fget_file_image(f.id(), std::ptr::null_mut(), 0) };
        if size <= 0 {
            return Err(Error::format(path, "HDF5: could not get the file image"));
        }
        f.close().map_err(|e| h5err(path, e))?;
        Ok(size as usize)
    });
    drop(fapl);
    // (owned from here: freed on an error too)
    let mut image = ModelImage {
        ptr: std::mem::replace(&mut kept.0, std::ptr::null_mut()).cast(),
        len: *size.as_ref().unwrap_or(&0),
    };
    size?;
    if image.ptr.is_null() {
        return Err(Error::format(
            path,
            "HDF5: the file image was not kept at its close",
        ));
    }
    crate::ui::phases::time("datasets", || w.copy_into(&mut image))?;
    Ok(image)
}

fn reference_words(r: &Reference) -> String {
    match r {
        Reference::Constant(v) => format!("constant {v}"),
        Reference::Profile(p) => format!(
            "1-D profile (depth, velocity): {}",
            p.iter()
                .map(|(z, v)| format!("({z}, {v})"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Reference::Mean => "constant: the mean slowness of the recovered model".into(),
    }
}

/// Everything in the model file; every group and dataset handle is closed on return.
fn write_model_to<'d>(
    f: &::hdf5::File,
    w: &W<'_, 'd>,
    inp: &'d ModelInputs,
    fields: &'d Fields,
) -> Result<()> {
    let path = w.path;
    let spec = inp.spec;
    let o = inp.outcome;
    let vunit = spec.velocity_unit();
    write_root_attrs(w, f, inp, &vunit)?;
    write_model_group(w, f, inp, &vunit, fields)?;
    if let Parameterisation::Cells(c) = &spec.param {
        let cg = f.create_group("cells").map_err(|e| h5err(path, e))?;
        let ncol = c.columns.len();
        let flat: Vec<f64> = c.rows.iter().flatten().copied().collect();
        w.dataset_owned(
            &cg,
            ("bounds", &[c.rows.len(), ncol]),
            flat,
            (&c.units, "cell bounds, one row per unknown"),
        )?;
        let cl: &Location = &cg;
        w.str_list_attr(cl, "columns", &c.columns)?;
        w.str_attr(cl, "units", &c.units)?;
    }

    if !inp.resolution.is_empty() {
        write_resolution(w, f, inp)?;
    }
    // Solver diagnostics: every report key as an attribute.
    let sg = f.create_group("solver").map_err(|e| h5err(path, e))?;
    let report =
        serde_json::to_value(&o.report).map_err(|e| Error::format(path, format!("report: {e}")))?;
    write_json_attrs(w, &sg, "", &report)?;
    write_history(w, f, &o.history)?;

    let rg = f.create_group("run").map_err(|e| h5err(path, e))?;
    w.str_dataset(&rg, "config_toml", inp.config_text)?;
    let rj = serde_json::to_string_pretty(&o.report)
        .map_err(|e| Error::format(path, format!("report: {e}")))?;
    w.str_dataset(&rg, "report_json", &rj)?;
    crate::ui::phases::time("provenance", || {
        crate::model::provenance::annotate(f, path, &o.report)
    })?;
    // netCDF-4 / CF view (src/model/cf.rs)
    crate::model::cf::annotate(f, spec, o.solution.x.len(), path)
}

/// The root attributes: format, program, what the unknowns are and in which units.
fn write_root_attrs(w: &W, f: &::hdf5::File, inp: &ModelInputs, vunit: &str) -> Result<()> {
    let spec = inp.spec;
    let f_loc: &Location = f;
    w.str_attr(f_loc, "format", FORMAT)?;
    w.scalar_attr(f_loc, "format_version", FORMAT_VERSION)?;
    w.str_attr(f_loc, "program", "seistomo")?;
    w.str_attr(f_loc, "version", crate::VERSION)?;
    let param = match &spec.param {
        Parameterisation::Grid(_) => "grid",
        Parameterisation::Cells(_) => "cells",
        Parameterisation::Vector => "vector",
    };
    w.str_attr(f_loc, "parameterisation", param)?;
    w.str_attr(f_loc, "unknowns", spec.unknowns.as_str())?;
    w.str_attr(f_loc, "slowness_unit", &spec.slowness_unit)?;
    w.str_attr(f_loc, "velocity_unit", vunit)?;
    w.str_attr(f_loc, "reference", &reference_words(&spec.reference))?;
    w.scalar_attr(f_loc, "kernel_rows", inp.kernel_rows as u64)?;
    w.scalar_attr(f_loc, "synthetic", u8::from(spec.true_model.is_some()))
}

/// The datasets of /model: one value per unknown each, in the grid's shape (or a vector).
struct FieldWriter<'a, 'd> {
    w: &'a W<'a, 'd>,
    g: Group,
    shape: Vec<usize>,
}

impl<'d> FieldWriter<'_, 'd> {
    fn put<T: H5Type + crate::io::prepared::Plain>(
        &self,
        name: &str,
        data: &'d [T],
        units: &str,
        what: &str,
    ) -> Result<()> {
        self.w
            .field(&self.g, (name, &self.shape), data, (units, what))
    }

    /// [`Self::put`] of values made for it.
    fn put_owned(&self, name: &str, data: Vec<f64>, units: &str, what: &str) -> Result<()> {
        self.w
            .dataset_owned(&self.g, (name, &self.shape), data, (units, what))
    }
}

/// /model: the recovered and reference fields, the coverage, the variance and the true model.
fn write_model_group<'d>(
    w: &W<'_, 'd>,
    f: &::hdf5::File,
    inp: &'d ModelInputs,
    vunit: &str,
    fields: &'d Fields,
) -> Result<()> {
    let spec = inp.spec;
    let x = &inp.outcome.solution.x;
    let g = f.create_group("model").map_err(|e| h5err(w.path, e))?;
    let shape: Vec<usize> = match &spec.param {
        Parameterisation::Grid(grid) => {
            write_grid_attrs(w, &g, grid)?;
            vec![grid.n[2], grid.n[1], grid.n[0]]
        }
        _ => vec![x.len()],
    };
    let su = spec.slowness_unit.as_str();
    let m = FieldWriter { w, g, shape };
    m.put(
        "velocity",
        &fields.velocity,
        vunit,
        "recovered velocity 1/slowness (NaN where the slowness is not positive)",
    )?;
    m.put("slowness", &fields.slowness, su, "recovered slowness")?;
    m.put(
        "reference_velocity",
        &fields.reference_velocity,
        vunit,
        "reference velocity model",
    )?;
    m.put(
        "perturbation",
        &fields.perturbation,
        "percent",
        "relative velocity perturbation 100 (v - v_ref) / v_ref",
    )?;
    m.put(
        "slowness_perturbation",
        &fields.slowness_perturbation,
        su,
        "slowness minus reference slowness",
    )?;
    m.put(
        "solution",
        x,
        su,
        &format!(
            "the solution vector x as solved ({})",
            spec.unknowns.as_str()
        ),
    )?;
    if let Some(c) = inp.coverage {
        m.put(
            "hit_count",
            &c.hit_count,
            "1",
            "number of kernel rows (rays) touching the cell",
        )?;
        m.put(
            "dws",
            &c.dws,
            "kernel units",
            "derivative weight sum: sum of |G_ij| over kernel rows",
        )?;
    }
    if let Some(var) = &inp.outcome.solution.var {
        write_variance(&m, &inp.outcome.report, var, su)?;
    }
    if let (Some(tv), Some(tp), Some(t)) = (
        &fields.true_velocity,
        &fields.true_perturbation,
        &spec.true_model,
    ) {
        m.put(
            "true_velocity",
            tv,
            vunit,
            "true velocity of the synthetic model",
        )?;
        m.put(
            "true_perturbation",
            tp,
            "percent",
            "true relative velocity perturbation, percent",
        )?;
        m.put(
            "true_solution",
            t,
            su,
            "the true model vector (same quantity as solution)",
        )?;
    }
    Ok(())
}

/// LSQR's variance (a lower bound) and the standard error it gives, with the scale used.
fn write_variance<'d>(m: &FieldWriter<'_, 'd>, r: &Report, var: &'d [f64], su: &str) -> Result<()> {
    let dof = r.m.saturating_sub(r.n);
    let s2 = if dof > 0 {
        r.norms.r1norm * r.norms.r1norm / dof as f64
    } else {
        1.0
    };
    let se: Vec<f64> = var.iter().map(|v| (v * s2).sqrt()).collect();
    m.put(
        "variance_lower_bound",
        var,
        &format!("({su})^2 / data^2"),
        "LSQR's var: a LOWER BOUND on diag((A^T A + damp^2 I)^-1)",
    )?;
    m.put_owned("std_error_lower_bound", se, su, "LOWER BOUND on the standard error of the solution: sqrt(var r1norm^2 / (m - n)) (sqrt(var) when m <= n)")?;
    let gv: &Location = &m.g;
    m.w.scalar_attr(gv, "std_error_scale_r1norm2_over_dof", s2)
}

/// /history: the convergence history, one dataset per column.
fn write_history(w: &W, f: &::hdf5::File, h: &[IterRecord]) -> Result<()> {
    let hg = f.create_group("history").map_err(|e| h5err(w.path, e))?;
    let col = |get: fn(&IterRecord) -> f64| h.iter().map(get).collect::<Vec<f64>>();
    let itn: Vec<u64> = h.iter().map(|r| r.itn as u64).collect();
    w.dataset(
        &hg,
        "itn",
        &[h.len()],
        &itn,
        "1",
        "iteration (0: the start)",
    )?;
    for (name, get, what) in [
        (
            "r1norm",
            (|r: &IterRecord| r.r1norm) as fn(&IterRecord) -> f64,
            "||b - A x||",
        ),
        (
            "r2norm",
            |r| r.r2norm,
            "sqrt(||b - A x||^2 + damp^2 ||x||^2)",
        ),
        ("arnorm", |r| r.arnorm, "||A^T (b - A x) - damp^2 x||"),
        (
            "anorm",
            |r| r.anorm,
            "Frobenius norm estimate of [A; damp I]",
        ),
        ("acond", |r| r.acond, "condition estimate"),
        ("xnorm", |r| r.xnorm, "||x||"),
        ("seconds", |r| r.seconds, "seconds since the solve started"),
    ] {
        w.dataset(&hg, name, &[h.len()], &col(get), "", what)?;
    }
    Ok(())
}

/// /resolution/NAME per test: its true and recovered models (the model's shape), the
/// correlation per depth layer, and what it is and how it came back as attributes.
fn write_resolution<'d>(w: &W<'_, 'd>, f: &::hdf5::File, inp: &'d ModelInputs) -> Result<()> {
    use crate::model::resolution::TestKind;
    let n = inp.outcome.solution.x.len();
    let shape: Vec<usize> = match &inp.spec.param {
        Parameterisation::Grid(grid) => vec![grid.n[2], grid.n[1], grid.n[0]],
        _ => vec![n],
    };
    let su = inp.spec.slowness_unit.as_str();
    let rg = f.create_group("resolution").map_err(|e| h5err(w.path, e))?;
    w.str_attr(
        &rg,
        "description",
        "resolution tests: synthetic models inverted with the run's settings (seistomo resolution)",
    )?;
    for t in inp.resolution {
        let g = rg.create_group(&t.name).map_err(|e| h5err(w.path, e))?;
        w.field(
            &g,
            ("true", &shape),
            &t.true_model,
            (su, "the test's true model (as x)"),
        )?;
        w.field(
            &g,
            ("recovered", &shape),
            &t.recovered,
            (su, "the model recovered from the test's data (as x)"),
        )?;
        w.dataset(
            &g,
            "depth_correlation",
            &[t.depth_correlation.len()],
            &t.depth_correlation,
            "1",
            "correlation of true and recovered per depth layer (k = 0 first; NaN where the true layer is constant)",
        )?;
        let l: &Location = &g;
        w.scalar_attr(l, "correlation", t.correlation)?;
        w.scalar_attr(l, "iterations", t.iterations as u64)?;
        w.scalar_attr(l, "istop", u64::from(t.istop))?;
        match &t.kind {
            TestKind::Checkerboard(c) => {
                w.str_attr(l, "kind", "checkerboard")?;
                w.vec_attr(l, "cells_per_checker", &c.map(|v| v as u64))?;
            }
            TestKind::Spike { at, width } => {
                w.str_attr(l, "kind", "spike")?;
                w.vec_attr(l, "centre_cell", &at.map(|v| v as u64))?;
                w.scalar_attr(l, "half_width_cells", *width as u64)?;
            }
        }
        if let Some(s) = &t.spike {
            w.scalar_attr(l, "peak_recovery", s.peak)?;
            w.scalar_attr(l, "spread_cells", s.spread)?;
            w.scalar_attr(l, "true_spread_cells", s.true_spread)?;
            w.scalar_attr(l, "leakage", s.leakage)?;
        }
    }
    Ok(())
}

fn write_grid_attrs(w: &W, g: &Group, grid: &Grid) -> Result<()> {
    let l: &Location = g;
    w.vec_attr(l, "n_xyz", &grid.n.map(|v| v as u64))?;
    w.vec_attr(l, "origin_xyz", &grid.origin)?;
    w.vec_attr(l, "spacing_xyz", &grid.spacing)?;
    w.str_list_attr(l, "axes_xyz", &grid.axes)?;
    w.str_attr(l, "units", &grid.units)?;
    w.str_attr(
        l,
        "layout",
        "C order, shape [nz][ny][nx]: cell (i, j, k) is element [k][j][i] = solution[i + nx*(j + ny*k)]; origin is the corner of cell (0,0,0), values are cell averages",
    )
}

fn write_json_attrs(w: &W, g: &Group, prefix: &str, v: &serde_json::Value) -> Result<()> {
    let l: &Location = g;
    if let serde_json::Value::Object(map) = v {
        for (k, v) in map {
            let name = format!("{prefix}{k}");
            match v {
                serde_json::Value::Number(num) => {
                    if let Some(u) = num.as_u64() {
                        w.scalar_attr(l, &name, u)?
                    } else if let Some(i) = num.as_i64() {
                        w.scalar_attr(l, &name, i)?
                    } else {
                        w.scalar_attr(l, &name, num.as_f64().unwrap_or(f64::NAN))?
                    }
                }
                serde_json::Value::String(s) => w.str_attr(l, &name, s)?,
                serde_json::Value::Bool(b) => w.scalar_attr(l, &name, u8::from(*b))?,
                serde_json::Value::Object(_) => write_json_attrs(w, g, &format!("{name}_"), v)?,
                serde_json::Value::Null => {}
                serde_json::Value::Array(_) => w.str_attr(l, &name, &v.to_string())?,
            }
        }
    }
    Ok(())
}

/// A resolution test read back from a model file: its name, true and recovered models.
pub type ResolutionModels = (String, Vec<f64>, Vec<f64>);

/// A model file read back (for plots and tests).
#[derive(Debug, Clone)]
pub struct ModelFile {
    pub path: PathBuf,
    pub parameterisation: String,
    pub unknowns: String,
    pub velocity_unit: String,
    pub grid: Option<Grid>,
    /// Cell bounds (cell parameterisations): columns and rows.
    pub cell_columns: Vec<String>,
    pub cells: Vec<Vec<f64>>,
    pub history: Vec<IterRecord>,
    pub istop: u64,
    pub stop_reason: String,
    file: ::hdf5::File,
}

impl ModelFile {
    pub fn open(path: &Path) -> Result<ModelFile> {
        let e = |er: ::hdf5::Error| h5err(path, er);
        crate::io::check_regular(path)?;
        let f = ::hdf5::File::open(path).map_err(e)?;
        let sattr = |loc: &Location, name: &str| -> Result<String> {
            loc.attr(name)
                .and_then(|a| a.read_scalar::<VarLenUnicode>())
                .map(|s| s.as_str().to_string())
                .map_err(|er| Error::format(path, format!("attribute {name}: {er}")))
        };
        let root: &Location = &f;
        let format = sattr(root, "format")?;
        if format != FORMAT {
            return Err(Error::format(
                path,
                format!("not a seistomo model file (format '{format}')"),
            ));
        }
        let parameterisation = sattr(root, "parameterisation")?;
        let unknowns = sattr(root, "unknowns")?;
        let velocity_unit = sattr(root, "velocity_unit")?;
        let model = f.group("model").map_err(e)?;
        let grid = if parameterisation == "grid" {
            let ml: &Location = &model;
            let n: Vec<u64> = ml.attr("n_xyz").and_then(|a| a.read_raw()).map_err(e)?;
            let origin: Vec<f64> = ml
                .attr("origin_xyz")
                .and_then(|a| a.read_raw())
                .map_err(e)?;
            let spacing: Vec<f64> = ml
                .attr("spacing_xyz")
                .and_then(|a| a.read_raw())
                .map_err(e)?;
            let axes: Vec<VarLenUnicode> =
                ml.attr("axes_xyz").and_then(|a| a.read_raw()).map_err(e)?;
            if n.len() != 3 || origin.len() != 3 || spacing.len() != 3 || axes.len() != 3 {
                return Err(Error::format(path, "grid attributes must have 3 values"));
            }
            let mut g = Grid::new(
                [n[0] as usize, n[1] as usize, n[2] as usize],
                [origin[0], origin[1], origin[2]],
                [spacing[0], spacing[1], spacing[2]],
            );
            g.axes = [0, 1, 2].map(|i| axes[i].as_str().to_string());
            g.units = sattr(ml, "units")?;
            Some(g)
        } else {
            None
        };
        let (cell_columns, cells) = if parameterisation == "cells" {
            let cg = f.group("cells").map_err(e)?;
            let cl: &Location = &cg;
            let cols: Vec<VarLenUnicode> =
                cl.attr("columns").and_then(|a| a.read_raw()).map_err(e)?;
            let b = cg.dataset("bounds").map_err(e)?;
            let flat: Vec<f64> = b.read_raw().map_err(e)?;
            let nc = cols.len().max(1);
            (
                cols.iter().map(|c| c.as_str().to_string()).collect(),
                flat.chunks(nc).map(|c| c.to_vec()).collect(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let hg = f.group("history").map_err(e)?;
        let col = |name: &str| -> Result<Vec<f64>> {
            hg.dataset(name)
                .and_then(|d| d.read_raw::<f64>())
                .map_err(e)
        };
        let itn: Vec<u64> = hg.dataset("itn").and_then(|d| d.read_raw()).map_err(e)?;
        let (r1, r2, ar, an, ac, xn, sec) = (
            col("r1norm")?,
            col("r2norm")?,
            col("arnorm")?,
            col("anorm")?,
            col("acond")?,
            col("xnorm")?,
            col("seconds")?,
        );
        let history = (0..itn.len())
            .map(|i| IterRecord {
                itn: itn[i] as usize,
                r1norm: r1[i],
                r2norm: r2[i],
                arnorm: ar[i],
                anorm: an[i],
                acond: ac[i],
                xnorm: xn[i],
                seconds: sec[i],
            })
            .collect();
        let sg = f.group("solver").map_err(e)?;
        let sl: &Location = &sg;
        let istop = sl
            .attr("istop")
            .and_then(|a| a.read_scalar::<u64>())
            .map_err(e)?;
        let stop_reason = sattr(sl, "stop_reason")?;
        Ok(ModelFile {
            path: path.to_path_buf(),
            parameterisation,
            unknowns,
            velocity_unit,
            grid,
            cell_columns,
            cells,
            history,
            istop,
            stop_reason,
            file: f,
        })
    }

    /// Does /model hold this field?
    pub fn has_field(&self, name: &str) -> bool {
        self.file
            .group("model")
            .map(|g| g.link_exists(name))
            .unwrap_or(false)
    }

    /// A field of /model, flattened in solution order, with its shape.
    /// The resolution tests in the file (/resolution): per test its name, true and recovered
    /// models; empty when the file has none.
    pub fn resolution_tests(&self) -> Result<Vec<ResolutionModels>> {
        let Ok(rg) = self.file.group("resolution") else {
            return Ok(Vec::new());
        };
        let e = |er: ::hdf5::Error| Error::format(&self.path, format!("/resolution: {er}"));
        let mut out = Vec::new();
        for name in rg.member_names().map_err(e)? {
            let g = rg.group(&name).map_err(e)?;
            let read = |d: &str| -> Result<Vec<f64>> {
                g.dataset(d).and_then(|d| d.read_raw()).map_err(|er| {
                    Error::format(&self.path, format!("/resolution/{name}/{d}: {er}"))
                })
            };
            out.push((name.clone(), read("true")?, read("recovered")?));
        }
        Ok(out)
    }

    pub fn field(&self, name: &str) -> Result<(Vec<f64>, Vec<usize>)> {
        let e = |er: ::hdf5::Error| Error::format(&self.path, format!("/model/{name}: {er}"));
        let ds = self
            .file
            .group("model")
            .and_then(|g| g.dataset(name))
            .map_err(e)?;
        let shape = ds.shape();
        let v: Vec<f64> = ds.read_raw().map_err(e)?;
        Ok((v, shape))
    }
}
