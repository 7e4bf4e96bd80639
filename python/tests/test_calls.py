"""Per call: the results carry their own report (.info), and the module's last_info is each
thread's own. Run by `make test-python`."""

import threading

import numpy as np
import scipy.sparse as sp

import seistomo
from test_seistomo import ctrl_c_during, second_difference, system


def test_results_carry_their_own_info():
    A, b = system("well1033")
    r = seistomo.lsqr(A, b, backend="cpu")
    assert isinstance(r, tuple) and len(r) == 10
    x, istop, itn, *_ = r
    assert r.info["itn"] == itn and r.info["istop"] == istop and "cpu" in r.info["backend"]
    assert r.info["seconds"] >= 0 and r.info == seistomo.last_info
    m = seistomo.lsmr(A, b, backend="cpu")
    assert len(m) == 8 and m.info["itn"] == m[2] and m.info["r1norm"] == m[3]
    assert r.info is not m.info and seistomo.last_info == m.info
    op = seistomo.Operator(A, backend="cpu")
    assert seistomo.lsqr(op, b).info["itn"] == itn
    n = 200
    T = sp.diags([-1.0, 2.5, -1.0], [-1, 0, 1], shape=(n, n), format="csr")
    g = seistomo.gmres(T, np.ones(n))
    assert g.info["iterations"] == g.iterations and g.info["converged"] == (g[1] == 0)


def test_threads_get_their_own_info():
    A, b = system("australia")
    iters = {}

    seen = {}
    barrier = threading.Barrier(4)

    def work(k):
        r = seistomo.lsqr(A, b, backend="cpu", iter_lim=10 * k, atol=0, btol=0, conlim=0)
        iters[k] = r.info["itn"]
        barrier.wait()  # every thread has made its call before any reads last_info
        seen[k] = seistomo.last_info["itn"]

    ts = [threading.Thread(target=work, args=(k,)) for k in (1, 2, 3, 4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert iters == {1: 10, 2: 20, 3: 30, 4: 40}
    # last_info is each thread's own
    assert seen == iters


def test_threads_per_call():
    A, b = system("australia")
    ref = seistomo.lsqr(A, b, backend="cpu")
    for t in (1, 2, 3):
        r = seistomo.lsqr(A, b, backend="cpu", threads=t)
        word = "1 thread)" if t == 1 else f"{t} threads)"
        assert word in r.info["backend"], r.info["backend"]
        assert r[1:3] == ref[1:3] and np.linalg.norm(r[0] - ref[0]) <= 1e-10 * np.linalg.norm(ref[0])
    seen = []
    m = seistomo.lsmr(A, b, backend="cpu", threads=1, callback=lambda *a: seen.append(a[0]),
                      callback_every=50)
    assert "1 thread)" in m.info["backend"] and seen == list(range(50, m[2] + 1, 50))
    g = seistomo.gmres(sp.eye(50) * 2.0 + sp.random(50, 50, density=0.05, random_state=2),
                       np.ones(50), threads=1, backend="cpu")
    assert g[1] == 0 and "1 thread" in g.backend
    op = seistomo.Operator(A, backend="cpu", threads=1)
    r = seistomo.lsqr(op, b, threads=1)
    assert op.threads == 1 and "1 thread)" in r.info["backend"] and r[1:3] == ref[1:3]
    import pytest

    with pytest.raises(ValueError, match="threads are fixed"):
        seistomo.lsqr(op, b, threads=2)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        seistomo.lsqr(A, b, threads=0)
    with pytest.raises(ValueError, match="threads must be in 1..=4096"):
        seistomo.lsqr(A, b, threads=5000)
    with pytest.raises(TypeError, match="threads must be an int"):
        seistomo.lsmr(A, b, threads=1.5)


def test_ctrl_c_with_threads_per_call():
    # As test_seistomo's Ctrl-C test, with threads=1: the solve runs on a pool's worker and
    # the waiting main thread sees SIGINT and stops it between iterations.
    A, b = second_difference()
    ctrl_c_during(lambda cb: seistomo.lsqr(A, b, atol=0, btol=0, conlim=0, iter_lim=10**8,
                                           threads=1, callback=cb, callback_every=1000))

def test_callbacks_may_take_x():
    # callback_type="x": callback(x) every callback_every iterations, x in A's column order:
    # the iterate after k iterations is what iter_lim=k returns, bit for bit (rows reordered
    # or not, on a matrix, a prepared Operator, an operator given by its products).
    import pytest
    from scipy.sparse.linalg import aslinearoperator

    A, b = system("well1033")
    for target, kw in [(A, dict(backend="cpu", reorder="rows")), (A, dict(backend="cpu")),
                       (seistomo.Operator(A, backend="cpu"), {}),
                       (aslinearoperator(A), {})]:
        xs = []
        r = seistomo.lsqr(target, b, callback=xs.append, callback_type="x", callback_every=7,
                          atol=1e-10, btol=1e-10, **kw)
        plain = seistomo.lsqr(target, b, atol=1e-10, btol=1e-10, **kw)
        assert np.array_equal(r[0], plain[0]) and r[1:3] == plain[1:3]
        assert len(xs) == r[2] // 7 and all(x.shape == (A.shape[1],) for x in xs)
        for k in (1, 3):
            assert np.array_equal(xs[k - 1], seistomo.lsqr(target, b, iter_lim=7 * k, **kw)[0])
        # and LSMR's (maxiter=k)
        xs = []
        m = seistomo.lsmr(target, b, callback=xs.append, callback_type="x", callback_every=7,
                          **kw)
        assert np.array_equal(m[0], seistomo.lsmr(target, b, **kw)[0])
        assert len(xs) == m[2] // 7
        assert np.array_equal(xs[1], seistomo.lsmr(target, b, maxiter=14, **kw)[0])

    def boom(x):
        raise ZeroDivisionError("from the x callback")

    with pytest.raises(ZeroDivisionError, match="from the x callback"):
        seistomo.lsqr(A, b, callback=boom, callback_type="x")
    with pytest.raises(ZeroDivisionError, match="from the x callback"):
        seistomo.lsmr(A, b, callback=boom, callback_type="x")
    with pytest.raises(ValueError, match="unknown callback_type"):
        seistomo.lsqr(A, b, callback=boom, callback_type="legacy")


def test_lsqr_x_callback_on_cuda():
    import pytest

    if not seistomo.cuda_available()[0]:
        pytest.skip("no CUDA GPU")
    A, b = system("australia")
    xs = []
    r = seistomo.lsqr(A, b, backend="cuda", callback=xs.append, callback_type="x",
                      callback_every=10)
    assert len(xs) == r[2] // 10
    x10 = seistomo.lsqr(A, b, backend="cuda", iter_lim=10)[0]
    assert np.linalg.norm(xs[0] - x10) <= 1e-10 * np.linalg.norm(x10)
