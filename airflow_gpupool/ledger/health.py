"""Node and GPU health with a source, and the node agent's heartbeats.

Health is set by four sources with a precedence (:data:`SOURCE_RANK`): an admin (``gpupool node
quarantine``) outranks the agent and the controller, which outrank inventory sync. A source may
change a health set by a source of lower or equal rank, or any ``healthy`` one; so inventory sync,
which reads only Kubernetes, never undoes a quarantine, and the controller never releases what an
admin quarantined.

A heartbeat (:meth:`LedgerHealth.record_report`) stores the agent's report, verifies the GPUs'
UUIDs (matched by index and PCI bus id; a mismatch is logged), quarantines a GPU on its own when
its sample is critical (see :mod:`~airflow_gpupool.ledger.agent_report`), and keeps the ledger's
judgement of each GPU (memory leak since when, idle grants, warnings, use per grant) in the node's
``agent_state``. :meth:`LedgerHealth.check_heartbeats` is the controller's side: a node whose
heartbeats stopped for ``missed`` intervals is quarantined, and comes back once they have resumed
for a stable period.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Row, select, update

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.ledger import schema
from airflow_gpupool.ledger.agent_report import GpuAssessment, GpuSample, GrantOnGpu, NodeReport, assess_gpu
from airflow_gpupool.ledger.cycle import WriteCycle, held_on_node
from airflow_gpupool.ledger.engine import transient_retry
from airflow_gpupool.ledger.store import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.resources import NodeHealth

__all__ = [
    "LEAK_ACTIONS",
    "LEAK_REASON",
    "SOURCE_RANK",
    "HeartbeatCheck",
    "HeartbeatResult",
    "LedgerHealth",
    "outranks",
]

log = logging.getLogger(LOGGER_NAME)

#: Who may change a health set by whom: a source changes what a source of its rank or lower set.
SOURCE_RANK: dict[str, int] = {"inventory": 0, "agent": 1, "controller": 1, "admin": 2}
#: What a leak does: only report it, or also quarantine the GPU until it is clean.
LEAK_ACTIONS = ("report", "quarantine")
#: The reason a GPU quarantined for a leak carries; such a quarantine ends by itself once clean.
LEAK_REASON = "gpu_memory_leak"
_HEALTHY = NodeHealth.HEALTHY.value
_QUARANTINED = NodeHealth.QUARANTINED.value


def outranks(source: str, current_source: str, current_health: str) -> bool:
    """Whether ``source`` may change a health that ``current_source`` set to ``current_health``."""
    if current_health == _HEALTHY:
        return True
    return SOURCE_RANK[source] >= SOURCE_RANK.get(current_source, 0)


def _check_source(source: str) -> None:
    if source not in SOURCE_RANK:
        raise InvalidInventoryError("health source", source, f"one of {sorted(SOURCE_RANK)}")


@dataclass(frozen=True)
class HeartbeatResult:
    """What one heartbeat changed.

    :param verified: GPU indices whose UUID the report verified or changed
    :param mismatches: what did not match the inventory (logged)
    :param quarantined: ``(uuid, reason)`` of GPUs quarantined by this report
    :param released: UUIDs of GPUs whose leak quarantine ended
    :param leaks: the leaks past their grace, one dict per GPU
    :param warnings: per reservation id, why it should checkpoint now
    """

    node: str
    verified: tuple[int, ...] = ()
    mismatches: tuple[str, ...] = ()
    quarantined: tuple[tuple[str, str], ...] = ()
    released: tuple[str, ...] = ()
    leaks: tuple[dict[str, Any], ...] = ()
    warnings: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class HeartbeatCheck:
    """What the controller's heartbeat check did: nodes quarantined and released, with why."""

    quarantined: tuple[tuple[str, str], ...] = ()
    released: tuple[str, ...] = ()


