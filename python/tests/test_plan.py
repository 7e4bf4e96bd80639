"""seistomo.Operator: a matrix prepared once (copied, laid out, its operator built) and reused
by lsqr and lsmr for any number of solves. Each solve must return what lsqr(A, ...) /
lsmr(A, ...) with the same options returns: bit for bit on the CPU. Run by `make test-python`."""

import threading

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import aslinearoperator

import seistomo
from test_seistomo import (HAS_GPU, ctrl_c_during, rel, second_difference, system,
                           within_2pct, x0_for)

# The layouts the CPU can prepare: storage, reordering, value precision, transpose.
LAYOUTS = {
    "csr": dict(storage="csr"),
    "csr-rows": dict(storage="csr", reorder="rows"),
    "csr-auto-scatter": dict(storage="csr", reorder="auto", transpose="scatter"),
    "compact": dict(storage="compact"),
    "compact-rows-f32": dict(storage="compact", reorder="rows", precision="f32"),
}
DAMPS = [0.0, 0.003, 0.03]


def same(ours, ref):
    """Every entry of two result tuples equal: arrays bit for bit, scalars exactly."""
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        if isinstance(b, np.ndarray):
            assert a.shape == b.shape and np.array_equal(a, b), f"entry {k} differs"
        else:
            assert a == b or (a != a and b != b), f"entry {k}: {a} != {b}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_operator_equals_the_plain_call_bit_for_bit(layout):
    A, b = system("australia")
    kw = dict(LAYOUTS[layout], backend="cpu")
    op = seistomo.Operator(A, **kw)
    assert op.shape == A.shape and op.nnz == A.nnz and op.backend == "cpu"
    assert op.storage == kw["storage"] and op.setup_seconds > 0
    assert op.precision == kw.get("precision", "f64")
    tight = dict(atol=1e-10, btol=1e-10, conlim=1e14)
    for damp in DAMPS:
        same(seistomo.lsqr(op, b, damp=damp, calc_var=True, **tight),
             seistomo.lsqr(A, b, damp=damp, calc_var=True, **tight, **kw))
        same(seistomo.lsmr(op, b, damp=damp, **tight), seistomo.lsmr(A, b, damp=damp, **tight, **kw))
    # x0, another b, SciPy's defaults, an iteration limit: the call's own settings
    x0, b2 = x0_for(A), np.cos(np.arange(A.shape[0]))
    same(seistomo.lsqr(op, b, x0=x0, damp=0.01), seistomo.lsqr(A, b, x0=x0, damp=0.01, **kw))
    same(seistomo.lsqr(op, b2, iter_lim=7), seistomo.lsqr(A, b2, iter_lim=7, **kw))
    same(seistomo.lsmr(op, b2, x0=x0, maxiter=30), seistomo.lsmr(A, b2, x0=x0, maxiter=30, **kw))
    # the layout options passed again (the values it was made with) change nothing
    same(seistomo.lsqr(op, b, **kw), seistomo.lsqr(A, b, **kw))


def test_solves_do_not_depend_on_the_ones_before():
    A, b = system("well1033")
    op = seistomo.Operator(A, backend="cpu")
    first = seistomo.lsqr(op, b, damp=0.1, calc_var=True)
    seistomo.lsmr(op, 2 * b, damp=1.0, x0=np.ones(A.shape[1]))
    seistomo.lsqr(op, b, iter_lim=3)
    same(seistomo.lsqr(op, b, damp=0.1, calc_var=True), first)
    assert seistomo.last_info["itn"] == first[2] and "cpu" in seistomo.last_info["backend"]


def test_attributes_close_and_context_manager():
    A, b = system("well1033")
    with seistomo.Operator(A, backend="cpu", reorder="rows") as op:
        assert op.dtype == np.float64 and not op.closed
        assert "rows sorted" in op.ordering and "cpu" in op.backend_detail
        assert "Operator(shape=(1033, 320)" in repr(op)
        x = seistomo.lsqr(op, b)[0]
    assert op.closed and "closed" in repr(op)
    with pytest.raises(ValueError, match="closed"):
        seistomo.lsqr(op, b)
    op.close()  # twice is fine
    assert rel(x, seistomo.lsqr(A, b, backend="cpu", reorder="rows")[0]) == 0


