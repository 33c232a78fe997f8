"""A forecast in words."""

from __future__ import annotations

import calendar

import pytest

from airflow_gpupool.forecast.words import describe_forecast, describe_position
from airflow_gpupool.ledger import StartForecast

NOW = float(calendar.timegm((2026, 12, 6, 13, 0, 0)))


@pytest.mark.parametrize(
    ("forecast", "words"),
    [
        pytest.param(None, "no forecast yet", id="none yet"),
        pytest.param(
            StartForecast("r", NOW, "forecast", NOW + 3600, NOW + 3900, NOW + 6000),
            "expected start 14:05 UTC, 90 % by 14:40",
            id="forecast",
        ),
        pytest.param(
            StartForecast("r", NOW, "forecast", NOW - 60, NOW - 30, NOW + 2 * 86400),
            "expected start 13:00 UTC, 90 % by 2026-12-08 13:00",
            id="never in the past; a far date",
        ),
        pytest.param(
            StartForecast("r", NOW, "never", reason="never, on the current nodes"),
            "never, on the current nodes",
            id="never",
        ),
        pytest.param(
            StartForecast("r", NOW, "unknown", reason="no GPU nodes"),
            "start unknown (no GPU nodes)",
            id="unknown",
        ),
    ],
)
def test_words(forecast: StartForecast | None, words: str) -> None:
    assert describe_forecast(forecast, NOW) == words


def test_position() -> None:
    f = StartForecast("r", NOW, "forecast", NOW + 3600, NOW + 3900, NOW + 6000, 3, 12)
    assert describe_position(3, 12, f, NOW) == "position 3 of 12; expected start 14:05 UTC, 90 % by 14:40"
