#!/usr/bin/env bash
# Installs what seistomo needs to build and test on a fresh Debian 12 / Ubuntu 24.04 machine
# that has only a Rust toolchain. Idempotent: every step checks before it installs.
#   - apt packages: compilers, OpenMPI, libclang (bindgen for rsmpi), HDF5 tools (h5dump),
#     SciPy + petsc4py (reference peers for tests); xarray, h5netcdf, pytest and netcdf-bin
#     (ncdump) for the Python module's tests
#   - CMake >= 3.26 from PyPI in .venv-cmake (the static HDF5 build needs it)
#   - .venv-py: Debian's python3 with its site packages (SciPy, xarray, ...) plus maturin from
#     PyPI, where `make test` builds and tests the Python module (python/, docs/python.md)
# Prints the CMAKE path to use on its last line: `export CMAKE=$(scripts/bootstrap.sh | tail -1)`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pkgs=(build-essential pkg-config libopenmpi-dev openmpi-bin libclang-dev hdf5-tools
      python3-scipy python3-petsc4py petsc-dev python3-venv gzip
      python3-xarray python3-h5netcdf python3-pytest netcdf-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >&2
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# rustfmt and clippy (the test command checks formatting and lints); a minimal rustup profile
# lacks them.
if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" >&2
  done
fi
venv="$root/.venv-cmake"
cmake_ok() {
  [ -x "$venv/bin/cmake" ] || return 1
  v=$("$venv/bin/cmake" --version | head -1 | awk '{print $3}')
  [ "$(printf '%s\n3.26\n' "$v" | sort -V | head -1)" = "3.26" ]
}
if ! cmake_ok; then
  echo "bootstrap: installing CMake from PyPI into $venv" >&2
  # Debian's python3-venv is the interpreter that has venv; fall back to any python3.
  py=/usr/bin/python3; [ -x "$py" ] || py=python3
  "$py" -m venv "$venv" >&2 || python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "cmake>=3.26,<4" >&2
fi
pyvenv="$root/.venv-py"
if ! [ -x "$pyvenv/bin/maturin" ]; then
  echo "bootstrap: making $pyvenv (system site packages + maturin from PyPI)" >&2
  /usr/bin/python3 -m venv --system-site-packages "$pyvenv" >&2
  "$pyvenv/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" >&2
fi
echo "$venv/bin/cmake"
