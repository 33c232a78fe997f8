"""One heartbeat of a node agent applied to the ledger: UUIDs verified, GPUs judged, state kept.

:class:`HeartbeatWrite` is the body of :meth:`airflow_gpupool.ledger.nodes.health.LedgerHealth.record_report`:
it matches the report's GPUs with the inventory's by index (and PCI bus id), judges each sample
(:func:`~airflow_gpupool.ledger.nodes.agent_report.assess_gpu`), quarantines or releases a GPU, and keeps
the ledger's judgement of each GPU in the node's ``agent_state`` for the next heartbeat, status and
metrics. Without the ledger's write lock (PostgreSQL's quick path) a change of capacity raises
``NEEDS_LOCK`` before anything is written.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Row, select, update

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.nodes.agent_report import (
    GpuAssessment,
    GpuSample,
    GrantOnGpu,
    NodeReport,
    assess_gpu,
)
from airflow_gpupool.ledger.nodes.external_move import HoldDrift, HoldMove, correct_external_holds
from airflow_gpupool.ledger.store.ends import held_on_node
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.resources import NodeHealth

__all__ = ["LEAK_REASON", "NEEDS_LOCK", "HeartbeatResult", "HeartbeatWrite", "write_gpu_health"]

log = logging.getLogger(LOGGER_NAME)

#: The reason a GPU quarantined for a leak carries; such a quarantine ends by itself once clean.
LEAK_REASON = "gpu_memory_leak"
_HEALTHY = NodeHealth.HEALTHY.value
_QUARANTINED = NodeHealth.QUARANTINED.value


@dataclass(frozen=True)
class HeartbeatResult:
    """What one heartbeat changed.

    :param verified: GPU indices whose UUID the report verified or changed
    :param mismatches: what did not match the inventory (logged)
    :param quarantined: ``(uuid, reason)`` of GPUs quarantined by this report
    :param released: UUIDs of GPUs whose leak quarantine ended
    :param leaks: the leaks past their grace, one dict per GPU
    :param warnings: per reservation id, why it should checkpoint now
    :param moved: external holds moved onto the GPUs the agent sees their pods on
    :param drift: foreign pods seen on GPUs that grants hold (the node was marked suspect)
    """

    node: str
    verified: tuple[int, ...] = ()
    mismatches: tuple[str, ...] = ()
    quarantined: tuple[tuple[str, str], ...] = ()
    released: tuple[str, ...] = ()
    leaks: tuple[dict[str, Any], ...] = ()
    warnings: dict[str, list[str]] = field(default_factory=dict)
    moved: tuple[HoldMove, ...] = ()
    drift: tuple[HoldDrift, ...] = ()


def write_gpu_health(tx: Tx, node: str, idx: int, value: str, source: str, reason: str | None) -> None:
    g = schema.gpus.c
    tx.conn.execute(
        update(schema.gpus)
        .where(g.node == node, g.idx == idx)
        .values(
            health=value,
            health_source="inventory" if value == _HEALTHY else source,
            health_reason=reason or None,
        )
    )
    # The GPU's health is part of its node's capacity: stamp the node so every copy reads it again.
    tx.conn.execute(update(schema.nodes).where(schema.nodes.c.name == node).values(version=tx.version))
    tx.dirty, tx.exact = True, False
    log.warning("GPU %s/%d is now %s (%s%s)", node, idx, value, source, f": {reason}" if reason else "")


class _NeedsLock(Exception):
    """A heartbeat found a change of capacity: it must run under the ledger's write lock."""


#: What a heartbeat without the ledger's lock raises when it must take the serialized path (internal
#: control flow, never seen by callers of the ledger).
NEEDS_LOCK = _NeedsLock


