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
# Before installing it says what, how much (apt's own download and disk figures) and how long;
# the package manager's output goes to a log file (its tail is shown if it fails).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
if [ ! -d "$target" ]; then
  free=$(df -Pk "$root" 2>/dev/null | awk 'NR==2 {printf "%.0f", $4 / 1048576}')
  echo "bootstrap: first build ahead: on 2 cores about 15-20 minutes (the static HDF5 library and" \
       "every test binary) and about 10 GB in $target for make test (make demo's release build:" \
       "about 2 GB); ${free:-?} GB free here" >&2
fi
pkgs=(build-essential pkg-config libopenmpi-dev openmpi-bin libclang-dev hdf5-tools
      python3-scipy python3-petsc4py petsc-dev python3-venv gzip
      python3-xarray python3-h5netcdf python3-pytest netcdf-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  log=${TMPDIR:-/tmp}/seistomo-bootstrap-apt.log
  apt_or_die() { # the command's output to the log; on failure its tail and where the log is
    if ! "$@" >>"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "bootstrap: '$*' failed; the whole output is in $log" >&2
      exit 1
    fi
  }
  : >"$log"
  echo "bootstrap: ${#missing[@]} apt packages to install: ${missing[*]}" >&2
  apt_or_die $SUDO apt-get update -q
  # apt's own figures for this machine (it stops at the question, --assume-no).
  need=$($SUDO apt-get install --assume-no --no-install-recommends "${missing[@]}" 2>/dev/null |
         grep -E '^(Need to get|After this operation)' | tr '\n' ' ' || true)
  echo "bootstrap: ${need:-apt gave no size}(a few minutes on a fresh machine; output in $log)" >&2
  apt_or_die $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  echo "bootstrap: packages installed" >&2
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
# PyLops for python/tests/test_operators.py (a real VStack of MatrixMult and Diagonal). Without
# its dependencies: PyLops 2.8 asks for SciPy >= 1.11, which would replace the system SciPy the
# tests compare against, and the classes the tests use run on this one. Not fatal: without it
# those tests use a stand-in or are skipped, naming PyLops.
if [ -x "$pyvenv/bin/pip" ] && ! "$pyvenv/bin/python" -c "import pylops" 2>/dev/null; then
  echo "bootstrap: installing PyLops 2.8.0 (no dependencies) into $pyvenv" >&2
  "$pyvenv/bin/pip" install -q --disable-pip-version-check --no-deps "pylops==2.8.0" \
    >/dev/null 2>&1 || echo "bootstrap: PyLops not installed (the PyLops tests are skipped)" >&2
fi
echo "$venv/bin/cmake"
