"""seistomo.mmread / mmwrite against SciPy's Matrix Market reader and writer (which we did not
write): the same matrices, values bit for bit. Run by `make test-python`."""

import gzip
from pathlib import Path

import numpy as np
import pytest
import scipy.io as sio
import scipy.sparse as sp

import seistomo

DATA = Path(__file__).resolve().parents[2] / "datasets"


def same(A, B):
    A, B = sp.csr_matrix(A), sp.csr_matrix(B)
    assert A.shape == B.shape
    A.sum_duplicates()
    B.sum_duplicates()
    A.sort_indices()
    B.sort_indices()
    assert np.array_equal(A.indptr, B.indptr)
    assert np.array_equal(A.indices, B.indices)
    assert np.array_equal(A.data, B.data)


def test_mmread_reads_what_scipy_reads():
    for name in ["australia/G.mtx.gz", "australia/R.mtx.gz"]:
        p = DATA / name
        A = seistomo.mmread(p)
        assert isinstance(A, sp.csr_matrix) and A.dtype == np.float64
        same(A, sio.mmread(p))


@pytest.mark.parametrize("symmetry", ["general", "symmetric", "skew-symmetric"])
@pytest.mark.parametrize("field", ["real", "integer", "pattern"])
def test_mmread_takes_every_form_scipy_writes(tmp_path, symmetry, field):
    rng = np.random.default_rng(7)
    n = 60
    A = sp.random(n, n, density=0.1, random_state=rng, format="csr")
    if field == "integer":
        A.data = np.round(A.data * 20 - 10)
    if symmetry == "symmetric":
        A = A + A.T
    elif symmetry == "skew-symmetric":
        A = sp.triu(A, 1)
        A = A - A.T
    if field == "pattern":
        if symmetry == "skew-symmetric":
            return  # (Matrix Market has no skew-symmetric pattern)
        A.data[:] = 1.0
    p = tmp_path / f"a_{field}_{symmetry}.mtx"
    sio.mmwrite(p, A, field=field, symmetry=symmetry)
    same(seistomo.mmread(p), sio.mmread(p))
    # and gzipped by gzip (one member: one decoder)
    with open(p, "rb") as f, gzip.open(str(p) + ".gz", "wb") as g:
        g.write(f.read())
    same(seistomo.mmread(str(p) + ".gz"), sio.mmread(p))


@pytest.mark.parametrize("symmetry", ["general", "symmetric"])
def test_mmread_takes_dense_array_files(tmp_path, symmetry):
    rng = np.random.default_rng(11)
    D = rng.standard_normal((7, 7)) * (rng.random((7, 7)) < 0.5)
    if symmetry == "symmetric":
        D = D + D.T
    p = tmp_path / f"dense_{symmetry}.mtx"
    sio.mmwrite(p, D, symmetry=symmetry)  # an `array` file: every value, zeros too
    assert "array" in p.read_text().splitlines()[0]
    same(seistomo.mmread(p), sio.mmread(p))
    assert np.array_equal(seistomo.mmread(p).toarray(), sio.mmread(p))


def test_mmwrite_round_trips_through_scipy_and_back(tmp_path):
    rng = np.random.default_rng(3)
    A = sp.random(3000, 400, density=0.02, random_state=rng, format="csr")
    A.data = rng.standard_normal(A.nnz) * 10.0 ** rng.integers(-300, 300, A.nnz)
    for name in ["a.mtx", "a.mtx.gz"]:
        p = tmp_path / name
        seistomo.mmwrite(p, A, comment="made by\nthe tests")
        same(sio.mmread(p), A)  # shortest round-trip values: exact
        same(seistomo.mmread(p), A)
    # the .gz is several members that say their lengths (read in parallel), and one gzip stream
    raw = (tmp_path / "a.mtx.gz").read_bytes()
    assert raw[12:14] == b"SM"
    text = gzip.decompress(raw).decode()
    assert text.startswith("%%MatrixMarket matrix coordinate real general\n%made by\n%the tests\n")
    assert text == (tmp_path / "a.mtx").read_text()
    # a dense array is written as its nonzeros
    D = np.array([[0.0, 1.5], [-2.0, 0.0]])
    seistomo.mmwrite(tmp_path / "d.mtx", D)
    same(seistomo.mmread(tmp_path / "d.mtx"), D)


def test_bad_files_are_one_error_naming_the_file_and_line(tmp_path):
    p = tmp_path / "bad.mtx"
    p.write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1.0\n2 x 2.0\n")
    with pytest.raises(OSError, match=r"bad\.mtx:4: bad column index"):
        seistomo.mmread(p)
    with pytest.raises(FileNotFoundError):
        seistomo.mmread(tmp_path / "missing.mtx")
    # a truncated member of a seistomo .gz: an error, never a short matrix
    seistomo.mmwrite(tmp_path / "t.mtx.gz", sp.eye(2000, format="csr"))
    raw = (tmp_path / "t.mtx.gz").read_bytes()
    (tmp_path / "cut.mtx.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(OSError, match="cut.mtx.gz"):
        seistomo.mmread(tmp_path / "cut.mtx.gz")
    # writing: an empty matrix is refused, and nothing is left behind
    with pytest.raises(ValueError, match="empty"):
        seistomo.mmwrite(tmp_path / "e.mtx", sp.csr_matrix((0, 3)))
    assert not (tmp_path / "e.mtx").exists()
