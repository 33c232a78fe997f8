"""GpuPoolHook fails loudly: only a missing default connection falls back; one ledger order everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_gpupool import settings
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.hooks import GpuPoolHook
from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook, resolve_ledger_url


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("GPUPOOL_LEDGER_URL", "AIRFLOW_CONN_GPUPOOL_DEFAULT", "AIRFLOW__GPUPOOL__LEDGER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")


def set_default(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    extra = {"ledger_url": url}
    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", json.dumps({"conn_type": "gpupool", "extra": extra}))


def test_an_error_resolving_the_default_connection_propagates(monkeypatch: pytest.MonkeyPatch) -> None:
    # The secrets backend is down: no silent fallback to a ledger of this worker's own.
    def backend_down(conn_id: str) -> None:
        raise ConnectionError(f"secrets backend unreachable while reading {conn_id}")

    monkeypatch.setattr(GpuPoolHook, "get_connection", staticmethod(backend_down))
    with pytest.raises(ConnectionError, match="secrets backend unreachable"):
        GpuPoolHook().options  # noqa: B018


async def test_the_async_hook_propagates_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    async def backend_down(conn_id: str) -> None:
        raise ConnectionError("secrets backend unreachable")

    monkeypatch.setattr(AsyncGpuPoolHook, "aget_connection", staticmethod(backend_down))
    with pytest.raises(ConnectionError):
        await AsyncGpuPoolHook().aoptions()


def test_only_a_missing_default_connection_falls_back(tmp_path: Path) -> None:
    assert GpuPoolHook().options.ledger_url == f"sqlite:///{tmp_path / 'gpupool-ledger.db'}"


@pytest.mark.parametrize(
    "executor",
    [
        "CeleryExecutor",
        "KubernetesExecutor",
        "airflow.providers.edge3.executors.EdgeExecutor",
        "LocalExecutor,CeleryExecutor",
        "team_a:my_company.executors.BatchExecutor",
    ],
)
def test_the_sqlite_default_is_refused_under_a_multi_machine_executor(
    monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    with pytest.raises(ConfigurationError, match="one shared PostgreSQL ledger") as refused:
        GpuPoolHook().options  # noqa: B018
    assert "AIRFLOW_CONN_GPUPOOL_DEFAULT" in str(refused.value) and "GPUPOOL_LEDGER_URL" in str(refused.value)


@pytest.mark.parametrize("how", ["env", "connection", "config"])
def test_a_configured_ledger_is_accepted_under_celery(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    url = "postgresql://gpupool@db:5432/gpupool"
    if how == "env":
        monkeypatch.setenv("GPUPOOL_LEDGER_URL", url)
    elif how == "connection":
        set_default(monkeypatch, url)
    else:
        monkeypatch.setenv("AIRFLOW__GPUPOOL__LEDGER_URL", url)
    assert GpuPoolHook().options.ledger_url == url


def test_one_order_argument_env_connection_config_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LEDGER_URL", "sqlite:////tmp/config.db")
    assert resolve_ledger_url() == "sqlite:////tmp/config.db"
    set_default(monkeypatch, "sqlite:////tmp/connection.db")
    assert resolve_ledger_url() == GpuPoolHook().options.ledger_url == "sqlite:////tmp/connection.db"
    monkeypatch.setenv("GPUPOOL_LEDGER_URL", "sqlite:////tmp/env.db")
    assert resolve_ledger_url() == GpuPoolHook().options.ledger_url == "sqlite:////tmp/env.db"
    assert resolve_ledger_url("sqlite:////tmp/flag.db") == "sqlite:////tmp/flag.db"
    assert GpuPoolHook(ledger_url="sqlite:////tmp/flag.db").options.ledger_url == "sqlite:////tmp/flag.db"


@pytest.mark.parametrize("value", ["inf", "Infinity", "nan", "-inf", "1e999"])
def test_infinite_seconds_are_refused_in_config_env_and_extras(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LEASE_TTL_SECONDS", value)
    with pytest.raises(ConfigurationError, match="lease_ttl_seconds"):
        settings.lease_ttl_seconds()
    monkeypatch.delenv("AIRFLOW__GPUPOOL__LEASE_TTL_SECONDS")
    extra = {"ledger_url": "sqlite:////tmp/x.db", "lease_ttl_seconds": value}
    monkeypatch.setenv("AIRFLOW_CONN_POOL_INF", json.dumps({"conn_type": "gpupool", "extra": extra}))
    with pytest.raises(ConfigurationError, match="lease_ttl_seconds"):
        GpuPoolHook("pool_inf").options  # noqa: B018
    with pytest.raises(ConfigurationError, match="lease_ttl_seconds"):
        GpuPoolHook(None, lease_ttl_seconds=float(value)).options  # noqa: B018
