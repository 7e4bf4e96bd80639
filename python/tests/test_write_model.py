"""seistomo.write_model and to_xarray (issue 34 item 5): a solution computed in Python written
as the model file `seistomo invert` writes (HDF5 + XDMF) and read back. Checked against the
model file of an invert run of the same solution. Run by `make test-python`."""

import os

import numpy as np
import pytest

import seistomo
from test_invert_inputs import demo_dict
from test_seistomo import DATA

GRID = dict(n=[4, 3, 2], origin=[10.0, 20.0, 0.0], spacing=[1.0, 2.0, 5.0], units="km")


def fields(path):
    return seistomo.open_model(path, xarray=False)


@pytest.fixture(scope="module")
def inverted(tmp_path_factory):
    """The demo inverted by `invert` (its model file and solution)."""
    out = tmp_path_factory.mktemp("inv")
    seistomo.invert(demo_dict(str(out)), base_dir=DATA / "demo")
    return out


def test_the_solution_of_an_invert_run_written_again_gives_its_fields(inverted, tmp_path):
    ran = fields(inverted / "model.h5")
    ds = seistomo.Dataset(DATA / "demo")
    x = ran["solution"].ravel()  # grid order: x[i + nx (j + ny k)] is element [k][j][i]
    seistomo.write_model(tmp_path / "m.h5", x, ds, unknowns="slowness_perturbation",
                         reference=2.0, true_model=ran["true_solution"].ravel())
    again = fields(tmp_path / "m.h5")
    for name in ("solution", "slowness", "velocity", "reference_velocity", "perturbation",
                 "slowness_perturbation", "true_velocity", "true_perturbation"):
        assert np.array_equal(again[name], ran[name], equal_nan=True), name
    for axis in ("x", "y", "z"):
        assert np.array_equal(again[axis], ran[axis])
    assert (tmp_path / "m.xdmf").is_file()
    # invert's coverage fields need the kernel rows, which a solution alone does not carry
    assert "hit_count" in ran and "hit_count" not in again


def test_a_result_of_lsqr_carries_x_var_and_its_report(tmp_path):
    ds = seistomo.Dataset(DATA / "demo")
    A, b = ds.system()
    r = seistomo.lsqr(A, b, atol=1e-8, btol=1e-8, calc_var=True)
    seistomo.write_model(tmp_path / "m.h5", r, ds.grid)
    f = fields(tmp_path / "m.h5")
    assert np.array_equal(f["solution"].ravel(), r[0])
    assert np.array_equal(f["variance_lower_bound"].ravel(), r[9])
    assert np.array_equal(f["std_error_lower_bound"].ravel(), np.sqrt(r[9]))
    assert f["attrs"]["istop"] == r[1]
    assert f["attrs"]["stop_reason"] == r.info["stop_reason"]
    # unknowns = slowness with the mean as reference (the defaults)
    assert f["attrs"]["unknowns"] == "slowness"
    v = f["velocity"].ravel()
    pos = r[0] > 0
    assert np.array_equal(v[pos], 1.0 / r[0][pos]) and np.all(np.isnan(v[~pos]))


def test_an_lsmr_result_and_a_bare_vector(tmp_path):
    x = np.linspace(0.2, 0.4, 24)
    seistomo.write_model(tmp_path / "v.h5", x)  # no grid: a bare vector
    f = fields(tmp_path / "v.h5")
    assert np.array_equal(f["solution"], x) and f["attrs"]["parameterisation"] == "vector"
    assert "not known" in f["attrs"]["stop_reason"]
    assert not (tmp_path / "v.xdmf").exists()
    import scipy.sparse as sp

    A = sp.random(60, 24, density=0.3, random_state=1, format="csr") + sp.eye(60, 24)
    r = seistomo.lsmr(A.tocsr(), A @ x, atol=1e-10, btol=1e-10)
    seistomo.write_model(tmp_path / "l.h5", r, GRID, reference_profile=[(0, 2.0), (10, 3.0)])
    f = fields(tmp_path / "l.h5")
    assert np.array_equal(f["solution"].ravel(), r[0]) and f["attrs"]["istop"] == r[1]
    # the profile, interpolated at the cell centres' depths (2.5 and 7.5)
    ref = f["reference_velocity"]
    assert np.allclose(ref[0], 2.25) and np.allclose(ref[1], 2.75)
    assert np.allclose(f["x"], [10.5, 11.5, 12.5, 13.5]) and np.allclose(f["z"], [2.5, 7.5])


def test_cells(tmp_path):
    rows = [[-30 + i, -29 + i, 130.0, 131.0] for i in range(5)]
    x = np.full(5, 0.25)
    cells = (["lat_min", "lat_max", "lon_min", "lon_max"], "degrees", rows)
    seistomo.write_model(tmp_path / "c.h5", x, cells=cells, reference=4.0)
    f = fields(tmp_path / "c.h5")
    assert np.array_equal(f["cells"], np.array(rows)) and np.allclose(f["velocity"], 4.0)
    assert np.allclose(f["perturbation"], 0.0)


def test_to_xarray_is_open_model_of_the_written_file(tmp_path):
    pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    x = np.linspace(0.2, 0.4, 24)
    ds = seistomo.to_xarray(x, GRID, unknowns="slowness_perturbation", reference=3.0)
    assert ds["solution"].dims == ("z", "y", "x") and ds["solution"].shape == (2, 3, 4)
    assert np.array_equal(ds["solution"].values.ravel(), x)
    seistomo.write_model(tmp_path / "m.h5", x, GRID, unknowns="slowness_perturbation",
                         reference=3.0)
    on_disk = seistomo.open_model(tmp_path / "m.h5")
    try:
        assert set(ds.data_vars) == set(on_disk.data_vars)
        for name in ds.data_vars:
            assert np.array_equal(ds[name].values, on_disk[name].values, equal_nan=True)
            assert ds[name].attrs.get("units") == on_disk[name].attrs.get("units")
    finally:
        on_disk.close()


@pytest.mark.parametrize("kw, msg", [
    (dict(grid=dict(n=[5, 3, 2], spacing=[1, 1, 1])), "30 grid cells but the system has 24"),
    (dict(unknowns="slowness_perturbation"), "needs a reference"),
    (dict(unknowns="speed"), "unknown value 'speed'"),
    (dict(reference="median"), "neither a velocity nor"),
    (dict(reference=-1.0), "reference must be > 0"),
    (dict(reference_profile=[(0, 2.0)]), "needs a grid"),
    (dict(grid=GRID, reference_profile=[(5, 2.0), (1, 3.0)]), "depths must increase"),
    (dict(var=np.ones(3)), "var has 3 entries, expected 24"),
    (dict(true_model=np.ones(2)), "true_model has 2 entries"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, kw, msg):
    x = np.linspace(0.2, 0.4, 24)
    grid = kw.pop("grid", None)
    with pytest.raises(ValueError, match=msg) as e:
        seistomo.write_model(tmp_path / "bad.h5", x, grid, **kw)
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path) == []


def test_several_columns_are_refused(tmp_path):
    with pytest.raises(ValueError, match="one solution"):
        seistomo.write_model(tmp_path / "m.h5", np.ones((24, 2)), GRID)
    with pytest.raises(ValueError, match="not finite|finite"):
        seistomo.write_model(tmp_path / "m.h5", np.full(24, np.nan), GRID)
    assert os.listdir(tmp_path) == []
