#!/usr/bin/python3
"""Reference LSMR results from SciPy's scipy.sparse.linalg.lsmr on the bundled real systems and on
Paige & Saunders' LSTP test problems.

Writes tests/reference/lsmr_scipy.json (per case: the system, damp, x0, tolerances, istop, itn,
normr, normar, norma, conda, normx, the true residual, and cond(A) from the SVD for the
datasets/lsq systems; per LSTP case: istop, itn and the relative
error against the known solution) and every real case's SciPy solution as
tests/reference/lsmr_x_<case>.txt.gz. tests/lsmr.rs compares seistomo's lsmr against these files.

Run with Debian's interpreter (python3-scipy; installed by scripts/bootstrap.sh):
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tests/reference/lsmr_reference.py
"""
import json, os, sys, time
import numpy as np, scipy
from scipy.sparse.linalg import lsmr

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from lsqr_reference import OUT, systems, write_gz  # noqa: E402  (the same systems as LSQR's)
from lstp_reference import lstp  # noqa: E402

TOL = 1e-10
CONLIM = 1e14


def cases():
    """(case, system, damp, x0 (a multiple of ones or None), atol/btol, conlim, maxiter)."""
    for name in ("illc1033", "well1033", "illc1850", "well1850", "australia"):
        yield name, name, 0.0, None, TOL, CONLIM, 100000
    # damping, a starting x, SciPy's default tolerances and iteration limit (min(m, n))
    yield "well1033_damp", "well1033", 0.05, None, TOL, CONLIM, 100000
    yield "australia_x0", "australia", 0.1, 0.01, TOL, CONLIM, 100000
    yield "australia_defaults", "australia", 0.0, None, 1e-6, 1e8, None


def lstp_cases():
    for m, n in ((2000, 1000), (1000, 1000), (1000, 2000)):
        for npower in (2, 4, 6):
            yield m, n, npower, 10.0 ** (-npower - 6)
    for m, n in ((2000, 1000), (1000, 2000)):
        for damp in (1e-3, 1e-1, 1.0):
            yield m, n, 4, damp


def main():
    res = dict(generator="tests/reference/lsmr_reference.py", scipy=scipy.__version__, numpy=np.__version__,
               cases={}, lstp=dict(atol=1e-14, btol=1e-14, conlim=1e15, nduplc=40, cases=[]))
    loaded = {name: (A, b) for name, A, b in systems()}
    for case, name, damp, x0s, tol, conlim, maxiter in cases():
        A, b = loaded[name]
        x0 = None if x0s is None else np.full(A.shape[1], x0s)
        t = time.perf_counter()
        x, istop, itn, normr, normar, norma, conda, normx = lsmr(A, b, damp=damp, atol=tol, btol=tol, conlim=conlim,
                                                                 maxiter=maxiter, x0=x0)
        dt = time.perf_counter() - t
        entry = dict(system=name, m=A.shape[0], n=A.shape[1], nnz=int(A.nnz), damp=damp, x0=x0s, atol=tol, btol=tol,
                     conlim=conlim, maxiter=maxiter, istop=int(istop), itn=int(itn), normr=float(normr),
                     normar=float(normar), norma=float(norma), conda=float(conda), normx=float(normx), seconds=dt,
                     true_rnorm=float(np.linalg.norm(b - A @ x)))
        if A.shape[1] < 1000:
            s = np.linalg.svd(A.toarray(), compute_uv=False)
            entry["cond"] = float(s[0] / s[-1])
        res["cases"][case] = entry
        write_gz(os.path.join(OUT, f"lsmr_x_{case}.txt.gz"), x)
        print(case, json.dumps(entry), file=sys.stderr)
    L = res["lstp"]
    for m, n, npower, damp in lstp_cases():
        op, b, exact = lstp(m, n, L["nduplc"], npower, damp)
        r = lsmr(op, b, damp=damp, atol=L["atol"], btol=L["btol"], conlim=L["conlim"], maxiter=20 * n)
        err = float(np.linalg.norm(r[0] - exact) / np.linalg.norm(exact))
        L["cases"].append(dict(m=m, n=n, npower=npower, damp=damp, istop=int(r[1]), itn=int(r[2]), rel_err=err))
        print(L["cases"][-1], file=sys.stderr)
    with open(os.path.join(OUT, "lsmr_scipy.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