class LedgerHealth:
    """Health with a source, and heartbeats (see :class:`~airflow_gpupool.ledger.Ledger`)."""

    def __init__(self, store: LedgerStore, cycle: WriteCycle) -> None:
        self.store = store
        self._cycle = cycle

    # -- health ----------------------------------------------------------------------------

    def set_node_health(self, name: str, health: NodeHealth | str, *, source: str, reason: str = "") -> bool:
        """Set a node's health as ``source``; False (nothing changed) when a higher source set it."""
        try:
            value = NodeHealth(health).value
        except ValueError:
            raise InvalidInventoryError("health", health, f"one of {[h.value for h in NodeHealth]}") from None
        _check_source(source)

        def run(tx: Tx) -> bool:
            row = tx.conn.execute(select(schema.nodes).where(schema.nodes.c.name == name)).first()
            if row is None:
                raise InvalidInventoryError("node", name, "a node of the inventory")
            if not outranks(source, row.health_source, row.health):
                log.info(
                    "Node %s stays %s (set by %s): %s may not change it",
                    name,
                    row.health,
                    row.health_source,
                    source,
                )
                return False
            tx.conn.execute(
                update(schema.nodes)
                .where(schema.nodes.c.name == name)
                .values(
                    health=value,
                    health_source="inventory" if value == _HEALTHY else source,
                    health_reason=reason or None,
                    version=tx.version,
                    # Any health but draining cancels a pending removal: the operator wants the node back.
                    remove_when_drained=value == NodeHealth.DRAINING.value,
                )
            )
            log.info("Node %s is now %s (%s%s)", name, value, source, f": {reason}" if reason else "")
            self.reserve_again(tx)
            return True

        return self._cycle.write(run)

    def set_gpu_health(
        self, node: str, gpu: str, health: NodeHealth | str, *, source: str, reason: str = ""
    ) -> bool:
        """Set one GPU's health (by UUID, or index) as ``source``; False when a higher source set it."""
        value = NodeHealth(health).value
        if value not in (_HEALTHY, _QUARANTINED):
            raise InvalidInventoryError("gpu health", health, "healthy or quarantined")
        _check_source(source)

        def run(tx: Tx) -> bool:
            row = _gpu_row(tx, node, gpu)
            if not outranks(source, row.health_source, row.health):
                return False
            _write_gpu_health(tx, node, row.idx, value, source, reason)
            self.reserve_again(tx)
            return True

        return self._cycle.write(run)

    def reserve_again(self, tx: Tx) -> None:
        """Read the capacity again (health changed what fits) and serve the queue on it."""
        tx.dirty, tx.exact = True, False
        self.store.cache.reload(tx.conn)
        tx.nodes = dict(self.store.cache.nodes)
        self._cycle.serve(tx)

    # -- heartbeats ------------------------------------------------------------------------

    def record_report(
        self, report: NodeReport, *, missed: int, leak_grace_s: float, leak_action: str = "report"
    ) -> HeartbeatResult:
        """Store a heartbeat with the agent's report; act on what it shows (one transaction).

        :param missed: heartbeats a node may miss (its streak restarts after a longer gap)
        :param leak_grace_s: how long memory may stay used with no grant before it is a leak
        :param leak_action: ``report``, or ``quarantine`` the GPU until it is clean
        :raises InvalidInventoryError: the node is not in the inventory (sync it first)
        """
        if leak_action not in LEAK_ACTIONS:
            raise InvalidInventoryError("leak action", leak_action, f"one of {list(LEAK_ACTIONS)}")

        def run(tx: Tx) -> HeartbeatResult:
            return _Heartbeat(self, tx, report, missed, leak_grace_s, leak_action).apply()

        if self.store.dialect == "postgresql":
            quick = self._record_unlocked(report, missed, leak_grace_s, leak_action)
            if quick is not None:
                return quick
        return self._cycle.write(run)

    @transient_retry
    def _record_unlocked(
        self, report: NodeReport, missed: int, leak_grace_s: float, leak_action: str
    ) -> HeartbeatResult | None:
        """The common heartbeat (nothing to verify, quarantine or release) without the ledger's lock.

        It changes only the node's heartbeat columns, which no placement reads, under the node's row
        lock (taken first, as every writer of a node does), so grants and releases on the
        concurrent path go on beside it. A report that changes capacity (a UUID, a GPU's health)
        returns None and takes the serialized path.
        """
        with self.store.engine.begin() as conn:
            # A heartbeat lost in a server crash is harmless (the next comes one interval later):
            # don't wait for the WAL flush.
            conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            self.store.check_schema(conn)
            tx = Tx(conn, self.store.clock(conn), 0, {})
            try:
                return _Heartbeat(self, tx, report, missed, leak_grace_s, leak_action, locked=False).apply()
            except _NeedsLock:
                conn.rollback()
                return None

    def check_heartbeats(self, *, missed: int, stable_s: float) -> HeartbeatCheck:
        """Quarantine nodes whose agent went silent for ``missed`` intervals; release recovered ones.

        Only nodes that ever sent a heartbeat are judged (a node with no agent is left alone). A node
        comes back once its heartbeats have come without a gap for ``stable_s`` seconds, and only if
        the controller quarantined it.
        """

        def run(tx: Tx) -> HeartbeatCheck:
            n = schema.nodes.c
            rows = tx.conn.execute(
                select(
                    n.name,
                    n.health,
                    n.health_source,
                    n.heartbeat_at,
                    n.heartbeat_interval,
                    n.heartbeat_streak_since,
                )
                .where(n.heartbeat_at.is_not(None), n.heartbeat_interval.is_not(None))
                .order_by(n.name)
            ).all()
            quarantined: list[tuple[str, str]] = []
            released: list[str] = []
            for row in rows:
                silent = tx.now - row.heartbeat_at
                if silent > missed * row.heartbeat_interval:
                    if row.health == _HEALTHY or (
                        row.health != _QUARANTINED and outranks("controller", row.health_source, row.health)
                    ):
                        reason = f"no heartbeat for {silent:.0f}s ({missed} intervals of {row.heartbeat_interval:g}s missed)"
                        _write_node_health(tx, row.name, _QUARANTINED, "controller", reason)
                        quarantined.append((row.name, reason))
                elif (
                    row.health == _QUARANTINED
                    and row.health_source == "controller"
                    and tx.now - (row.heartbeat_streak_since or tx.now) >= stable_s
                ):
                    _write_node_health(tx, row.name, _HEALTHY, "inventory", None)
                    released.append(row.name)
            if quarantined or released:
                for name, reason in quarantined:
                    log.warning("Node %s quarantined: %s", name, reason)
                for name in released:
                    log.info("Node %s released: heartbeats steady for %.0fs", name, stable_s)
                self.reserve_again(tx)
            return HeartbeatCheck(tuple(quarantined), tuple(released))

        return self._cycle.write(run)


