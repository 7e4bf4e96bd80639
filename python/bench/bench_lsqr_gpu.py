#!/usr/bin/env python3
"""GPU timing of seistomo.lsqr from Python beside CuPy, in one call (issue 13's "Must show").
Run on the GPU machine after `make python` (or `pip install ./python`), with CuPy installed:

    .venv-py/bin/python python/bench/bench_lsqr_gpu.py australia --iters 300
    target/release/seistomo bench --size large --export-npy /tmp/npy --reorder none
    .venv-py/bin/python python/bench/bench_lsqr_gpu.py /tmp/npy --iters 100 [--precision f32]

SYSTEM is `australia` ([G; 0.015 R], [d; 0] from datasets/australia) or a directory of
indptr/indices/data/shape(/b) .npy files (`seistomo bench --export-npy DIR`). Every solver runs
exactly --iters LSQR iterations (atol = btol = conlim = 0), after one warm-up solve. Prints one
JSON line per solver: ms per iteration of the solve loop (seistomo: its own timer, the same one
the CLI's `bench` and report.json use; wall: the whole Python call including the upload) and
CuPy's LSQR loop (SciPy's algorithm on cupyx.scipy.sparse, one host sync per scalar, as CuPy has
no LSQR of its own). Compare `seistomo_py.ms_per_iter` with the CLI's
`seistomo bench --matrix ... --backend cuda --iters N` figure on the same system and options
(storage, transpose, precision, reorder, loop): they should agree within 5 % (no per-iteration Python
overhead: the loop runs in Rust with the GIL released; callbacks are off).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.io as sio
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[2]


def load(system):
    """(A, b): australia's [G; 0.015 R], [d; 0]; a dataset directory's [G; lam R], [d; 0]
    (seistomo.Dataset.system()); or a directory of .npy arrays (`seistomo bench
    --export-npy`)."""
    if os.path.exists(os.path.join(system, "dataset.toml")):
        import seistomo

        return seistomo.Dataset.open(system).system()
    if system == "australia":
        a = ROOT / "datasets" / "australia"
        G = sio.mmread(str(a / "G.mtx.gz")).tocsr()
        R = sio.mmread(str(a / "R.mtx.gz")).tocsr()
        d = np.loadtxt(a / "d.txt", comments="#")
        return sp.vstack([G, 0.015 * R]).tocsr(), np.concatenate([d, np.zeros(R.shape[0])])
    ld = lambda k: np.load(os.path.join(system, k + ".npy"))
    shape = tuple(int(v) for v in ld("shape"))
    A = sp.csr_matrix((ld("data").astype(np.float64), ld("indices"), ld("indptr")), shape=shape)
    b = ld("b").ravel() if os.path.exists(os.path.join(system, "b.npy")) else A @ np.ones(shape[1])
    return A, b


def bench_seistomo(A, b, iters, precision, transpose, lsqr_loop, storage, reorder):
    import seistomo

    kw = dict(atol=0.0, btol=0.0, conlim=0.0, iter_lim=iters, backend="cuda",
              precision=precision, transpose=transpose, lsqr_loop=lsqr_loop, storage=storage,
              reorder=reorder)
    seistomo.lsqr(A, b, **dict(kw, iter_lim=min(iters, 10)))  # warm-up: kernels, context
    t = time.perf_counter()
    r = seistomo.lsqr(A, b, **kw)
    wall = time.perf_counter() - t
    info = dict(seistomo.last_info)
    return dict(solver="seistomo_py", iterations=r[2], istop=r[1], r1norm=r[3],
                ms_per_iter=1e3 * info["seconds"] / max(r[2], 1),
                wall_ms_per_iter=1e3 * wall / max(r[2], 1), backend=info["backend"],
                precision=precision, transpose=transpose, lsqr_loop=lsqr_loop, storage=storage,
                reorder=reorder)


def cupy_lsqr(A, b, iters):
    """SciPy's LSQR recurrences (no damping, no var) on the GPU with CuPy; fixed iterations."""
    import cupy as cp

    u = b.copy()
    beta = float(cp.linalg.norm(u))
    u /= beta
    v = A.T @ u
    alpha = float(cp.linalg.norm(v))
    v /= alpha
    w = v.copy()
    x = cp.zeros_like(v)
    phibar, rhobar = beta, alpha
    for _ in range(iters):
        u = A @ v - alpha * u
        beta = float(cp.linalg.norm(u))
        u /= beta
        v = A.T @ u - beta * v
        alpha = float(cp.linalg.norm(v))
        v /= alpha
        rho = (rhobar * rhobar + beta * beta) ** 0.5
        c, s = rhobar / rho, beta / rho
        theta, rhobar = s * alpha, -c * alpha
        phi, phibar = c * phibar, s * phibar
        x += (phi / rho) * w
        w = v - (theta / rho) * w
    cp.cuda.Device().synchronize()
    return x, phibar


def bench_cupy(A, b, iters):
    try:
        import cupy as cp
        import cupyx.scipy.sparse as csp
    except ImportError:
        return dict(solver="cupy", error="cupy not installed")
    Ad = csp.csr_matrix(A)
    bd = cp.asarray(b)
    cupy_lsqr(Ad, bd, min(iters, 10))
    t = time.perf_counter()
    _, r = cupy_lsqr(Ad, bd, iters)
    dt = time.perf_counter() - t
    return dict(solver="cupy", iterations=iters, r1norm=r, ms_per_iter=1e3 * dt / iters,
                version=cp.__version__)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--precision", default="f64")
    ap.add_argument("--transpose", default="auto")
    ap.add_argument("--lsqr-loop", default="auto")
    ap.add_argument("--storage", default="auto")
    ap.add_argument("--reorder", default="auto")
    ap.add_argument("--no-cupy", action="store_true")
    a = ap.parse_args()
    import seistomo

    ok, why = seistomo.cuda_available()
    if not ok:
        print(json.dumps(dict(error=f"no usable CUDA GPU: {why}")))
        sys.exit(2)
    A, b = load(a.system)
    head = dict(system=a.system, m=A.shape[0], n=A.shape[1], nnz=int(A.nnz), gpu=why)
    print(json.dumps(dict(head, **bench_seistomo(A, b, a.iters, a.precision, a.transpose,
                                                 a.lsqr_loop, a.storage, a.reorder))), flush=True)
    if not a.no_cupy:
        print(json.dumps(dict(head, **bench_cupy(A, b, a.iters))), flush=True)


if __name__ == "__main__":
    main()
