# airflow-gpupool: `make demo` and `make test` work on a fresh clone; both install into .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export AIRFLOW__CORE__LOAD_EXAMPLES ?= False
# The Alibaba GPU trace (third-party data, not in the repository): the shared copy beside the
# checkout when there is one; elsewhere `gpupool traces fetch` fills a cache the simulator reads.
ifneq ($(wildcard ../shared/traces/alibaba-gpu-v2023),)
export GPUPOOL_TRACE_DIR ?= $(abspath ../shared/traces)
endif

# test-oldest: the core subset on the oldest supported Airflow (docs/install.md, "Supported Airflow versions").
.PHONY: install moto lint test test-fast test-oldest docs demo ui bench-placement bench-ledger clean constraints

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test,lint,plot,docs]"
	touch $(STAMP)

install: $(STAMP)

# moto's S3 server for the s3:// checkpoint tests, in a virtualenv of its own: its Flask server and
# boto3 stay out of constraints.txt, and the tests reach it over HTTP only (tests/s3_fixtures.py).
MOTO_VENV ?= .venv-moto
MOTO_STAMP := $(MOTO_VENV)/.installed-stamp
export GPUPOOL_MOTO_SERVER ?= $(abspath $(MOTO_VENV))/bin/moto_server

$(MOTO_STAMP): tests/moto-requirements.txt
	test -x $(MOTO_VENV)/bin/python || $(PYTHON) -m venv $(MOTO_VENV)
	$(MOTO_VENV)/bin/python -m pip install -q -r tests/moto-requirements.txt
	touch $(MOTO_STAMP)

moto: $(MOTO_STAMP)

lint: install
	$(BIN)/ruff check airflow_gpupool tests benchmarks dags docs
	$(BIN)/ruff format --check airflow_gpupool tests benchmarks dags docs
	$(BIN)/mypy
	$(BIN)/lint-imports  # the layering contract in pyproject.toml

test: lint $(MOTO_STAMP)
	$(BIN)/pytest -q

# The documentation (docs/, Sphinx with MyST Markdown), strictly: -W makes every warning (a broken
# internal link or anchor, a missing cross-reference) an error, -n checks every reference, -E
# rereads every page. tests/integration/test_docs.py runs the same build in `make test`.
docs: install
	$(BIN)/sphinx-build -E -W --keep-going -n -q -b html docs docs/_build/html

test-fast: install $(MOTO_STAMP)
	$(BIN)/pytest -q -x -m "not slow"

# The oldest supported Airflow (3.1) in a venv of its own, from its own pins: the tests marked core
# (the operator, triggers, sensor, hook, testing kit and example DAGs; tests/conftest.py lists them).
OLDEST_VENV ?= .venv-airflow-3.1
OLDEST_STAMP := $(OLDEST_VENV)/.installed-stamp

$(OLDEST_STAMP): pyproject.toml constraints-airflow-3.1.txt
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q -c constraints-airflow-3.1.txt -e ".[testing]" pytest pytest-timeout hypothesis
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/python -c "import airflow; assert airflow.__version__.startswith('3.1.'), airflow.__version__"
	GPUPOOL_CORE_ONLY=1 $(OLDEST_VENV)/bin/pytest -q -m core

# The example DAGs run gpu_retraining end to end on embedded parts; the summary ends with `grants leaked: 0`.
demo: install
	$(BIN)/python -m airflow_gpupool.demo

# The Airflow UI (airflow standalone, http://localhost:$(AIRFLOW_UI_PORT)) with the Kubernetes
# emulator (the demo's cluster, port $(EMULATOR_PORT)), a SQLite ledger synced from it, the
# controller beside them (its log in .demo/ui/controller.log), the executor hook and the example DAGs in dags/.
# Sized for a laptop: the LocalExecutor starts one worker process per parallelism slot (32 by
# default, about 6 GB); UI_WORKERS of them run the example DAGs' few parallel tasks.
UI_DIR := $(abspath .demo/ui)
EMULATOR_PORT ?= 8001
AIRFLOW_UI_PORT ?= 8080
UI_WORKERS ?= 4
UI_CONN := {"conn_type": "gpupool", "extra": {"ledger_url": "sqlite:///$(UI_DIR)/ledger.db", "node_pool_bindings": "a100-mig=mig,t4-shared=hami"}}
UI_ENV := AIRFLOW_HOME=$(UI_DIR)/airflow AIRFLOW__CORE__DAGS_FOLDER=$(abspath dags) AIRFLOW__CORE__LOAD_EXAMPLES=False \
	KUBECONFIG=$(UI_DIR)/kubeconfig GPUPOOL_EMULATOR=1 GPUPOOL_CHECKPOINT_ROOT=$(UI_DIR)/checkpoints \
	AIRFLOW__CORE__PARALLELISM=$(UI_WORKERS) AIRFLOW__API__PORT=$(AIRFLOW_UI_PORT) AIRFLOW__API__WORKERS=1 \
	AIRFLOW_CONN_GPUPOOL_DEFAULT='$(UI_CONN)'

# One supervisor runs the long-lived processes (airflow_gpupool/demo/ui.py): Ctrl-C or SIGTERM
# stops every one of them, their children included, within 10 s. `exec` makes it make's own child,
# so the SIGTERM that make forwards to its child reaches it.
ui: install
	mkdir -p $(UI_DIR)
	$(BIN)/python -m airflow_gpupool.demo --write-nodes $(UI_DIR)/nodes.json
	$(BIN)/python -m airflow_gpupool.demo --write-fake-nvml $(UI_DIR)/nvml  # one fake NVML per GPU node
	$(BIN)/python -m airflow_gpupool.demo --write-local-settings $(UI_DIR)/airflow  # the executor hook
	exec env $(UI_ENV) $(BIN)/python -m airflow_gpupool.demo.ui --dir $(UI_DIR) --emulator-port $(EMULATOR_PORT)

bench-placement: install
	$(BIN)/python benchmarks/placement.py

bench-ledger: install
	$(BIN)/gpupool bench ledger --url postgresql://postgres@127.0.0.1:5432/test --clients 16 --seconds 10 --nodes 1000 --json

# Regenerate the pins from the current, working .venv.
constraints:
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^airflow-gpupool' > constraints.txt

clean:
	rm -rf $(VENV) $(MOTO_VENV) $(OLDEST_VENV) docs/_build .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
