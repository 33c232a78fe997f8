"""Test-wide setup: an isolated AIRFLOW_HOME, set before anything imports Airflow."""

from __future__ import annotations

import os
import tempfile

_HOME = tempfile.mkdtemp(prefix="gpupool-airflow-home-")
os.environ.setdefault("AIRFLOW_HOME", _HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# Airflow reads the DAGs folder once, at import: set it before any test imports Airflow.
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = os.path.join(os.path.dirname(__file__), "integration", "dags")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.pop("GPUPOOL_LEDGER_URL", None)

pytest_plugins = ["tests.ledger_fixtures"]
