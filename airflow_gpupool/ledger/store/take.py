"""Take a grant's capacity out of the rows and the transaction's copy: the one way a waiting request is granted.

Each statement checks that the row still has room (:mod:`~airflow_gpupool.ledger.db.statements`):
a row without it means this process's copy of the capacity was wrong, and the transaction
runs again on a fresh copy.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_gpupool.exceptions import StaleCacheError
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.records import class_delta
from airflow_gpupool.ledger.store.transactions import Tx
from airflow_gpupool.placement.accounting import allocate
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest

__all__ = ["grant_row"]


def grant_row(tx: Tx, rid: str, request: GpuRequest, assignment: Assignment) -> None:
    """Record ``assignment`` as the grant of the waiting request ``rid``, if the rows still have room for it.

    :raises StaleCacheError: they have not: the capacity copy was wrong
    """
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
        taken_slice = {"at_node": node, "at_slice": assignment.mig_slice, "rid": rid}
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
            "rid": rid,
            "now": tx.now,
            "granted_node": node,
            "indices_json": json.dumps(list(assignment.gpu_indices)),
            "milli": assignment.milli_per_gpu,
            "gmem": assignment.gpu_memory_mib,
            "granted_slice": assignment.mig_slice,
        },
    ).rowcount
    if granted != 1:
        raise StaleCacheError(rid)
    tx.nodes[node] = allocate(tx.nodes[node], request, assignment)
    tx.granted.append(rid)
    tx.settled.append(rid)
    tx.assignments[rid] = assignment
    tx.dirty = True
