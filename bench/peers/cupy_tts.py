"""Time to solution of the CuPy user: the peer of `seistomo invert`'s report.json seconds.

  python3 cupy_tts.py DIR ITERS

DIR holds the system as `seistomo export --format npy` writes it (indptr, indices, data, b,
shape .npy). The script does what a CuPy user would write, each step timed with the wall clock
(device work synchronised before each stop): start CuPy on the device (import, context), load
the arrays with np.load (warm page cache when DIR was just written), upload them, build A^T as a
CSR (cuSPARSE), run ITERS iterations of a plain LSQR loop (bench/peers/cupy_lsqr.py's, no
stopping tests), and copy x back and save it (np.save). Prints JSON.
"""
import json
import os
import sys
import time

T0 = time.perf_counter()
import numpy as np  # noqa: E402
import cupy as cp  # noqa: E402
import cupyx.scipy.sparse as csp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cupy_lsqr import lsqr_plain  # noqa: E402


def main():
    d, iters = sys.argv[1], int(sys.argv[2])
    sync = cp.cuda.Device().synchronize
    res = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "iters": iters}
    cp.zeros(1)
    sync()
    t = time.perf_counter()
    res["start_s"] = t - T0
    ld = lambda k: np.load(os.path.join(d, k + ".npy"))  # noqa: E731
    indptr, indices, data, b = ld("indptr"), ld("indices"), ld("data"), ld("b")
    shape = tuple(int(v) for v in ld("shape"))
    t1 = time.perf_counter()
    res["load_s"] = t1 - t
    A = csp.csr_matrix((cp.asarray(data), cp.asarray(indices), cp.asarray(indptr)), shape=shape)
    bd = cp.asarray(b)
    sync()
    t2 = time.perf_counter()
    res["upload_s"] = t2 - t1
    AT = A.T.tocsr()
    sync()
    t3 = time.perf_counter()
    res["transpose_s"] = t3 - t2
    x = lsqr_plain(A, AT, bd, iters)
    sync()
    t4 = time.perf_counter()
    res["solve_s"] = t4 - t3
    res["ms_per_iter"] = (t4 - t3) / iters * 1e3
    np.save("/tmp/cupy_tts_x.npy", cp.asnumpy(x))
    t5 = time.perf_counter()
    res["write_s"] = t5 - t4
    res["nnz"], res["m"], res["n"] = int(A.nnz), shape[0], shape[1]
    res["setup_s"] = res["upload_s"] + res["transpose_s"]
    res["total_s"] = t5 - T0
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
