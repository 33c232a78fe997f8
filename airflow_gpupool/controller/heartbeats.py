"""The controller's watch on node agents: quarantine a node whose heartbeats stop, release it after.

:func:`check_heartbeats` runs each reconcile interval (see :mod:`~airflow_gpupool.controller.run`):
the ledger quarantines a node whose agent missed ``[gpupool] missed_heartbeats`` intervals (no new
grants; live grants keep running) and releases one whose heartbeats have been steady for
``[gpupool] heartbeat_stable_seconds``; each change leaves a core/v1 Event on the Node, so
``kubectl describe node`` says why.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_gpupool.ledger import HeartbeatCheck, Ledger

__all__ = ["QUARANTINE_EVENT_REASON", "RELEASE_EVENT_REASON", "check_heartbeats", "node_event"]

log = logging.getLogger(__name__)

QUARANTINE_EVENT_REASON = "GpuPoolNodeQuarantined"
RELEASE_EVENT_REASON = "GpuPoolNodeReleased"
_SOURCE = "gpupool-controller"


def node_event(node: str, reason: str, message: str, now: float, *, warning: bool) -> dict[str, Any]:
    """Return a core/v1 Event about a Node (events of cluster-scoped objects live in ``default``)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node}.gpupool-{int(now * 1000):x}", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": _SOURCE},
        "reportingComponent": _SOURCE,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def check_heartbeats(ledger: Ledger, core_v1_api: Any) -> HeartbeatCheck:
    """Quarantine silent nodes and release recovered ones in the ledger; leave an Event on each.

    :param core_v1_api: a ``kubernetes.client.CoreV1Api`` (None: no events)
    """
    result = ledger.check_heartbeats()
    now = time.time()
    events = [
        node_event(name, QUARANTINE_EVENT_REASON, f"no new GPU grants: {why}", now, warning=True)
        for name, why in result.quarantined
    ] + [
        node_event(
            name, RELEASE_EVENT_REASON, "heartbeats steady again: takes GPU grants", now, warning=False
        )
        for name in result.released
    ]
    for event in events if core_v1_api is not None else ():
        try:
            core_v1_api.create_namespaced_event("default", event)
        except Exception as e:  # the ledger's quarantine is what matters; the event only explains it
            log.warning("Could not record an event on node %s: %s", event["involvedObject"]["name"], e)
    return result
