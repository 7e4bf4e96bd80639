//! The netCDF-4 / CF view of model files (src/model/cf.rs): coordinates as HDF5 dimension
//! scales attached to every field, fields at the root, lat/lon lattices of cell tables.
//! (python/tests opens the same files with xarray/h5netcdf and ncdump.)

mod common;

use common::{cpu_opts, identity_system, scratch as tmp, str_attr};
use std::path::PathBuf;

use hdf5::types::VarLenArray;
use hdf5::{ObjectReference1, ReferencedObject};
use seistomo::backend::TransposeStrategy;
use seistomo::comm::SerialComm;
use seistomo::grid::Grid;
use seistomo::model::hdf5::{write_model, ModelInputs};
use seistomo::model::report::Outcome;
use seistomo::model::spec::{CellTable, ModelSpec, Parameterisation, Reference, Unknowns};
use seistomo::pipeline::solve::solve_system;
use seistomo::solver::LsqrParams;

/// Solve I x = b: x = b.
fn identity_outcome(b: &[f64]) -> Outcome {
    let params = LsqrParams {
        atol: 1e-12,
        btol: 1e-12,
        ..Default::default()
    };
    let opts = cpu_opts(params, TransposeStrategy::Auto);
    solve_system(identity_system(b), &opts, &SerialComm, 0.0, 0).unwrap()
}

fn write(dir: &std::path::Path, spec: &ModelSpec, o: &Outcome) -> PathBuf {
    let p = dir.join("model.h5");
    write_model(
        &p,
        &ModelInputs {
            spec,
            outcome: o,
            coverage: None,
            kernel_rows: o.solution.x.len(),
            config_text: "# test",
            resolution: &[],
        },
    )
    .unwrap();
    p
}

/// The names of the scales in a dataset's DIMENSION_LIST, slowest axis first.
fn dims(f: &hdf5::File, ds: &hdf5::Dataset) -> Vec<String> {
    let list: Vec<VarLenArray<ObjectReference1>> =
        ds.attr("DIMENSION_LIST").unwrap().read_raw().unwrap();
    list.iter()
        .map(|refs| {
            assert_eq!(refs.len(), 1);
            match f.dereference(&refs[0]).unwrap() {
                ReferencedObject::Dataset(d) => d.name(),
                _ => panic!("a dimension scale must be a dataset"),
            }
        })
        .collect()
}

#[test]
fn grid_fields_have_coordinates_and_sit_at_the_root() {
    let mut g = Grid::new([4, 3, 2], [-10.0, 20.0, 0.0], [2.0, 5.0, 7.5]);
    g.axes = ["x".into(), "y".into(), "depth".into()];
    let x: Vec<f64> = (0..g.ncells()).map(|i| 0.5 + i as f64 * 1e-3).collect();
    let o = identity_outcome(&x);
    let spec = ModelSpec {
        param: Parameterisation::Grid(g.clone()),
        unknowns: Unknowns::Slowness,
        slowness_unit: "s/km".into(),
        reference: Reference::Constant(2.0),
        true_model: None,
    };
    let dir = tmp("grid");
    let p = write(&dir, &spec, &o);
    let f = hdf5::File::open(&p).unwrap();
    assert_eq!(str_attr(&f, "Conventions"), "CF-1.8");
    let xs: Vec<f64> = f.dataset("x").unwrap().read_raw().unwrap();
    assert_eq!(xs, vec![-9.0, -7.0, -5.0, -3.0]);
    let z = f.dataset("z").unwrap();
    assert_eq!(z.read_raw::<f64>().unwrap(), vec![3.75, 11.25]);
    assert_eq!(str_attr(&z, "standard_name"), "depth");
    assert_eq!(str_attr(&z, "positive"), "down");
    assert_eq!(str_attr(&z, "units"), "km");
    let class: hdf5::types::FixedAscii<16> = z.attr("CLASS").unwrap().read_scalar().unwrap();
    assert_eq!(class.as_str(), "DIMENSION_SCALE");
    for field in ["velocity", "slowness", "solution", "perturbation"] {
        let ds = f.dataset(&format!("model/{field}")).unwrap();
        assert_eq!(dims(&f, &ds), vec!["/z", "/y", "/x"], "{field}");
        assert!(!str_attr(&ds, "long_name").is_empty());
        // The same object at the root (a hard link: no second copy of the data).
        let at_root = f.dataset(field).unwrap();
        assert_eq!(
            at_root.read_raw::<f64>().unwrap(),
            ds.read_raw::<f64>().unwrap()
        );
    }
    let refs = f.dataset("x").unwrap().attr("REFERENCE_LIST").unwrap();
    assert!(refs.size() >= 4);
    // History columns are indexed by itn.
    let h = f.dataset("history/r1norm").unwrap();
    assert_eq!(dims(&f, &h), vec!["/history/itn"]);
}

