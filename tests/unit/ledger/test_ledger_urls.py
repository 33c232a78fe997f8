"""Ledger URLs: a known driver is normalized to psycopg 3; another driver or database is refused."""

from __future__ import annotations

import pytest

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.ledger.db.engine import normalize_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h:5432/d", "postgresql+psycopg://u@h:5432/d"),
        ("postgresql+psycopg://u@h/d", "postgresql+psycopg://u@h/d"),
        ("postgresql+psycopg2://u@h/d", "postgresql+psycopg://u@h/d"),  # Airflow's own metadata URL
        ("sqlite:////tmp/l.db", "sqlite:////tmp/l.db"),
        ("sqlite+pysqlite:////tmp/l.db", "sqlite+pysqlite:////tmp/l.db"),
    ],
)
def test_a_ledger_url_of_a_known_driver_is_normalized(url: str, expected: str) -> None:
    assert normalize_url(url) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql+nosuchdriver://u@h/d", "driver 'nosuchdriver' is not supported"),
        ("sqlite+aiosqlite:////tmp/l.db", "driver 'aiosqlite' is not supported"),
        ("http://example.invalid/ledger", "only sqlite and postgresql"),
        ("mysql://u@h/d", "only sqlite and postgresql"),
    ],
)
def test_another_driver_or_database_is_refused_not_rewritten(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        normalize_url(url)
