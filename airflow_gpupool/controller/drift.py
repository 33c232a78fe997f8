"""The controller's drift step: the ledger's books beside the pods its watch has cached, each pass.

:class:`DriftKeeper` compares each node's grants and external holds with the live GPU pods the
pod watch keeps (:class:`~airflow_gpupool.controller.external_pods.GpuPodCache`: no list of its
own, so a pass costs one ledger snapshot and no API call), with the same rule as ``gpupool
status`` and the exporter (:func:`~airflow_gpupool.ledger.ledger_drift`). It remembers since when
each node drifts, logs a warning once a node has drifted for ``[gpupool] drift_alert_seconds`` (and
once more when it agrees again), and stores the result in the ledger
(:class:`~airflow_gpupool.ledger.LedgerDriftRecords`) for the page, which has no cluster access.
It writes when a node's numbers change, and at least every :attr:`DriftKeeper.refresh_seconds` so
the page can tell a fresh row from a stale one. A restarted controller takes ``since`` from the
stored rows, so a node's drift does not start again from zero.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpupool.ledger import DriftRecord, LedgerDriftRecords, NodeDrift, ledger_drift

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.pod_gpus import ClaimLookup

__all__ = ["DriftKeeper", "DriftPass", "drift_records"]

log = logging.getLogger(__name__)


@dataclass
class DriftPass:
    """What one drift pass found.

    :param drifting: nodes whose books disagree with their pods now
    :param alerted: nodes that drifted past the alert time this pass (logged)
    :param written: whether the rows were stored
    """

    drifting: list[str] = field(default_factory=list)
    alerted: list[str] = field(default_factory=list)
    written: bool = False


def drift_records(
    rows: list[NodeDrift], now: float, since: dict[str, float]
) -> tuple[list[DriftRecord], dict[str, float]]:
    """Return the records of one pass and, per drifting node, since when it drifts (pure).

    :param rows: :func:`~airflow_gpupool.ledger.ledger_drift` with pods
    :param now: the ledger's clock
    :param since: the previous pass's ``since`` per node
    """
    records, drifting = [], {}
    for row in rows:
        drift = row.drift or 0.0
        start = since.get(row.node, now) if drift else None
        if start is not None:
            drifting[row.node] = start
        records.append(DriftRecord(row.node, row.running or 0.0, drift, row.mismatched, start, now))
    return records, drifting


class DriftKeeper:
    """One drift pass per call.

    :param ledger: the ledger
    :param pods: returns the live GPU pods (the watch's cache), or None while it has listed nothing
    :param alert_seconds: a node drifting this long is logged (``[gpupool] drift_alert_seconds``)
    :param claims: reads the DRA ResourceClaims the pods name (the pod watch's cache)
    """

    refresh_seconds = 60.0

    def __init__(
        self,
        ledger: Ledger,
        pods: Callable[[], list[dict[str, Any]] | None],
        alert_seconds: float,
        claims: ClaimLookup | None = None,
    ) -> None:
        self.ledger = ledger
        self.pods = pods
        self.claims = claims
        self.alert_seconds = alert_seconds
        self._records = LedgerDriftRecords(ledger)
        self._since: dict[str, float] | None = None  # read from the stored rows on the first pass
        self._alerted: set[str] = set()
        self._last: tuple[tuple[Any, ...], ...] | None = None
        self._written_at = float("-inf")

    def __call__(self) -> DriftPass | None:
        """Compare, log what drifted too long, store; None while the watch has listed nothing."""
        pods = self.pods()
        if pods is None:
            return None
        if self._since is None:
            self._since = {n: r.since for n, r in self._records.get().items() if r.since is not None}
        now = self.ledger.now()
        records, self._since = drift_records(
            ledger_drift(self.ledger.snapshot(), pods, self.claims), now, self._since
        )
        result = DriftPass(drifting=sorted(self._since))
        by_node = {r.node: r for r in records}
        for node, start in sorted(self._since.items()):
            if now - start >= self.alert_seconds and node not in self._alerted:
                self._alerted.add(node)
                result.alerted.append(node)
                row = by_node[node]
                log.warning(
                    "Node %s: the ledger's books have disagreed with its pods for %.0fs (%g GPUs: %s); "
                    "the controller's external holds and resyncs should close it: look for pods the "
                    "watch cannot read, or grants whose pods never started",
                    node,
                    now - start,
                    row.drift,
                    "; ".join(row.mismatched),
                )
        for node in sorted(self._alerted - set(self._since)):
            self._alerted.discard(node)
            log.info("Node %s: the ledger's books agree with its pods again", node)
        numbers = tuple((r.node, r.running, r.drift, r.mismatched, r.since) for r in records)
        if numbers != self._last or now - self._written_at >= self.refresh_seconds:
            self._records.replace(records)
            self._last, self._written_at, result.written = numbers, now, True
        return result
