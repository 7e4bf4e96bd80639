# seistomo: the two commands a new machine needs are `make demo` and `make test`.
# Each runs scripts/bootstrap.sh first (idempotent: installs apt packages and CMake only if
# missing) and exports CMAKE for the static HDF5 build.
SHELL := /bin/bash
CARGO ?= cargo
BOOT = export CMAKE="$$(scripts/bootstrap.sh | tail -n 1)"

.PHONY: bootstrap build demo test test-quick lint clean-out python test-python check-kernels

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

test-python: python
	@$(PYVENV)/bin/python -m pytest -q python/tests

# Formatting, lints (with and without the default `mpi` feature), then every test (with the
# publisher's fault-injection hooks compiled in: tests/outputs.rs kills and fills the disk
# through them; release builds never have them), then the Python module's tests (pytest).
test: lint
	@$(BOOT) && $(CARGO) test --no-fail-fast --features fault-injection
	@$(MAKE) --no-print-directory test-python

# Compile kernels/*.cu as the CUDA backend does, without a GPU (NVRTC and ptxas from NVIDIA's PyPI
# wheels, installed once into .venv-nvrtc): compile errors, registers and spills per kernel.
check-kernels:
	@python3 scripts/check_kernels.py

clean-out:
	rm -rf out
