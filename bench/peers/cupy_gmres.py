"""GPU peer for GMRES, run on the GPU machine (CuPy is installed there): CuPy's
cupyx.scipy.sparse.linalg.gmres with a Jacobi preconditioner on a square CSR system, b = ones,
x0 = 0, plus the device copy bandwidth and a cuSPARSE SpMV for the bandwidth floor.

  python3 cupy_gmres.py DIR [RESTART] [RTOL]

DIR holds indptr.npy, indices.npy, data.npy (`seistomo export A.mtx --format npy -o DIR`).
Prints one JSON object. CuPy's gmres preconditions on the right and checks the true residual
only at each restart, so its iteration count is a multiple of RESTART.
"""
import inspect
import json
import sys
import time

import cupy as cp
import cupyx.scipy.sparse as csp
import cupyx.scipy.sparse.linalg as csl
import numpy as np


def median_ms(fn, reps=20):
    fn()
    cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(reps):
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    return float(np.median(ts))


def main():
    d = sys.argv[1]
    restart = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    rtol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-10
    indptr = np.load(f"{d}/indptr.npy")
    indices = np.load(f"{d}/indices.npy")
    data = np.load(f"{d}/data.npy")
    n = len(indptr) - 1
    A = csp.csr_matrix(
        (cp.asarray(data, dtype=cp.float64), cp.asarray(indices, dtype=cp.int32),
         cp.asarray(indptr.astype(np.int64))), shape=(n, n))
    nnz = int(A.nnz)
    diag = A.diagonal()
    dinv = cp.where(diag != 0, 1.0 / cp.where(diag != 0, diag, 1.0), 1.0)
    M = csl.LinearOperator((n, n), matvec=lambda x: dinv * x, dtype=cp.float64)
    b = cp.ones(n)
    kw = "rtol" if "rtol" in inspect.signature(csl.gmres).parameters else "tol"

    # copy bandwidth and SpMV
    big = cp.empty(64 << 20, dtype=cp.float64)
    big2 = cp.empty_like(big)
    copy_ms = median_ms(lambda: big2.__setitem__(Ellipsis, big))
    copy_gbs = 2 * big.nbytes / (copy_ms * 1e-3) / 1e9
    del big, big2
    x = cp.ones(n)
    spmv_ms = median_ms(lambda: A @ x)

    # warm-up (kernel compilation), then a run to convergence
    csl.gmres(A, b, restart=restart, maxiter=restart, M=M, **{kw: rtol})
    cp.cuda.Device().synchronize()
    cycles = []
    t = time.perf_counter()
    xs, info = csl.gmres(A, b, restart=restart, maxiter=restart * 3000, M=M,
                         callback=lambda r: cycles.append(float(r)),
                         callback_type="pr_norm", **{kw: rtol})
    cp.cuda.Device().synchronize()
    secs = time.perf_counter() - t
    relres = float(cp.linalg.norm(b - A @ xs) / cp.linalg.norm(b))
    # iterations: every cycle runs `restart` inner steps
    iters = restart * len(cycles)
    # a fixed number of cycles without convergence, for a clean per-iteration time
    K = 20
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    csl.gmres(A, b, restart=restart, maxiter=restart * K, M=M, **{kw: 1e-300})
    cp.cuda.Device().synchronize()
    fixed = time.perf_counter() - t
    # bytes of the floor of one inner step of classical Gram-Schmidt GMRES(m) with Jacobi:
    # SpMV (values + columns + u64 offsets + x + y), Jacobi (3 vectors), one pass of inner
    # products over j+1 basis vectors + w, one update pass (j+1 vectors + w read + w write),
    # averaged over j = 0..m-1.
    avg = (restart + 1) / 2.0
    vec = 8 * n
    floor_bytes = nnz * 12 + (n + 1) * 8 + 2 * vec + 3 * vec + (avg + 1) * vec + (avg + 2) * vec
    print(json.dumps({
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cp.__version__, "n": n, "nnz": nnz, "restart": restart, "rtol": rtol,
        "copy_GBps": round(copy_gbs, 1), "spmv_ms": round(spmv_ms, 4),
        "converged": info == 0, "info": int(info), "iterations": iters, "cycles": len(cycles),
        "relres": relres, "seconds": round(secs, 4),
        "ms_per_inner_iter": round(1e3 * secs / max(iters, 1), 4),
        "fixed_cycles": K, "ms_per_inner_iter_fixed": round(1e3 * fixed / (K * restart), 4),
        "floor_ms_per_inner_iter_cgs1": round(floor_bytes / (copy_gbs * 1e9) * 1e3, 4),
    }))


if __name__ == "__main__":
    main()
