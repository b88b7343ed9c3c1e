# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test faults lint bench clean

# uv installs in parallel (about 50 s on a 2-core machine, pip took 100), and byte-compiles as pip does: where
# PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile torch and transformers from source.
UV := $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv
	# torch first and alone: the CPU wheel on this machine (pip's find-links, which uv reads as UV_FIND_LINKS)
	# satisfies the range without a multi-GB download.
	UV_FIND_LINKS="$(PIP_FIND_LINKS)" $(UV) "torch==2.13.0" || $(UV) "torch>=2.6,<2.15"
	$(UV) -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m compileall -q laminar
	RAY_AUTH_MODE=disabled $(BIN)/laminar train --out runs/demo

# One test process and one Ray cluster: on a 2-core machine, three processes with a cluster each took as long and
# loaded it enough (load average 15-30) for end-to-end runs to cross their waits; `-n 3 --dist loadfile` where
# there are cores to spare.
# Compiled first: where PYTHONDONTWRITEBYTECODE is set (this machine sets it), every process of every run (a
# dozen a run) would otherwise compile the package from source again, about a CPU-second a run.
test: $(STAMP)
	$(BIN)/python -m compileall -q laminar
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q --durations=15

# The fault suite (`-m fault`) FAULT_RUNS times in a row, stopping at the first failure; each run's log in runs/faults/.
FAULT_RUNS ?= 10
faults: $(STAMP)
	mkdir -p runs/faults; for i in $$(seq 1 $(FAULT_RUNS)); do \
	  echo "fault suite run $$i/$(FAULT_RUNS)"; \
	  RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -m fault \
	    > runs/faults/run-$$i.log 2>&1 || { tail -30 runs/faults/run-$$i.log; exit 1; }; \
	  tail -1 runs/faults/run-$$i.log; done

lint: $(STAMP)
	$(BIN)/ruff check laminar tests && $(BIN)/ruff format --check laminar tests

clean:
	rm -rf $(VENV) runs .pytest_cache
