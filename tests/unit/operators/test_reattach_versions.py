"""Durable re-attach below Airflow 3.3: a retry logs the documented fallback and still settles."""

from __future__ import annotations

from unittest import mock

import airflow
import pytest

from airflow_gpupool.operators.retries.reattach import (
    DURABLE_FALLBACK,
    EarlierTries,
    durable_reattach_supported,
)
from airflow_gpupool.task_try import TaskTry

TRY_2 = TaskTry("train_dag", "train", "manual__1", try_number=2)


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("3.1.8", False),
        ("3.2.2", False),
        ("3.3.0", True),
        ("3.3.2", True),
        ("3.3.0rc1", True),
        ("3.4.0.dev0", True),
    ],
)
def test_durable_reattach_needs_airflow_3_3(
    version: str, supported: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(airflow, "__version__", version)
    assert durable_reattach_supported() is supported


@pytest.mark.parametrize(
    ("version", "durable", "logged"), [("3.1.8", True, True), ("3.1.8", False, False), ("3.3.2", True, False)]
)
def test_a_durable_retry_below_3_3_logs_the_fallback_and_settles(
    version: str, durable: bool, logged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(airflow, "__version__", version)
    hook, log = mock.Mock(), mock.Mock()
    hook.get_or_none.return_value = None  # try 1 holds nothing
    earlier = EarlierTries(hook, mock.Mock(), "default", log)

    assert earlier.settle(TRY_2, durable=durable, ttl=60.0) is None

    hook.get_or_none.assert_called_once_with(
        TaskTry("train_dag", "train", "manual__1", try_number=1).reservation_id
    )
    expected = [mock.call(DURABLE_FALLBACK, version)] if logged else []
    assert log.info.call_args_list == expected
