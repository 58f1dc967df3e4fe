# radixserve: `make serve` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 30000
PYTEST_ARGS ?=

.PHONY: install serve test test-slow test-bench lint format bench clean gpu-wheels cross-tools

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first, pinned: the CPU build on disk (an unpinned torch pulls a multi-GB CUDA build).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,dev,bench]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/radixserve serve --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check radixserve tests benchmarks examples
	$(BIN)/ruff format --check radixserve tests benchmarks examples
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/python tools/check_file_length.py radixserve

# The aarch64 cross compiler and qemu-user, with which tests/models/test_kernel_isas.py builds the
# NEON kernels and runs them under emulation. Installed with apt-get where it is usable (as root);
# otherwise, or when apt-get fails, this says what to install and goes on: those tests skip.
CROSS_TOOLS := g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
cross-tools:
	@if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; then \
		exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "cross-tools: apt-get install $(CROSS_TOOLS)"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			-o DPkg::Lock::Timeout=120 --no-install-recommends $(CROSS_TOOLS) >/dev/null; } \
		|| echo "cross-tools: apt-get failed; the NEON kernel tests will skip"; \
	else \
		echo "cross-tools: install $(CROSS_TOOLS) to run the NEON kernel tests (they skip)"; \
	fi

# pytest exits 5 when it collects no test: that is a failure here, never a pass. Two workers
# (pytest-xdist), each a test file at a time (a file's servers start once): most tests wait on
# servers and subprocesses, so one process alone leaves a core idle.
TEST_WORKERS ?= 2
test: lint cross-tools
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP) cross-tools
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

# every script in benchmarks/ on its smallest workload (tests/bench/test_bench_scripts.py)
test-bench: $(STAMP)
	$(BIN)/python -m pytest -q -m bench $(PYTEST_ARGS)

format: $(STAMP)
	$(BIN)/ruff format radixserve tests benchmarks examples
	$(BIN)/ruff check --fix radixserve tests benchmarks examples

# The wheels benchmarks/device_gpu.sh installs on the lent GPU machine (Python 3.12, x86-64, no
# network), each without its dependencies: benchmarks/gpu/wheels.txt says why these.
WHEEL_PLATFORMS := $(foreach n,2_35 2_34 2_31 2_28 2_27 2_24 2_17,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64
gpu-wheels: $(STAMP)
	mkdir -p .whl
	grep -v '^#' benchmarks/gpu/wheels.txt | xargs $(BIN)/pip download -q --no-deps --only-binary=:all: \
		--python-version 3.12 --implementation cp $(WHEEL_PLATFORMS) -d .whl
	du -sh .whl

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis
