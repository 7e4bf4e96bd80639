#!/usr/bin/env python3
"""Compile seistomo's CUDA kernels without a GPU, as the backend does at run time, and print
each kernel's registers, spills and shared memory (docs/developers.md, `make check-kernels`).

NVRTC (and ptxas, for the resource report) come from NVIDIA's PyPI wheels, installed once into
.venv-nvrtc/ (about 150 MB). The CUDA backend compiles the same sources with the same options
(src/backend/cuda/mod.rs kernels_for); the GPU machines run CUDA 13, the wheels here are 12.x:
a kernel that compiles here compiles there as far as the language goes.

    python3 scripts/check_kernels.py [--arch 90] [-DNAME=VALUE ...] [--filter REGEX]
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-nvrtc")
# the order of src/backend/cuda/nvrtc.rs KERNEL_SOURCES, read from it (one list to keep)
SOURCES = re.findall(
    r'include_str!\("\.\./\.\./\.\./kernels/([a-z_]+\.cu)"\)',
    open(os.path.join(ROOT, "src", "backend", "cuda", "nvrtc.rs")).read(),
)
WHEELS = ["nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvcc-cu12"]


def find(pattern):
    hits = glob.glob(os.path.join(VENV, "**", pattern), recursive=True)
    return hits[0] if hits else None


def install():
    if find("libnvrtc.so.12") and find("ptxas"):
        return
    print(f"installing {', '.join(WHEELS)} into {VENV} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", VENV] + WHEELS,
                   check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="90", help="compute capability, e.g. 90 (Hopper)")
    ap.add_argument("--filter", default="", help="only kernels whose name matches")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                    help="a preprocessor define, as the tuning key nvrtc_defines (repeatable)")
    a = ap.parse_args()
    install()
    lib = ctypes.CDLL(find("libnvrtc.so.12"))
    src = "\n".join(open(os.path.join(ROOT, "kernels", s)).read() for s in SOURCES).encode()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"seistomo_kernels.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture=compute_{a.arch}", "--std=c++17", "--fmad=false"]
    opts += [f"-D{d}" for d in a.defines]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if log.value.strip():
        print(log.value.decode(), file=sys.stderr)
    if rc != 0:
        sys.exit(f"kernels/*.cu do not compile (NVRTC error {rc})")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    os.makedirs(os.path.join(ROOT, "target"), exist_ok=True)
    path = os.path.join(ROOT, "target", "seistomo_kernels.ptx")
    open(path, "w").write(ptx.value.decode())
    r = subprocess.run([find("ptxas"), f"-arch=sm_{a.arch}", "-v", path, "-o", os.devnull],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    name, rows = None, []
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name, spills = m.group(1), "?"
        m = re.search(r"(\d+) bytes spill stores.*?(\d+) bytes spill loads", line)
        if m and name:
            spills = f"{m.group(1)}/{m.group(2)}"
        m = re.search(r"Used (\d+) registers.*?(?:(\d+) bytes smem)?$", line)
        if m and name:
            rows.append((name, int(m.group(1)), spills, m.group(2) or "0"))
            name = None
    print(f"{'kernel':<24} {'registers':>9} {'spills st/ld':>12} {'smem B':>7}")
    for k, regs, sp, smem in sorted(rows):
        if re.search(a.filter, k):
            print(f"{k:<24} {regs:>9} {sp:>12} {smem:>7}")
    print(f"{len(rows)} kernels compiled for sm_{a.arch} ({path})", file=sys.stderr)


if __name__ == "__main__":
    main()
