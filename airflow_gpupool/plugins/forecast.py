"""The page's expected-start cell: the median start, the p10-p90 range in its tooltip."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from airflow_gpupool.forecast.words import clock_time, describe_forecast

if TYPE_CHECKING:
    from airflow_gpupool.ledger import StartForecast

__all__ = ["forecast_cell"]


def forecast_cell(forecast: StartForecast | None, now: float) -> str:
    """Return the queue's expected-start cell: the median start, the p10-p90 range in its tooltip."""
    if forecast is None or forecast.status != "forecast" or forecast.p50 is None:
        return f'<span class="forecast">{escape(describe_forecast(forecast, now))}</span>'
    low = clock_time(max(forecast.p10 or forecast.p50, now), now)
    high = clock_time(max(forecast.p90, now), now) if forecast.p90 is not None else "?"
    tip = f"80 % between {low} and {high} UTC; {forecast.reason}"
    return f'<span class="forecast" title="{escape(tip)}">{clock_time(max(forecast.p50, now), now)}</span>'
