# seistomo: the two commands a new machine needs are `make demo` and `make test`.
# Each runs scripts/bootstrap.sh first (idempotent: installs apt packages and CMake only if
# missing) and exports CMAKE for the static HDF5 build.
SHELL := /bin/bash
CARGO ?= cargo
BOOT = export CMAKE="$$(scripts/bootstrap.sh | tail -n 1)"

.PHONY: bootstrap build demo test test-quick lint clean-out

bootstrap:
	@scripts/bootstrap.sh >/dev/null

build:
	@$(BOOT) && $(CARGO) build --release

# The bundled demo inversion: real surface-wave tomography of Australia ([G; 0.015 R] m = [d; 0]).
demo:
	@$(BOOT) && $(CARGO) build --release && \
	./target/release/seistomo invert configs/australia.toml --progress 50 && \
	echo "demo outputs: out/australia/{solution.txt,report.json,history.csv}"

lint:
	@$(BOOT) && $(CARGO) fmt --all -- --check && $(CARGO) clippy --all-targets -- -D warnings && \
	$(CARGO) clippy --no-default-features --all-targets -- -D warnings

# Formatting, lints (with and without the default `mpi` feature), then every test.
test: lint
	@$(BOOT) && $(CARGO) test --no-fail-fast

clean-out:
	rm -rf out
