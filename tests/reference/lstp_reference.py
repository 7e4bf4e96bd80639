#!/usr/bin/python3
"""SciPy's lsqr on Paige & Saunders' LSTP test problems (the same generator as
src/testproblems/lstp.rs: A = H_Y D H_Z, hy_i = sin(4 pi i/m), hz_i = cos(4 pi i/n), unit norm, negated;
d_i = (ceil(i/nduplc) nduplc / min(m,n))^npower; x_j = n - j; residual H_Y [s; t]).

Writes tests/reference/lstp_scipy.json: for every case, SciPy's istop, iterations and relative
error against the known solution. tests/lstp.rs requires seistomo to be as accurate.
    /usr/bin/python3 tests/reference/lstp_reference.py
"""
import json, os
import numpy as np, scipy
from scipy.sparse.linalg import lsqr, LinearOperator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL, CONLIM = 1e-14, 1e15


def lstp(m, n, nduplc, npower, damp):
    hy = np.sin(np.arange(1, m + 1) * 4 * np.pi / m); hz = np.cos(np.arange(1, n + 1) * 4 * np.pi / n)
    hy = -hy / np.linalg.norm(hy); hz = -hz / np.linalg.norm(hz)
    H = lambda h, v: v - 2 * h * (h @ v)
    mn = min(m, n); i = np.arange(1, mn + 1)
    d = (((i - 1 + nduplc) // nduplc) * nduplc / mn) ** npower
    x = (n - np.arange(1, n + 1)).astype(float)
    def A(v):
        z = H(hz, v); y = np.zeros(m); y[:mn] = d * z[:mn]; return H(hy, y)
    def AT(y):
        z = H(hy, y); v = np.zeros(n); v[:mn] = d * z[:mn]; return H(hz, v)
    w = np.zeros(m); w[:mn] = damp ** 2 * H(hz, x)[:mn] / d
    t = 1.0
    for k in range(mn, m):
        w[k] = t * (k + 1 - mn) / m; t = -t
    b = H(hy, w) + A(x)
    c = H(hy, b); z = np.zeros(n); z[:mn] = d * c[:mn] / (d * d + damp * damp)
    return LinearOperator((m, n), matvec=A, rmatvec=AT, dtype=float), b, H(hz, z)


def cases():
    for m, n in ((2000, 1000), (1000, 1000), (1000, 2000)):
        for npower in range(2, 8):
            yield m, n, npower, 10.0 ** (-npower - 6)
    for m, n in ((2000, 1000), (1000, 2000)):
        for damp in (1e-3, 1e-1, 1.0):
            yield m, n, 4, damp


def main():
    out = dict(generator="tests/reference/lstp_reference.py", scipy=scipy.__version__, atol=TOL, btol=TOL, conlim=CONLIM,
               nduplc=40, cases=[])
    for m, n, npower, damp in cases():
        op, b, exact = lstp(m, n, 40, npower, damp)
        r = lsqr(op, b, damp=damp, atol=TOL, btol=TOL, conlim=CONLIM, iter_lim=20 * n)
        err = float(np.linalg.norm(r[0] - exact) / np.linalg.norm(exact))
        out["cases"].append(dict(m=m, n=n, npower=npower, damp=damp, istop=int(r[1]), itn=int(r[2]), rel_err=err))
        print(out["cases"][-1])
    with open(os.path.join(ROOT, "tests", "reference", "lstp_scipy.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
