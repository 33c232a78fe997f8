"""Grants and their leases: reserve, renew and release, in the serialized write cycle.

A reserve or release takes one of two paths. On PostgreSQL, one that needs no queue
decision tries :class:`~airflow_gpupool.ledger.grants.concurrent_grants.ConcurrentGrants` first: it
places on this process's copy of the capacity and commits under the shared lock, alongside
others. Anything else, and everything on SQLite, runs :class:`LedgerGrants` here, in the
serialized write cycle (:mod:`airflow_gpupool.ledger.queue.cycle`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

from sqlalchemy import func, insert, select, update

from airflow_gpupool.exceptions import (
    GrantPreemptedError,
    InvalidRequestError,
    LeaseExpiredError,
)
from airflow_gpupool.ledger.db import records, schema
from airflow_gpupool.ledger.db.models import Grant, ReleaseResult, Reservation, ReservationState
from airflow_gpupool.ledger.db.records import GRANTED, HOLDING, ORPHANED, WAITING
from airflow_gpupool.ledger.grants.no_fit import refuse_if_never_fits, waits_as_it_is
from airflow_gpupool.ledger.grants.reserve_args import MAX_HOLDER, ReserveArgs, checked_seconds
from airflow_gpupool.ledger.queue import gangs
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.queue.holds import held_nodes
from airflow_gpupool.ledger.store.gate import ALL_SPENT, QueueGate
from airflow_gpupool.ledger.store.scalable import scalable_shapes
from airflow_gpupool.ledger.store.take import grant_row
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.ledger.teams.plan import governed
from airflow_gpupool.ledger.teams.preempting import victims_exist
from airflow_gpupool.ledger.teams.run_gate import refuse_if_too_large, run_columns
from airflow_gpupool.placement.verdict import Assignment, NoFit
from airflow_gpupool.resources import GpuRequest

log = logging.getLogger(LOGGER_NAME)


def released(reservation_id: str, state: ReservationState, reason: str) -> ReleaseResult:
    """Return the result of a release that ended a reservation that was in ``state``."""
    return ReleaseResult(reservation_id, True, state, f"{state.value} reservation released: {reason}")


def new_grant(
    store: LedgerStore, assignment: Assignment, args: ReserveArgs, node_pool: str, now: float
) -> Grant:
    """Return the grant a reserve made: ``assignment`` with its GPUs' identities and its lease."""
    gpu_info = store.cache.gpu_info
    node = assignment.node
    return records.build_grant(
        assignment,
        args.request,
        node_pool=node_pool,
        gpu_info={i: gpu_info[(node, i)] for i in assignment.gpu_indices if (node, i) in gpu_info},
        granted_at=now,
        expires_at=now + args.ttl,
    )


def granted(args: ReserveArgs, now: float, grant: Grant) -> Reservation:
    """Return the reservation a reserve granted at once."""
    return Reservation(
        args.reservation_id,
        args.holder,
        ReservationState.GRANTED,
        args.request,
        now,
        now + args.timeout,
        grant,
    )


