"""GpuPoolHook: connection resolution (arguments beat extras beat configuration) and clear errors."""

from __future__ import annotations

import json

import pytest

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.hooks import GpuPoolHook


def set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "gpupool", **fields}))


def test_extras_are_read_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(
        monkeypatch,
        "pool_eu",
        extra={
            "ledger_url": "sqlite:////tmp/eu.db",
            "binding": "hami",
            "node_pool_bindings": "a100=mig",
            "lease_ttl_seconds": 90,
        },
    )
    options = GpuPoolHook("pool_eu").options
    assert options.ledger_url == "sqlite:////tmp/eu.db"
    assert options.binding == "hami"
    assert options.node_pool_bindings == {"a100": "mig"}
    assert options.lease_ttl_seconds == 90


def test_constructor_arguments_beat_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "pool_eu", extra={"ledger_url": "sqlite:////tmp/eu.db", "binding": "hami"})
    options = GpuPoolHook("pool_eu", ledger_url="sqlite:////tmp/mine.db", binding="whole").options
    assert (options.ledger_url, options.binding) == ("sqlite:////tmp/mine.db", "whole")


def test_host_fields_make_a_postgresql_url(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(
        monkeypatch,
        "pool_pg",
        host="db.internal",
        port=5433,
        login="gpupool",
        password="s3cret",
        schema="ledger",
    )
    assert GpuPoolHook("pool_pg").options.ledger_url == "postgresql://gpupool:s3cret@db.internal:5433/ledger"


def test_missing_named_connection_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="connection 'does_not_exist' not found"):
        GpuPoolHook("does_not_exist").options  # noqa: B018


def test_missing_default_connection_falls_back_to_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_GPUPOOL_DEFAULT", raising=False)
    monkeypatch.setenv("GPUPOOL_LEDGER_URL", "sqlite:////tmp/from-env.db")
    assert GpuPoolHook().options.ledger_url == "sqlite:////tmp/from-env.db"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param({"binding": "nvlink"}, "unknown binding 'nvlink'", id="unknown-binding"),
        pytest.param({"lease_ttl_seconds": -1}, "must be positive", id="negative-ttl"),
        pytest.param({"ledger_uri": "x"}, "unknown extras ['ledger_uri']", id="misspelt-extra"),
        pytest.param({"node_pool_bindings": "a100"}, "is not pool=strategy", id="bad-pool-binding"),
    ],
)
def test_bad_extras_fail_loudly(monkeypatch: pytest.MonkeyPatch, extra: dict, message: str) -> None:
    set_conn(monkeypatch, "pool_bad", extra=extra)
    with pytest.raises(ConfigurationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        GpuPoolHook("pool_bad").options  # noqa: B018