def _gpu_row(tx: Tx, node: str, gpu: str) -> Row[Any]:
    g = schema.gpus.c
    rows = tx.conn.execute(select(schema.gpus).where(g.node == node)).all()
    for row in rows:
        if row.uuid == gpu or str(row.idx) == str(gpu):
            return row
    raise InvalidInventoryError(f"node {node} gpu", gpu, f"one of {[r.uuid for r in rows] or 'its GPUs'}")


def _write_gpu_health(tx: Tx, node: str, idx: int, value: str, source: str, reason: str | None) -> None:
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


def _write_node_health(tx: Tx, name: str, value: str, source: str, reason: str | None) -> None:
    tx.conn.execute(
        update(schema.nodes)
        .where(schema.nodes.c.name == name)
        .values(health=value, health_source=source, health_reason=reason, version=tx.version)
    )


class _NeedsLock(Exception):
    """A heartbeat found a change of capacity: it must run under the ledger's write lock."""


class _Heartbeat:
    """One report applied in one transaction (split out of :meth:`LedgerHealth.record_report`).

    :param locked: the transaction holds the ledger's write lock; without it a change of
        capacity raises :class:`_NeedsLock` before anything is written
    """

    def __init__(
        self,
        health: LedgerHealth,
        tx: Tx,
        report: NodeReport,
        missed: int,
        grace: float,
        action: str,
        *,
        locked: bool = True,
    ) -> None:
        self.locked = locked
        self.health = health
        self.tx = tx
        self.report = report
        self.missed = missed
        self.grace = grace
        self.action = action
        self.mismatches: list[str] = []
        self.verified: list[int] = []
        self.quarantined: list[tuple[str, str]] = []
        self.released: list[str] = []
        self.structural = False

    def apply(self) -> HeartbeatResult:
        tx, report = self.tx, self.report
        # The node's row first, locked: the order every writer of a node follows (pg_functions.py).
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
        grants = _grants_by_gpu(self.health, tx, report.node, node.node_pool)
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
            self.health.reserve_again(tx)
        return HeartbeatResult(
            report.node,
            tuple(self.verified),
            tuple(self.mismatches),
            tuple(self.quarantined),
            tuple(self.released),
            tuple(leaks),
            {k: v for k, v in warnings.items() if v},
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
            _write_gpu_health(self.tx, self.report.node, row.idx, _QUARANTINED, "agent", "; ".join(reasons))
            self.quarantined.append((sample.uuid or row.uuid, "; ".join(reasons)))
            self.structural = True
        elif (
            not reasons
            and row.health == _QUARANTINED
            and row.health_source == "agent"
            and (row.health_reason or "").startswith(LEAK_REASON)
        ):
            self._need_lock()
            _write_gpu_health(self.tx, self.report.node, row.idx, _HEALTHY, "agent", None)
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
        self.structural = True

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
    health: LedgerHealth, tx: Tx, node: str, node_pool: str
) -> dict[int, tuple[GrantOnGpu, ...]]:
    out: dict[int, list[GrantOnGpu]] = defaultdict(list)
    for h in held_on_node(health.store, tx.conn, node):
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
