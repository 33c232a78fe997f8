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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sqlalchemy import Connection, Row, and_, select, update

from airflow_gpupool.governance.preemption import Preemptor, VictimCandidate, lost_gpu_seconds, may_preempt
from airflow_gpupool.governance.queue_pass import Governance
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.records import GRANTED, HOLDING, assignment_of
from airflow_gpupool.ledger.store.cache import classes_from_counts
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.placement.accounting import deallocate
from airflow_gpupool.placement.fit import EXCLUSIVE_CLASSES
from airflow_gpupool.placement.policy import PlacementPolicy
from airflow_gpupool.placement.pools import PoolBindings
from airflow_gpupool.placement.queue import QueueEntry
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFit
from airflow_gpupool.resources import GpuRequest, WorkloadClass


class WriteCycle(Protocol):
    """What preemption needs of the write cycle (:class:`~airflow_gpupool.ledger.queue.cycle.WriteCycle`)."""

    store: LedgerStore
    policy: PlacementPolicy
    bindings: PoolBindings
    min_runtime_seconds: float
    preemption_grace_seconds: float


__all__ = ["PREEMPTORS_PER_PASS", "Victim", "preempt_for_waiting", "victims_exist"]

log = logging.getLogger(LOGGER_NAME)

# Waiting requests offered victims per pass: the queue's head, where preemption matters.
PREEMPTORS_PER_PASS = 4

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


@dataclass(frozen=True)
class Victim:
    """A live preemptible grant, as a node's victims are chosen among them."""

    row: Row[Any]
    request: GpuRequest
    assignment: Assignment
    candidate: VictimCandidate


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
    lowest = min((v.request.priority for v in victims), default=None)
    offered = 0
    for entry in preemptors:
        if offered >= PREEMPTORS_PER_PASS or not victims:
            return
        if entry.request_id in pending:
            continue
        if lowest is not None and entry.request.priority <= lowest and quota is None:
            return  # in queue order: no later request outranks any victim either
        offered += 1
        chosen = _best_node(cycle, tx, entry.request, victims, quota)
        if chosen is None:
            continue
        _mark(cycle, tx, entry, chosen)
        taken = {v.row.id for v in chosen}
        victims = [v for v in victims if v.row.id not in taken]


def _victim(cycle: WriteCycle, tx: Tx, row: Row[Any], quota: Governance | None) -> Victim:
    request = cycle.store.request_of(row)
    assignment = assignment_of(row)
    node = tx.nodes[row.node]
    milli = (
        request.total_gpu_milli
        if assignment.mig_slice is not None
        else len(assignment.gpu_indices) * assignment.milli_per_gpu
    )
    candidate = VictimCandidate(
        reservation_id=row.id,
        priority=request.priority,
        preemptible=request.preemptible,
        granted_at=float(row.granted_at),
        milli=milli,
        # A step that writes a checkpoint on SIGTERM within its grace loses no work stopped now,
        # as the simulator ranks it (sim/governed.py): checkpointed now.
        checkpoint_at=tx.now if request.checkpoint_on_sigterm else row.checkpoint_at,
        # Without quotas every team borrows: priority alone decides.
        borrowed=quota.borrowing(request.team, node) if quota is not None else True,
        team=request.team,
        on_headroom_loan=bool(row.headroom_loan),
    )
    return Victim(row, request, assignment, candidate)


def _best_node(
    cycle: WriteCycle, tx: Tx, request: GpuRequest, victims: Sequence[Victim], quota: Governance | None
) -> tuple[Victim, ...] | None:
    """Return the victims on the node where freeing them places ``request`` losing the least work."""
    by_node: dict[str, list[Victim]] = {}
    for victim in victims:
        by_node.setdefault(victim.row.node, []).append(victim)
    best: tuple[tuple[float, int, str], tuple[Victim, ...]] | None = None
    for name, here in sorted(by_node.items()):
        node = tx.nodes[name]
        if not node.schedulable or not cycle.bindings.allows(node.node_pool, request):
            continue
        chosen = _victims_on(cycle, tx, request, node, here, quota)
        if chosen is None:
            continue
        lost = sum(lost_gpu_seconds(v.candidate, tx.now) for v in chosen)
        key = (lost, len(chosen), name)
        if best is None or key < best[0]:
            best = (key, chosen)
    return best[1] if best is not None else None


