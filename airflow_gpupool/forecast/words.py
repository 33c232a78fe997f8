"""A stored forecast in words, the one form every reader shows (trigger logs, CLI, page, messages)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_gpupool.ledger import StartForecast

__all__ = ["clock_time", "describe_forecast", "describe_position"]


def clock_time(at: float, now: float) -> str:
    """Return ``14:05`` (UTC), with the date when it is not within the next day."""
    fmt = "%H:%M" if 0 <= at - now < 86400 else "%Y-%m-%d %H:%M"
    return time.strftime(fmt, time.gmtime(at))


def describe_forecast(forecast: StartForecast | None, now: float) -> str:
    """Say when a waiting request is expected to start: ``expected start 14:05 UTC, 90 % by 14:40``.

    :param forecast: its stored forecast (None: none computed yet)
    :param now: the time the words are for; a start already past reads as now
    """
    if forecast is None:
        return "no forecast yet"
    if forecast.status == "never":
        return forecast.reason
    if forecast.status != "forecast" or forecast.p50 is None:
        return f"start unknown ({forecast.reason})"
    p50 = clock_time(max(forecast.p50, now), now)
    if forecast.p90 is None:
        return f"expected start {p50} UTC, 90 % bound unknown"
    return f"expected start {p50} UTC, 90 % by {clock_time(max(forecast.p90, now), now)}"


def describe_position(
    position: int | None, total: int | None, forecast: StartForecast | None, now: float
) -> str:
    """Say ``position 3 of 12; expected start 14:05 UTC, 90 % by 14:40``."""
    where = f"position {position if position is not None else '?'}"
    if total is not None:
        where += f" of {total}"
    return f"{where}; {describe_forecast(forecast, now)}"
