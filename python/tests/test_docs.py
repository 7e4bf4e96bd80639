"""Docs that run: every ```python block of README.md's Python section and of docs/python.md is
executed, each on its own in a fresh namespace, in a temporary directory that holds a copy of
the bundled datasets/ and configs/ (so `datasets/demo/invert.toml` writes out/demo there). A
block must define every name it uses. A block that imports a module not installed here
(pylops, matplotlib: the `[plot]` extra; cupy), or opens a model with xarray where the
`[xarray]` extra is missing, is skipped, naming it. Run by `make test-python`."""

import ast
import importlib.util
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def blocks(path, section=None):
    """(path:line, code) of the ```python blocks of `path` (of its `## section` only)."""
    text = (ROOT / path).read_text()
    start, end = 0, len(text)
    if section is not None:
        start = text.index(f"## {section}")
        end = text.find("\n## ", start + 3) % (len(text) + 1)
    out = [(f"{path}:{text[:m.start()].count(chr(10)) + 1}", m.group(1))
           for m in FENCE.finditer(text, start, end)]
    assert out, f"no python blocks in {path}"
    return out


BLOCKS = blocks("README.md", "From Python (docs/python.md)") + blocks("docs/python.md")


def imported_modules(code):
    """The top-level modules a block imports."""
    mods = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods.add(node.module.split(".")[0])
    return mods


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """A copy of datasets/ and configs/ (the blocks write beside and into them)."""
    base = tmp_path_factory.mktemp("bundled")
    for d in ("datasets", "configs"):
        shutil.copytree(ROOT / d, base / d)
    return base


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[i for i, _ in BLOCKS])
def test_doc_example_runs(code, bundled, tmp_path, monkeypatch):
    compiled = compile(code, "<doc example>", "exec")  # even where it is skipped
    needs = set(imported_modules(code))
    if re.search(r"\b(open_model|to_xarray)\(", code) and "xarray=False" not in code:
        needs |= {"xarray", "h5netcdf", "h5py"}  # what open_model needs (the [xarray] extra)
    for mod in sorted(needs):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"the example imports or needs {mod}, not installed here")
    for d in ("datasets", "configs"):
        shutil.copytree(bundled / d, tmp_path / d)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__doc_example__"}
    exec(compiled, namespace)


def test_the_blocks_are_found():
    ids = [i for i, _ in BLOCKS]
    assert any(i.startswith("README.md") for i in ids)
    assert sum(i.startswith("docs/python.md") for i in ids) >= 8
