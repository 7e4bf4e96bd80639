#!/usr/bin/env bash
# `make wheel`: the Python package as a manylinux_2_28 abi3 wheel (one wheel for CPython >= 3.9
# on any x86_64 Linux with glibc >= 2.28: RHEL/Rocky 8, Debian 10, Ubuntu 18.10 and newer),
# which installs with no compiler. Built by maturin with zig as the C compiler and linker
# (`--zig`), so the extension links against glibc 2.28's symbol versions whatever glibc this
# machine has; no manylinux container needed. The static HDF5 library inside it is built the
# same way (CMake from PyPI). Then `auditwheel show` must report the wheel as manylinux_2_28
# (or older), else the script fails.
#
# The tools live in .venv-wheel (maturin, ziglang, cmake, auditwheel from PyPI; installed once,
# idempotently); the Cargo target folder is target/wheel. Output: dist/ (or $WHEEL_DIR), and
# the wheel's path on the last line of standard output.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv-wheel"
out=${WHEEL_DIR:-$root/dist}
py=/usr/bin/python3; [ -x "$py" ] || py=python3
pip_q=(-q --disable-pip-version-check)

if [ ! -x "$venv/bin/python" ]; then
  echo "wheel: making $venv (maturin, ziglang, cmake, auditwheel from PyPI)" >&2
  "$py" -m venv "$venv"
fi
for tool in "maturin>=1.5,<2" ziglang "cmake>=3.20" auditwheel; do
  name=${tool%%[><=]*}
  "$venv/bin/python" -m pip show -q "$name" >/dev/null 2>&1 ||
    "$venv/bin/pip" install "${pip_q[@]}" "$tool" >&2
done
# maturin calls `zig`; ziglang ships it as a Python module.
if [ ! -x "$venv/bin/zig" ]; then
  printf '#!/bin/sh\nexec "%s" -m ziglang "$@"\n' "$venv/bin/python" >"$venv/bin/zig"
  chmod +x "$venv/bin/zig"
fi

export PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$root/target/wheel"
export CMAKE="$venv/bin/cmake"
unset VIRTUAL_ENV
mkdir -p "$out"
rm -f "$out"/seistomo-*manylinux*.whl
echo "wheel: maturin build --release --zig --compatibility manylinux_2_28 (on 2 cores about" \
     "3 minutes the first time)" >&2
"$venv/bin/maturin" build --release --zig --compatibility manylinux_2_28 \
  -m "$root/python/Cargo.toml" -o "$out" >&2
wheel=$(ls "$out"/seistomo-*-manylinux_2_28_x86_64.whl)
report=$("$venv/bin/auditwheel" show "$wheel" 2>&1)
if ! echo "$report" | grep -Eq 'platform tag: "manylinux_2_(2[0-8]|1[0-9]|5)_x86_64"|manylinux(1|2010|2014)_x86_64'; then
  echo "$report" >&2
  echo "wheel: auditwheel does not call $(basename "$wheel") manylinux_2_28 or older" >&2
  exit 1
fi
echo "wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1)), auditwheel: $(echo "$report" | grep -o 'platform tag: "[^"]*"')" >&2
echo "$wheel"
