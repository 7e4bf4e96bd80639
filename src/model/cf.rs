//! netCDF-4 / CF conventions for model files, so that netCDF tools read them as they are:
//! `xarray.open_dataset("model.h5", engine="h5netcdf")` gives `velocity(z, y, x)` with
//! coordinates, and `ncdump -h model.h5` lists dimensions, variables and units.
//!
//! Added to the file [`crate::model::hdf5`] has written (one call before it closes), nothing
//! of that layout changes:
//! - Grids: root datasets `x`, `y`, `z` (cell centres, `units`, `long_name`, `axis`; `depth`'s
//!   `standard_name` and `positive = "down"` when the z axis is depth) made HDF5 dimension
//!   scales and attached to every `/model` field (dimensions z, y, x); every field is also
//!   hard-linked at the root, so the root group opens as one netCDF dataset.
//! - Cell tables: a `cell` dimension scale (the unknown's index) attached to every `/model`
//!   field; when the cells are lat/lon (optionally depth) boxes on a regular lattice, as
//!   australia's are, gridded copies of the fields at the root, `velocity(lat, lon)` or
//!   `velocity(depth, lat, lon)`, with `lat`/`lon`/`depth` coordinates (CF standard names and
//!   units) and `_FillValue` NaN where the lattice has no cell.
//! - `/history/itn` is the dimension scale of the history columns.
//! - Every field gets a CF `long_name`; the root gets `Conventions = "CF-1.8"`.
//!
//! Dimension scales are written the way the HDF5 high-level library (H5DS) writes them:
//! `CLASS = "DIMENSION_SCALE"` (fixed-length, null-terminated) and `REFERENCE_LIST` on the
//! scale, `DIMENSION_LIST` (variable-length arrays of object references) on the dataset.

use std::ffi::CString;
use std::path::Path;

use ::hdf5::types::{
    CompoundField, CompoundType, H5Type, TypeDescriptor, VarLenArray, VarLenUnicode,
};
use ::hdf5::{Dataset, File, Group, Location, ObjectReference1};

use crate::error::{Error, Result};
use crate::grid::Grid;
use crate::model::spec::{CellTable, ModelSpec, Parameterisation};

fn h5err(path: &Path, e: ::hdf5::Error) -> Error {
    Error::format(path, format!("HDF5 (netCDF conventions): {e}"))
}

/// One entry of a scale's `REFERENCE_LIST`: the dataset it is attached to and the axis.
#[repr(C)]
#[derive(Clone, Copy)]
struct RefEntry {
    dataset: ObjectReference1,
    dimension: i32,
}

// SAFETY: the descriptor matches the #[repr(C)] layout: an 8-byte object reference at offset 0
// and an i32 at offset 8, 16 bytes in all (alignment 8).
unsafe impl H5Type for RefEntry {
    fn type_descriptor() -> TypeDescriptor {
        TypeDescriptor::Compound(CompoundType {
            fields: vec![
                CompoundField::typed::<ObjectReference1>("dataset", 0, 0),
                CompoundField::typed::<i32>(
                    "dimension",
                    std::mem::size_of::<ObjectReference1>(),
                    1,
                ),
            ],
            size: std::mem::size_of::<RefEntry>(),
        })
    }
}

struct Cf<'a> {
    f: &'a File,
    path: &'a Path,
}