def test_dense_and_coo_inputs_prepare_the_same_operator():
    A, b = system("well1033")
    ref = seistomo.lsqr(seistomo.Operator(A, backend="cpu"), b)
    same(seistomo.lsqr(seistomo.Operator(A.toarray(), backend="cpu"), b), ref)
    same(seistomo.lsqr(seistomo.Operator(A.tocoo(), backend="cpu"), b), ref)
    same(seistomo.lsqr(seistomo.Operator(A.tocsc(), backend="cpu"), b), ref)


def test_operator_errors_are_clear():
    A, b = system("well1033")
    op = seistomo.Operator(A, backend="cpu")
    with pytest.raises(ValueError, match="shape mismatch: b has 5 entries"):
        seistomo.lsqr(op, np.ones(5))
    with pytest.raises(ValueError, match="x0 has 3 entries"):
        seistomo.lsmr(op, b, x0=np.ones(3))
    with pytest.raises(ValueError, match="b\\[0\\] is not finite"):
        seistomo.lsqr(op, np.full(A.shape[0], np.nan))
    with pytest.raises(ValueError, match="storage='compact': the layout options are fixed"):
        seistomo.lsqr(op, b, storage="compact")
    with pytest.raises(ValueError, match="backend='cuda'"):
        seistomo.lsmr(op, b, backend="cuda")
    with pytest.raises(ValueError, match="iter_lim must be >= 1"):
        seistomo.lsqr(op, b, iter_lim=0)
    with pytest.raises(ValueError, match="damp"):
        seistomo.lsqr(op, b, damp=-1.0)
    with pytest.raises(TypeError, match="given by its products"):
        seistomo.Operator(aslinearoperator(A))
    with pytest.raises(TypeError, match="expected a scipy.sparse matrix"):
        seistomo.Operator(object())
    with pytest.raises(TypeError, match="not a real number type"):
        seistomo.Operator("A")
    with pytest.raises(TypeError, match="already a seistomo.Operator"):
        seistomo.Operator(op)
    with pytest.raises(TypeError, match="prepared for lsqr and lsmr"):
        seistomo.gmres(op, b)
    with pytest.raises(ValueError, match="unknown storage"):
        seistomo.Operator(A, storage="dense")
    with pytest.raises(ValueError, match="precision f32"):
        seistomo.Operator(A, backend="cpu", precision="f32", storage="csr")
    with pytest.raises(ValueError, match="empty"):
        seistomo.Operator(sp.csr_matrix((0, 3)))
    # after the errors it still solves, as before
    same(seistomo.lsqr(op, b), seistomo.lsqr(A, b, backend="cpu"))


def test_b_in_any_layout_is_read_as_the_plain_call_reads_it():
    # the Operator reads b where it lies (its address): strided, other dtypes, a column, a
    # read-only view, each the same solve as a contiguous float64 copy
    A, b = system("well1033")
    op = seistomo.Operator(A, backend="cpu")
    ref = seistomo.lsqr(op, b.copy())
    wide = np.zeros((A.shape[0], 3))
    wide[:, 1] = b
    ro = b.copy()
    ro.flags.writeable = False
    for given in (wide[:, 1], b.reshape(-1, 1), ro, list(b), b.astype(np.float32)):
        r = seistomo.lsqr(op, given)
        ref_b = np.asarray(given, dtype=np.float64).reshape(-1)
        same(r, seistomo.lsqr(A, ref_b, backend="cpu"))
    same(seistomo.lsqr(op, wide[:, 1]), ref)
    bad = b.copy()
    bad[17] = np.inf
    with pytest.raises(ValueError, match="b\\[17\\] is not finite"):
        seistomo.lsqr(op, bad)
    # B of 3 columns on an Operator: one solve after another on it, each its own call's
    wide[:, 0], wide[:, 2] = -b, np.linspace(0.0, 1.0, A.shape[0])
    X = seistomo.lsqr(op, wide)[0]
    assert "3 columns one after another (a prepared Operator)" in seistomo.last_info["backend"]
    for j in range(3):
        assert np.array_equal(X[:, j], seistomo.lsqr(op, wide[:, j])[0]), j
    with pytest.raises(TypeError, match="complex values are not supported"):
        seistomo.lsqr(op, b.astype(complex))


