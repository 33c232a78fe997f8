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

# CI runs the same property-test examples every time (a red CI must mean a change broke
# something); local runs draw new ones, which is how the state machine finds new bugs.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

from tests.skips import under_ci  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if under_ci():
    _hypothesis_settings.load_profile("ci")