impl Cf<'_> {
    fn e(&self) -> impl Fn(::hdf5::Error) -> Error + '_ {
        |e| h5err(self.path, e)
    }

    fn str_attr(&self, loc: &Location, name: &str, value: &str) -> Result<()> {
        if loc
            .attr_names()
            .map_err(self.e())?
            .iter()
            .any(|n| n == name)
        {
            loc.delete_attr(name).map_err(self.e())?;
        }
        let v: VarLenUnicode = value
            .parse()
            .map_err(|e| Error::format(self.path, format!("HDF5 string: {e}")))?;
        loc.new_attr::<VarLenUnicode>()
            .create(name)
            .and_then(|a| a.write_scalar(&v))
            .map_err(self.e())
    }

    fn f64_attr(&self, loc: &Location, name: &str, value: f64) -> Result<()> {
        loc.new_attr::<f64>()
            .create(name)
            .and_then(|a| a.write_scalar(&value))
            .map_err(self.e())
    }

    /// `CLASS = "DIMENSION_SCALE"` as H5DSset_scale writes it: a fixed-length ASCII string
    /// with null termination (H5DSis_scale, used by h5py, h5netcdf and netCDF-C, checks the
    /// padding), which the high-level wrapper does not make (its fixed strings are null-padded).
    fn class_attr(&self, ds: &Dataset) -> Result<()> {
        use ::hdf5_sys::{h5a, h5p::H5P_DEFAULT, h5s, h5t};
        const VALUE: &[u8] = b"DIMENSION_SCALE\0";
        let name = CString::new("CLASS").expect("no NUL in a literal");
        let fail = || Error::format(self.path, "HDF5: cannot write a dimension scale's CLASS");
        // HDF5 is built without thread safety: raw calls take the crate's global lock, as its
        // own calls do (two threads writing models at once crashed without it).
        let ok = ::hdf5::sync::sync(|| {
            // SAFETY: plain HDF5 C calls on a valid, open dataset id; every id created here is
            // closed on every path, and the buffer holds exactly the type's 16 bytes.
            unsafe {
                let tid = h5t::H5Tcopy(*h5t::H5T_C_S1);
                if tid < 0 {
                    return false;
                }
                let sid = h5s::H5Screate(h5s::H5S_class_t::H5S_SCALAR);
                let ok = sid >= 0
                    && h5t::H5Tset_size(tid, VALUE.len()) >= 0
                    && h5t::H5Tset_strpad(tid, h5t::H5T_str_t::H5T_STR_NULLTERM) >= 0;
                let mut aid = -1;
                if ok {
                    aid =
                        h5a::H5Acreate2(ds.id(), name.as_ptr(), tid, sid, H5P_DEFAULT, H5P_DEFAULT);
                }
                let written = aid >= 0 && h5a::H5Awrite(aid, tid, VALUE.as_ptr().cast()) >= 0;
                if aid >= 0 {
                    h5a::H5Aclose(aid);
                }
                if sid >= 0 {
                    h5s::H5Sclose(sid);
                }
                h5t::H5Tclose(tid);
                written
            }
        });
        if ok {
            Ok(())
        } else {
            Err(fail())
        }
    }

    /// A 1-D coordinate dataset made a dimension scale.
    fn scale(&self, g: &Group, name: &str, values: &[f64], attrs: &[(&str, &str)]) -> Result<()> {
        let ds = g
            .new_dataset::<f64>()
            .shape([values.len()])
            .create(name)
            .map_err(self.e())?;
        ds.write_raw(values).map_err(self.e())?;
        self.class_attr(&ds)?;
        for (k, v) in attrs {
            self.str_attr(&ds, k, v)?;
        }
        Ok(())
    }

    /// Attach scales (by path, one per axis, slowest first) to the datasets (by path), writing
    /// `DIMENSION_LIST` on each dataset and one `REFERENCE_LIST` per scale.
    fn attach(&self, datasets: &[String], scales: &[String]) -> Result<()> {
        let root: &Location = self.f;
        let sref: Vec<ObjectReference1> = scales
            .iter()
            .map(|s| root.reference::<ObjectReference1>(s))
            .collect::<std::result::Result<_, _>>()
            .map_err(self.e())?;
        let mut back: Vec<Vec<RefEntry>> = vec![Vec::new(); scales.len()];
        for d in datasets {
            let ds = self.f.dataset(d).map_err(self.e())?;
            let dref = root.reference::<ObjectReference1>(d).map_err(self.e())?;
            let list: Vec<VarLenArray<ObjectReference1>> = sref
                .iter()
                .map(|r| VarLenArray::from_slice(std::slice::from_ref(r)))
                .collect();
            ds.new_attr::<VarLenArray<ObjectReference1>>()
                .shape([list.len()])
                .create("DIMENSION_LIST")
                .and_then(|a| a.write_raw(&list))
                .map_err(self.e())?;
            for (axis, b) in back.iter_mut().enumerate() {
                b.push(RefEntry {
                    dataset: dref,
                    dimension: axis as i32,
                });
            }
        }
        for (s, entries) in scales.iter().zip(&back) {
            let ds = self.f.dataset(s).map_err(self.e())?;
            ds.new_attr::<RefEntry>()
                .shape([entries.len()])
                .create("REFERENCE_LIST")
                .and_then(|a| a.write_raw(entries))
                .map_err(self.e())?;
        }
        Ok(())
    }

    /// Names of the datasets in a group whose shape is `shape`.
    fn fields_of_shape(&self, g: &Group, shape: &[usize]) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for name in g.member_names().map_err(self.e())? {
            if let Ok(ds) = g.dataset(&name) {
                if ds.shape() == shape {
                    out.push(name);
                }
            }
        }
        Ok(out)
    }
}

/// A CF long name for each model field (the `description` attribute keeps the long text).
fn long_name(field: &str) -> String {
    match field {
        "velocity" => "seismic velocity".into(),
        "slowness" => "seismic slowness".into(),
        "reference_velocity" => "reference velocity".into(),
        "perturbation" => "relative velocity perturbation".into(),
        "slowness_perturbation" => "slowness perturbation".into(),
        "solution" => "solution vector".into(),
        "hit_count" => "ray hit count".into(),
        "dws" => "derivative weight sum".into(),
        "variance_lower_bound" => "variance (lower bound)".into(),
        "std_error_lower_bound" => "standard error (lower bound)".into(),
        "true_velocity" => "true velocity".into(),
        "true_perturbation" => "true relative velocity perturbation".into(),
        "true_solution" => "true solution vector".into(),
        other => other.replace('_', " "),
    }
}