#[test]
fn lat_lon_cell_tables_become_gridded_fields_with_a_fill_value() {
    // A 3 x 4 lattice of 0.5 degree boxes with one box missing; the unknowns are out of order.
    let mut rows = Vec::new();
    for (i, j) in [
        (2, 3),
        (0, 0),
        (1, 1),
        (0, 1),
        (2, 0),
        (1, 0),
        (0, 2),
        (2, 1),
        (1, 3),
    ]
    .into_iter()
    .chain([(0, 3), (2, 2)])
    {
        let (lat, lon) = (-30.0 + 0.5 * i as f64, 140.0 + 0.5 * j as f64);
        rows.push(vec![lat, lat + 0.5, lon, lon + 0.5]);
    }
    let n = rows.len();
    let cells = CellTable {
        columns: ["lat_min", "lat_max", "lon_min", "lon_max"]
            .map(String::from)
            .to_vec(),
        units: "degrees".into(),
        rows: rows.clone(),
    };
    let x: Vec<f64> = (0..n).map(|i| 1.0 + i as f64).collect();
    let o = identity_outcome(&x);
    let spec = ModelSpec {
        param: Parameterisation::Cells(cells),
        unknowns: Unknowns::Slowness,
        slowness_unit: "s/km".into(),
        reference: Reference::Mean,
        true_model: None,
    };
    let dir = tmp("cells");
    let p = write(&dir, &spec, &o);
    let f = hdf5::File::open(&p).unwrap();
    let lat = f.dataset("lat").unwrap();
    assert_eq!(lat.read_raw::<f64>().unwrap(), vec![-29.75, -29.25, -28.75]);
    assert_eq!(str_attr(&lat, "units"), "degrees_north");
    let lon = f.dataset("lon").unwrap();
    assert_eq!(str_attr(&lon, "standard_name"), "longitude");
    let s = f.dataset("solution").unwrap();
    assert_eq!(s.shape(), vec![3, 4]);
    assert_eq!(dims(&f, &s), vec!["/lat", "/lon"]);
    let fill: f64 = s.attr("_FillValue").unwrap().read_scalar().unwrap();
    assert!(fill.is_nan());
    let v: Vec<f64> = s.read_raw().unwrap();
    let xs: Vec<f64> = f.dataset("model/solution").unwrap().read_raw().unwrap();
    for (c, r) in rows.iter().enumerate() {
        let i = ((r[0] + 30.0) / 0.5).round() as usize;
        let j = ((r[2] - 140.0) / 0.5).round() as usize;
        assert!((v[i * 4 + j] - xs[c]).abs() <= 1e-12, "cell {c}");
    }
    // (1, 2) is the box no cell covers.
    assert!(v[4 + 2].is_nan());
    assert_eq!(v.iter().filter(|a| a.is_nan()).count(), 1);
    // The per-unknown fields keep their layout, indexed by `cell`.
    let m = f.dataset("model/velocity").unwrap();
    assert_eq!(m.shape(), vec![n]);
    assert_eq!(dims(&f, &m), vec!["/cell"]);
}
