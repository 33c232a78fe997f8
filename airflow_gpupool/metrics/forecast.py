"""The forecast's metric: when each team's queue next moves.

``gpupool_forecast_wait_seconds{team,quantile}`` (a gauge): for each team's first waiting request
in service order (the next of its requests to start), the p10, p50 and p90 of its forecast start
(quantile ``0.1``, ``0.5``, ``0.9``) as seconds from the scrape, 0 for a start already due. Teams
whose first request has no forecast, or says "never" or "unknown", have no series: an alert on
``absent`` or on a value above the team's reservation timeout reads straight off it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from airflow_gpupool.ledger import LedgerSnapshot, StartForecast

__all__ = ["FORECAST_METRIC_NAMES", "forecast_metrics"]

FORECAST_METRIC_NAMES = ("gpupool_forecast_wait_seconds",)


def forecast_metrics(snapshot: LedgerSnapshot, forecasts: Mapping[str, StartForecast]) -> list[Metric]:
    """Return the forecast gauge for the snapshot's queue and the stored forecasts."""
    from prometheus_client.core import GaugeMetricFamily

    gauge = GaugeMetricFamily(
        FORECAST_METRIC_NAMES[0],
        "Forecast wait of each team's next waiting request, seconds from now",
        labels=["team", "quantile"],
    )
    seen: set[str] = set()
    for reservation in snapshot.queue:  # in service order
        team = reservation.request.team
        if team in seen:
            continue
        seen.add(team)
        f = forecasts.get(reservation.id)
        if f is None or f.status != "forecast":
            continue
        for quantile, at in (("0.1", f.p10), ("0.5", f.p50), ("0.9", f.p90)):
            if at is not None:
                gauge.add_metric([team, quantile], max(0.0, at - snapshot.taken_at))
    return [gauge]
