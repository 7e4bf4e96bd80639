"""Per call: the results carry their own report (.info), besides the module's last_info, so
that threads do not share it. Run by `make test-python`."""

import threading

import numpy as np
import scipy.sparse as sp

import seistomo
from test_seistomo import system


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

    def work(k):
        r = seistomo.lsqr(A, b, backend="cpu", iter_lim=10 * k, atol=0, btol=0, conlim=0)
        iters[k] = r.info["itn"]

    ts = [threading.Thread(target=work, args=(k,)) for k in (1, 2, 3, 4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert iters == {1: 10, 2: 20, 3: 30, 4: 40}
