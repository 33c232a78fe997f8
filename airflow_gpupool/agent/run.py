"""The agent's loop: sample, write a heartbeat with the report, wait for the next interval.

A failed write (the ledger unreachable, the node not yet synced into the inventory) is logged and
tried again at the next interval: a missed heartbeat is what the controller watches for, so the
agent keeps going rather than exit. Only a node with no GPU (:class:`NoGpuError`) ends it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.validate import positive_seconds

if TYPE_CHECKING:
    from airflow_gpupool.agent.collect import NvmlCollector
    from airflow_gpupool.health import LoopHealth
    from airflow_gpupool.ledger import HeartbeatResult, Ledger, NodeReport

__all__ = ["AgentPass", "NodeAgent"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentPass:
    """One interval: the report, what the ledger did with it, or why it could not be written.

    :param cpu_s: CPU seconds this process spent on the pass (sampling and writing)
    """

    report: NodeReport
    result: HeartbeatResult | None = None
    error: str | None = None
    cpu_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (``--json``)."""
        r = self.result
        return {
            "report": self.report.to_dict(),
            "heartbeat": None
            if r is None
            else {
                "verified": list(r.verified),
                "mismatches": list(r.mismatches),
                "quarantined": [{"uuid": u, "reason": why} for u, why in r.quarantined],
                "released": list(r.released),
                "leaks": list(r.leaks),
                "warnings": r.warnings,
            },
            "error": self.error,
            "cpu_s": self.cpu_s,
        }


class NodeAgent:
    """Samples a node's GPUs and writes a heartbeat each interval.

    :param collector: an open :class:`~airflow_gpupool.agent.collect.NvmlCollector`
    :param ledger: where heartbeats go; None only prints (``--once`` without a ledger)
    :param interval: seconds between heartbeats
    :param health: told of each pass :meth:`run` ends (the liveness and readiness probes)
    """

    def __init__(
        self,
        collector: NvmlCollector,
        ledger: Ledger | None,
        interval: float,
        *,
        health: LoopHealth | None = None,
    ) -> None:
        self.health = health
        self.collector = collector
        self.ledger = ledger
        self.interval = positive_seconds(interval)

    def run_pass(self) -> AgentPass:
        """Sample once and write the heartbeat; a failed write is in ``error``, not raised."""
        started = _cpu_seconds()
        report = self.collector.sample(self.interval)
        if self.ledger is None:
            return AgentPass(report, cpu_s=_cpu_seconds() - started)
        try:
            result = self.ledger.record_report(report)
        except GpuPoolError as e:  # not in the inventory yet, the ledger busy or away: next interval
            log.warning("Heartbeat of %s not written (tried again in %gs): %s", report.node, self.interval, e)
            return AgentPass(report, error=f"{type(e).__name__}: {e}", cpu_s=_cpu_seconds() - started)
        for uuid, reason in result.quarantined:
            log.warning("GPU %s of %s quarantined: %s", uuid, report.node, reason)
        for leak in result.leaks:
            log.warning("GPU memory leak on %s: %s", report.node, leak)
        return AgentPass(report, result, cpu_s=_cpu_seconds() - started)

    def run(self, stop: threading.Event) -> None:
        """Run passes every interval until ``stop`` is set (waiting ends as soon as it is)."""
        while not stop.is_set():
            began = time.monotonic()
            self.run_pass()
            if self.health is not None:
                self.health.beat()
            stop.wait(max(0.0, self.interval - (time.monotonic() - began)))


def _cpu_seconds() -> float:
    # This thread's CPU time: agents of several emulated nodes may share one process (the demo).
    return time.thread_time()
