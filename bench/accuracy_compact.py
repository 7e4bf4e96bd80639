#!/usr/bin/python3
"""Accuracy of compact storage against f64 CSR on the bundled systems (docs/performance.md).

For each system: seistomo's CPU backend solves it with CSR f64 (the reference), compact f64 and
compact f32 values, all from one binary; the table gives istop, iterations, ||x - x_f64|| /
||x_f64|| and the true ||b - A x|| computed here with SciPy from the files on disk (not
seistomo's estimate).

    /usr/bin/python3 bench/accuracy_compact.py [path/to/seistomo] > table.md

Needs numpy and scipy (Debian: python3-scipy). Runs in about a minute on two cores.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import scipy.io
import scipy.sparse as sp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/seistomo")
VARIANTS = [("csr", "f64"), ("compact", "f64"), ("compact", "f32")]


def ds(*p):
    return os.path.join(ROOT, "datasets", *p)


def run(args):
    r = subprocess.run([BIN] + args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"seistomo {' '.join(args)} failed:\n{r.stderr}")


def read_vec(path):
    if path.endswith((".mtx", ".mtx.gz")):
        return np.asarray(scipy.io.mmread(path)).ravel()
    return np.loadtxt(path, comments=["#", "%"]).ravel()


def mtx_system(name, matrix, rhs, reg=None, w=1.0, tol=1e-8):
    a = sp.csr_matrix(scipy.io.mmread(matrix))
    b = read_vec(rhs)
    args = ["--matrix", matrix, "--rhs", rhs, "--atol", str(tol), "--btol", str(tol),
            "--conlim", "1e14"]
    if reg is not None:
        r = sp.csr_matrix(scipy.io.mmread(reg))
        a = sp.vstack([a, w * r]).tocsr()
        b = np.concatenate([b, np.zeros(r.shape[0])])
        args += ["--reg", reg, "--reg-weight", str(w)]

    def solve(storage, prec, tmp):
        sol, rep = os.path.join(tmp, "x.txt"), os.path.join(tmp, "r.json")
        run(["solve"] + args + ["--backend", "cpu", "--storage", storage, "--precision", prec,
                                "--solution", sol, "--report", rep])
        with open(rep) as f:
            info = json.load(f)
        return read_vec(sol), info
    return name, a, b, solve


def demo_system():
    tmp = tempfile.mkdtemp()
    run(["export", ds("demo"), "--format", "npy", "--out", os.path.join(tmp, "sys")])
    d = os.path.join(tmp, "sys")
    shape = tuple(np.load(os.path.join(d, "shape.npy")))
    a = sp.csr_matrix((np.load(os.path.join(d, "data.npy")), np.load(os.path.join(d, "indices.npy")),
                       np.load(os.path.join(d, "indptr.npy"))), shape=shape)
    b = np.load(os.path.join(d, "b.npy"))
    with open(ds("demo", "invert.toml")) as f:
        base = f.read()

    def solve(storage, prec, tmp2):
        out = os.path.join(tmp2, "out")
        cfg = base.replace('path = "dataset.toml"', f'path = "{ds("demo", "dataset.toml")}"')
        cfg = cfg.replace('dir = "../../out/demo"', f'dir = "{out}"')
        cfg = cfg.replace("[output]", f'[backend]\nkind = "cpu"\nstorage = "{storage}"\n'
                                      f'precision = "{prec}"\n\n[output]')
        p = os.path.join(tmp2, "invert.toml")
        with open(p, "w") as f:
            f.write(cfg)
        run(["invert", p])
        with open(os.path.join(out, "report.json")) as f:
            info = json.load(f)
        return read_vec(os.path.join(out, "solution.txt")), info
    return "demo (invert: stencil rows)", a, b, solve


def main():
    systems = [
        mtx_system("australia [G; 0.015 R]", ds("australia", "G.mtx.gz"), ds("australia", "d.txt"),
                   ds("australia", "R.mtx.gz"), 0.015),
        mtx_system("well1033", ds("lsq", "well1033.mtx.gz"), ds("lsq", "well1033_rhs1.mtx.gz")),
        mtx_system("well1850", ds("lsq", "well1850.mtx.gz"), ds("lsq", "well1850_rhs1.mtx.gz")),
        mtx_system("illc1033", ds("lsq", "illc1033.mtx.gz"), ds("lsq", "illc1033_rhs1.mtx.gz")),
        mtx_system("illc1850", ds("lsq", "illc1850.mtx.gz"), ds("lsq", "illc1850_rhs1.mtx.gz")),
        demo_system(),
    ]
    print("| system | storage | values | istop | iterations | ‖x − x_f64‖/‖x_f64‖ | true ‖b − A x‖ |")
    print("|---|---|---|---|---|---|---|")
    for name, a, b, solve in systems:
        ref = None
        for storage, prec in VARIANTS:
            with tempfile.TemporaryDirectory() as tmp:
                x, info = solve(storage, prec, tmp)
            if ref is None:
                ref = x
            rel = np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300)
            res = np.linalg.norm(b - a @ x)
            print(f"| {name} | {storage} | {prec} | {info['istop']} | {info['iterations']} "
                  f"| {rel:.2e} | {res:.10e} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
