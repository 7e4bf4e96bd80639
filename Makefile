# seistomo: the two commands a new machine needs are `make demo` and `make test`.
# Each runs scripts/bootstrap.sh first (idempotent: installs apt packages and CMake only if
# missing) and exports CMAKE for the static HDF5 build.
SHELL := /bin/bash
CARGO ?= cargo
BOOT = export CMAKE="$$(scripts/bootstrap.sh | tail -n 1)"

.PHONY: bootstrap build demo test test-quick lint clean-out python test-python check-kernels check-timeouts check-install wheel

bootstrap:
	@scripts/bootstrap.sh >/dev/null

build:
	@$(BOOT) && $(CARGO) build --release

# The bundled demo: a synthetic straight-ray checkerboard (datasets/demo, made by `seistomo synth`,
# command in datasets/demo/README.md) inverted, written as model.h5 + model.xdmf, and drawn; then
# the real surface-wave tomography of Australia ([G; 0.015 R] m = [d; 0]) with its cell table.
demo:
	@$(BOOT) && $(CARGO) build --release && \
	./target/release/seistomo invert datasets/demo/invert.toml && \
	./target/release/seistomo plot out/demo/model.h5 --depth 2.5 --compare-true -o out/demo/slice.png && \
	./target/release/seistomo plot out/demo/model.h5 --section y=6 --compare-true -o out/demo/section.png && \
	./target/release/seistomo invert configs/australia-model.toml && \
	./target/release/seistomo plot out/australia-model/model.h5 --field velocity -o out/australia-model/velocity.png && \
	echo "demo outputs: out/demo/{model.h5,model.xdmf,slice.png,section.png,report.json}, out/australia-model/{model.h5,velocity.png}"

lint:
	@$(BOOT) && $(CARGO) fmt --all -- --check && $(CARGO) clippy --all-targets --features fault-injection -- -D warnings && \
	$(CARGO) clippy --no-default-features --all-targets -- -D warnings && \
	PYO3_PYTHON=$(CURDIR)/$(PYVENV)/bin/python $(CARGO) clippy -p seistomo-py --all-targets -- -D warnings

# The Python module (python/, docs/python.md): built (dev profile, no MPI) into .venv-py, which
# bootstrap.sh makes from Debian's python3 (SciPy, xarray, h5netcdf, pytest) plus maturin.
PYVENV = .venv-py
python:
	@$(BOOT) && VIRTUAL_ENV=$(CURDIR)/$(PYVENV) PATH=$(CURDIR)/$(PYVENV)/bin:$$PATH \
	maturin develop -q -m python/Cargo.toml

# -rs lists every skipped test with its reason (the GPU tests where there is no GPU); each test
# has a time limit (python/tests/conftest.py, SEISTOMO_TEST_TIMEOUT seconds, default 300).
test-python: python
	@$(PYVENV)/bin/python -m pytest -q -rs python/tests

# Formatting, lints (with and without the default `mpi` feature), then every test (with the
# publisher's fault-injection hooks compiled in: tests/outputs.rs kills and fills the disk
# through them; release builds never have them), then the Python module's tests (pytest).
# `make test` cannot hang: with cargo-nextest (CI has it) every test runs in its own process
# and is killed and failed after 10 minutes (.config/nextest.toml); without it, cargo test runs
# with the whole run limited to TEST_LIMIT seconds. The crate has no doctests (nextest does not
# run them). The GPU tests are #[ignore]d and counted as such (docs/gpu.md).
TEST_LIMIT ?= 5400
test: lint
	@$(BOOT) && if $(CARGO) nextest --version >/dev/null 2>&1; then \
	  $(CARGO) nextest run --no-fail-fast --features fault-injection; \
	else \
	  echo "make test: no cargo-nextest, so no per-test time limit: cargo test, the whole run limited to $(TEST_LIMIT) s (cargo install cargo-nextest)" >&2; \
	  timeout -k 30 $(TEST_LIMIT) $(CARGO) test --no-fail-fast --features fault-injection; \
	fi
	@$(MAKE) --no-print-directory test-python
	@$(MAKE) --no-print-directory check-install

# How a Python user installs it (scripts/check_install.sh): `pip install ./python[test]` in a
# fresh venv with no variables set, the pytest suite against it; the built wheel in a second
# fresh venv without Rust on PATH, the suite again. Needs PyPI (as bootstrap does).
check-install:
	@scripts/bootstrap.sh >/dev/null && timeout -k 30 2400 bash scripts/check_install.sh

# The manylinux_2_28 abi3 wheel in dist/ (scripts/build_wheel.sh: maturin with zig as the
# linker, tools from PyPI in .venv-wheel; auditwheel checks the tag). Installs with no compiler:
# pip install dist/seistomo-*.whl
wheel:
	@scripts/bootstrap.sh >/dev/null && bash scripts/build_wheel.sh >/dev/null

# The time limit itself: tests/hang_probe.rs hangs on purpose (SEISTOMO_FORCE_HANG=1); under
# nextest's hang-check profile (2 s) it must be killed and reported as a failure (TIMEOUT).
# pytest's limit has its own test (test_a_hung_test_fails_within_its_time_limit).
check-timeouts:
	@$(BOOT) && $(CARGO) nextest --version >/dev/null 2>&1 || { echo "check-timeouts: needs cargo-nextest" >&2; exit 1; }; \
	$(CARGO) nextest run --no-run --features fault-injection --test hang_probe 2>/dev/null && \
	out=$$(SEISTOMO_FORCE_HANG=1 timeout 120 $(CARGO) nextest run --profile hang-check --features fault-injection --run-ignored only --test hang_probe 2>&1); rc=$$?; \
	echo "$$out" | grep -E "TIMEOUT|Summary" >&2; \
	if [ $$rc -ne 0 ] && [ $$rc -ne 124 ] && echo "$$out" | grep -q TIMEOUT; then \
	  echo "check-timeouts: ok, the hung test was killed and failed" >&2; \
	else echo "check-timeouts: the hung test was not stopped by its time limit (rc $$rc)" >&2; exit 1; fi

# Compile kernels/*.cu as the CUDA backend does, without a GPU (NVRTC and ptxas from NVIDIA's PyPI
# wheels, installed once into .venv-nvrtc): compile errors, registers and spills per kernel.
check-kernels:
	@python3 scripts/check_kernels.py

clean-out:
	rm -rf out
