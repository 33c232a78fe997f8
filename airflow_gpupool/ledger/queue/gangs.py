"""Gang reservations in the ledger: one queue entry, granted all or nothing, ended together.

A gang waits as one row, its leader's (``gang_id`` its own id, ``gang_index`` 0): one entry of
the queue, at the leader's priority and arrival. A pass over the queue that can place its
``min_members`` (:func:`~airflow_gpupool.placement.gang.place_gang`, on every node the pass
may use) grants them in the same transaction: the leader takes member 0's slice and a row per
other member (``{leader}.{i}``) is inserted granted, all with one ``granted_at``. An elastic
gang's further members are inserted waiting, as single requests at the gang's place in the
queue, granted one by one as capacity frees; they never time out on their own and are
withdrawn when the gang ends.

The gang's lease is one: renewing or adopting any member renews every member that holds,
so they expire together, and expiry takes the whole gang (or, when any member's pod is
bound, orphans every member): the pool never leaves a gang below its minimum. Only the
holder shrinks a gang, by releasing one member; releasing the leader ends the gang.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from sqlalchemy import Connection, Row, insert, select, update

from airflow_gpupool.exceptions import InvalidGangError, LeaseExpiredError
from airflow_gpupool.ledger.db import records, schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.models import Gang, ReservationState
from airflow_gpupool.ledger.db.records import GRANTED, HOLDING, ORPHANED, WAITING
from airflow_gpupool.ledger.store.take import grant_row
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.placement.gang import GangAssignment, place_gang
from airflow_gpupool.placement.policy import PlacementPolicy
from airflow_gpupool.placement.pools import PoolBindings
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.placement.verdict import Assignment, NoFit
from airflow_gpupool.resources import GpuRequest

__all__ = [
    "GangEnds",
    "admit",
    "end_gang",
    "expire_gang",
    "gang_of",
    "leader_id_limit",
    "member_id",
    "place",
    "renew_members",
]

log = logging.getLogger(LOGGER_NAME)

_r = schema.reservations.c
#: How long an elastic member may wait: for ever, in effect; it ends with its gang.
ELASTIC_WAIT_S = 100 * 366 * 86400.0
_ID_LENGTH = 64


class GangEnds(Protocol):
    """What the write cycle does to one reservation row (:class:`~airflow_gpupool.ledger.queue.cycle.WriteCycle`)."""

    def end_grant(self, tx: Tx, row: Row[Any], state: ReservationState, message: str) -> None:
        """End a grant in ``state`` and give back what it held."""
        ...

    def end_waiting(self, tx: Tx, row: Row[Any], state: ReservationState, message: str) -> None:
        """End a waiting reservation in ``state``."""
        ...


def member_id(leader_id: str, index: int) -> str:
    """Return the id of member ``index`` of the gang led by ``leader_id`` (the leader's own for 0)."""
    return leader_id if index == 0 else f"{leader_id}.{index}"


def leader_id_limit(request: GpuRequest) -> int:
    """Return the longest id a gang's leader may have: its members' ids fit the id column."""
    if request.gang is None or request.gang.members == 1:
        return _ID_LENGTH
    return _ID_LENGTH - len(f".{request.gang.members - 1}")


def place(
    tx: Tx,
    request: GpuRequest,
    held: frozenset[str],
    policy: PlacementPolicy,
    bindings: PoolBindings,
) -> GangAssignment | NoFit:
    """Place a waiting gang's ``min_members`` on the transaction's nodes, avoiding ``held``."""
    assert request.gang is not None
    nodes = tuple(
        n for n in tx.nodes.values() if n.name not in held and bindings.allows(n.node_pool, request)
    )
    return place_gang(ClusterSnapshot(nodes), request, request.gang.min_members, policy, bindings)


def admit(
    tx: Tx, store: LedgerStore, leader_id: str, request: GpuRequest, verdict: GangAssignment
) -> Assignment:
    """Grant the gang led by the waiting row ``leader_id`` as ``verdict`` places it; return the leader's assignment.

    Inserts the other members granted and, for an elastic gang, the members above its
    minimum waiting.

    :raises StaleCacheError: a row had no room: the capacity copy was wrong
    """
    assert request.gang is not None
    leader = records.row_by_id(tx.conn, leader_id)
    member = request.member
    text = json.dumps(member.to_dict(), sort_keys=True)
    for index, assignment in enumerate(verdict.members):
        if index:
            _insert_member(tx, leader, index, text, tx.now + ELASTIC_WAIT_S)
            store.requests.put(member_id(leader_id, index), member)
        grant_row(tx, member_id(leader_id, index), member, assignment)
    for index in range(request.gang.min_members, request.gang.members):
        _insert_member(tx, leader, index, text, tx.now + ELASTIC_WAIT_S)
        store.requests.put(member_id(leader_id, index), member)
        tx.elastic_added = True
    log.info("Gang %s granted %d members on %s", leader_id, len(verdict.members), ", ".join(verdict.nodes))
    return verdict.members[0]


def _insert_member(tx: Tx, leader: Row[Any], index: int, text: str, deadline: float) -> None:
    rid = member_id(leader.id, index)
    tx.queue_inserted.add(rid)  # nobody waits for it yet: not woken at commit
    tx.conn.execute(
        insert(schema.reservations).values(
            id=rid,
            holder=leader.holder,
            request=text,
            priority=leader.priority,
            # The gang's place in the queue: its growth is served where the gang was.
            seq=leader.seq,
            state=WAITING,
            team=leader.team,
            workload_class=leader.workload_class,
            created_at=tx.now,
            deadline=deadline,
            ttl=leader.ttl,
            overtakes=0,
            gang_id=leader.id,
            gang_index=index,
        )
    )
    tx.dirty = True


def rows_of(conn: Connection, gang_id: str) -> list[Row[Any]]:
    """Return the rows of a gang's members, by index."""
    query = select(schema.reservations).where(_r.gang_id == gang_id).order_by(_r.gang_index)
    return list(conn.execute(query).all())


def end_gang(
    ends: GangEnds,
    tx: Tx,
    gang_id: str,
    held_state: ReservationState,
    waiting_state: ReservationState,
    message: str,
) -> None:
    """End every member of a gang: those that hold in ``held_state``, those that wait in ``waiting_state``."""
    for row in rows_of(tx.conn, gang_id):
        if row.state in HOLDING:
            ends.end_grant(tx, row, held_state, message)
        elif row.state == WAITING:
            ends.end_waiting(tx, row, waiting_state, message)


def expire_gang(ends: GangEnds, tx: Tx, gang_id: str) -> None:
    """End a gang whose lease expired: every member expires, or, when a member's pod is bound, is orphaned.

    A gang keeps its slices together: while any of its pods may run, every member holds.
    """
    rows = rows_of(tx.conn, gang_id)
    bound = [r for r in rows if r.state in HOLDING and r.pod_name is not None]
    message = "lease of its gang expired without renewal"
    for row in rows:
        if row.state == WAITING:
            ends.end_waiting(tx, row, ReservationState.CANCELLED, f"{message}: growth withdrawn")
        elif row.state == GRANTED and bound:
            pods = ", ".join(f"{r.pod_namespace}/{r.pod_name}" for r in bound)
            log.warning(
                "Lease of gang %s expired while pods %s are bound: member %s orphaned", gang_id, pods, row.id
            )
            held = f"lease expired; slice held with its gang until pods {pods} are confirmed finished or gone"
            tx.conn.execute(sql.ORPHAN_ROW, {"rid": row.id, "now": tx.now, "orphan_message": held})
            tx.orphaned.append(row.id)
        elif row.state == GRANTED:
            log.warning("Lease of gang %s expired: returning member %s's slice", gang_id, row.id)
            ends.end_grant(tx, row, ReservationState.EXPIRED, message)
            tx.expired.append(row.id)


def renew_members(tx: Tx, row: Row[Any], expires_at: float, holder: str | None) -> None:
    """Renew every holding member of ``row``'s gang to ``expires_at`` (and pass them to ``holder``).

    :raises LeaseExpiredError: ``row`` itself holds nothing
    """
    if row.state not in HOLDING:
        raise LeaseExpiredError(row.id, row.state)
    for member in rows_of(tx.conn, row.gang_id):
        if member.state not in HOLDING:
            continue
        values: dict[str, object] = {"expires_at": expires_at}
        if member.state == ORPHANED:
            log.info("Orphaned gang member %s renewed by its holder: granted again", member.id)
            values.update(state=GRANTED, orphaned_at=None, message=None)
        if holder is not None and holder != member.holder:
            values.update(holder=holder)
        tx.conn.execute(update(schema.reservations).where(_r.id == member.id).values(**values))


def gang_of(conn: Connection, store: LedgerStore, reservation_id: str) -> Gang:
    """Return the gang of a leader or member id.

    :raises UnknownReservationError: no such id
    :raises InvalidGangError: the reservation is not part of a gang
    """
    row = records.row_by_id(conn, reservation_id)
    if row.gang_id is None:
        raise InvalidGangError("reservation_id", reservation_id, "the id of a gang's leader or member")
    members = tuple(store.reservation(conn, r) for r in rows_of(conn, row.gang_id))
    spec = members[0].request.gang
    assert spec is not None and members[0].gang_index == 0
    return Gang(row.gang_id, spec, members)
