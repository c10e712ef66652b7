# One-command setup, build, test and benchmark. `make test` and `make bench` do all set-up.
#
#   make setup     pinned CUDA compiler, NVSHMEM, NCCL, cuBLAS, cuBLASMp, MPICH and libclang
#                  wheels into .venv,
#                  and .venv/bin/nvshmemrun
#   make test      CPU tests (no GPU needed)
#   make run EXAMPLE=hello NP=2
#   make check     GPU checks (our collectives, the host API, the TP layers, channels, the
#                  page pool, all of them from many threads at once for 20 s, the
#                  ring-pipeline user crate, the fault suite)
#                  with 2 and 4 PEs (those the machine has GPUs for; SHARE_GPUS=1 runs the
#                  others with several PEs per GPU through CUDA MPS: checks, not timings)
#   make soak DURATION=600 NP=2
#                  random checked collectives for DURATION seconds, then every role of the
#                  threaded stress check (channels, the page pool, TP layers, collectives,
#                  allocations, host calls) for DURATION seconds; memory compared at start and end
#   make bench     the benchmark suite against NCCL, one PE per local GPU
#
# The GPU targets stop with one line, before building, on a machine without GPUs.

SHELL := /bin/bash
VENV := .venv
PYTHON ?= python3
NP ?=
EXAMPLE ?= hello
ARGS ?=
CHECK_NP ?= 2 4
SHARE_GPUS ?=
SHARE_FLAG := $(if $(filter-out 0,$(SHARE_GPUS)),--share-gpus)

# Versions must match the host library on the GPU machines: the device library linked into
# our cubins must be the same NVSHMEM release as the host library that runs them.
CUDA_WHEELS := nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
               nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
NVSHMEM_WHEELS := nvidia-nvshmem-cu13==3.4.5
# libclang for bindgen (the wheel ships libclang.so; nvshmem-build's LIBCLANG_WHEEL agrees).
OTHER_WHEELS := nvidia-nccl-cu13==2.28.9 nvidia-cublas==13.1.0.3 mpich==5.0.2 libclang==18.1.1
# cuBLASMp, the bench's cublasmp baseline: 0.7 is the last release on NVSHMEM and NCCL 2.28
# (0.8 and later need NCCL 2.29). Its dependencies are the pins above, so none is pulled in.
NODEPS_WHEELS := nvidia-cublasmp-cu13==0.7.0.125
WHEELS := $(if $(CUDA_HOME),,$(CUDA_WHEELS)) $(if $(NVSHMEM_HOME),,$(NVSHMEM_WHEELS)) $(OTHER_WHEELS)
STAMP := $(VENV)/.setup-done

# Expanded when a GPU target's recipe starts: one line and a stop when there is no GPU (or
# fewer than NP), before anything is built.
require-gpus = $(eval GPUS := $(shell scripts/gpus $(if $(SHARE_FLAG),--share) $(1)))$(if $(filter ok,$(firstword $(GPUS))),,$(error $(GPUS)))

.PHONY: setup build test run check soak bench fmt clippy ci clean-venv

setup:
	@if [ "$$(cat $(STAMP) 2>/dev/null)" = "$(strip $(WHEELS) $(NODEPS_WHEELS))" ]; then \
	  echo "setup: .venv is up to date"; \
	else \
	  set -e; \
	  [ -x $(VENV)/bin/pip ] || $(PYTHON) -m venv $(VENV); \
	  $(VENV)/bin/pip install --quiet --disable-pip-version-check $(WHEELS); \
	  $(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps $(NODEPS_WHEELS); \
	  echo "$(strip $(WHEELS) $(NODEPS_WHEELS))" > $(STAMP); \
	  echo "setup: installed $(strip $(WHEELS) $(NODEPS_WHEELS))"; \
	fi
	@printf '#!/usr/bin/env bash\nNVSHMRUN_NAME=nvshmemrun exec "%s/scripts/nvshmrun" "$$@"\n' "$(CURDIR)" > $(VENV)/bin/nvshmemrun
	@chmod +x $(VENV)/bin/nvshmemrun

build: setup
	cargo build --release --workspace --bins --examples

test: setup
	cargo test --workspace

run:
	$(call require-gpus,$(NP))
	@$(MAKE) --no-print-directory build
	scripts/nvshmrun $(if $(NP),-np $(NP)) $(SHARE_FLAG) target/release/examples/$(EXAMPLE) $(ARGS)

check:
	$(call require-gpus,)
	@$(MAKE) --no-print-directory build
	@for np in $(CHECK_NP); do \
	  if [ $$np -gt $(word 2,$(GPUS)) ] && [ -z "$(SHARE_FLAG)" ]; then echo "check: -np $$np skipped ($(word 2,$(GPUS)) GPUs; SHARE_GPUS=1 shares them)"; continue; fi; \
	  for prog in coll_check gpu_check tp_mlp pipeline kv_pool map_check stress_check examples/cudarc_interop examples/pipeline_1f1b examples/decoder_mlp examples/param_cache examples/disaggregated examples/hybrid ring-pipeline; do \
	    if [ $$prog = stress_check ] && [ -n "$(SHARE_FLAG)" ]; then echo "check: stress_check is timed for one GPU per PE; not run with SHARE_GPUS"; continue; fi; \
	    args=$$([ $$prog = gpu_check ] && echo "$(ARGS)"); \
	    echo "scripts/nvshmrun -np $$np $(SHARE_FLAG) target/release/$$prog $$args"; \
	    scripts/nvshmrun -np $$np $(SHARE_FLAG) target/release/$$prog $$args || exit 1; \
	  done; \
	  if [ $$np -ge 4 ]; then \
	    echo "scripts/nvshmrun -np $$np $(SHARE_FLAG) target/release/tp_mlp --group 2 --no-timing"; \
	    scripts/nvshmrun -np $$np $(SHARE_FLAG) target/release/tp_mlp --group 2 --no-timing || exit 1; \
	  fi; \
	  echo "target/release/fault_check --np $$np --launcher 'scripts/nvshmrun $(SHARE_FLAG)'"; \
	  target/release/fault_check --np $$np --launcher "scripts/nvshmrun $(SHARE_FLAG)" || exit 1; \
	done

DURATION ?= 600
soak:
	$(call require-gpus,$(NP))
	@$(MAKE) --no-print-directory build
	scripts/nvshmrun $(if $(NP),-np $(NP)) $(SHARE_FLAG) target/release/coll_check --soak $(DURATION)
	scripts/nvshmrun $(if $(NP),-np $(NP)) $(SHARE_FLAG) target/release/stress_check --seconds $(DURATION)

bench:
	$(call require-gpus,$(NP))
	@$(MAKE) --no-print-directory build
	scripts/nvshmrun $(if $(NP),-np $(NP)) $(SHARE_FLAG) target/release/bench $(ARGS)

fmt:
	cargo fmt --all

clippy: setup
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p nvshmem --all-targets -- -D warnings

ci: test clippy
	cargo fmt --all -- --check

clean-venv:
	rm -rf $(VENV)
