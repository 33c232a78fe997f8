"""Preemption in the ledger's queue service: a waiting request takes a slice back, with a grace.

After a pass over the queue, the requests still waiting that may preempt (``preempts``, not a
gang) are offered victims among the live grants that are ``preemptible`` (gangs are neither
preemptors nor victims). Which grant may be a victim of which request, and in what order victims
are taken, is :mod:`airflow_gpupool.governance.preemption`'s rule; here each node is tried: its
eligible grants are freed one by one, in that order, on a copy of the node until the request
fits there (placement, binding and quota as a grant would be checked). The node whose victims
lose the least work (GPU-seconds since their newest checkpoint) wins. A victim whose request says
``checkpoint_on_sigterm`` counts as checkpointed now: it writes one in its grace and loses nothing.

The victims are not ended: each keeps its slice with a deadline (now plus its request's
``preemption_grace_seconds``, or the ledger's default), becoming ``preempting``. Its holder sees
this at its next renewal (:class:`~airflow_gpupool.exceptions.GrantPreemptedError`), ends the
pod with that much termination grace (the training gets SIGTERM and may write a checkpoint) and
releases the grant: it ends ``preempted``, and the queue passes the slice on. At the deadline
the lease runs out: a grant still bound to a pod is orphaned, and the controller deletes the pod
at once (:mod:`airflow_gpupool.controller.reconcile`); one without a pod ends ``preempted``.

A request with victims pending does not preempt again; a victim is told once. Only the first
few waiting requests are offered victims per pass (``PREEMPTORS_PER_PASS``), and nothing here
runs unless a preemptible grant exists (one indexed read).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, Row, and_, select, update

from airflow_gpupool.governance.preemption import VictimCandidate, lost_gpu_seconds
from airflow_gpupool.governance.queue_pass import Governance
from airflow_gpupool.governance.victim_nodes import (
    PREEMPTORS_PER_PASS,
    LiveGrant,
    PreemptionRules,
    held_milli,
    offer_victims,
)
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.records import GRANTED, HOLDING, assignment_of
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.placement.policy import PlacementPolicy
from airflow_gpupool.placement.pools import PoolBindings
from airflow_gpupool.placement.queue import QueueEntry
from airflow_gpupool.resources import WorkloadClass


class WriteCycle(Protocol):
    """What preemption needs of the write cycle (:class:`~airflow_gpupool.ledger.queue.cycle.WriteCycle`)."""

    store: LedgerStore
    policy: PlacementPolicy
    bindings: PoolBindings
    min_runtime_seconds: float
    preemption_grace_seconds: float


__all__ = ["PREEMPTORS_PER_PASS", "preempt_for_waiting", "victims_exist"]

log = logging.getLogger(LOGGER_NAME)

_r = schema.reservations.c
# The stored request text is JSON with sorted keys, so a preemptible request's says exactly this.
_PREEMPTIBLE_TEXT = '%"preemptible": true%'
_CANDIDATES = select(schema.reservations).where(
    _r.state == GRANTED,
    _r.preempt_deadline.is_(None),
    _r.gang_id.is_(None),
    _r.request.like(_PREEMPTIBLE_TEXT),
)


def victims_exist(conn: Connection) -> bool:
    """Whether any live grant could be offered as a victim (one indexed read)."""
    return conn.execute(_CANDIDATES.limit(1)).first() is not None


_PENDING = select(schema.reservations).where(_r.state.in_(HOLDING), _r.preempt_deadline.is_not(None))


def preempt_for_waiting(
    cycle: WriteCycle, tx: Tx, waiting: Sequence[QueueEntry], quota: Governance | None
) -> bool:
    """Offer victims to the first requests of ``waiting`` (in queue order) that the pass did not grant.

    Return whether preemption may come into question (a preemptor and a preemptible grant exist):
    later writes then serve the queue instead of passing it by (:mod:`~airflow_gpupool.ledger.store.gate`).
    """
    preemptors = [
        e
        for e in waiting
        if e.request_id not in tx.assignments and e.request.gang is None and e.request.preempts
    ]
    if not preemptors:
        return False
    rows = tx.conn.execute(_CANDIDATES).all()
    if not rows:
        return False
    _offer(cycle, tx, preemptors, rows, quota)
    return True


def _offer(
    cycle: WriteCycle,
    tx: Tx,
    preemptors: Sequence[QueueEntry],
    rows: Sequence[Row[Any]],
    quota: Governance | None,
) -> None:
    """Offer the candidates ``rows`` as victims to ``preemptors``, in queue order."""
    told = tx.conn.execute(_PENDING).all()
    pending = {row.preempted_by for row in told}
    if quota is not None:  # what the victims already told hold is as good as given back
        quota = quota.without((cycle.store.request_of(row), assignment_of(row)) for row in told)
    victims = [_victim(cycle, tx, row, quota) for row in rows if row.node in tx.nodes]
    rules = PreemptionRules(cycle.min_runtime_seconds, cycle.preemption_grace_seconds, cycle.bindings)
    offers = offer_victims(
        preemptors,
        victims,
        tx.nodes,
        pending,
        now=tx.now,
        rules=rules,
        place=cycle.policy.place,
        classes_on=lambda name: _classes_by_grant(tx, name),
        quota=quota,
    )
    for entry, chosen in offers:
        _mark(cycle, tx, entry, chosen)


def _victim(cycle: WriteCycle, tx: Tx, row: Row[Any], quota: Governance | None) -> LiveGrant:
    request = cycle.store.request_of(row)
    assignment = assignment_of(row)
    node = tx.nodes[row.node]
    candidate = VictimCandidate(
        reservation_id=row.id,
        priority=request.priority,
        preemptible=request.preemptible,
        granted_at=float(row.granted_at),
        milli=held_milli(request, assignment),
        # A step that writes a checkpoint on SIGTERM within its grace loses no work stopped now,
        # as the simulator ranks it (sim/preemption.py): checkpointed now.
        checkpoint_at=tx.now if request.checkpoint_on_sigterm else row.checkpoint_at,
        # Without quotas every team borrows: priority alone decides.
        borrowed=quota.borrowing(request.team, node) if quota is not None else True,
        team=request.team,
        on_headroom_loan=bool(row.headroom_loan),
    )
    return LiveGrant(row.id, row.node, request, assignment, candidate, source=row)


def _classes_by_grant(tx: Tx, node: str) -> dict[str, WorkloadClass]:
    rows = tx.conn.execute(
        select(schema.reservations.c.id, schema.reservations.c.workload_class).where(
            and_(_r.node == node, _r.state.in_(HOLDING))
        )
    ).all()
    return {row.id: WorkloadClass(row.workload_class) for row in rows}


def _mark(cycle: WriteCycle, tx: Tx, entry: QueueEntry, chosen: Sequence[LiveGrant]) -> None:
    """Make each victim ``preempting``: a deadline by which its pod ends, its lease ending then too."""
    for victim in chosen:
        grace = victim.request.preemption_grace_seconds or cycle.preemption_grace_seconds
        row = victim.source
        deadline = tx.now + grace
        lost = lost_gpu_seconds(victim.candidate, tx.now)
        message = (
            f"preempted for {entry.request_id} (team {entry.request.team}, priority "
            f"{entry.request.priority}): {grace:g} s to checkpoint and end"
        )
        at_risk = (
            "it checkpoints on SIGTERM"
            if victim.request.checkpoint_on_sigterm
            else f"{lost:.0f} GPU-s since its last checkpoint"
        )
        log.warning(
            "Preempting grant %s (team %s, priority %d, %s) for %s "
            "(team %s, priority %d): its pod has %g s to checkpoint and end",
            victim.reservation_id,
            victim.request.team,
            victim.request.priority,
            at_risk,
            entry.request_id,
            entry.request.team,
            entry.request.priority,
            grace,
        )
        tx.conn.execute(
            update(schema.reservations)
            .where(_r.id == victim.reservation_id)
            .values(
                preempt_deadline=deadline,
                preempted_by=entry.request_id,
                expires_at=min(float(row.expires_at), deadline),
                message=message,
            )
        )
    tx.dirty = True