def _victims_on(
    cycle: WriteCycle,
    tx: Tx,
    request: GpuRequest,
    node: NodeState,
    here: Sequence[Victim],
    quota: Governance | None,
) -> tuple[Victim, ...] | None:
    """Free the eligible grants of ``node`` one by one, least work lost first, until ``request`` fits."""
    preemptor = Preemptor(
        priority=request.priority,
        milli=request.total_gpu_milli,
        reclaims=quota is not None and quota.within_nominal(request, node),
        team=request.team,
        urgent=quota is not None and quota.urgent(request),
    )
    conflicting = EXCLUSIVE_CLASSES.get(request.workload_class.value)
    eligible = [
        v
        for v in here
        if may_preempt(preemptor, _with_class_block(v, conflicting), tx.now, cycle.min_runtime_seconds)
    ]
    if not eligible:
        return None
    eligible.sort(
        key=lambda v: (lost_gpu_seconds(v.candidate, tx.now), v.candidate.priority, -v.candidate.granted_at)
    )
    staying = _classes_by_grant(tx, node.name)
    freed = node
    chosen: list[Victim] = []
    for victim in eligible:
        if quota is not None and chosen and _only_as_borrower(preemptor, victim):
            # Taken back only while its team still borrows after the victims chosen before it.
            if not quota.without(_freeing(chosen)).borrowing(victim.request.team, node):
                continue
        chosen.append(victim)
        staying.pop(victim.row.id, None)
        freed = deallocate(freed, victim.request, victim.assignment, _classes(staying.values()))
        verdict = cycle.policy.place(ClusterSnapshot((freed,)), request)
        if isinstance(verdict, NoFit):
            continue
        if quota is not None and not quota.without(_freeing(chosen)).admits(request, node):
            continue
        return tuple(chosen)
    return None


def _only_as_borrower(preemptor: Preemptor, victim: Victim) -> bool:
    """Whether ``victim`` is eligible only because its team borrows (another team, not outranked, not on a headroom loan)."""
    on_loan = victim.candidate.on_headroom_loan and preemptor.urgent
    return (
        victim.request.team != preemptor.team
        and victim.request.priority >= preemptor.priority
        and not on_loan
    )


def _freeing(chosen: Sequence[Victim]) -> list[tuple[GpuRequest, Assignment]]:
    return [(v.request, v.assignment) for v in chosen]


def _with_class_block(victim: Victim, conflicting: str | None) -> VictimCandidate:
    """The candidate, marked when its class may not share a node with the preemptor's."""
    if conflicting is None or victim.request.workload_class.value != conflicting:
        return victim.candidate
    return replace(victim.candidate, blocks_by_class=True)


def _classes_by_grant(tx: Tx, node: str) -> dict[str, WorkloadClass]:
    rows = tx.conn.execute(
        select(schema.reservations.c.id, schema.reservations.c.workload_class).where(
            and_(_r.node == node, _r.state.in_(HOLDING))
        )
    ).all()
    return {row.id: WorkloadClass(row.workload_class) for row in rows}


def _classes(staying: Iterable[WorkloadClass]) -> frozenset[str]:
    held = list(staying)
    return classes_from_counts(
        sum(c is WorkloadClass.TRAINING for c in held), sum(c is WorkloadClass.INFERENCE for c in held)
    )


def _mark(cycle: WriteCycle, tx: Tx, entry: QueueEntry, chosen: Sequence[Victim]) -> None:
    """Make each victim ``preempting``: a deadline by which its pod ends, its lease ending then too."""
    for victim in chosen:
        grace = victim.request.preemption_grace_seconds or cycle.preemption_grace_seconds
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
            victim.row.id,
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
            .where(_r.id == victim.row.id)
            .values(
                preempt_deadline=deadline,
                preempted_by=entry.request_id,
                expires_at=min(float(victim.row.expires_at), deadline),
                message=message,
            )
        )
    tx.dirty = True
