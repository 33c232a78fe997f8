"""The ledger's write cycle: expire what is due, apply the change, serve the queue.

Every write transaction first ends the leases nobody renewed and the requests that waited
too long, so a pool heals itself as long as anyone uses it. A change that frees capacity
or adds a request then serves the queue (:func:`airflow_gpupool.placement.queue.serve`),
all in the same transaction under the write lock.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, delete, select

from airflow_gpupool.exceptions import StaleCacheError
from airflow_gpupool.ledger import schema
from airflow_gpupool.ledger import statements as sql
from airflow_gpupool.ledger.cache import classes_from_counts
from airflow_gpupool.ledger.equivalence import EquivalenceIndex
from airflow_gpupool.ledger.models import ReapResult, ReservationState
from airflow_gpupool.ledger.records import GRANTED, HOLDING, assignment_of, class_delta, waiting_ahead
from airflow_gpupool.ledger.store import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.placement.accounting import allocate, deallocate
from airflow_gpupool.placement.policy import PlacementPolicy
from airflow_gpupool.placement.queue import QueueEntry, hold_node, serve
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFit
from airflow_gpupool.resources import GpuRequest

log = logging.getLogger(LOGGER_NAME)

T = TypeVar("T")


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


def blocked_message(policy: PlacementPolicy, tx: Tx, row: Row[Any], request: GpuRequest) -> str:
    """Say why the waiting reservation ``row`` waits: its place in the queue, or the closest nodes."""
    verdict = policy.place(tx.snapshot(), request)
    waited = tx.now - row.created_at
    ahead = waiting_ahead(tx.conn, row)
    if isinstance(verdict, NoFit):
        closest = "; ".join(verdict.summary(3)) or "the inventory is empty"
        blocked = f"no node fits {request.describe()}; closest: {closest}"
    else:
        blocked = f"it fits {verdict.node} now but {ahead} earlier request(s) hold the queue"
    return f"waited {waited:.0f}s with {ahead} request(s) ahead; {blocked}"


class WriteCycle:
    """Write transactions that expire what is due first, and the queue they serve.

    :param policy: where requests go
    :param max_overtakes: the no-starvation bound, see :mod:`airflow_gpupool.placement.queue`
    """

    def __init__(self, store: LedgerStore, policy: PlacementPolicy, max_overtakes: int) -> None:
        self.store = store
        self.policy = policy
        self.max_overtakes = max_overtakes
        self._equivalence = EquivalenceIndex()

    def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one write transaction, after expiring the leases and requests that are due."""

        def run(tx: Tx) -> T:
            self.expire_due(tx)
            return fn(tx)

        return self.store.write(run)

    def reap(self) -> ReapResult:
        """Expire dead leases and overdue requests, then serve the queue."""

        def run(tx: Tx) -> ReapResult:
            # Every write transaction starts by expiring what is due; report what it did.
            self.serve(tx)
            return ReapResult(tuple(tx.expired), tuple(tx.timed_out), tuple(tx.granted), tuple(tx.orphaned))

        return self.write(run)

    def place(
        self,
        nodes: dict[str, NodeState],
        request: GpuRequest,
        skipped: AbstractSet[str],
        changed: set[str] | None = None,
    ) -> Assignment | NoFit:
        """Place ``request`` on ``nodes`` but ``skipped``, one node of each kind tried.

        :param changed: the nodes changed since the last call (None: any may have)
        """
        return self.policy.place(self._equivalence.representatives(nodes, skipped, changed), request)

    def blocked_message(self, tx: Tx, row: Row[Any]) -> str:
        """Say why the waiting reservation ``row`` waits (see :func:`blocked_message`)."""
        return blocked_message(self.policy, tx, row, self.store.request_of(row))

    def expire_due(self, tx: Tx) -> None:
        """End the leases and waits that are overdue at ``tx.now``, then serve the queue if any were.

        A lease with a pod bound to it does not free its slice: the pod may still run on it
        (its worker died). It becomes ``orphaned`` and holds the slice until reconcile sees
        the pod finished or gone, or deletes it.
        """
        due = tx.conn.execute(sql.DUE, {"now": tx.now}).all()
        for row in due:
            if row.state == GRANTED and row.pod_name is not None:
                self.orphan(tx, row)
            elif row.state == GRANTED:
                log.warning("Lease of %s (holder %s) expired: returning its slice", row.id, row.holder)
                self.end_grant(tx, row, ReservationState.EXPIRED, "lease expired without renewal")
                tx.expired.append(row.id)
            else:
                message = self.blocked_message(tx, row)
                log.warning("Reservation %s timed out: %s", row.id, message)
                self.end_waiting(tx, row, ReservationState.TIMED_OUT, message)
                tx.timed_out.append(row.id)
        if due:
            self.serve(tx)

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

    @staticmethod
    def end_waiting(tx: Tx, row: Row[Any], state: ReservationState, message: str) -> None:
        """End a waiting reservation in ``state``."""
        tx.conn.execute(
            sql.END_ROW, {"rid": row.id, "new_state": state.value, "now": tx.now, "end_message": message}
        )
        tx.dirty = True

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

    def serve(self, tx: Tx) -> None:
        """Grant what the queue can grant now, in its order (see :func:`~airflow_gpupool.placement.queue.serve`)."""
        rows = tx.conn.execute(sql.WAITING).all()
        if not rows:
            return
        entries = [QueueEntry(row.id, self.store.request_of(row), row.seq, row.overtakes) for row in rows]

        def try_place(entry: QueueEntry, held: frozenset[str]) -> Assignment | None:
            verdict = self.place(tx.nodes, entry.request, held)
            if isinstance(verdict, NoFit):
                return None
            _grant(tx, entry, verdict)
            return verdict

        def hold(entry: QueueEntry, held: frozenset[str]) -> str | None:
            current = list(tx.nodes.values())
            return hold_node(current, self.store.cache.empty_snapshot(current).nodes, entry.request, held)

        outcome = serve(entries, try_place, self.max_overtakes, hold)
        for rid, count in outcome.overtakes.items():
            tx.conn.execute(sql.SET_OVERTAKES, {"rid": rid, "overtake_count": count})
        for rid, node in outcome.holds.items():
            log.info(
                "Queue holds node %s for %s: its overtake budget (%d) is spent", node, rid, self.max_overtakes
            )
        if outcome.barrier is not None:
            log.info(
                "Queue held for %s: its overtake budget is spent and no node can be held", outcome.barrier
            )


