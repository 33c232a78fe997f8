"""Move external holds onto the GPUs the node agent sees their pods use (inside a heartbeat).

Where no annotation names a foreign pod's GPUs, its hold is a guess (the lowest free GPUs, see
:mod:`~airflow_gpupool.ledger.nodes.external`). The agent maps each GPU process to its pod through
the process's cgroup, so a report that shows processes of a held pod on GPUs its hold did not
take corrects the hold, whatever named its GPUs first: the agent sees the truth. Each hold row
that sits on a GPU where its pod runs nothing moves to one where it does, lowest index first.

Invariants kept: a hold moves only onto a GPU with room for it (the same conditional take as
every grant), so no GPU is held twice. A reported GPU that a grant of this project holds is drift:
the grant keeps it, a warning names the pod, the GPU and the grant, and the node is marked suspect
(:mod:`~airflow_gpupool.ledger.nodes.suspects`) so placement avoids it until the controller
resyncs it. MIG slices are not moved (their processes are not mapped to slices here).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Row, select, update

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.models import EXTERNAL_HOLDER_PREFIX, ReservationState
from airflow_gpupool.ledger.db.records import HOLDING
from airflow_gpupool.ledger.nodes.agent_report import NodeReport
from airflow_gpupool.ledger.nodes.suspects import write_suspect
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, Tx

__all__ = ["HoldDrift", "HoldMove", "HoldCorrections", "correct_external_holds"]

log = logging.getLogger(LOGGER_NAME)

EXTERNAL = ReservationState.EXTERNAL.value


@dataclass(frozen=True)
class HoldMove:
    """One external hold row moved from the GPU it guessed to the GPU its pod runs on."""

    pod: str
    reservation_id: str
    from_gpu: int
    to_gpu: int


@dataclass(frozen=True)
class HoldDrift:
    """A foreign pod runs on a GPU a grant of this project holds: the books were wrong."""

    pod: str
    gpu: int
    grant: str


@dataclass
class HoldCorrections:
    """What one report corrected: holds moved, drift found, and whether the node was marked."""

    moves: list[HoldMove] = field(default_factory=list)
    drift: list[HoldDrift] = field(default_factory=list)
    marked: bool = False

    @property
    def changed(self) -> bool:
        """Whether the capacity changed (the caller reads it again and serves the queue)."""
        return bool(self.moves) or self.marked


def correct_external_holds(
    tx: Tx, report: NodeReport, inventory: set[int], *, suspect: bool, need_lock: Callable[[], None]
) -> HoldCorrections:
    """Move the node's external holds onto the GPUs the report shows their pods on.

    :param inventory: the indices of the node's GPUs in the inventory (others are not trusted)
    :param suspect: the node is suspect already (drift is then not marked or logged again)
    :param need_lock: called before the first write (the heartbeat's quick path backs off there)
    """
    out = HoldCorrections()
    r = schema.reservations.c
    rows = tx.conn.execute(
        select(schema.reservations).where(r.node == report.node, r.state.in_(HOLDING))
    ).all()
    by_pod: dict[str, list[Row[Any]]] = defaultdict(list)
    for row in rows:
        if row.state == EXTERNAL and row.pod_uid and row.mig_slice is None and _indices(row):
            by_pod[row.pod_uid].append(row)
    if not by_pod:
        return out
    seen = _seen(report, inventory)
    granted = {
        idx: row.id
        for row in sorted(rows, key=lambda row: row.id, reverse=True)
        if row.state != EXTERNAL
        for idx in _indices(row)
    }
    planned: list[tuple[Row[Any], int]] = []
    for uid, pod_rows in sorted(by_pod.items()):
        planned += _plan(pod_rows, seen.get(uid, set()), granted, out)
    if planned:
        need_lock()
    for row, idx in planned:
        _move(tx, row, idx, out)
    if out.drift and not suspect:
        need_lock()
        for d in out.drift:
            log.warning(
                "Node %s: external pod %s runs on GPU %d, which grant %s holds (the books were wrong)",
                report.node,
                d.pod,
                d.gpu,
                d.grant,
            )
        what = "; ".join(f"pod {d.pod} runs on GPU {d.gpu}, held by grant {d.grant}" for d in out.drift)
        out.marked = write_suspect(tx, report.node, f"the node agent saw drift: {what}")
    return out


def _seen(report: NodeReport, inventory: set[int]) -> dict[str, set[int]]:
    """Return, per pod uid, the inventory GPUs the report shows its processes on."""
    seen: dict[str, set[int]] = defaultdict(set)
    for sample in report.gpus:
        if sample.index in inventory and not sample.lost:
            for process in sample.processes:
                if process.pod_uid:
                    seen[process.pod_uid].add(sample.index)
    return seen


def _plan(
    pod_rows: list[Row[Any]], where: set[int], granted: dict[int, str], out: HoldCorrections
) -> list[tuple[Row[Any], int]]:
    """Pair the pod's rows on GPUs it does not run on with the free GPUs it runs on, lowest first."""
    if not where:
        return []  # the agent shows nothing of this pod: the hold stays as it is
    pod = pod_rows[0].holder.removeprefix(EXTERNAL_HOLDER_PREFIX)
    held = {_gpu(row) for row in pod_rows}
    wrong = sorted((row for row in pod_rows if _gpu(row) not in where), key=_gpu)
    free: list[int] = []
    for idx in sorted(where - held):
        if idx in granted:
            out.drift.append(HoldDrift(pod, idx, granted[idx]))
        else:
            free.append(idx)
    return list(zip(wrong, free, strict=False))


def _move(tx: Tx, row: Row[Any], idx: int, out: HoldCorrections) -> None:
    params = {"at_node": row.node, "milli": row.milli_per_gpu or 0, "gmem": row.gpu_memory_mib or 0}
    pod = row.holder.removeprefix(EXTERNAL_HOLDER_PREFIX)
    if tx.conn.execute(sql.TAKE_GPUS, {**params, "indices": [idx]}).rowcount != 1:
        log.info(
            "External pod %s on %s runs on GPU %d, which has no room for its hold: it stays on GPU %d",
            pod,
            row.node,
            idx,
            _gpu(row),
        )
        return
    tx.conn.execute(sql.RETURN_GPUS, {**params, "indices": [_gpu(row)]})
    r = schema.reservations.c
    tx.conn.execute(update(schema.reservations).where(r.id == row.id).values(gpu_indices=json.dumps([idx])))
    tx.conn.execute(update(schema.nodes).where(schema.nodes.c.name == row.node).values(version=tx.version))
    tx.dirty, tx.exact = True, False
    out.moves.append(HoldMove(pod, row.id, _gpu(row), idx))
    log.info(
        "External pod %s on %s: hold moved from GPU %d to GPU %d, where the node agent sees its processes",
        pod,
        row.node,
        _gpu(row),
        idx,
    )


def _indices(row: Row[Any]) -> list[int]:
    return [int(i) for i in json.loads(row.gpu_indices or "[]")]


def _gpu(row: Row[Any]) -> int:
    return _indices(row)[0]
