#!/usr/bin/env python3
"""Repeated solves from Python on the GPU: what a call costs beyond its iterations (issue 34's
"Must show": a prepared `seistomo.Operator` makes a repeated australia solve cost <= 2x its
iterations' GPU time, a repeated 100M solve <= 1.2x; and LSMR within 10 % of LSQR per
iteration). Run on the GPU machine after `make python` (or `pip install ./python`):

    python3 python/bench/bench_operator_gpu.py australia
    seistomo synth -o big --grid 128,128,80 --rays 600000 --norm-damping 0.1 --flattening 0.5,0.5,0.5
    python3 python/bench/bench_operator_gpu.py big --iters 100

SYSTEM is `australia` ([G; 0.015 R], [d; 0] from datasets/australia, SciPy's default
tolerances) or a dataset directory (its [G; lam R], [d; 0] through seistomo.Dataset.system(),
--iters iterations with atol = btol = conlim = 0). For each way, after one warm-up call, --repeat
calls with damping values from 0 to 1e-2:

- `plain`: seistomo.lsqr(A, b, backend="cuda") (A copied, laid out and uploaded every call);
- `operator`: seistomo.lsqr(op, b) on one seistomo.Operator(A, backend="cuda") made once;
- `operator_lsmr`: seistomo.lsmr(op, b) on the same Operator.

Prints one JSON line per way: the median wall time of a call (time.perf_counter around it), the
median of the solve's own seconds (last_info["seconds"]: the iterations on the GPU, the same
timer as report.json's solve), their ratio (`call_over_solve`), ms per iteration, and for the
Operator its set-up seconds; then LSMR's ms/iteration over LSQR's.
"""
import argparse
import json
import sys
import time

import numpy as np

from bench_lsqr_gpu import load  # australia, a dataset directory, or exported .npy arrays


def run(way, target, b, kw, repeat):
    import seistomo

    solve = seistomo.lsmr if way == "operator_lsmr" else seistomo.lsqr
    lim = "maxiter" if way == "operator_lsmr" else "iter_lim"
    args = dict(kw)
    if "iter_lim" in args:
        args[lim] = args.pop("iter_lim")
    solve(target, b, **args)  # warm-up: kernels, context, caches
    walls, secs, itns = [], [], []
    for damp in np.linspace(0.0, 1e-2, repeat):
        t = time.perf_counter()
        r = solve(target, b, damp=float(damp), **args)
        walls.append(time.perf_counter() - t)
        secs.append(seistomo.last_info["seconds"])
        itns.append(int(r[2]))
    wall, sec = float(np.median(walls)), float(np.median(secs))
    return dict(way=way, calls=repeat, iterations=itns, ms_per_call=1e3 * wall,
                ms_solve=1e3 * sec, call_over_solve=wall / sec if sec > 0 else None,
                ms_per_iter=float(np.median([1e3 * s / max(i, 1) for s, i in zip(secs, itns)])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--precision", default="f64")
    ap.add_argument("--backend", default="cuda", help="cpu: a check of this script anywhere")
    args = ap.parse_args()
    import seistomo

    ok, why = seistomo.cuda_available()
    if args.backend == "cuda" and not ok:
        sys.exit(f"bench_operator_gpu: no usable GPU ({why})")
    A, b = load(args.system)
    kw = dict(backend=args.backend, precision=args.precision)
    if args.iters is not None:
        kw.update(atol=0.0, btol=0.0, conlim=0.0, iter_lim=args.iters)
    print(json.dumps(dict(system=args.system, shape=A.shape, nnz=int(A.nnz), gpu=why,
                          iters=args.iters)), flush=True)
    res = [run("plain", A, b, kw, args.repeat)]
    print(json.dumps(res[-1]), flush=True)
    t = time.perf_counter()
    op = seistomo.Operator(A, backend=args.backend, precision=args.precision)
    made = time.perf_counter() - t
    okw = {k: v for k, v in kw.items() if k not in ("backend", "precision")}
    for way in ("operator", "operator_lsmr"):
        r = run(way, op, b, okw, args.repeat)
        r.update(operator_setup_s=made, storage=op.storage, backend=op.backend_detail)
        res.append(r)
        print(json.dumps(r), flush=True)
    op.close()
    lsqr_it, lsmr_it = res[1]["ms_per_iter"], res[2]["ms_per_iter"]
    print(json.dumps(dict(lsmr_over_lsqr_per_iter=lsmr_it / lsqr_it,
                          plain_over_operator_per_call=res[0]["ms_per_call"] /
                          res[1]["ms_per_call"])), flush=True)


if __name__ == "__main__":
    main()