def _grant(tx: Tx, entry: QueueEntry, assignment: Assignment) -> None:
    """Record ``assignment`` as the grant of a waiting request, if the rows still have room for it.

    :raises StaleCacheError: they have not: the capacity copy was wrong
    """
    request = entry.request
    conn = tx.conn
    d_train, d_infer = class_delta(request)
    node = assignment.node
    taken = conn.execute(
        sql.TAKE_NODE,
        {
            "at_node": node,
            "cpu": request.cpu_milli,
            "mem": request.memory_mib,
            "training": d_train,
            "inference": d_infer,
            "new_version": tx.version,
        },
    ).rowcount
    if taken != 1:
        raise StaleCacheError(node)
    if assignment.mig_slice is not None:
        taken_slice = {"at_node": node, "at_slice": assignment.mig_slice, "rid": entry.request_id}
        if conn.execute(sql.TAKE_MIG, taken_slice).rowcount != 1:
            raise StaleCacheError(node)
    elif assignment.gpu_indices:
        args: dict[str, Any] = {
            "at_node": node,
            "indices": list(assignment.gpu_indices),
            "milli": assignment.milli_per_gpu,
            "gmem": assignment.gpu_memory_mib,
        }
        if conn.execute(sql.TAKE_GPUS, args).rowcount != len(assignment.gpu_indices):
            raise StaleCacheError(node)
    granted = conn.execute(
        sql.GRANT_ROW,
        {
            "rid": entry.request_id,
            "now": tx.now,
            "granted_node": node,
            "indices_json": json.dumps(list(assignment.gpu_indices)),
            "milli": assignment.milli_per_gpu,
            "gmem": assignment.gpu_memory_mib,
            "granted_slice": assignment.mig_slice,
        },
    ).rowcount
    if granted != 1:
        raise StaleCacheError(entry.request_id)
    tx.nodes[node] = allocate(tx.nodes[node], request, assignment)
    tx.granted.append(entry.request_id)
    tx.assignments[entry.request_id] = assignment
    tx.dirty = True
