"""Reference GMRES runs for seistomo's tests: SciPy's gmres (and PETSc's KSPGMRES when petsc4py
imports) on the square test systems, with restart 16, Jacobi (or no) preconditioning, rtol 1e-10,
x0 = 0, b = ones, at most 300 cycles (SciPy 1.10 counts `maxiter` in cycles; PETSc gets
300 * 16 inner iterations). Inner iterations are counted with a pr_norm callback (one call per
inner iteration).

Run with Debian's interpreter and one thread, from the repository root:
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 tests/reference/gmres_reference.py \
      > tests/reference/gmres_scipy.json
One system (for benchmarks; prints one JSON line):
  /usr/bin/python3 tests/reference/gmres_reference.py --one A.mtx[.gz] [--precond jacobi|none]
Jacobi: M^-1 = diag(1/a_ii), with 1 where a_ii = 0 (seistomo's documented fallback).
"""
import json, sys, time, platform
import numpy as np, scipy, scipy.io as sio, scipy.sparse as sp
from scipy.sparse.linalg import gmres

RESTART, TOL, CYCLES = 16, 1e-10, 300
SYSTEMS = [
    ("convdiff16", "datasets/square_gen/convdiff16.mtx.gz", ["jacobi", "none"]),
    ("convdiff24", "datasets/square_gen/convdiff24.mtx.gz", ["jacobi", "none"]),
    ("poisson16", "datasets/square_gen/poisson16.mtx.gz", ["jacobi", "none"]),
    ("west0479", "datasets/square/west0479.mtx.gz", ["jacobi"]),
    ("nnc1374", "datasets/square/nnc1374.mtx.gz", ["jacobi"]),
    ("bayer10", "datasets/square/bayer10.mtx.gz", ["jacobi"]),
]


def jacobi(A):
    d = A.diagonal()
    return sp.diags(np.where(d != 0, 1 / np.where(d != 0, d, 1), 1.0)), int(np.sum(d == 0))


def scipy_run(A, b, M):
    its = [0]
    cb = lambda r: its.__setitem__(0, its[0] + 1)
    kw = dict(M=M, atol=0, restart=RESTART, maxiter=CYCLES, callback=cb, callback_type="pr_norm")
    t = time.perf_counter()
    try:
        x, info = gmres(A, b, rtol=TOL, **kw)
    except TypeError:  # SciPy < 1.12 names it tol
        x, info = gmres(A, b, tol=TOL, **kw)
    dt = time.perf_counter() - t
    return dict(converged=bool(info == 0), info=int(info), iterations=its[0],
                relres=float(np.linalg.norm(b - A @ x) / np.linalg.norm(b)), seconds=dt,
                ms_per_iter=1e3 * dt / max(its[0], 1))


def petsc_run(A, b, pc):
    try:
        import petsc4py
        petsc4py.init([])
        from petsc4py import PETSc
    except ImportError:
        return None
    M = PETSc.Mat().createAIJ(size=A.shape, csr=(A.indptr.astype(PETSc.IntType),
                                                A.indices.astype(PETSc.IntType), A.data))
    M.assemble()
    bv = PETSc.Vec().createWithArray(b.copy()); xv = M.createVecRight()
    ksp = PETSc.KSP().create(); ksp.setOperators(M); ksp.setType("gmres")
    ksp.setGMRESRestart(RESTART); ksp.getPC().setType(pc)
    ksp.setTolerances(rtol=TOL, atol=0.0, max_it=RESTART * CYCLES)
    t = time.perf_counter(); ksp.solve(bv, xv); dt = time.perf_counter() - t
    its = ksp.getIterationNumber(); r = b - (M * xv).getArray()
    reason = int(ksp.getConvergedReason())
    return dict(converged=reason > 0, reason=reason, iterations=its,
                relres=float(np.linalg.norm(r) / np.linalg.norm(b)), seconds=dt,
                ms_per_iter=1e3 * dt / max(its, 1))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        path = sys.argv[2]
        pc = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--precond" else "jacobi"
        A = sp.csr_matrix(sio.mmread(path)).astype(float)
        b = np.ones(A.shape[0])
        M, zeros = jacobi(A) if pc == "jacobi" else (None, 0)
        c = dict(name=path, n=A.shape[0], nnz=int(A.nnz), precond=pc, scipy_version=scipy.__version__,
                 scipy=scipy_run(A, b, M))
        p = petsc_run(A, b, "jacobi" if pc == "jacobi" else "none")
        if p is not None:
            c["petsc"] = p
        print(json.dumps(c))
        return
    cases = []
    for name, path, pcs in SYSTEMS:
        A = sp.csr_matrix(sio.mmread(path)).astype(float)
        b = np.ones(A.shape[0])
        for pc in pcs:
            M, zeros = jacobi(A) if pc == "jacobi" else (None, 0)
            c = dict(name=name, file=path, n=A.shape[0], nnz=int(A.nnz), precond=pc,
                     zero_diagonals=zeros, scipy=scipy_run(A, b, M))
            p = petsc_run(A, b, "jacobi" if pc == "jacobi" else "none")
            if p is not None:
                c["petsc"] = p
            cases.append(c)
            print(name, pc, c["scipy"]["iterations"], c["scipy"]["converged"], file=sys.stderr)
    try:
        import petsc4py
        pv = petsc4py.__version__
    except ImportError:
        pv = None
    print(json.dumps(dict(generator="tests/reference/gmres_reference.py", scipy_version=scipy.__version__,
                          numpy_version=np.__version__, petsc4py_version=pv,
                          python=platform.python_version(), machine=platform.machine(),
                          restart=RESTART, rtol=TOL, max_cycles=CYCLES, x0="zeros", rhs="ones",
                          cases=cases), indent=1))


if __name__ == "__main__":
    main()
