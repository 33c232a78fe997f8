"""The shared checks of small configuration values."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_gpupool.validate import pairs, positive_seconds


@pytest.mark.parametrize(
    ("value", "seconds"), [(5, 5.0), (0.5, 0.5), ("30", 30.0), (timedelta(minutes=2), 120.0)]
)
def test_positive_seconds(value: object, seconds: float) -> None:
    assert positive_seconds(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "positive"),
        (-1, "positive"),
        (float("nan"), "positive"),
        ("soon", "not a number"),
        (True, "not a number"),
        (None, "not a number"),
        (timedelta(0), "positive"),
    ],
)
def test_positive_seconds_refuses(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        positive_seconds(value)


def test_positive_seconds_maximum() -> None:
    assert positive_seconds(10, maximum=10) == 10.0
    with pytest.raises(ValueError, match="more than 10 seconds"):
        positive_seconds(11, maximum=10)


def test_pairs() -> None:
    assert pairs("a100-mig=mig, t4-shared = hami,") == {"a100-mig": "mig", "t4-shared": "hami"}
    assert pairs({"a": 1}) == {"a": "1"}
    assert pairs("") == {}


@pytest.mark.parametrize("bad", ["a100", "=mig", "a100=", "a=b,c"])
def test_pairs_refuses(bad: str) -> None:
    with pytest.raises(ValueError, match="is not 'pool=binding'"):
        pairs(bad, what="pool=binding")
