"""Rows of the ledger's tables made into the values it returns, and the queue position.

Each value is built in one place: a grant the ledger just made and a grant read back
later are the same :class:`~airflow_gpupool.ledger.db.models.Grant`. The functions take the
reservation's request as an argument, parsed once per process by the store's cache.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, Row, select

from airflow_gpupool.exceptions import UnknownReservationError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.models import HOLDING_STATES, Grant, Reservation, ReservationState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest, WorkloadClass

WAITING = ReservationState.WAITING.value
GRANTED = ReservationState.GRANTED.value
ORPHANED = ReservationState.ORPHANED.value
EXTERNAL = ReservationState.EXTERNAL.value
HOLDING = HOLDING_STATES


def class_delta(request: GpuRequest) -> tuple[int, int]:
    """Return how a grant of ``request`` changes its node's (training, inference) counts."""
    if request.workload_class is WorkloadClass.TRAINING:
        return 1, 0
    if request.workload_class is WorkloadClass.INFERENCE:
        return 0, 1
    return 0, 0


def assignment_of(row: Row[Any]) -> Assignment:
    """Return what a reservation row holds (or held) on its node."""
    return Assignment(
        node=row.node,
        gpu_indices=tuple(json.loads(row.gpu_indices or "[]")),
        milli_per_gpu=row.milli_per_gpu or 0,
        gpu_memory_mib=row.gpu_memory_mib or 0,
        mig_slice=row.mig_slice,
    )


def build_grant(
    assignment: Assignment,
    request: GpuRequest,
    *,
    node_pool: str,
    gpu_info: Mapping[int, tuple[str, str, bool]],
    granted_at: float,
    expires_at: float,
) -> Grant:
    """Return the grant of ``assignment``.

    :param gpu_info: ``(uuid, model, uuid verified)`` by GPU index on the assignment's node
    """
    indices = assignment.gpu_indices
    verified = bool(indices) and all(i in gpu_info and gpu_info[i][2] for i in indices)
    return Grant(
        node=assignment.node,
        node_pool=node_pool,
        gpu_indices=indices,
        gpu_uuids=tuple(gpu_info.get(i, ("", ""))[0] for i in indices),
        gpu_model=next((gpu_info[i][1] for i in indices if i in gpu_info), None),
        milli_per_gpu=assignment.milli_per_gpu,
        gpu_memory_mib=assignment.gpu_memory_mib,
        mig_slice=assignment.mig_slice,
        mig_profile=request.mig_profile if assignment.mig_slice is not None else None,
        granted_at=granted_at,
        expires_at=expires_at,
        gpu_uuids_verified=verified,
    )


def grant_of(conn: Connection, row: Row[Any], request: GpuRequest) -> Grant:
    """Return the grant a reservation row holds (or held), with its node's GPUs as they are now."""
    gpus = schema.gpus.c
    info = {
        g.idx: (g.uuid, g.model, bool(g.uuid_verified))
        for g in conn.execute(
            select(gpus.idx, gpus.uuid, gpus.model, gpus.uuid_verified).where(gpus.node == row.node)
        )
    }
    pool = conn.execute(select(schema.nodes.c.node_pool).where(schema.nodes.c.name == row.node)).scalar()
    grant = build_grant(
        assignment_of(row),
        request,
        node_pool=pool or "default",
        gpu_info=info,
        granted_at=row.granted_at,
        expires_at=row.expires_at,
    )
    if row.pod_name is None:
        return grant
    return replace(
        grant,
        pod_namespace=row.pod_namespace,
        pod_name=row.pod_name,
        pod_uid=row.pod_uid,
        bound_at=row.bound_at,
    )


def row_by_id(conn: Connection, reservation_id: str) -> Row[Any]:
    """Return the row of ``reservation_id``.

    :raises UnknownReservationError: no such id
    """
    row = conn.execute(sql.ROW_BY_ID, {"id": reservation_id}).first()
    if row is None:
        raise UnknownReservationError(reservation_id)
    return row


def waiting_ahead(conn: Connection, row: Row[Any]) -> int:
    """Return how many waiting requests the queue serves before the reservation ``row``."""
    return int(
        conn.execute(
            sql.WAITING_AHEAD, {"priority": row.priority, "seq": row.seq, "rid": row.id}
        ).scalar_one()
    )


def reservation_of(conn: Connection, row: Row[Any], request: GpuRequest) -> Reservation:
    """Return the reservation of ``row``: its grant when it holds (or held) one, its place when it waits."""
    grant = None
    position = None
    if row.state in HOLDING or (row.node is not None and row.state != WAITING):
        grant = grant_of(conn, row, request)
    if row.state == WAITING:
        position = 1 + waiting_ahead(conn, row)
    return Reservation(
        id=row.id,
        holder=row.holder,
        state=state_of(row),
        request=request,
        created_at=row.created_at,
        deadline=row.deadline,
        grant=grant,
        position=position,
        message=row.message or "",
        ended_at=row.ended_at,
        orphaned_at=row.orphaned_at,
        gang_id=row.gang_id,
        gang_index=row.gang_index,
        preempt_deadline=row.preempt_deadline,
        preempted_by=row.preempted_by,
        checkpoint_at=row.checkpoint_at,
        headroom_loan=bool(row.headroom_loan),
        not_before=row.not_before,
        overtakes=(row.overtakes or 0) if row.state == WAITING else 0,
    )


def state_of(row: Row[Any]) -> ReservationState:
    """Return the state of ``row``: a grant with a preemption deadline is ``preempting``."""
    if row.state == GRANTED and row.preempt_deadline is not None:
        return ReservationState.PREEMPTING
    return ReservationState(row.state)
