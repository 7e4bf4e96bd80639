"""The native code's console lines (progress, notes) reach Python's sys.stdout / sys.stderr by
default, so that a notebook or a redirected sys.stdout sees them; set_console("native") sends
them to the process's streams instead. Run by `make test-python`."""

import io
import sys

import pytest

import seistomo
from test_invert_inputs import DATA, demo_dict

FIRST = "itn       0  r1norm"


def run(tmp_path, name):
    return seistomo.invert(demo_dict(str(tmp_path / name)), base_dir=DATA / "demo", progress=True)


def test_progress_lines_reach_python_sys_stderr(tmp_path, capsys):
    r = run(tmp_path, "py")
    err = capsys.readouterr().err
    assert FIRST in err, err[:500]
    # one line per shown iteration, in order, ending with the last iteration's
    itns = [int(line.split()[1]) for line in err.splitlines() if line.startswith("  itn")]
    assert itns == sorted(itns) and itns[-1] == r["iterations"], itns[-5:]


def test_native_console_bypasses_sys_stderr(tmp_path, capfd, monkeypatch):
    python_side = io.StringIO()
    monkeypatch.setattr(sys, "stderr", python_side)
    seistomo.set_console("native")
    try:
        run(tmp_path, "native")
    finally:
        seistomo.set_console("python")
    assert FIRST not in python_side.getvalue()
    assert FIRST in capfd.readouterr().err


def test_set_console_refuses_other_places():
    with pytest.raises(ValueError, match="python"):
        seistomo.set_console("terminal")