@pytest.mark.skipif(HAS_GPU, reason="a CUDA GPU is present")
def test_operator_on_cuda_without_a_gpu_is_a_runtime_error():
    A, _ = system("well1033")
    with pytest.raises(RuntimeError, match="no usable CUDA GPU"):
        seistomo.Operator(A, backend="cuda")


def test_callbacks_and_their_exceptions_on_an_operator():
    A, b = system("well1033")
    op = seistomo.Operator(A, backend="cpu")
    seen = []
    r = seistomo.lsqr(op, b, callback=lambda *a: seen.append(a), callback_every=10)
    plain = []
    seistomo.lsqr(A, b, backend="cpu", callback=lambda *a: plain.append(a), callback_every=10)
    assert seen == plain and seen[-1][0] == r[2] // 10 * 10

    def boom(itn, *rest):
        if itn == 3:
            raise ZeroDivisionError("from the callback")

    with pytest.raises(ZeroDivisionError, match="from the callback"):
        seistomo.lsmr(op, b, callback=boom)
    same(seistomo.lsqr(op, b), r)


def test_threads_share_one_operator():
    A, b = system("australia")
    op = seistomo.Operator(A, backend="cpu")
    damps = [0.0, 0.01, 0.1, 1.0]
    want = [seistomo.lsqr(op, b, damp=d) for d in damps]
    got = [None] * len(damps)

    def work(i):
        got[i] = seistomo.lsqr(op, b, damp=damps[i])

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(damps))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for g, w in zip(got, want):
        same(g, w)


def test_ctrl_c_stops_a_solve_on_an_operator_and_it_stays_usable():
    # As test_seistomo's Ctrl-C test: the solve runs on the operator's own thread; the waiting
    # main thread sees the signal and stops it between iterations.
    A, b = second_difference()
    op = seistomo.Operator(A, backend="cpu")
    ctrl_c_during(lambda cb: seistomo.lsqr(op, b, atol=0, btol=0, conlim=0, iter_lim=10**8,
                                           callback=cb, callback_every=1000))
    same(seistomo.lsqr(op, b, iter_lim=5), seistomo.lsqr(A, b, iter_lim=5, backend="cpu"))


@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU")
@pytest.mark.parametrize("storage", ["auto", "csr", "compact"])
def test_operator_on_cuda_matches_the_plain_cuda_call(storage):
    A, b = system("australia")
    kw = dict(backend="cuda", storage=storage)
    tight = dict(atol=1e-10, btol=1e-10, conlim=1e14)
    op = seistomo.Operator(A, **kw)
    assert op.backend == "cuda" and op.storage in ("csr", "compact")
    for damp in DAMPS:
        ours = seistomo.lsqr(op, b, damp=damp, **tight)
        ref = seistomo.lsqr(A, b, damp=damp, **tight, **kw)
        assert ours[1] == ref[1] and within_2pct(ours[2], ref[2])
        assert rel(ours[0], ref[0]) <= 1e-8
        ours = seistomo.lsmr(op, b, damp=damp, **tight)
        ref = seistomo.lsmr(A, b, damp=damp, **tight, **kw)
        assert ours[1] == ref[1] and within_2pct(ours[2], ref[2])
        assert rel(ours[0], ref[0]) <= 1e-8
    op.close()
