#!/usr/bin/env bash
# How a Python user installs seistomo, checked (issue 34; `make check-install`, which `make test`
# runs): in a fresh virtual environment, `pip install "./python[test]"` with no seistomo or
# CMake variable set (pip's isolated build brings CMake and maturin itself), then the pytest
# suite against the installed package; then `make wheel` (scripts/build_wheel.sh) builds the
# manylinux_2_28 abi3 wheel, and a second fresh environment, whose PATH has no Rust (no cargo,
# no rustc), installs that wheel and runs the suite again. Needs network access to PyPI (as
# scripts/bootstrap.sh does) and a Rust toolchain for the first half.
# Everything lives under $CHECK_INSTALL_DIR (default: a temporary folder, removed afterwards);
# the builds' Cargo target folders are kept in target/check-install and target/wheel so that a
# second run is incremental.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${CHECK_INSTALL_DIR:-$(mktemp -d)}
[ -n "${CHECK_INSTALL_DIR:-}" ] || trap 'rm -rf "$work"' EXIT
py=/usr/bin/python3; [ -x "$py" ] || py=python3
export CARGO_TARGET_DIR="$root/target/check-install"
unset CMAKE VIRTUAL_ENV PYTHONPATH
pip_q=(-q --disable-pip-version-check)

echo "check-install: pip install ./python[test] into a fresh venv" >&2
"$py" -m venv "$work/build-venv"
"$work/build-venv/bin/pip" install "${pip_q[@]}" "$root/python[test]"
(cd "$root" && "$work/build-venv/bin/python" -m pytest -q -p no:cacheprovider python/tests)

echo "check-install: the manylinux wheel (make wheel), into a fresh venv without Rust on PATH" >&2
wheel=$(WHEEL_DIR="$work/wheels" bash "$root/scripts/build_wheel.sh" | tail -n 1)
echo "check-install: built $(basename "$wheel")" >&2
"$py" -m venv "$work/wheel-venv"
norust=$(echo "$PATH" | tr ':' '\n' | grep -v -e cargo -e rustup | paste -sd: -)
PATH="$work/wheel-venv/bin:$norust"
if command -v cargo >/dev/null 2>&1 || command -v rustc >/dev/null 2>&1; then
  echo "check-install: cargo or rustc still on PATH ($(command -v cargo rustc | head -1))" >&2
  exit 1
fi
pip install "${pip_q[@]}" "$wheel[test]"
(cd "$root" && python -m pytest -q -p no:cacheprovider python/tests)
echo "check-install: ok ($(basename "$wheel"))" >&2