class HeartbeatWrite:
    """One report applied in one transaction (:meth:`LedgerHealth.record_report <airflow_gpupool.ledger.nodes.health.LedgerHealth.record_report>`).

    :param locked: the transaction holds the ledger's write lock; without it a change of
        capacity raises ``NEEDS_LOCK`` before anything is written
    """

    def __init__(
        self,
        store: LedgerStore,
        reserve_again: Callable[[Tx], None],
        tx: Tx,
        report: NodeReport,
        missed: int,
        grace: float,
        action: str,
        *,
        locked: bool = True,
    ) -> None:
        self.locked = locked
        self.store = store
        self.reserve_again = reserve_again
        self.tx = tx
        self.report = report
        self.missed = missed
        self.grace = grace
        self.action = action
        self.mismatches: list[str] = []
        self.verified: list[int] = []
        self.quarantined: list[tuple[str, str]] = []
        self.released: list[str] = []
        # A GPU's health changed: what fits changed, so the queue is served again.
        self.structural = False

    def apply(self) -> HeartbeatResult:
        tx, report = self.tx, self.report
        # The node's row first, locked: the order every writer of a node follows (postgres/sql/).
        node = tx.conn.execute(
            select(schema.nodes).where(schema.nodes.c.name == report.node).with_for_update()
        ).first()
        if node is None:
            raise InvalidInventoryError(
                "node", report.node, "a node of the inventory (run inventory sync first)"
            )
        rows = {
            r.idx: r for r in tx.conn.execute(select(schema.gpus).where(schema.gpus.c.node == report.node))
        }
        previous = _previous(node.agent_state)
        # Holds first: the GPUs are then judged with the holds where their pods really run.
        corrected = correct_external_holds(
            tx, report, set(rows), suspect=node.suspect_since is not None, need_lock=self._need_lock
        )
        self.structural = corrected.changed
        grants = _grants_by_gpu(self.store, tx, report.node, node.node_pool)
        state: dict[str, Any] = {}
        leaks: list[dict[str, Any]] = []
        warnings: dict[str, list[str]] = defaultdict(list)
        for sample in report.gpus:
            row = rows.get(sample.index)
            before = previous["samples"].get(sample.index)
            assessment = assess_gpu(
                sample,
                before,
                previous["gpus"].get(str(sample.index), {}),
                grants.get(sample.index, ()),
                now=tx.now,
                leak_grace_s=self.grace,
            )
            if row is None:
                self.mismatches.append(
                    f"GPU {sample.index} ({sample.uuid}, bus {sample.bus_id}) is not in the inventory"
                )
            else:
                if sample.uuid:  # a lost GPU tells nothing of its UUID or bus
                    self._verify(row, sample)
                self._act(row, sample, assessment)
            state[str(sample.index)] = _gpu_state(sample, assessment)
            if assessment.leak is not None:
                leaks.append(
                    {"node": report.node, "gpu": sample.uuid, "index": sample.index, **assessment.leak}
                )
            for g in grants.get(sample.index, ()):
                warnings[g.reservation_id] += list(assessment.warnings)
        for idx in sorted(set(rows) - {s.index for s in report.gpus}):
            self.mismatches.append(f"inventory GPU {idx} ({rows[idx].uuid}) is not reported by the agent")
        for message in self.mismatches:
            log.warning("Node %s: %s", report.node, message)
        self._write_node(node, state)
        if self.structural:
            self.reserve_again(tx)
        return HeartbeatResult(
            report.node,
            tuple(self.verified),
            tuple(self.mismatches),
            tuple(self.quarantined),
            tuple(self.released),
            tuple(leaks),
            {k: v for k, v in warnings.items() if v},
            tuple(corrected.moves),
            tuple(corrected.drift),
        )

    def _verify(self, row: Row[Any], sample: GpuSample) -> None:
        if row.bus_id is not None and row.bus_id != sample.bus_id:
            self.mismatches.append(f"GPU {row.idx} moved from bus {row.bus_id} to {sample.bus_id}")
        if row.uuid_verified and row.uuid != sample.uuid:
            self.mismatches.append(f"GPU {row.idx} was {row.uuid}, now {sample.uuid} (replaced?)")
        elif not row.uuid_verified and row.uuid != sample.uuid:
            log.info(
                "Node %s GPU %d: inventory UUID %s replaced by %s",
                self.report.node,
                row.idx,
                row.uuid,
                sample.uuid,
            )
        if row.uuid_verified and row.uuid == sample.uuid and row.bus_id == sample.bus_id:
            return
        self._need_lock()
        g = schema.gpus.c
        self.tx.conn.execute(
            update(schema.gpus)
            .where(g.node == self.report.node, g.idx == row.idx)
            .values(uuid=sample.uuid, uuid_verified=True, bus_id=sample.bus_id)
        )
        self.verified.append(row.idx)
        self._stamp()

    def _act(self, row: Row[Any], sample: GpuSample, assessment: GpuAssessment) -> None:
        reasons = list(assessment.quarantine)
        if assessment.leak is not None and self.action == "quarantine":
            reasons.append(
                f"{LEAK_REASON}: {assessment.leak['memory_mib']} MiB held by pids {assessment.leak['pids']}"
            )
        if reasons and row.health == _HEALTHY:
            self._need_lock()
            write_gpu_health(self.tx, self.report.node, row.idx, _QUARANTINED, "agent", "; ".join(reasons))
            self.quarantined.append((sample.uuid or row.uuid, "; ".join(reasons)))
            self.structural = True
        elif (
            not reasons
            and row.health == _QUARANTINED
            and row.health_source == "agent"
            and (row.health_reason or "").startswith(LEAK_REASON)
        ):
            self._need_lock()
            write_gpu_health(self.tx, self.report.node, row.idx, _HEALTHY, "agent", None)
            self.released.append(sample.uuid)
            self.structural = True

    def _need_lock(self) -> None:
        if not self.locked:
            raise _NeedsLock

    def _stamp(self) -> None:
        self.tx.conn.execute(
            update(schema.nodes)
            .where(schema.nodes.c.name == self.report.node)
            .values(version=self.tx.version)
        )
        self.tx.dirty, self.tx.exact = True, False
        # New UUIDs change nothing placement decides on, but grants carry them: read them again.
        self.store.cache.mark_stale()

    def _write_node(self, node: Row[Any], gpu_state: dict[str, Any]) -> None:
        tx = self.tx
        interval = self.report.interval_s
        gap = tx.now - node.heartbeat_at if node.heartbeat_at is not None else None
        allowed = self.missed * (node.heartbeat_interval or interval)
        streak = node.heartbeat_streak_since if gap is not None and gap <= allowed else tx.now
        agent_state = {"report": self.report.to_dict(), "gpus": gpu_state, "received_at": tx.now}
        tx.conn.execute(
            update(schema.nodes)
            .where(schema.nodes.c.name == self.report.node)
            .values(
                heartbeat_at=tx.now,
                heartbeat_interval=interval,
                heartbeat_streak_since=streak if streak is not None else tx.now,
                agent_state=json.dumps(agent_state, separators=(",", ":")),
            )
        )


