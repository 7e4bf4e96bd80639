#!/usr/bin/env python3
"""A CuPy matrix in, on the GPU (issue 33 item 4): `seistomo.lsqr(cupyx CSR, b)` against the
same solve from the SciPy matrix with the same storage (CSR, explicit transpose), in one
process on the GPU machine. Run after `make python` (or `pip install ./python`), with CuPy:

    python3 python/bench/bench_cupy_input.py australia
    python3 python/bench/bench_cupy_input.py big --iters 100     # a `seistomo synth` dataset

SYSTEM as in bench_operator_gpu.py. Prints one JSON line per way (median of --repeat calls
after a warm-up): wall ms of the call, the solve's own ms (last_info["seconds"]), and whether
x is the same bit for bit; the CuPy way's time includes CuPy's transpose (A.T.tocsr()) and the
device-to-device copy of both matrices, the SciPy way's the copy of A, the host transpose and
the upload.
"""
import argparse
import json
import time

import numpy as np

from bench_operator_gpu import load


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import cupy
    import cupyx.scipy.sparse as csp

    import seistomo

    A, b = load(args.system)
    kw = {} if args.iters is None else dict(atol=0.0, btol=0.0, conlim=0.0, iter_lim=args.iters)
    t = time.perf_counter()
    Ac = csp.csr_matrix(A)
    cupy.cuda.Device().synchronize()
    upload = time.perf_counter() - t
    bc = cupy.asarray(b)
    ways = {
        "scipy_input": lambda: seistomo.lsqr(A, b, backend="cuda", storage="csr",
                                             transpose="csc", **kw),
        "cupy_input": lambda: seistomo.lsqr(Ac, bc, **kw),
    }
    xs = {}
    for name, call in ways.items():
        call()  # warm-up
        walls, secs = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            r = call()
            walls.append(time.perf_counter() - t)
            secs.append(seistomo.last_info["seconds"])
        x = r[0]
        xs[name] = cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else x
        print(json.dumps(dict(way=name, system=args.system, nnz=int(A.nnz), iterations=int(r[2]),
                              ms_per_call=1e3 * float(np.median(walls)),
                              ms_solve=1e3 * float(np.median(secs)),
                              backend=seistomo.last_info["backend"])), flush=True)
    print(json.dumps(dict(cupy_upload_of_A_s=upload,
                          same_x_bit_for_bit=bool(np.array_equal(xs["scipy_input"],
                                                                 xs["cupy_input"])))),
          flush=True)


if __name__ == "__main__":
    main()