/// Add the netCDF-4 / CF view to an open model file (see the module docs).
pub fn annotate(f: &File, spec: &ModelSpec, n: usize, path: &Path) -> Result<()> {
    let cf = Cf { f, path };
    let root: &Location = f;
    cf.str_attr(root, "Conventions", "CF-1.8")?;
    let g = f.group("model").map_err(cf.e())?;
    match &spec.param {
        Parameterisation::Grid(grid) => grid_view(&cf, &g, grid)?,
        Parameterisation::Cells(c) => {
            cell_dimension(&cf, &g, c.rows.len())?;
            lattice_view(&cf, &g, c)?;
        }
        Parameterisation::Vector if n > 0 => cell_dimension(&cf, &g, n)?,
        Parameterisation::Vector => {}
    }
    for name in g.member_names().map_err(cf.e())? {
        if let Ok(ds) = g.dataset(&name) {
            cf.str_attr(&ds, "long_name", &long_name(&name))?;
        }
    }
    if let Ok(h) = f.group("history") {
        if let Ok(itn) = h.dataset("itn") {
            let len = itn.shape();
            cf.class_attr(&itn)?;
            cf.str_attr(&itn, "long_name", "iteration")?;
            let cols: Vec<String> = cf
                .fields_of_shape(&h, &len)?
                .into_iter()
                .filter(|n| n != "itn")
                .map(|n| format!("/history/{n}"))
                .collect();
            cf.attach(&cols, &["/history/itn".to_string()])?;
        }
    }
    Ok(())
}

fn centres(n: usize, origin: f64, d: f64) -> Vec<f64> {
    (0..n).map(|i| origin + (i as f64 + 0.5) * d).collect()
}

fn grid_view(cf: &Cf, g: &Group, grid: &Grid) -> Result<()> {
    let root: &Group = cf.f;
    let axis_letter = ["X", "Y", "Z"];
    let names = ["x", "y", "z"];
    for a in 0..3 {
        let long = format!("{} (cell centre)", grid.axes[a]);
        let mut attrs = vec![
            ("units", grid.units.as_str()),
            ("long_name", long.as_str()),
            ("axis", axis_letter[a]),
        ];
        if a == 2 && grid.axes[2].to_ascii_lowercase().contains("depth") {
            attrs.push(("standard_name", "depth"));
            attrs.push(("positive", "down"));
        }
        cf.scale(
            root,
            names[a],
            &centres(grid.n[a], grid.origin[a], grid.spacing[a]),
            &attrs,
        )?;
    }
    let shape = [grid.n[2], grid.n[1], grid.n[0]];
    let fields = cf.fields_of_shape(g, &shape)?;
    let paths: Vec<String> = fields.iter().map(|n| format!("/model/{n}")).collect();
    cf.attach(&paths, &["/z".into(), "/y".into(), "/x".into()])?;
    // The root group as one netCDF dataset: the fields hard-linked beside their coordinates.
    for n in &fields {
        if root.link_exists(n) {
            continue;
        }
        root.link_hard(&format!("/model/{n}"), n).map_err(cf.e())?;
    }
    Ok(())
}

fn cell_dimension(cf: &Cf, g: &Group, n: usize) -> Result<()> {
    let root: &Group = cf.f;
    let idx: Vec<f64> = (0..n).map(|i| i as f64).collect();
    cf.scale(
        root,
        "cell",
        &idx,
        &[
            ("units", "1"),
            ("long_name", "index of the unknown (column of the system)"),
        ],
    )?;
    let paths: Vec<String> = cf
        .fields_of_shape(g, &[n])?
        .into_iter()
        .map(|n| format!("/model/{n}"))
        .collect();
    cf.attach(&paths, &["/cell".into()])
}

/// One axis of a regular lattice found in a cell table: centres of the lattice and each
/// cell's index along it.
struct Axis {
    centres: Vec<f64>,
    index: Vec<usize>,
}

