#!/usr/bin/env python3
"""Many right-hand sides from Python on the GPU (issue 33 item 4): `seistomo.lsqr(A, B)` with B
of k columns against the same k solves one after another on one prepared `seistomo.Operator`
(what lsqr(A, B) does below gpu_batch_min_nnz()). Run on the GPU machine after installing the
module (`make python`, or the wheel of `make wheel`):

    python3 python/bench/bench_columns_gpu.py australia --k 8
    seistomo synth -o big --grid 128,128,80 --rays 600000 --norm-damping 0.1 --flattening 0.5,0.5,0.5
    python3 python/bench/bench_columns_gpu.py big --k 8 --iters 300

SYSTEM as python/bench/bench_lsqr_gpu.py takes it (australia, a dataset directory, or exported
.npy arrays). B is b and k - 1 random right-hand sides; --iters iterations each with atol =
btol = conlim = 0 (every column runs them all), f64 or --precision f32, the module's defaults
otherwise (reorder="none"). After a warm-up, prints one JSON line per way with the median wall
time of --repeat calls (time.perf_counter around the whole call: the copy of A, the set-up, the
solves) and how the call ran (last_info["backend"]):

- `columns`: seistomo.lsqr(A, B, backend="cuda"): from 4M nonzeros the GPU's batch, below one
  solve after another on one operator;
- `one_by_one`: seistomo.Operator(A, backend="cuda") made in the call, then lsqr(op, B[:, j])
  for every column;

then their ratio, and the largest relative difference between the two ways' columns.
"""
import argparse
import json
import time

import numpy as np

from bench_lsqr_gpu import load


def main():
    import seistomo

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--precision", default="f64")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    A, b = load(a.system)
    B = np.random.default_rng(5).standard_normal((A.shape[0], a.k))
    B[:, 0] = b
    kw = dict(atol=0.0, btol=0.0, conlim=0.0, iter_lim=a.iters, backend="cuda",
              precision=a.precision)

    def columns():
        return seistomo.lsqr(A, B, **kw)[0]

    def one_by_one():
        with seistomo.Operator(A, "cuda", precision=a.precision) as op:
            args = {k: v for k, v in kw.items() if k not in ("backend", "precision")}
            return np.stack([seistomo.lsqr(op, B[:, j], **args)[0] for j in range(a.k)], axis=1)

    xs = {}
    res = {}
    for way, f in (("columns", columns), ("one_by_one", one_by_one)):
        f()  # warm-up: context, kernels, caches
        walls = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            xs[way] = f()
            walls.append(time.perf_counter() - t)
        how = seistomo.last_info["backend"]
        res[way] = float(np.median(walls))
        print(json.dumps(dict(way=way, system=a.system, shape=list(A.shape), nnz=int(A.nnz),
                              k=a.k, iterations=a.iters, precision=a.precision,
                              s_per_call=res[way], walls=walls, how=how)), flush=True)
    diff = max(np.linalg.norm(xs["columns"][:, j] - xs["one_by_one"][:, j])
               / max(np.linalg.norm(xs["one_by_one"][:, j]), 1e-300) for j in range(a.k))
    print(json.dumps(dict(system=a.system, k=a.k, columns_over_one_by_one=res["columns"]
                          / res["one_by_one"], max_rel_diff=float(diff))), flush=True)


if __name__ == "__main__":
    main()