def _previous(agent_state: str | None) -> dict[str, Any]:
    if not agent_state:
        return {"samples": {}, "gpus": {}}
    data = json.loads(agent_state)
    report = NodeReport.from_dict(data["report"])
    return {"samples": {g.index: g for g in report.gpus}, "gpus": data.get("gpus") or {}}


def _grants_by_gpu(
    store: LedgerStore, tx: Tx, node: str, node_pool: str
) -> dict[int, tuple[GrantOnGpu, ...]]:
    out: dict[int, list[GrantOnGpu]] = defaultdict(list)
    for h in held_on_node(store, tx.conn, node):
        a = h.assignment
        for i in a.gpu_indices:
            out[i].append(
                GrantOnGpu(
                    reservation_id=h.row.id,
                    pod_uid=h.row.pod_uid,
                    team=h.request.team,
                    node_pool=node_pool,
                    milli=a.milli_per_gpu,
                    memory_mib=a.gpu_memory_mib,
                    granted_at=h.row.granted_at or tx.now,
                )
            )
    return {i: tuple(g) for i, g in out.items()}


def _gpu_state(sample: GpuSample, assessment: GpuAssessment) -> dict[str, Any]:
    """What the ledger keeps of one GPU between heartbeats and shows in status and the UI."""
    return {
        "uuid": sample.uuid,
        "memory_used_mib": sample.memory_used_mib,
        "memory_total_mib": sample.memory_total_mib,
        "utilization": sample.utilization_gpu,
        "temperature_c": sample.temperature_c,
        "processes": [
            {"pid": p.pid, "memory_mib": p.memory_mib, "pod_uid": p.pod_uid} for p in sample.all_processes
        ],
        "leak_since": assessment.leak_since,
        "leak": assessment.leak,
        "idle": assessment.idle,
        "warnings": list(assessment.warnings),
        "critical": list(assessment.quarantine),
        "usage": assessment.usage,
    }
