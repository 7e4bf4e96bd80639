#!/usr/bin/env python3
"""seistomo.mmread against scipy.io.mmread(...).tocsr() on the same files, in one process, turns
taken (the peer first in each round), the median of --repeat rounds; both results checked equal
(indptr, indices and data bit for bit). Run after `make python` (or with the wheel installed):

    python3 python/bench/bench_mmread.py FILE.mtx[.gz] ... [--repeat 3]

SciPy from 1.12 reads with fast_matrix_market on every core; older SciPy reads in Python, one
thread. Prints one Markdown row per file: text MB (the plain size, from the file or gzip's
trailer), seconds of each, MB/s of text and the ratio.
"""
import argparse
import gzip
import os
import statistics
import time

import numpy as np
import scipy
import scipy.io as sio

import seistomo


def text_mb(path):
    if not str(path).endswith(".gz"):
        return os.path.getsize(path) / 1e6
    with gzip.open(path, "rb") as f:
        n = 0
        while True:
            b = f.read(1 << 24)
            if not b:
                return n / 1e6
            n += len(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"SciPy {scipy.__version__}, {os.cpu_count()} cores; median of {a.repeat}")
    print("| file | text MB | nonzeros | seistomo.mmread s | SciPy mmread + tocsr s | "
          "seistomo MB/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for path in a.files:
        ours, theirs = [], []
        for _ in range(a.repeat):
            t = time.perf_counter()
            B = sio.mmread(path).tocsr()
            theirs.append(time.perf_counter() - t)
            del B
            t = time.perf_counter()
            A = seistomo.mmread(path)
            ours.append(time.perf_counter() - t)
        B = sio.mmread(path).tocsr()
        B.sum_duplicates()
        B.sort_indices()
        same = (A.shape == B.shape and np.array_equal(A.indptr, B.indptr)
                and np.array_equal(A.indices, B.indices) and np.array_equal(A.data, B.data))
        assert same, f"{path}: seistomo.mmread and SciPy differ"
        mb = text_mb(path)
        o, p = statistics.median(ours), statistics.median(theirs)
        print(f"| {os.path.basename(os.path.dirname(path))}/{os.path.basename(path)} | {mb:.0f} "
              f"| {A.nnz} | {o:.3f} | {p:.3f} | {mb / o:.0f} | {p / o:.1f}x |")


if __name__ == "__main__":
    main()
