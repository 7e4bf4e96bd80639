"""GPU peer for the batched products of issue 33, run on the GPU machine (CuPy is installed there).

cuSPARSE's sparse x dense products through CuPy on one system: A X (X of n x k) and A^T Y (Y of
m x k) for k = 1, 4, 8, 16, values in f32 and f64 (the dense blocks in the values' type, as
cuSPARSE needs), A^T Y both through CuPy's implicit transpose (A.T, a CSC view) and an explicit
CSR of A^T. Times are medians of 20 runs (CUDA events), after one warm-up. Prints one line per
product and JSON at the end.

  python3 cupy_spmm.py DIR      CSR system from DIR/{indptr,indices,data}.npy (+ shape.npy)
                                 (`seistomo export DATASET --format npy -o DIR`)
"""
import json
import os
import sys

import numpy as np
import cupy as cp
import cupyx.scipy.sparse as csp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cupy_lsqr import median_ms  # noqa: E402


def load(d):
    ip = np.load(os.path.join(d, "indptr.npy"))
    ix = np.load(os.path.join(d, "indices.npy"))
    dv = np.load(os.path.join(d, "data.npy"))
    shp = os.path.join(d, "shape.npy")
    m, n = (int(v) for v in np.load(shp)) if os.path.exists(shp) else (len(ip) - 1, int(ix.max()) + 1)
    return ip, ix, dv, (m, n)


def main():
    ip, ix, dv, (m, n) = load(sys.argv[1])
    out = {"m": m, "n": n, "nnz": int(len(dv)), "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    print(f"{m} x {n}, {len(dv)} nonzeros, {out['device']}")
    res = []
    for dt in (np.float32, np.float64):
        a = csp.csr_matrix((cp.asarray(dv.astype(dt)), cp.asarray(ix), cp.asarray(ip)), shape=(m, n))
        at = a.T.tocsr()
        for k in (1, 4, 8, 16):
            rng = cp.random.default_rng(1)
            x = rng.random((n, k), dtype=dt) if k > 1 else rng.random(n, dtype=dt)
            y = rng.random((m, k), dtype=dt) if k > 1 else rng.random(m, dtype=dt)
            r = {"dtype": np.dtype(dt).name, "k": k,
                 "ax_ms": median_ms(lambda: a @ x),
                 "aty_ms_implicit": median_ms(lambda: a.T @ y),
                 "aty_ms_csr": median_ms(lambda: at @ y)}
            print(f"{r['dtype']} k {k:2d}: A X {r['ax_ms']:.3f} ms, A^T Y {r['aty_ms_implicit']:.3f} ms "
                  f"(A.T), {r['aty_ms_csr']:.3f} ms (explicit CSR of A^T)")
            res.append(r)
            del x, y
        del a, at
        cp.get_default_memory_pool().free_all_blocks()
    out["runs"] = res
    print(json.dumps(out))


if __name__ == "__main__":
    main()
