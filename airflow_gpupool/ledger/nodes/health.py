"""Node and GPU health with a source, and the node agent's heartbeats.

Health is set by four sources with a precedence (:data:`SOURCE_RANK`): an admin (``gpupool node
quarantine``) outranks the agent and the controller, which outrank inventory sync. A source may
change a health set by a source of lower or equal rank, or any ``healthy`` one; so inventory sync,
which reads only Kubernetes, never undoes a quarantine, and the controller never releases what an
admin quarantined.

A heartbeat (:meth:`LedgerHealth.record_report`) stores the agent's report, verifies the GPUs'
UUIDs (matched by index and PCI bus id; a mismatch is logged), quarantines a GPU on its own when
its sample is critical (see :mod:`~airflow_gpupool.ledger.nodes.agent_report`), and keeps the ledger's
judgement of each GPU (memory leak since when, idle grants, warnings, use per grant) in the node's
``agent_state``. :meth:`LedgerHealth.check_heartbeats` is the controller's side: a node whose
heartbeats stopped for ``missed`` intervals is quarantined, and comes back once they have resumed
for a stable period.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, select, update

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.engine import transient_retry
from airflow_gpupool.ledger.nodes.agent_report import NodeReport
from airflow_gpupool.ledger.nodes.heartbeats import (
    LEAK_REASON,
    NEEDS_LOCK,
    HeartbeatResult,
    HeartbeatWrite,
    write_gpu_health,
)
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
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
            write_gpu_health(tx, node, row.idx, value, source, reason)
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
            return HeartbeatWrite(
                self.store, self.reserve_again, tx, report, missed, leak_grace_s, leak_action
            ).apply()

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
                return HeartbeatWrite(
                    self.store,
                    self.reserve_again,
                    tx,
                    report,
                    missed,
                    leak_grace_s,
                    leak_action,
                    locked=False,
                ).apply()
            except NEEDS_LOCK:
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


def _write_node_health(tx: Tx, name: str, value: str, source: str, reason: str | None) -> None:
    tx.conn.execute(
        update(schema.nodes)
        .where(schema.nodes.c.name == name)
        .values(health=value, health_source=source, health_reason=reason, version=tx.version)
    )
