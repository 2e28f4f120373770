# `make demo` and `make test` work on a fresh machine: both create .venv first (idempotent).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR := artifacts/policy-value-heads

.PHONY: venv demo test test-all bench clean

venv: $(STAMP)

# torch==2.13.0 first: it is the local CPU build; the range in pyproject then installs nothing more.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[cpu,dev,tune,sb3,openvino,serve]"
	touch $(STAMP)

demo: venv
	$(BIN)/rlopt compile recipes/policy_value_heads.yaml -o $(DEMO_DIR)
	$(BIN)/rlopt verify $(DEMO_DIR)
	$(BIN)/rlopt warmup --model_dir $(DEMO_DIR) \
		--profile recipes/warmup_profiles/chatbot.json --duration 5 --concurrency 4

# Two pytest workers, one per core; a test file stays on one worker, so its module fixtures are built once.
# Bytecode is compiled once up front and written even where PYTHONDONTWRITEBYTECODE is set: the suite starts
# ~100 interpreters (CLI runs, bench and route workers), and each would otherwise recompile rlopt from source.
test: venv
	$(BIN)/python -m compileall -q -j 2 rlopt tests scripts
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -m "not slow and not gpu" -n 2 --dist loadfile

test-all: venv
	$(BIN)/python -m compileall -q -j 2 rlopt tests scripts
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -m "not gpu"

# make bench BENCH_ARGS=--quick: a smoke run (R = 1, fewer rounds, four models)
bench: venv
	$(BIN)/python scripts/bench.py --out bench-results.json $(BENCH_ARGS)

clean:
	rm -rf artifacts .pytest_cache
