# One-command setup, build, test and benchmark. `make test` and `make bench` do all set-up.
#
#   make setup     pinned CUDA compiler, NVSHMEM, NCCL and MPICH wheels into .venv (+ libclang)
#   make test      CPU tests (no GPU needed)
#   make run EXAMPLE=hello NP=2
#   make check     GPU checks (our collectives, the host API, the ring-pipeline user crate)
#                  with 2 and 4 PEs
#   make bench     the benchmark suite against NCCL, one PE per local GPU

SHELL := /bin/bash
VENV := .venv
PYTHON ?= python3
NP ?=
EXAMPLE ?= hello
ARGS ?=

# Versions must match the host library on the GPU machines: the device library linked into
# our cubins must be the same NVSHMEM release as the host library that runs them.
CUDA_WHEELS := nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
               nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
NVSHMEM_WHEELS := nvidia-nvshmem-cu13==3.4.5
OTHER_WHEELS := nvidia-nccl-cu13==2.28.9 mpich==5.0.2
WHEELS := $(if $(CUDA_HOME),,$(CUDA_WHEELS)) $(if $(NVSHMEM_HOME),,$(NVSHMEM_WHEELS)) $(OTHER_WHEELS)
STAMP := $(VENV)/.setup-done

.PHONY: setup build test run check bench fmt clippy ci clean-venv

setup:
	@if [ "$$(cat $(STAMP) 2>/dev/null)" = "$(strip $(WHEELS))" ]; then \
	  echo "setup: .venv is up to date"; \
	else \
	  set -e; \
	  [ -x $(VENV)/bin/pip ] || $(PYTHON) -m venv $(VENV); \
	  $(VENV)/bin/pip install --quiet --disable-pip-version-check $(WHEELS); \
	  echo "$(strip $(WHEELS))" > $(STAMP); \
	  echo "setup: installed $(strip $(WHEELS))"; \
	fi
	@scripts/ensure-libclang

build: setup
	cargo build --release --workspace --bins --examples

test: setup
	cargo test --workspace

run: build
	scripts/nvshmrun $(if $(NP),-np $(NP)) target/release/examples/$(EXAMPLE) $(ARGS)

check: build
	scripts/nvshmrun -np 2 target/release/examples/coll_check
	scripts/nvshmrun -np 4 target/release/examples/coll_check
	scripts/nvshmrun -np 2 target/release/examples/gpu_check $(ARGS)
	scripts/nvshmrun -np 4 target/release/examples/gpu_check $(ARGS)
	scripts/nvshmrun -np 2 target/release/ring-pipeline
	scripts/nvshmrun -np 4 target/release/ring-pipeline

bench: build
	scripts/nvshmrun $(if $(NP),-np $(NP)) target/release/examples/bench $(ARGS)

fmt:
	cargo fmt --all

clippy: setup
	cargo clippy --workspace --all-targets -- -D warnings

ci: test clippy
	cargo fmt --all -- --check

clean-venv:
	rm -rf $(VENV)
