"""Fuzz: configuration, environment and connection values give finite, valid options or a ConfigurationError."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpupool import settings as gpupool_settings
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.hooks.options import EXTRAS, options_from

SECONDS_OPTIONS = (
    "lease_ttl_seconds",
    "reservation_timeout_seconds",
    "orphan_grace_seconds",
    "poll_interval_seconds",
    "lock_timeout_seconds",
    "statement_timeout_seconds",
    "idle_in_transaction_timeout_seconds",
    "ledger_retry_seconds",
)
TEXT = st.sampled_from(
    ["inf", "-inf", "nan", "NaN", "1e999", "0", "-1", "", " ", "5", "0.5", "1e3", "x"]
) | st.text(alphabet="0123456789.-+einfaNx ", max_size=8)
VALUE = (
    st.none()
    | st.booleans()
    | st.integers(-10, 10**6)
    | st.floats()
    | TEXT
    | st.lists(st.integers(), max_size=2)
)


@settings(max_examples=200, deadline=None)
@given(option=st.sampled_from(SECONDS_OPTIONS), raw=TEXT)
def test_seconds_from_the_environment_are_finite_or_refused(option: str, raw: str) -> None:
    name = f"AIRFLOW__GPUPOOL__{option.upper()}"
    old = os.environ.get(name)
    os.environ[name] = raw
    try:
        value = getattr(gpupool_settings, option.removesuffix("_seconds") + "_seconds")()
    except ConfigurationError as e:
        assert option in str(e)
    else:
        assert 0 < value < math.inf
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


@settings(max_examples=200, deadline=None)
@given(extras=st.dictionaries(st.sampled_from(EXTRAS[1:]), VALUE, max_size=4))
def test_connection_extras_are_valid_or_refused(extras: dict[str, Any]) -> None:
    try:
        options = options_from({"ledger_url": "sqlite:////tmp/fuzz.db", **extras}, {}, "connection 'fuzz'")
    except ConfigurationError as e:
        assert "connection 'fuzz'" in str(e)
        return
    for seconds in (
        options.lease_ttl_seconds,
        options.reservation_timeout_seconds,
        options.poll_interval_seconds,
    ):
        assert 0 < seconds < math.inf


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "inf", "1e999"])
def test_the_issue_examples_are_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="lease_ttl_seconds"):
        options_from({"ledger_url": "sqlite:////tmp/x.db", "lease_ttl_seconds": value}, {}, "connection 'x'")
