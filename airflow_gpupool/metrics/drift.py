"""The gauge of the ledger's drift from the cluster: ``gpupool_ledger_drift_gpus{node}``.

Drift needs the cluster's pods as well as the ledger, so this collector is registered only where
the API server can be read: ``gpupool metrics serve --kubeconfig F`` (or in-cluster), not the
Airflow API server's ``/gpupool/metrics``, which reads the ledger alone. Each scrape lists every
pod and reads one snapshot; the value is :func:`~airflow_gpupool.ledger.ledger_drift`'s, in GPUs
(0 on a node whose books agree). A scrape that cannot list the pods yields no drift series, so
the alert neither fires nor clears on a guess; the ledger's own ``gpupool_ledger_up`` covers a
ledger that does not answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpupool.ledger import NodeDrift, ledger_drift
from airflow_gpupool.redact import scrub

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from airflow_gpupool.ledger import Ledger

__all__ = ["DRIFT_METRIC_NAMES", "LedgerDriftCollector", "drift_metrics"]

log = logging.getLogger(__name__)

DRIFT_METRIC_NAMES = ("gpupool_ledger_drift_gpus",)


def drift_metrics(rows: Iterable[NodeDrift]) -> list[Metric]:
    """Return the drift gauge, one series per node whose drift was computed.

    :param rows: :func:`~airflow_gpupool.ledger.ledger_drift` given a pod list
    """
    from prometheus_client.core import GaugeMetricFamily

    drift = GaugeMetricFamily(
        "gpupool_ledger_drift_gpus",
        "GPUs the ledger holds on the node that its live pods do not run, plus GPUs they run that the "
        "ledger does not hold (summed per grant, external hold and pod)",
        labels=["node"],
    )
    for row in rows:
        if row.drift is not None:
            drift.add_metric([row.node], row.drift)
    return [drift]


class LedgerDriftCollector:
    """Compare the ledger with the cluster's pods on each scrape.

    :param ledger: the ledger to read
    :param pods: returns every pod in the cluster as JSON (``list_objects(api.list_pod_for_all_namespaces)``)
    """

    def __init__(self, ledger: Ledger, pods: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        self._ledger = ledger
        self._pods = pods

    def describe(self) -> list[Metric]:
        """Return nothing, so registering reads neither the ledger nor the cluster."""
        return []

    def collect(self) -> Iterator[Metric]:
        """List the pods, read one snapshot and yield the drift gauge."""
        try:
            pods = list(self._pods())
            rows = ledger_drift(self._ledger.snapshot(), pods)
        except Exception as e:  # the cluster or the ledger unreachable: no drift this scrape
            log.error(
                "Could not compare the GPU ledger with the cluster's pods: %s: %s",
                type(e).__name__,
                scrub(str(e), self._ledger.url),
            )
            return
        yield from drift_metrics(rows)
