"""CuPy input (issue 33 item 4): seistomo.lsqr and lsmr on a cupyx.scipy.sparse matrix solve
on the GPU without the matrix passing through the host (its arrays and its CuPy-made transpose
are copied device to device into the library's CSR storage), and equal the same solve from the
SciPy matrix with the same storage (CSR, explicit transpose), bit for bit. Needs CuPy and a
GPU: skipped elsewhere (the GPU machine has both). Run by `make test-python`."""

import numpy as np
import pytest
import scipy.sparse as sp

import seistomo
from test_seistomo import HAS_GPU, rel, system, x0_for

cupy = pytest.importorskip("cupy", reason="CuPy is not installed here")
csp = pytest.importorskip("cupyx.scipy.sparse", reason="CuPy is not installed here")
pytestmark = pytest.mark.skipif(not HAS_GPU, reason="no usable CUDA GPU")

SAME = dict(backend="cuda", storage="csr", transpose="csc")


def same(ours, ref):
    """Result tuples equal entry for entry (ours from CuPy input, ref from SciPy input)."""
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        if isinstance(b, np.ndarray):
            assert isinstance(a, cupy.ndarray), f"entry {k}: {type(a)}"
            assert np.array_equal(cupy.asnumpy(a), b), f"entry {k}: {rel(cupy.asnumpy(a), b)}"
        else:
            assert a == b or (a != a and b != b), f"entry {k}: {a} != {b}"


@pytest.mark.parametrize("name", ["australia", "well1850", "illc1033"])
def test_a_cupy_matrix_solves_as_the_scipy_one(name):
    A, b = system(name)
    Ac, bc = csp.csr_matrix(A), cupy.asarray(b)
    tight = dict(atol=1e-10, btol=1e-10, conlim=1e14)
    for damp in (0.0, 0.01):
        r = seistomo.lsqr(Ac, bc, damp=damp, calc_var=True, **tight)
        same(r, seistomo.lsqr(A, b, damp=damp, calc_var=True, **tight, **SAME))
        assert "the matrix given on the GPU" in r.info["backend"]
        same(seistomo.lsmr(Ac, bc, damp=damp, **tight), seistomo.lsmr(A, b, damp=damp, **tight, **SAME))
    # the caller's matrix is left as it was (arrays, dtypes)
    assert Ac.indices.dtype == cupy.int32 and np.array_equal(cupy.asnumpy(Ac.data), A.data)
    # x0 as a CuPy array, SciPy's defaults, an iteration limit, the host loop
    x0 = x0_for(A)
    same(seistomo.lsqr(Ac, bc, x0=cupy.asarray(x0)), seistomo.lsqr(A, b, x0=x0, **SAME))
    same(seistomo.lsqr(Ac, bc, iter_lim=7, lsqr_loop="host"),
         seistomo.lsqr(A, b, iter_lim=7, lsqr_loop="host", **SAME))


def test_against_scipy_and_other_cupy_formats():
    from scipy.sparse.linalg import lsqr as scipy_lsqr

    A, b = system("australia")
    ref = scipy_lsqr(A, b, atol=1e-10, btol=1e-10)
    r = seistomo.lsqr(csp.csr_matrix(A), b, atol=1e-10, btol=1e-10)  # b on the host
    assert r[1] == ref[1] and abs(r[2] - ref[2]) <= 0.02 * ref[2]
    assert rel(cupy.asnumpy(r[0]), ref[0]) <= 1e-8
    ours = seistomo.lsqr(A, b, atol=1e-10, btol=1e-10, **SAME)
    for M in (csp.csc_matrix(A), csp.coo_matrix(A)):
        same(seistomo.lsqr(M, b, atol=1e-10, btol=1e-10), ours)
    # a dense CuPy array: made a CSR matrix on the GPU (its zeros left out)
    W, c = system("well1033")
    r = seistomo.lsqr(cupy.asarray(W.toarray()), c)
    ref = seistomo.lsqr(W, c, **SAME)
    assert r[1] == ref[1] and abs(r[2] - ref[2]) <= 0.02 * ref[2]
    assert rel(cupy.asnumpy(r[0]), ref[0]) <= 1e-10


def test_f32_values():
    A, b = system("australia")
    A32 = csp.csr_matrix(A.astype(np.float32))
    r = seistomo.lsqr(A32, cupy.asarray(b))
    same(r, seistomo.lsqr(A, b, precision="f32", **SAME))
    same(seistomo.lsqr(csp.csr_matrix(A), b, precision="f32"),
         seistomo.lsqr(A, b, precision="f32", **SAME))


def test_a_matrix_with_repeats_and_unsorted_columns():
    A, b = system("well1033")
    coo = A.tocoo()
    # every entry split in two halves, in reverse order: CuPy sums and sorts them on the GPU
    rows = np.concatenate([coo.row, coo.row])[::-1]
    cols = np.concatenate([coo.col, coo.col])[::-1]
    vals = np.concatenate([coo.data / 2, coo.data / 2])[::-1]
    M = csp.coo_matrix((cupy.asarray(vals), (cupy.asarray(rows), cupy.asarray(cols))),
                       shape=A.shape)
    r = seistomo.lsqr(M, b)
    ref = seistomo.lsqr(sp.coo_matrix((vals, (rows, cols)), shape=A.shape).tocsr(), b, **SAME)
    assert r[1] == ref[1] and r[2] == ref[2]
    assert rel(cupy.asnumpy(r[0]), ref[0]) <= 1e-12


def test_errors_are_clear():
    A, b = system("well1033")
    Ac = csp.csr_matrix(A)
    with pytest.raises(ValueError, match="shape mismatch: b has 5 entries"):
        seistomo.lsqr(Ac, cupy.ones(5))
    with pytest.raises(ValueError, match="backend='cpu': a CuPy matrix lies on the GPU"):
        seistomo.lsqr(Ac, b, backend="cpu")
    with pytest.raises(ValueError, match="storage='compact': a CuPy matrix runs as CSR"):
        seistomo.lsqr(Ac, b, storage="compact")
    with pytest.raises(TypeError, match="complex values are not supported"):
        seistomo.lsqr(Ac.astype(cupy.complex128), b)
    with pytest.raises(ValueError, match="backend='cpu': a CuPy matrix lies on the GPU"):
        seistomo.lsqr(Ac, np.stack([b, b], axis=1), backend="cpu")  # k columns: test_columns
    with pytest.raises(ValueError, match="not finite"):
        seistomo.lsqr(Ac, np.full(A.shape[0], np.nan))
    # still solves after the errors
    same(seistomo.lsqr(Ac, b), seistomo.lsqr(A, b, **SAME))
