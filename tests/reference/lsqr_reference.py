#!/usr/bin/python3
"""Reference LSQR results from SciPy (and PETSc through petsc4py) on the bundled real systems.

Writes tests/reference/lsqr_scipy.json (istop, itn, norms, SciPy/PETSc versions) and, for every
system, the SciPy solution and var estimate as tests/reference/{x,var}_<name>.txt.gz. The Rust tests
(tests/lsqr_reference.rs) compare seistomo against these files.

Run with Debian's interpreter (python3-scipy, python3-petsc4py; installed by scripts/bootstrap.sh):
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tests/reference/lsqr_reference.py
"""
import gzip, io, json, os, sys, time
import numpy as np, scipy, scipy.io as sio, scipy.sparse as sp
from scipy.sparse.linalg import lsqr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DS = os.path.join(ROOT, "datasets")
OUT = os.path.join(ROOT, "tests", "reference")
TOL = 1e-10
CONLIM = 1e14


def write_gz(path, values):
    """One value per line (repr: round-trip precision); gzip with mtime 0 so reruns are identical."""
    with gzip.GzipFile(path, "wb", mtime=0) as g, io.TextIOWrapper(g) as f:
        f.write("\n".join(repr(float(v)) for v in values) + "\n")


def systems():
    for name in ("illc1033", "well1033", "illc1850", "well1850"):
        A = sp.csr_matrix(sio.mmread(os.path.join(DS, "lsq", name + ".mtx.gz"))).astype(float)
        b = np.asarray(sio.mmread(os.path.join(DS, "lsq", name + "_rhs1.mtx.gz"))).ravel()
        yield name, A, b
    G = sp.csr_matrix(sio.mmread(os.path.join(DS, "australia", "G.mtx.gz"))).astype(float)
    R = sp.csr_matrix(sio.mmread(os.path.join(DS, "australia", "R.mtx.gz"))).astype(float)
    d = np.loadtxt(os.path.join(DS, "australia", "d.txt"))
    A = sp.vstack([G, 0.015 * R]).tocsr()
    yield "australia", A, np.concatenate([d, np.zeros(R.shape[0])])


def petsc_lsqr(A, b):
    try:
        import petsc4py
        petsc4py.init([])
        from petsc4py import PETSc
    except ImportError:
        return None
    M = PETSc.Mat().createAIJ(size=A.shape, csr=(A.indptr.astype(PETSc.IntType), A.indices.astype(PETSc.IntType), A.data))
    M.assemble()
    bv = PETSc.Vec().createWithArray(b.copy()); xv = M.createVecRight()
    ksp = PETSc.KSP().create(); ksp.setOperators(M); ksp.setType("lsqr"); ksp.getPC().setType("none")
    ksp.setTolerances(rtol=TOL, atol=0.0, max_it=100000)
    ksp.solve(bv, xv)
    x = xv.getArray().copy()
    return dict(version=".".join(map(str, PETSc.Sys.getVersion())), iterations=ksp.getIterationNumber(),
                reason=int(ksp.getConvergedReason()), rnorm=float(np.linalg.norm(b - A @ x)),
                xnorm=float(np.linalg.norm(x)))


def main():
    os.makedirs(OUT, exist_ok=True)
    res = dict(generator="tests/reference/lsqr_reference.py", scipy=scipy.__version__, numpy=np.__version__,
               atol=TOL, btol=TOL, conlim=CONLIM, damp=0.0, systems={})
    for name, A, b in systems():
        t = time.perf_counter()
        x, istop, itn, r1, r2, an, ac, arn, xn, var = lsqr(A, b, atol=TOL, btol=TOL, conlim=CONLIM, iter_lim=100000,
                                                           calc_var=True)
        dt = time.perf_counter() - t
        entry = dict(m=A.shape[0], n=A.shape[1], nnz=int(A.nnz), istop=int(istop), itn=int(itn), r1norm=r1,
                     r2norm=r2, anorm=an, acond=ac, arnorm=float(arn), xnorm=xn, seconds=dt,
                     true_rnorm=float(np.linalg.norm(b - A @ x)))
        entry["petsc"] = petsc_lsqr(A, b)
        res["systems"][name] = entry
        write_gz(os.path.join(OUT, f"x_{name}.txt.gz"), x)
        write_gz(os.path.join(OUT, f"var_{name}.txt.gz"), var)
        # var after 10 iterations: before rounding differences are amplified (see docs/lsqr.md).
        var10 = lsqr(A, b, atol=TOL, btol=TOL, conlim=CONLIM, iter_lim=10, calc_var=True)[9]
        write_gz(os.path.join(OUT, f"var10_{name}.txt.gz"), var10)
        print(name, json.dumps(entry), file=sys.stderr)
    with open(os.path.join(OUT, "lsqr_scipy.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
