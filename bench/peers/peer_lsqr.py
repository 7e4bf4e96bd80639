#!/usr/bin/python3
"""LSQR peers on one Matrix Market system: SciPy's lsqr and PETSc's KSPLSQR (petsc4py), one
thread each. Prints one JSON line per peer (iterations, stop reason, norms, seconds, ms/iter).
Under `mpirun -np N ... --peers petsc`, PETSc runs on N ranks (rows split evenly; rank 0 prints).

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peers/peer_lsqr.py A.mtx[.gz] [--rhs b] \
        [--reg R.mtx.gz --lam 0.015] [--damp 0] [--tol 1e-8] [--maxit N] [--solution-dir DIR]

The system is [A; lam R] x = [b; 0] (b = A 1 without --rhs). A directory instead of A.mtx holds
indptr/indices/data/shape(/b) .npy files. PETSc's KSPLSQR has no damping
option: damp > 0 is applied by appending damp*I rows. With --solution-dir the solutions are
written as DIR/x_scipy.txt and DIR/x_petsc.txt.
"""
import argparse, json, os, sys, time
import numpy as np, scipy, scipy.io as sio, scipy.sparse as sp
from scipy.sparse.linalg import lsqr


def vec(path):
    if path.endswith(".npy"):
        return np.load(path).ravel()
    return np.asarray(sio.mmread(path)).ravel() if ".mtx" in path else np.loadtxt(path).ravel()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("matrix"); ap.add_argument("--rhs"); ap.add_argument("--reg")
    ap.add_argument("--lam", type=float, default=1.0); ap.add_argument("--damp", type=float, default=0.0)
    ap.add_argument("--tol", type=float, default=1e-8); ap.add_argument("--conlim", type=float, default=1e14)
    ap.add_argument("--maxit", type=int, default=100000); ap.add_argument("--solution-dir")
    ap.add_argument("--peers", default="scipy,petsc")
    a = ap.parse_args()
    peers = a.peers.split(",")
    if os.path.isdir(a.matrix):  # CSR as .npy files (seistomo export --format npy / bench --export-npy)
        ld = lambda k: np.load(os.path.join(a.matrix, k + ".npy"))
        A = sp.csr_matrix((ld("data").astype(float), ld("indices"), ld("indptr")), shape=tuple(int(v) for v in ld("shape")))
        if a.rhs is None and os.path.exists(os.path.join(a.matrix, "b.npy")):
            a.rhs = os.path.join(a.matrix, "b.npy")
    else:
        A = sp.csr_matrix(sio.mmread(a.matrix)).astype(float)
    b = vec(a.rhs) if a.rhs else A @ np.ones(A.shape[1])
    if a.reg:
        R = sp.csr_matrix(sio.mmread(a.reg)).astype(float)
        A = sp.vstack([A, a.lam * R]).tocsr(); b = np.concatenate([b, np.zeros(R.shape[0])])
    if "scipy" in peers:
        t = time.perf_counter()
        x, istop, itn, r1, r2, an, ac, arn, xn, _ = lsqr(A, b, damp=a.damp, atol=a.tol, btol=a.tol, conlim=a.conlim, iter_lim=a.maxit)
        dt = time.perf_counter() - t
        print(json.dumps(dict(peer="scipy", version=scipy.__version__, m=A.shape[0], n=A.shape[1], nnz=int(A.nnz),
                              istop=int(istop), iterations=int(itn), rnorm=float(np.linalg.norm(b - A @ x)), r1norm=r1,
                              arnorm=float(arn), xnorm=float(np.linalg.norm(x)), seconds=dt, ms_per_iter=1e3 * dt / max(itn, 1))), flush=True)
        if a.solution_dir:
            np.savetxt(os.path.join(a.solution_dir, "x_scipy.txt"), x, fmt="%.17e")
    if "petsc" not in peers:
        return
    try:
        import petsc4py
        petsc4py.init([])
        from petsc4py import PETSc
    except ImportError:
        print(json.dumps(dict(peer="petsc", skipped="petsc4py is not importable by " + sys.executable)))
        return
    K = A if a.damp == 0 else sp.vstack([A, a.damp * sp.identity(A.shape[1])]).tocsr()
    rhs = b if K is A else np.concatenate([b, np.zeros(A.shape[1])])
    comm = PETSc.COMM_WORLD
    size, rank = comm.getSize(), comm.getRank()
    (m, n) = K.shape
    r0, r1 = rank * m // size, (rank + 1) * m // size
    c0, c1 = rank * n // size, (rank + 1) * n // size
    Kl = K[r0:r1]
    M = PETSc.Mat().createAIJ(size=((r1 - r0, m), (c1 - c0, n)), comm=comm,
                              csr=(Kl.indptr.astype(PETSc.IntType), Kl.indices.astype(PETSc.IntType), Kl.data))
    M.assemble()
    bv = PETSc.Vec().createMPI((r1 - r0, m), comm=comm); bv.setArray(rhs[r0:r1].copy()); xv = M.createVecRight()
    ksp = PETSc.KSP().create(comm=comm); ksp.setOperators(M); ksp.setType("lsqr"); ksp.getPC().setType("none")
    ksp.setTolerances(rtol=a.tol, atol=0.0, max_it=a.maxit)
    comm.barrier()
    t = time.perf_counter(); ksp.solve(bv, xv); comm.barrier(); dt = time.perf_counter() - t
    its = ksp.getIterationNumber()
    sc, x0 = PETSc.Scatter.toZero(xv)
    sc.scatter(xv, x0, addv=PETSc.InsertMode.INSERT, mode=PETSc.ScatterMode.FORWARD)
    if rank != 0:
        return
    x = x0.getArray().copy()
    print(json.dumps(dict(peer="petsc", version=".".join(map(str, PETSc.Sys.getVersion())), reason=int(ksp.getConvergedReason()),
                          ranks=size, iterations=its, rnorm=float(np.linalg.norm(b - A @ x)), xnorm=float(np.linalg.norm(x)),
                          seconds=dt, ms_per_iter=1e3 * dt / max(its, 1))), flush=True)
    if a.solution_dir:
        np.savetxt(os.path.join(a.solution_dir, "x_petsc.txt"), x, fmt="%.17e")


if __name__ == "__main__":
    main()
