# airflow-gpupool: `make demo` and `make test` work on a fresh clone; both install into .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export AIRFLOW__CORE__LOAD_EXAMPLES ?= False

.PHONY: install lint test test-fast demo bench-placement bench-ledger clean constraints

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test,lint,plot]"
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check airflow_gpupool tests benchmarks dags
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -x -m "not slow"

demo: install
	$(BIN)/python -m airflow_gpupool.demo

bench-placement: install
	$(BIN)/python benchmarks/placement.py

bench-ledger: install
	$(BIN)/gpupool bench ledger --url postgresql://postgres@127.0.0.1:5432/test --clients 16 --seconds 10 --nodes 1000 --json

# Regenerate the pins from the current, working .venv.
constraints:
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^airflow-gpupool' > constraints.txt

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
