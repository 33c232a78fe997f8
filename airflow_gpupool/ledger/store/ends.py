"""End a reservation in the rows and the transaction's copy: a grant gives back what it held, a wait ends, a lease orphans.

The reverse of :mod:`~airflow_gpupool.ledger.store.take`. :class:`ReservationEnds` is the part of
:class:`~airflow_gpupool.ledger.queue.cycle.WriteCycle` that ends one reservation row (a gang's
members end through :class:`~airflow_gpupool.ledger.queue.gangs.GangEnds`); a node being drained
leaves the inventory with its last grant.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, delete, select

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.models import ReservationState
from airflow_gpupool.ledger.db.records import HOLDING, assignment_of, class_delta
from airflow_gpupool.ledger.store.cache import classes_from_counts
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.placement.accounting import deallocate
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest

__all__ = ["Held", "ReservationEnds", "delete_node", "held_on_node"]

log = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class Held:
    """A live grant on a node: its row, its request and what it holds."""

    row: Row[Any]
    request: GpuRequest
    assignment: Assignment


def held_on_node(store: LedgerStore, conn: Connection, node: str) -> list[Held]:
    """Return the grants that hold capacity on ``node`` (orphans included)."""
    r = schema.reservations.c
    rows = conn.execute(select(schema.reservations).where(r.node == node, r.state.in_(HOLDING))).all()
    return [Held(row, store.request_of(row), assignment_of(row)) for row in rows]


def delete_node(tx: Tx, name: str) -> None:
    """Remove a node, its GPUs and MIG slices from the inventory."""
    tx.conn.execute(delete(schema.mig_slices).where(schema.mig_slices.c.node == name))
    tx.conn.execute(delete(schema.gpus).where(schema.gpus.c.node == name))
    tx.conn.execute(delete(schema.nodes).where(schema.nodes.c.name == name))
    tx.nodes.pop(name, None)
    tx.dirty = tx.inventory_changed = True


class ReservationEnds:
    """End one reservation row: the write cycle's ends, apart from what it expires and serves."""

    # Set by the write cycle that ends its reservations with these.
    store: LedgerStore
    max_overtakes: int

    def end_preemption(self, tx: Tx, row: Row[Any]) -> None:
        """End a preemption victim whose grace ran out: orphaned while a pod is bound, else ``preempted``.

        The orphan keeps the slice until the controller has deleted its pod (at once: its grace
        was given), so the preemptor never shares the GPU with it.
        """
        if row.pod_name is None:
            log.warning("Preemption grace of %s ended without a pod: passing its slice on", row.id)
            self.end_grant(tx, row, ReservationState.PREEMPTED, f"preempted for {row.preempted_by}")
            tx.expired.append(row.id)
            return
        pod = f"{row.pod_namespace}/{row.pod_name}"
        log.warning(
            "Preemption grace of %s ended with pod %s still bound: orphaned, for the controller to delete the pod",
            row.id,
            pod,
        )
        message = f"preemption grace ended; slice held for pod {pod} until the controller deletes it"
        tx.conn.execute(sql.ORPHAN_ROW, {"rid": row.id, "now": tx.now, "orphan_message": message})
        tx.orphaned.append(row.id)

    @staticmethod
    def orphan(tx: Tx, row: Row[Any]) -> None:
        """Mark the bound grant ``row`` orphaned: its lease expired, its slice stays held."""
        pod = f"{row.pod_namespace}/{row.pod_name}"
        log.warning(
            "Lease of %s (holder %s) expired while pod %s (uid %s) is bound to it: "
            "keeping its slice as orphaned until the pod is confirmed finished or gone",
            row.id,
            row.holder,
            pod,
            row.pod_uid,
        )
        message = f"lease expired; slice held for pod {pod} until it is confirmed finished or gone"
        tx.conn.execute(sql.ORPHAN_ROW, {"rid": row.id, "now": tx.now, "orphan_message": message})
        tx.orphaned.append(row.id)

    def end_waiting(self, tx: Tx, row: Row[Any], state: ReservationState, message: str) -> None:
        """End a waiting reservation in ``state``."""
        tx.conn.execute(
            sql.END_ROW, {"rid": row.id, "new_state": state.value, "now": tx.now, "end_message": message}
        )
        tx.dirty = True
        tx.settled.append(row.id)
        tx.spent_changed |= row.overtakes >= self.max_overtakes

    def end_grant(self, tx: Tx, row: Row[Any], state: ReservationState, message: str) -> None:
        """End a grant in ``state`` and give what it held back to its node.

        A node being drained leaves the inventory with its last grant.
        """
        request = self.store.request_of(row)
        assignment = assignment_of(row)
        d_train, d_infer = class_delta(request)
        conn = tx.conn
        counts = conn.execute(
            sql.RETURN_NODE,
            {
                "at_node": row.node,
                "cpu": request.cpu_milli,
                "mem": request.memory_mib,
                "training": d_train,
                "inference": d_infer,
                "new_version": tx.version,
            },
        ).first()
        if assignment.mig_slice is not None:
            conn.execute(sql.RETURN_MIG, {"at_node": row.node, "at_slice": assignment.mig_slice})
        elif assignment.gpu_indices:
            conn.execute(
                sql.RETURN_GPUS,
                {
                    "at_node": row.node,
                    "indices": list(assignment.gpu_indices),
                    "milli": assignment.milli_per_gpu,
                    "gmem": assignment.gpu_memory_mib,
                },
            )
        conn.execute(
            sql.END_ROW, {"rid": row.id, "new_state": state.value, "now": tx.now, "end_message": message}
        )
        tx.dirty = True
        if counts is None:
            return
        if row.node in tx.nodes:
            classes = classes_from_counts(counts.n_training, counts.n_inference)
            tx.nodes[row.node] = deallocate(tx.nodes[row.node], request, assignment, classes)
        if counts.remove_when_drained and not held_on_node(self.store, conn, row.node):
            log.info("Node %s is drained: removing it from the inventory", row.node)
            delete_node(tx, row.node)
