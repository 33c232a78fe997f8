"""Test-wide setup: an isolated AIRFLOW_HOME, set before anything imports Airflow."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

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
pytest_plugins = ["tests.ledger_fixtures", "tests.integration.fuzz_fixtures"]

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


# The core subset (`pytest -m core`), also run on the oldest supported Airflow by `make test-oldest`
# (docs/install.md, "Supported Airflow versions"): the operator, the triggers, the sensor, the hook, the
# testing kit and the example DAGs. Marked here by file, so the kit's doc examples stay as written.
CORE_FILES = frozenset(
    {
        "tests/integration/test_example_dags.py",
        "tests/integration/test_gpu_pod_operator.py",
        "tests/integration/test_kit_doc_prefill.py",
        "tests/integration/test_kit_doc_run_result.py",
        "tests/integration/test_kit_doc_training.py",
        "tests/integration/test_kit_emulator_fixtures.py",
        "tests/integration/test_kit_example.py",
        "tests/integration/test_kit_home.py",
        "tests/integration/test_kit_unschedulable.py",
        "tests/unit/hooks/test_gpupool_hook.py",
        "tests/unit/hooks/test_gpupool_hook_ledger.py",
        "tests/unit/hooks/test_hook_fails_loudly.py",
        "tests/unit/hooks/test_options_fuzz.py",
        "tests/unit/operators/test_reattach_versions.py",
        "tests/unit/sensors/test_checkpoint_sensor.py",
        "tests/unit/test_get_provider_info.py",
        "tests/unit/triggers/test_checkpoint_trigger.py",
        "tests/unit/triggers/test_lease_trigger.py",
        "tests/unit/triggers/test_pod_trigger.py",
        "tests/unit/triggers/test_queue_life.py",
        "tests/unit/triggers/test_reservation_trigger.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        if item.path.relative_to(root).as_posix() in CORE_FILES:
            item.add_marker(pytest.mark.core)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # make test-oldest (GPUPOOL_CORE_ONLY=1) collects the core files alone: the rest of the suite
    # uses test-only extras (Celery, playwright, moto) that the oldest Airflow's venv does not install.
    if os.environ.get("GPUPOOL_CORE_ONLY") != "1" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return collection_path.relative_to(config.rootpath).as_posix() not in CORE_FILES
