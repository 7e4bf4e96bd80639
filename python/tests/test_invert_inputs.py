"""seistomo.invert with a config given as a dict or a seistomo.Dataset, besides a path: the
same run as the TOML file's. Run by `make test-python`."""

import json
import os

import numpy as np
import pytest
import scipy.sparse as sp

import seistomo
from test_seistomo import DATA, rel

DEMO = {
    "dataset": {"path": "dataset.toml"},
    "solver": {"method": "lsqr", "atol": 1e-8, "btol": 1e-8, "iter_lim": 1000},
    "output": {"dir": "OUT"},
    "model": {"unknowns": "slowness_perturbation", "slowness_unit": "s/km", "reference": 2.0},
}


def demo_dict(out, **solver):
    cfg = json.loads(json.dumps(DEMO))
    cfg["output"]["dir"] = out
    cfg["solver"].update(solver)
    return cfg


def test_a_dict_runs_as_its_toml_file(tmp_path):
    # relative paths: against base_dir (here the dataset's directory), as a file's against
    # the file's directory
    r1 = seistomo.invert(demo_dict(str(tmp_path / "dict")), base_dir=DATA / "demo")
    text = (DATA / "demo" / "invert.toml").read_text()
    text = text.replace('dir = "../../out/demo"', f'dir = "{tmp_path / "file"}"')
    cfg = tmp_path / "invert.toml"
    cfg.write_text(text.replace('path = "dataset.toml"',
                                f'path = "{DATA / "demo" / "dataset.toml"}"'))
    r2 = seistomo.invert(cfg)
    assert r1["iterations"] == r2["iterations"] and r1["istop"] == r2["istop"]
    x1 = np.loadtxt(tmp_path / "dict" / "solution.txt")
    x2 = np.loadtxt(tmp_path / "file" / "solution.txt")
    assert np.array_equal(x1, x2)
    ds = seistomo.open_model(tmp_path / "dict" / "model.h5", xarray=False)  # no extra needed
    assert "velocity" in ds


def test_a_dict_resolves_relative_paths_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(DATA / "demo")
    cfg = demo_dict(str(tmp_path / "out"), iter_lim=5, atol=0.0, btol=0.0)
    r = seistomo.invert(cfg)
    assert r["iterations"] == 5 and (tmp_path / "out" / "model.h5").is_file()


def test_a_dataset_object_runs_its_directory(tmp_path):
    G = sp.random(60, 24, density=0.2, random_state=4, format="csr") + sp.eye(60, 24)
    x = np.linspace(1, 2, 24)
    grid = dict(n=[4, 3, 2], origin=[0, 0, 0], spacing=[1.0, 1.0, 1.0], units="km")
    ds = seistomo.Dataset.create(tmp_path / "mine", G.tocsr(), G @ x, grid=grid)
    report = seistomo.invert(ds)
    assert report["istop"] in (1, 2)
    got = np.loadtxt(tmp_path / "mine-inversion" / "solution.txt")
    assert rel(got, x) <= 1e-6


def test_bad_dict_configs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="atol"):
        seistomo.invert(demo_dict(str(tmp_path / "a"), atol=-1.0), base_dir=DATA / "demo")
    with pytest.raises(ValueError, match="unknown field|unknown key|nosuch"):
        seistomo.invert(dict(demo_dict(str(tmp_path / "b")), nosuch={"a": 1}),
                        base_dir=DATA / "demo")
    with pytest.raises(TypeError, match="solver.atol is None"):
        seistomo.invert(demo_dict(str(tmp_path / "c"), atol=None))
    with pytest.raises(TypeError, match="not a TOML value"):
        seistomo.invert(demo_dict(str(tmp_path / "d"), atol=object()))
    with pytest.raises(TypeError, match="a path, a seistomo.Dataset or a dict"):
        seistomo.invert(42)
    with pytest.raises(ValueError, match="base_dir is for a config given as a dict"):
        seistomo.invert(DATA / "demo" / "invert.toml", base_dir=".")
    assert not os.path.exists(tmp_path / "a")


def test_toml_of_a_dict():
    text = seistomo._toml({"a": 1, "b": {"c": [1.5, float("inf")], "d e": "x\"y\\z", "f": True,
                                         "g": {"h": np.float64(1e-8)}}})
    import tomllib  # Python >= 3.11; the module itself does not need it

    assert tomllib.loads(text) == {"a": 1, "b": {"c": [1.5, float("inf")], "d e": "x\"y\\z",
                                                 "f": True, "g": {"h": 1e-8}}}


def test_each_run_records_its_own_inputs(tmp_path, monkeypatch):
    # Two runs in one process, from different directories: the second model file names the
    # second run's inputs only (the first's relative paths would not even resolve there).
    h5py = pytest.importorskip("h5py")
    G = sp.random(60, 24, density=0.2, random_state=4, format="csr") + sp.eye(60, 24)
    grid = dict(n=[4, 3, 2], origin=[0, 0, 0], spacing=[1.0, 1.0, 1.0], units="km")
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        ds = seistomo.Dataset.create(f"data-{name}", G.tocsr(), G @ np.ones(24), grid=grid)
        seistomo.invert(ds)
    with h5py.File(tmp_path / "second" / "data-second-inversion" / "model.h5") as f:
        files = [str(v) for v in np.atleast_1d(f["provenance"].attrs["input_files"])]
    assert files and all("first" not in v for v in files)
    assert any("data-second" in v for v in files)
