"""Test-wide setup: an isolated AIRFLOW_HOME, set before anything imports Airflow."""

from __future__ import annotations

import os
import tempfile

# The testing kit's plugin (the pytest11 entry point) has already given the session a temporary
# AIRFLOW_HOME and removes it at the end; this covers a run with the plugin disabled.
if not os.environ.get("AIRFLOW_HOME"):
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="gpupool-airflow-home-")
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# Airflow reads the DAGs folder once, at import: set it before any test imports Airflow.
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = os.path.join(os.path.dirname(__file__), "integration", "dags")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.pop("GPUPOOL_LEDGER_URL", None)
# The Alibaba trace is third-party data, never copied into the repository: CI and the developers'
# machines have it in shared/ beside the checkout.
_SHARED_TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces")
if os.path.isdir(_SHARED_TRACES):
    os.environ.setdefault("GPUPOOL_TRACE_DIR", os.path.abspath(_SHARED_TRACES))

# The kit's fixtures (gpu_cluster, gpupool_ledger, k8s_emulator) come from the package's pytest11
# entry point, as they do in a DAG author's project: no line here, so the repository's own tests
# would fail if the documented way of loading them broke.
pytest_plugins = ["tests.ledger_fixtures"]

# CI runs the same property-test examples every time (a red CI must mean a change broke
# something); local runs draw new ones, which is how the state machine finds new bugs.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

from tests.skips import under_ci  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if under_ci():
    _hypothesis_settings.load_profile("ci")


# Hooks and triggers share one ledger per process and URL (airflow_gpupool.ledger.shared):
# each test starts without any, so no pool or capacity copy outlives the test that opened it.
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _close_shared_ledgers():  # type: ignore[no-untyped-def]
    yield
    from airflow_gpupool.ledger import close_shared

    close_shared()