fn lattice_axis(c: &CellTable, lo: &str, hi: &str) -> Option<Axis> {
    let col = |name: &str| c.columns.iter().position(|s| s.eq_ignore_ascii_case(name));
    let (il, ih) = (col(lo)?, col(hi)?);
    let w = c.rows.first().map(|r| r[ih] - r[il])?;
    if !(w.is_finite() && w > 0.0) {
        return None;
    }
    let mut cmin = f64::INFINITY;
    let mut cmax = f64::NEG_INFINITY;
    for r in &c.rows {
        if ((r[ih] - r[il]) - w).abs() > 1e-6 * w {
            return None;
        }
        let m = 0.5 * (r[il] + r[ih]);
        cmin = cmin.min(m);
        cmax = cmax.max(m);
    }
    let count = ((cmax - cmin) / w).round() as usize + 1;
    let mut index = Vec::with_capacity(c.rows.len());
    for r in &c.rows {
        let k = (0.5 * (r[il] + r[ih]) - cmin) / w;
        if (k - k.round()).abs() > 1e-4 {
            return None;
        }
        index.push(k.round() as usize);
    }
    Some(Axis {
        centres: (0..count).map(|i| cmin + i as f64 * w).collect(),
        index,
    })
}

fn lattice_view(cf: &Cf, g: &Group, c: &CellTable) -> Result<()> {
    let (Some(lat), Some(lon)) = (
        lattice_axis(c, "lat_min", "lat_max"),
        lattice_axis(c, "lon_min", "lon_max"),
    ) else {
        return Ok(());
    };
    let depth = lattice_axis(c, "depth_min", "depth_max");
    let nd = depth.as_ref().map_or(1, |d| d.centres.len());
    let (nlat, nlon) = (lat.centres.len(), lon.centres.len());
    let size = nd * nlat * nlon;
    // Sparse tables on a huge lattice are left as they are.
    if size > 16 * c.rows.len().max(1) {
        return Ok(());
    }
    let mut slot = vec![usize::MAX; size];
    for i in 0..c.rows.len() {
        let k = depth.as_ref().map_or(0, |d| d.index[i]);
        let s = (k * nlat + lat.index[i]) * nlon + lon.index[i];
        if slot[s] != usize::MAX {
            return Ok(()); // two cells in one lattice box: not a lattice
        }
        slot[s] = i;
    }
    let root: &Group = cf.f;
    cf.scale(
        root,
        "lat",
        &lat.centres,
        &[
            ("units", "degrees_north"),
            ("standard_name", "latitude"),
            ("long_name", "latitude (cell centre)"),
            ("axis", "Y"),
        ],
    )?;
    cf.scale(
        root,
        "lon",
        &lon.centres,
        &[
            ("units", "degrees_east"),
            ("standard_name", "longitude"),
            ("long_name", "longitude (cell centre)"),
            ("axis", "X"),
        ],
    )?;
    let mut scales = vec!["/lat".to_string(), "/lon".to_string()];
    let mut shape = vec![nlat, nlon];
    if let Some(d) = &depth {
        cf.scale(
            root,
            "depth",
            &d.centres,
            &[
                ("units", "km"),
                ("standard_name", "depth"),
                ("long_name", "depth (cell centre)"),
                ("positive", "down"),
                ("axis", "Z"),
            ],
        )?;
        scales.insert(0, "/depth".into());
        shape.insert(0, nd);
    }
    let n = c.rows.len();
    let mut made = Vec::new();
    for name in cf.fields_of_shape(g, &[n])? {
        if root.link_exists(&name) {
            continue;
        }
        let src = g.dataset(&name).map_err(cf.e())?;
        let v: Vec<f64> = src.read_raw().map_err(cf.e())?;
        let grid: Vec<f64> = slot
            .iter()
            .map(|&i| if i == usize::MAX { f64::NAN } else { v[i] })
            .collect();
        let ds = root
            .new_dataset::<f64>()
            .shape(shape.clone())
            .create(name.as_str())
            .map_err(cf.e())?;
        ds.write_raw(&grid).map_err(cf.e())?;
        cf.f64_attr(&ds, "_FillValue", f64::NAN)?;
        if let Ok(u) = src
            .attr("units")
            .and_then(|a| a.read_scalar::<VarLenUnicode>())
        {
            cf.str_attr(&ds, "units", u.as_str())?;
        }
        cf.str_attr(&ds, "long_name", &long_name(&name))?;
        cf.str_attr(
            &ds,
            "description",
            &format!("/model/{name} on the lat/lon lattice of the cell table (NaN: no cell)"),
        )?;
        made.push(format!("/{name}"));
    }
    cf.attach(&made, &scales)
}

/// Names of the datasets in a model file's `/model` group (for readers that list fields).
pub fn field_names(path: &Path) -> Result<Vec<String>> {
    let e = |er| h5err(path, er);
    crate::io::check_regular(path)?;
    let f = File::open(path).map_err(e)?;
    let g = f.group("model").map_err(e)?;
    let mut names = Vec::new();
    for n in g.member_names().map_err(e)? {
        if g.dataset(&n).is_ok() {
            names.push(n);
        }
    }
    Ok(names)
}