class LedgerGrants:
    """Grants, renewals and releases in the serialized write cycle."""

    def __init__(self, store: LedgerStore, cycle: WriteCycle) -> None:
        self._store = store
        self._cycle = cycle

    def reserve(self, args: ReserveArgs) -> Reservation:
        """Grant the request now, or queue it (see :meth:`~airflow_gpupool.ledger.Ledger.reserve`)."""
        request, rid = args.request, args.reservation_id

        def run(tx: Tx) -> Reservation:
            # Looked up even for an id made here (before the first attempt): a retry after a
            # commit whose reply was lost finds its own reservation instead of a duplicate key.
            existing = tx.conn.execute(
                select(schema.reservations).where(schema.reservations.c.id == rid)
            ).first()
            if existing is not None:
                return self._store.reservation(tx.conn, existing)
            tx.queue_tracked = True
            if args.run_need is not None:  # a run too large for its team or the pool is never queued
                nodes = self._cycle.run_nodes.of(tx, request)
                refuse_if_too_large(nodes, self._cycle.quota_plan(tx), request, args.run_need)
            ahead = (args.not_before is not None and args.not_before > tx.now) or args.run_need is not None
            placed = None if ahead else self._place_past_queue(tx, args)
            if placed is not None and isinstance(placed[0], Assignment):
                return self._grant_past_queue(tx, args, placed[0])
            self._insert_waiting(tx, args)
            if ahead or not self._waits_past_pass(tx, args, placed):
                self._cycle.serve(tx)
            if rid in tx.assignments and request.gang is None:
                assignment = tx.assignments[rid]
                node_pool = tx.nodes[assignment.node].node_pool
                return granted(args, tx.now, new_grant(self._store, assignment, args, node_pool, tx.now))
            self._refuse_if_never_fits(tx, request)
            row = tx.conn.execute(select(schema.reservations).where(schema.reservations.c.id == rid)).one()
            return self._store.reservation(tx.conn, row)

        return self._cycle.write(run)

    def _place_past_queue(
        self, tx: Tx, args: ReserveArgs
    ) -> tuple[Assignment | NoFit, frozenset[str]] | None:
        """Place the request outside the held nodes, where the gate lets it be granted without a pass (:mod:`~airflow_gpupool.ledger.store.gate`).

        :returns: the verdict and the held nodes it avoided; None where a pass must decide (the
            gate is closed, quotas govern, or a preemptible request would pass waiting ones: a
            pass offers it to them as a victim)
        """
        request, gate = args.request, tx.current_gate
        if not gate.lets_grant(request) or governed(tx.quota_version):
            return None
        if request.preemptible and gate.has_waiters:
            return None
        held = held_nodes(tx.conn)
        return self._cycle.place(tx.nodes, request, held), held

    def _grant_past_queue(self, tx: Tx, args: ReserveArgs, assignment: Assignment) -> Reservation:
        """Grant the request on ``assignment`` without a pass over the queue (:meth:`_place_past_queue`).

        Every waiting request is blocked, so a pass would place this one the same way (on a node
        the queue does not hold) and count its overtakes of the requests it passes.
        """
        request, gate = args.request, tx.current_gate
        self._insert_waiting(tx, args)
        grant_row(tx, args.reservation_id, request, assignment)
        # Passing requests whose budget is not spent counts one overtake each, as a pass would.
        # One that spends its budget here gets its hold from the next pass: the gate closes.
        tx.gate_kept = not gate.counts(request) or not self._count_overtakes(tx, request.priority, gate)
        node_pool = tx.nodes[assignment.node].node_pool
        return granted(args, tx.now, new_grant(self._store, assignment, args, node_pool, tx.now))

    def _waits_past_pass(
        self, tx: Tx, args: ReserveArgs, placed: tuple[Assignment | NoFit, frozenset[str]] | None
    ) -> bool:
        """Whether the request, queued, may wait without a pass over the queue (:mod:`~airflow_gpupool.ledger.store.gate`).

        One that fits no node, held ones included, would be blocked wherever a pass put it, and
        the pass would change nothing else: every other request stays blocked, the hold stays, and
        no victim can be offered (the gate is open only while none could be, and a preemptor
        finds no preemptible grant). The gate then takes in its shape and priority.

        :param placed: what :meth:`_place_past_queue` found; with no node held, it was placed on
            every node already
        """
        gate, request = tx.current_gate, args.request
        if not (gate.lets_grant(request) and waits_as_it_is(request, self._cycle.max_overtakes)):
            return False
        if governed(tx.quota_version):
            return False
        verdict = placed[0] if placed is not None and not placed[1] else None
        if verdict is None:
            verdict = self._cycle.place(tx.nodes, request, frozenset())
        if not isinstance(verdict, NoFit):
            return False
        if request.preempts and victims_exist(tx.conn):
            return False
        self._refuse_if_never_fits(tx, request)
        tx.gate = gate.queued(request)
        tx.queued_blocked.append(args.reservation_id)
        return True

    def _count_overtakes(self, tx: Tx, priority: int, gate: QueueGate) -> bool:
        """Count one overtake of every waiting request at or above ``priority`` whose budget is not spent.

        Return whether one of them spent its budget ahead of the request the queue holds a node
        for (or with none held): the next pass then holds a node for it.
        """
        r, bound = schema.reservations.c, self._cycle.max_overtakes
        counted = tx.conn.execute(
            update(schema.reservations)
            .where(r.state == WAITING, r.overtakes < bound, r.priority >= priority)
            .values(overtakes=r.overtakes + 1)
            .returning(r.overtakes, r.priority, r.seq)
        ).all()
        spent = [row for row in counted if row.overtakes >= bound]
        tx.spent_changed |= bool(spent)
        ahead = not all(gate.behind_hold(row.priority, row.seq) for row in spent)
        if spent and not ahead:
            # The gate stays open: its unspent priority comes down to what is left unspent, so
            # later grants skip the count while nothing is (as ``gpupool_take`` does).
            left = tx.conn.execute(
                select(func.max(r.priority)).where(r.state == WAITING, r.overtakes < bound)
            ).scalar_one()
            tx.gate = replace(gate, unspent_priority=ALL_SPENT if left is None else int(left))
        return ahead

    def _insert_waiting(self, tx: Tx, args: ReserveArgs) -> None:
        """Queue the request (a pass, or the caller, then grants it or leaves it waiting)."""
        request, rid = args.request, args.reservation_id
        tx.queue_inserted.add(rid)
        tx.conn.execute(
            insert(schema.reservations).values(
                id=rid,
                holder=args.holder,
                request=json.dumps(request.to_dict(), sort_keys=True),
                priority=request.priority,
                seq=tx.version,
                state=WAITING,
                team=request.team,
                workload_class=request.workload_class.value,
                created_at=tx.now,
                deadline=tx.now + args.timeout,
                ttl=args.ttl,
                overtakes=0,
                gang_id=rid if request.gang is not None else None,
                gang_index=0 if request.gang is not None else None,
                not_before=args.not_before if (args.not_before or 0) > tx.now else None,
                **run_columns(args.run_need),
            )
        )
        self._store.requests.put(rid, request)
        tx.dirty = True

    def _refuse_if_never_fits(self, tx: Tx, request: GpuRequest) -> None:
        # Raising rolls the whole transaction back: the request was never queued. One only a
        # scalable pool's new node fits waits: the controller asks the autoscaler for that node.
        pool = refuse_if_never_fits(
            self._store, self._cycle, tx.nodes.values(), request, lambda: scalable_shapes(tx.conn)
        )
        if pool is not None:
            log.debug("A request for %s waits for the autoscaler: pool %s", request.describe(), pool)

    def renew(
        self, reservation_id: str, ttl: float | None = None, *, holder: str | None = None
    ) -> Reservation:
        """Extend a grant's lease by ``ttl`` seconds from now (default: its own TTL).

        An orphaned grant is still held, so its holder (back after a pause) may renew it: it
        becomes granted again. With ``holder``, the grant also passes to that holder: a retry
        adopting the grant of the try whose pod it re-attached to.
        """
        if holder is not None and (not isinstance(holder, str) or not 0 < len(holder) <= MAX_HOLDER):
            raise InvalidRequestError("holder", holder, f"a string of 1 to {MAX_HOLDER} characters")

        def run(tx: Tx) -> Reservation:
            tx.queue_tracked = True
            row = records.row_by_id(tx.conn, reservation_id)
            if row.state not in HOLDING:
                raise LeaseExpiredError(reservation_id, row.state)
            if row.preempt_deadline is not None:  # a victim's lease ends at its deadline
                left = float(row.preempt_deadline) - tx.now
                raise GrantPreemptedError(reservation_id, float(row.preempt_deadline), left, row.preempted_by)
            seconds = checked_seconds("ttl", ttl, lambda: float(row.ttl))
            if row.gang_id is not None:  # a gang's lease is one: every holding member renews
                gangs.renew_members(tx, row, tx.now + seconds, holder)
                return self._store.reservation(tx.conn, records.row_by_id(tx.conn, reservation_id))
            values: dict[str, object] = {"expires_at": tx.now + seconds}
            if row.state == ORPHANED:
                log.info("Orphaned grant %s renewed by its holder: granted again", reservation_id)
                values.update(state=GRANTED, orphaned_at=None, message=None)
            if holder is not None and holder != row.holder:
                log.info("Grant %s passes from %s to %s", reservation_id, row.holder, holder)
                values.update(holder=holder)
            tx.conn.execute(
                update(schema.reservations).where(schema.reservations.c.id == reservation_id).values(**values)
            )
            return self._store.reservation(tx.conn, records.row_by_id(tx.conn, reservation_id))

        return self._cycle.write(run)

    def release(self, reservation_id: str, reason: str, keep_ahead: bool = False) -> ReleaseResult:
        """Give a grant back, or withdraw a waiting request; idempotent. ``keep_ahead``: its step succeeded."""

        def run(tx: Tx) -> ReleaseResult:
            tx.queue_tracked = True
            if keep_ahead:  # what queued ahead of it stays (ledger.grants.queue_ahead)
                tx.keep_ahead.add(reservation_id)
            row = records.row_by_id(tx.conn, reservation_id)
            state = ReservationState(row.state)
            if state.ended:
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.ended_at or tx.now))
                return ReleaseResult(
                    reservation_id, False, state, f"nothing to release: reservation {state.value} at {when}"
                )
            if state is ReservationState.EXTERNAL:
                pod = f"{row.pod_namespace}/{row.pod_name}"
                message = f"not released: an external hold ends when its pod {pod} is gone (delete the pod)"
                return ReleaseResult(reservation_id, False, state, message)
            if row.gang_id is not None and row.gang_index == 0:  # the leader: the whole gang ends
                gangs.end_gang(
                    self._cycle,
                    tx,
                    row.gang_id,
                    ReservationState.RELEASED,
                    ReservationState.CANCELLED,
                    reason,
                )
            elif state.holds and row.preempt_deadline is not None:
                why = f"preempted for {row.preempted_by}" if row.preempted_by else row.message  # revoked
                message = f"{reason} ({why})"
                self._cycle.end_grant(tx, row, ReservationState.PREEMPTED, message)
            elif state.holds:
                self._cycle.end_grant(tx, row, ReservationState.RELEASED, reason)
                if self._frees_past_queue(tx, row.node):
                    tx.gate_kept = True
                    return released(reservation_id, state, reason)
            else:
                self._cycle.end_waiting(tx, row, ReservationState.CANCELLED, reason)
            self._cycle.serve(tx)
            return released(reservation_id, state, reason)

        return self._cycle.write(run)

    def _frees_past_queue(self, tx: Tx, node: str) -> bool:
        """Whether what a release freed on ``node`` fits no waiting request (:mod:`~airflow_gpupool.ledger.store.gate`): no pass needed.

        A held node too: it only comes closer to fitting its request, so it stays the one held.
        """
        state = tx.nodes.get(node)
        return state is not None and not governed(tx.quota_version) and tx.current_gate.lets_release(state)
