"""Hand-on: an ending step passes the part of its slice the next step of its DAG run needs to that step.

:meth:`HandOns.hand_on` ends the upstream grant and, in the same transaction, grants the part
the downstream request takes (:func:`~airflow_gpupool.placement.accounting.hand_on`: same node,
within the slice) to a reservation held for the downstream's task key, with no pod and a lease
of the hold: unclaimed (a skipped branch, another upstream still running), the lease runs out
and the write cycle ends it at that bound as any unrenewed lease, so it never outlives it. The
rest of the slice is freed and the queue served, as in a release.

The downstream's reserve (:meth:`HandOns.claim`) takes the handed grant over under its own
try's reservation id in one transaction: the GPUs are never free in between, and the history
shows one chain (the upstream ended "handed on to ...", the downstream granted at that moment).
Anything that cannot be handed on is released as usual and the result says why.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from airflow_gpupool import settings
from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.ledger.db import records, schema
from airflow_gpupool.ledger.db.models import ReleaseResult, Reservation, ReservationState
from airflow_gpupool.ledger.db.records import GRANTED, WAITING
from airflow_gpupool.ledger.grants.reserve_args import ReserveArgs
from airflow_gpupool.ledger.grants.serialized import LedgerGrants
from airflow_gpupool.ledger.queue import ahead
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.queue.holds import held_nodes
from airflow_gpupool.ledger.store.take import grant_row
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.placement.accounting import hand_on as place_within
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.validate import positive_seconds

__all__ = ["HANDED_PREFIX", "HandOnResult", "HandOns", "LedgerHandOnApi", "handed_holder"]

log = logging.getLogger(LOGGER_NAME)

#: How the ids of handed grants start (before their downstream claims them under its own id).
HANDED_PREFIX = "ho-"
_MAX_HOLD = 86400.0
_HOLDER_SUFFIX = "/handed-on"


def handed_holder(task_key: str) -> str:
    """Return the holder of a slice handed on to ``task_key``, not yet claimed: what its claim looks for."""
    return task_key[: 512 - len(_HOLDER_SUFFIX)] + _HOLDER_SUFFIX


def _handed_id(task_key: str, upstream_id: str) -> str:
    # Keyed by the upstream try too: handing the same grant on again finds what the first did.
    return HANDED_PREFIX + hashlib.sha256(f"{task_key}|{upstream_id}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class HandOnResult:
    """What a hand-on did: the part handed on (if any) and what was released.

    :param reservation_id: the ending grant
    :param task_key: the downstream step it was to be handed to
    :param handed_id: the reservation held for the downstream until it claims it or the hold ends;
        None when nothing was handed on (the grant was released as usual)
    :param node: the node of the handed part
    :param gpu_indices: the GPUs of the handed part
    :param hold_until: ledger time at which an unclaimed handed part is released
    :param message: what was handed on and what released, or why nothing was handed on
    """

    reservation_id: str
    task_key: str
    handed_id: str | None
    node: str | None
    gpu_indices: tuple[int, ...]
    hold_until: float | None
    message: str

    @property
    def handed(self) -> bool:
        """Whether part of the slice was handed on."""
        return self.handed_id is not None


def check_hold(hold_seconds: float) -> float:
    """Return ``hold_seconds`` checked: a number of seconds in (0, 86400].

    :raises InvalidRequestError: anything else
    """
    if isinstance(hold_seconds, bool) or not isinstance(hold_seconds, int | float):
        raise InvalidRequestError("hold_seconds", hold_seconds, "a number of seconds in (0, 86400]")
    try:
        return positive_seconds(hold_seconds, maximum=_MAX_HOLD)
    except ValueError:
        raise InvalidRequestError("hold_seconds", hold_seconds, "a number of seconds in (0, 86400]") from None


class HandOns:
    """Hand a grant's slice on to the next step of its DAG run, and that step's claim of it."""

    def __init__(self, store: LedgerStore, cycle: WriteCycle) -> None:
        self._store = store
        self._cycle = cycle

    def hand_on(
        self, reservation_id: str, task_key: str, request: GpuRequest, hold_seconds: float, reason: str
    ) -> HandOnResult | None:
        """End the grant, handing the part ``request`` takes to ``task_key``; None: not a plain grant, nothing written.

        A plain grant (no gang, no preemption under way, not a MIG slice) always ends here:
        handed on in part, or, where the request does not fit within it, released.
        """
        if not isinstance(request, GpuRequest):
            raise InvalidRequestError("request", request, "a GpuRequest")
        if not isinstance(task_key, str) or not 0 < len(task_key) <= 512:
            raise InvalidRequestError("task_key", task_key, "a string of 1 to 512 characters")
        hold = check_hold(hold_seconds)

        def run(tx: Tx) -> HandOnResult | None:
            tx.queue_tracked = True
            row = records.row_by_id(tx.conn, reservation_id)
            plain = row.preempt_deadline is None and row.gang_id is None and row.mig_slice is None
            if row.state != GRANTED or not plain:
                return None
            hid = _handed_id(task_key, reservation_id)
            why = self._refusal(tx, row, request, task_key)
            before = tx.nodes.get(row.node)
            tx.keep_ahead.add(reservation_id)  # a hand-on is the step's success: what queued ahead stays
            self._cycle.end_grant(tx, row, ReservationState.RELEASED, reason)
            after = tx.nodes.get(row.node)
            part: Assignment | None = None
            if why is None and before is not None and after is not None:
                upstream = self._store.request_of(row)
                part = place_within(before, upstream, records.assignment_of(row), request, after.classes)
                why = None if part is not None else f"{request.describe()} does not fit within the slice"
            if part is None:
                self._cycle.serve(tx)
                message = f"not handed on to {task_key}: {why or 'its node is gone'}; the slice is released"
                return HandOnResult(reservation_id, task_key, None, None, (), None, message)
            self._grant_handed(tx, hid, task_key, request, part, hold, row.holder)
            ahead.withdraw_for_step(tx, self._cycle, task_key, f"handed a slice of {reservation_id}")
            gpus = ",".join(map(str, part.gpu_indices))
            kept = set(part.gpu_indices)
            rest = [i for i in records.assignment_of(row).gpu_indices if i not in kept]
            rest_text = f"GPU {','.join(map(str, rest))} released" if rest else "nothing else held"
            message = (
                f"handed on to {task_key} as {hid}: GPU {gpus} on node {row.node} "
                f"(held {hold:g} s for it to claim); {rest_text}"
            )
            tx.conn.execute(
                update(schema.reservations)
                .where(schema.reservations.c.id == reservation_id)
                .values(message=f"{reason}; {message}")
            )
            self._cycle.serve(tx)
            return HandOnResult(
                reservation_id, task_key, hid, row.node, part.gpu_indices, tx.now + hold, message
            )

        return self._cycle.write(run)

    def _refusal(self, tx: Tx, row: Row[Any], request: GpuRequest, task_key: str) -> str | None:
        """Say why the grant ``row`` may not be handed on to ``task_key`` at all (None: it may)."""
        upstream = self._store.request_of(row)
        if request.gang is not None or request.mig_profile is not None:
            return "a gang or a MIG profile is not handed on"
        if request.team != upstream.team:
            return f"its team {request.team} is not the ending step's {upstream.team}"
        node = tx.nodes.get(row.node)
        if node is not None and not node.schedulable:
            return f"node {node.name} takes no grants now ({node.health or 'unschedulable'})"
        if row.node in held_nodes(tx.conn):  # a hand-on overtakes: never one that waited its turn
            return f"node {row.node} is held for a request that spent its overtake budget"
        if node is not None and not self._cycle.bindings.allows(node.node_pool, request):
            return f"node pool {node.node_pool}'s binding cannot express {request.describe()}"
        r = schema.reservations.c
        live = tx.conn.execute(
            select(r.id).where(r.holder == handed_holder(task_key), r.state == GRANTED).limit(1)
        ).first()
        if live is not None:
            return f"a slice is handed on to it already ({live.id})"
        return None

    def _grant_handed(
        self,
        tx: Tx,
        hid: str,
        task_key: str,
        request: GpuRequest,
        part: Assignment,
        hold: float,
        upstream_holder: str,
    ) -> None:
        """Grant ``part`` to the reservation held for ``task_key``: its lease is the hold, no pod."""
        tx.conn.execute(
            insert(schema.reservations).values(
                id=hid,
                holder=handed_holder(task_key),
                request=json.dumps(request.to_dict(), sort_keys=True),
                priority=request.priority,
                seq=tx.version,
                state=WAITING,
                team=request.team,
                workload_class=request.workload_class.value,
                created_at=tx.now,
                deadline=tx.now + hold,
                ttl=hold,
                overtakes=0,
            )
        )
        tx.queue_inserted.add(hid)
        self._store.requests.put(hid, request)
        grant_row(tx, hid, request, part)
        message = f"handed on from {upstream_holder}"[:1000]
        tx.conn.execute(
            update(schema.reservations).where(schema.reservations.c.id == hid).values(message=message)
        )
        log.info(
            "Handed GPU %s on node %s on to %s as %s (held %g s)",
            ",".join(map(str, part.gpu_indices)),
            part.node,
            task_key,
            hid,
            hold,
        )

    def pending(self, task_key: str) -> tuple[str, GpuRequest] | None:
        """The slice handed on to ``task_key`` that waits for its claim: its id and request (one read, no write)."""
        r = schema.reservations.c
        holder = handed_holder(task_key)

        def run(conn: Connection) -> tuple[str, GpuRequest] | None:
            query = select(schema.reservations).where(r.holder == holder, r.state == GRANTED).limit(1)
            row = conn.execute(query).first()
            return None if row is None else (str(row.id), self._store.request_of(row))

        return self._store.read(run)

    def claim(self, args: ReserveArgs, task_key: str) -> Reservation | str | None:
        """Take over the slice handed on to ``task_key`` as ``args``'s reservation; None: none to take.

        One transaction: the handed grant becomes the reservation ``args.reservation_id`` (its
        holder, lease and deadline those of ``args``), on the same GPUs. A slice handed on for
        another request than ``args.request`` is not taken: its id is returned, for the caller
        to release once its own reserve is accepted (a refused reserve changes nothing).
        """
        rid, holder = args.reservation_id, handed_holder(task_key)

        def run(tx: Tx) -> Reservation | str | None:
            tx.queue_tracked = True
            r = schema.reservations.c
            existing = tx.conn.execute(select(schema.reservations).where(r.id == rid)).first()
            if existing is not None:
                return self._store.reservation(tx.conn, existing)
            if args.not_before is not None and args.not_before > tx.now:
                return None  # queued ahead: not granted before its time, handed slice or not
            row = tx.conn.execute(
                select(schema.reservations).where(r.holder == holder, r.state == GRANTED).limit(1)
            ).first()
            if row is None:
                return None
            if self._store.request_of(row) != args.request:
                return str(row.id)
            tx.conn.execute(
                update(schema.reservations)
                .where(r.id == row.id)
                .values(
                    id=rid,
                    holder=args.holder,
                    ttl=args.ttl,
                    expires_at=tx.now + args.ttl,
                    deadline=tx.now + args.timeout,
                )
            )
            tx.dirty = True
            self._store.requests.put(rid, args.request)
            log.info("Slice %s handed on to %s claimed as %s by %s", row.id, task_key, rid, args.holder)
            return self._store.reservation(tx.conn, records.row_by_id(tx.conn, rid))

        return self._cycle.write(run)


class LedgerHandOnApi:
    """The ledger's public hand-on: :class:`~airflow_gpupool.ledger.Ledger` inherits it."""

    _hand_ons: HandOns
    _grants: LedgerGrants

    def _reserve(self, args: ReserveArgs) -> Reservation:
        raise NotImplementedError  # the ledger's

    def release(self, reservation_id: str, *, reason: str = "released by holder") -> ReleaseResult:
        raise NotImplementedError  # the ledger's

    def _claim_ahead(self, args: ReserveArgs, task_key: str) -> Reservation | str | None:
        raise NotImplementedError  # the ledger's (grants.queue_ahead)

    def _withdraw_ahead(self, task_key: str, why: str) -> None:
        raise NotImplementedError  # the ledger's (grants.queue_ahead)

    def _claim_or_reserve(self, args: ReserveArgs, task_key: str) -> Reservation:
        """Take over the slice handed on to ``task_key`` (:meth:`HandOns.claim`), or the request queued
        ahead for it, or reserve as usual."""
        queued = self._claim_ahead(args, task_key)
        if isinstance(queued, Reservation):
            return queued
        handed = self._hand_ons.pending(task_key)
        # Only a slice handed on for this very request is taken over (a write, which reaps what is
        # due); one for another request is freed once this reserve is accepted: a refused reserve
        # (a request that fits no node) changes nothing.
        same = handed is not None and handed[1] == args.request
        claimed = self._hand_ons.claim(args, task_key) if same else None
        if isinstance(claimed, Reservation):
            return claimed
        reservation = self._reserve(args)
        if queued is not None:  # a plan not entered, or another request: withdrawn now
            self._withdraw_ahead(task_key, queued)
        if claimed is None and handed is not None and not same:
            claimed = handed[0]
        if claimed is not None:  # handed on for another request than this step's: freed now
            why = f"claimed by {args.reservation_id} for another request ({args.request.describe()})"
            log.info("Slice %s handed on to %s not taken: %s; released", claimed, task_key, why)
            self.release(claimed, reason=why)
        return reservation

    def hand_on(
        self,
        reservation_id: str,
        to_task_key: str,
        request: GpuRequest,
        *,
        hold_seconds: float | None = None,
        reason: str = "pod succeeded",
    ) -> HandOnResult:
        """End a grant, handing the part of its slice ``request`` takes on to the step ``to_task_key``.

        One transaction: the part (same node, within the slice) is held for that step's reserve
        (``task_key=to_task_key``) to take over, at most ``hold_seconds``; the rest is freed and
        the queue served. What cannot be handed on (another team, a gang, a MIG slice, a request
        bigger than the slice, a slice handed to that step already) is released as usual.

        :param to_task_key: the downstream step's :attr:`~airflow_gpupool.task_try.TaskTry.task_key`
        :param request: the downstream step's request
        :param hold_seconds: how long the part waits for its claim (default ``[gpupool] handoff_seconds``)
        :param reason: why the grant ends, kept in its history
        :raises UnknownReservationError: no such id
        :raises InvalidRequestError: a bad request, task key or hold; nothing is written
        """
        hold = settings.handoff_seconds() if hold_seconds is None else hold_seconds
        result = self._hand_ons.hand_on(reservation_id, to_task_key, request, hold, reason)
        if result is not None:
            return result
        released = self._grants.release(reservation_id, reason, True)  # a success: what queued ahead stays
        message = f"not handed on to {to_task_key} (not a plain grant): {released.message}"
        return HandOnResult(reservation_id, to_task_key, None, None, (), None, message)
