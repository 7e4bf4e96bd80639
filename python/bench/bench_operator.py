#!/usr/bin/env python3
"""A damping sweep from Python: `seistomo.lsqr(A, b, damp=...)` called afresh for each damping
value (A copied and the operator set up every call) against one `seistomo.Operator(A)` reused
(copied and set up once). Issue 34 item 5's "Must show". Run after `make python` (or
`pip install ./python`):

    .venv-py/bin/python python/bench/bench_operator.py [--backend cpu] [--repeat 3]

The system is australia's [G; 0.015 R], [d; 0] (datasets/australia), solved for 9 damping
values (0 and 1e-3 .. 1e-1) with SciPy's default tolerances. Each way runs in a fresh process
of its own, so that its peak memory is its own: ru_maxrss (the resident peak, everything the
process touched: Python, NumPy and the Rust side) minus the peak before the first solve, and
tracemalloc's peak of Python-side allocations during the sweep (NumPy arrays and the bytes that
carry A to the Rust side). The times come from one process, the two ways' sweeps taking turns
for --repeat rounds after a warm-up (the build machine is shared: turns see the same load).
Prints per way: wall ms per call and the solve's own ms (last_info["seconds"]; medians over
every call), the rest of the call (overhead: the copy of A and the set-up for lsqr(A, ...)),
the whole sweep (the Operator made in it), and the memory; then whether both ways returned the
same x for every damping value (they must, bit for bit on the CPU).
"""
import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DAMPS = [0.0] + list(np.logspace(-3, -1, 8))


def load():
    import scipy.io as sio
    import scipy.sparse as sp

    a = ROOT / "datasets" / "australia"
    G = sio.mmread(str(a / "G.mtx.gz")).tocsr()
    R = sio.mmread(str(a / "R.mtx.gz")).tocsr()
    d = np.loadtxt(a / "d.txt", comments="#")
    A = sp.vstack([G, 0.015 * R]).tocsr()
    A.sum_duplicates()
    return A, np.concatenate([d, np.zeros(R.shape[0])])


def maxrss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sweep(seistomo, way, A, b, backend):
    """One sweep over DAMPS, one way: (seconds of the whole sweep, the Operator's set-up
    included; wall seconds per call; solve seconds per call; results)."""
    t0 = time.perf_counter()
    setup = None
    if way == "operator":
        target = seistomo.Operator(A, backend=backend)
        setup = target.setup_seconds
        kw = {}
    else:
        target, kw = A, dict(backend=backend)
    walls, solves, results = [], [], []
    for damp in DAMPS:
        t = time.perf_counter()
        r = seistomo.lsqr(target, b, damp=damp, **kw)
        walls.append(time.perf_counter() - t)
        solves.append(seistomo.last_info["seconds"])
        results.append(r)
    if way == "operator":
        target.close()
    return time.perf_counter() - t0, setup, walls, solves, results


def memory(way, backend):
    """One sweep in this (fresh) process: its peak memory and its x's digests, as JSON."""
    import seistomo

    A, b = load()
    rss0 = maxrss_mb()
    tracemalloc.start()
    _, _, _, _, results = sweep(seistomo, way, A, b, backend)
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return dict(way=way, rss_before_mb=rss0, rss_peak_growth_mb=maxrss_mb() - rss0,
                tracemalloc_peak_mb=py_peak / 2**20,
                iterations=[r[2] for r in results],
                x_sha256=[hashlib.sha256(r[0].tobytes()).hexdigest()[:16] for r in results])


def timing(backend, repeat):
    """`repeat` rounds, each a sweep of each way one after the other (so that both see the
    same machine: the 2-core build machine is shared)."""
    import seistomo

    A, b = load()
    sweep(seistomo, "plain", A, b, backend)  # warm-up: the thread pool, the caches
    out = {w: dict(sweep_s=[], setup_s=[], wall_s=[], solve_s=[]) for w in ("plain", "operator")}
    for _ in range(repeat):
        for way in ("plain", "operator"):
            total, setup, walls, solves, _ = sweep(seistomo, way, A, b, backend)
            o = out[way]
            o["sweep_s"].append(total)
            o["setup_s"].append(setup)
            o["wall_s"] += walls
            o["solve_s"] += solves
    res = {}
    for way, o in out.items():
        wall, solve = np.array(o["wall_s"]), np.array(o["solve_s"])
        res[way] = dict(
            way=way, rounds=repeat,
            ms_per_call_median=1e3 * float(np.median(wall)),
            ms_solve_median=1e3 * float(np.median(solve)),
            ms_overhead_median=1e3 * float(np.median(wall - solve)),
            sweep_s_median=float(np.median(o["sweep_s"])),
            setup_ms_median=(None if way == "plain"
                             else 1e3 * float(np.median(o["setup_s"]))))
    res["info"] = dict(m=A.shape[0], n=A.shape[1], nnz=int(A.nnz), damps=len(DAMPS),
                       backend=seistomo.last_info["backend"],
                       threads=os.environ.get("RAYON_NUM_THREADS", str(os.cpu_count())))
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="cpu")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--memory", choices=["plain", "operator"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.memory:
        print(json.dumps(memory(a.memory, a.backend)))
        return
    mem = {}
    for way in ("plain", "operator"):
        cmd = [sys.executable, __file__, "--memory", way, "--backend", a.backend]
        mem[way] = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                             text=True).stdout.splitlines()[-1])
        print(json.dumps(mem[way]))
    t = timing(a.backend, a.repeat)
    print(json.dumps(t))
    i, pl, op = t["info"], mem["plain"], mem["operator"]
    print(f"\n{i['m']} x {i['n']}, {i['nnz']} nonzeros, {i['damps']} damping values, iterations "
          f"{min(pl['iterations'])}-{max(pl['iterations'])}, {i['backend']}, medians of "
          f"{a.repeat} rounds")
    print(f"{'':22}{'per call ms':>12}{'solve ms':>10}{'overhead ms':>13}{'sweep s':>9}"
          f"{'maxrss +MB':>12}{'tracemalloc MB':>16}")
    for way, name in (("plain", "lsqr(A, ...)"), ("operator", "Operator(A) reused")):
        r, m = t[way], mem[way]
        print(f"{name:22}{r['ms_per_call_median']:12.1f}{r['ms_solve_median']:10.1f}"
              f"{r['ms_overhead_median']:13.2f}{r['sweep_s_median']:9.3f}"
              f"{m['rss_peak_growth_mb']:12.1f}{m['tracemalloc_peak_mb']:16.1f}")
    print(f"Operator set-up (copy of A, layout, operator): {t['operator']['setup_ms_median']:.1f}"
          f" ms, once per sweep (in its sweep time)")
    print("same x for every damping value:", pl["x_sha256"] == op["x_sha256"])


if __name__ == "__main__":
    main()
