"""Choose and take the GPUs of one external pod on its node, in the order :mod:`~airflow_gpupool.ledger.nodes.external` documents.

Each GPU, share of a GPU or MIG slice becomes one ``external`` row. A take is a conditional update
(the row must still have room), so a grant made concurrently on PostgreSQL is never held twice:
what it took first counts as what fell short.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, insert, select, update

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.models import EXTERNAL_HOLDER_PREFIX, EXTERNAL_TEAM, ReservationState
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, Tx
from airflow_gpupool.placement.accounting import allocate
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.pod_gpus import ExternalPod
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest

__all__ = ["CONSERVATIVE", "SHORT", "HoldTaker"]

log = logging.getLogger(LOGGER_NAME)

EXTERNAL = ReservationState.EXTERNAL.value
#: The message of a row that could not hold all its pod holds: a full relist tries it again.
SHORT = "short: "
#: The message of an unreadable pod's rows: it holds what was free when it was counted, once.
CONSERVATIVE = "counted conservatively: "


@dataclass(frozen=True)
class HoldUnit:
    """One GPU, share of a GPU, or MIG slice an external pod holds."""

    assignment: Assignment
    request: GpuRequest


class HoldTaker:
    """Choose and take one pod's GPUs on its node, in the documented order."""

    def __init__(self, tx: Tx, pod: ExternalPod) -> None:
        self.tx, self.pod = tx, pod
        g, m = schema.gpus.c, schema.mig_slices.c
        self.gpus = tx.conn.execute(select(schema.gpus).where(g.node == pod.node).order_by(g.idx)).all()
        self.slices = tx.conn.execute(
            select(schema.mig_slices)
            .where(m.node == pod.node, m.holder.is_(None))
            .order_by(m.gpu_idx, m.slice_id)
        ).all()
        self.used: set[int] = set()
        self.taken: list[Assignment] = []
        self.rows: list[str] = []

    def choose(self) -> tuple[list[HoldUnit], str]:
        use = self.pod.use
        profiles = {
            s.profile
            for s in self.tx.conn.execute(
                select(schema.mig_slices.c.profile).where(schema.mig_slices.c.node == self.pod.node)
            )
        }
        missing = [p for p, _ in use.mig if p not in profiles]
        if use.unreadable or missing:
            why = use.unreadable or f"MIG profile {missing[0]} does not exist on {self.pod.node}"
            everything = [self._whole(gpu) for gpu in self.gpus if _wholly_free(gpu)]
            everything += [self._slice(s) for s in self.slices]
            return everything, f"{CONSERVATIVE}{why}: every free GPU of the node held"
        units: list[HoldUnit] = []
        short: list[str] = []
        by_uuid = {gpu.uuid: gpu for gpu in self.gpus}
        by_idx = {gpu.idx: gpu for gpu in self.gpus}
        named = [by_uuid[u] for u in use.devices if u in by_uuid]
        named += [by_idx[i] for i in use.gpu_indices if i in by_idx]  # a DRA allocation's GPUs
        if use.whole:
            pool = named or [gpu for gpu in self.gpus if _wholly_free(gpu)]
            got = [self._whole(gpu) for gpu in pool if _wholly_free(gpu)][: use.whole]
            units += got
            if len(got) < use.whole:
                short.append(f"{use.whole - len(got)} of its {use.whole} GPUs are granted in the ledger")
        for _ in range(use.shared):
            unit = self._share(named)
            if unit is None:
                short.append("a share of a GPU it holds is granted in the ledger")
            else:
                units.append(unit)
        for profile, count in use.mig:
            free = [s for s in self.slices if s.profile == profile][:count]
            units += [self._slice(s) for s in free]
            if len(free) < count:
                short.append(
                    f"{count - len(free)} of its {count} MIG {profile} slices are granted in the ledger"
                )
        return units, "; ".join(short) + (" (the books were wrong)" if short else "")

    def _whole(self, gpu: Row[Any]) -> HoldUnit:
        self.used.add(gpu.idx)
        request = GpuRequest(cpu_milli=0, memory_mib=0, gpus=1, team=EXTERNAL_TEAM)
        return HoldUnit(Assignment(self.pod.node, (gpu.idx,), MILLI_PER_GPU, gpu.memory_mib), request)

    def _share(self, named: list[Row[Any]]) -> HoldUnit | None:
        use = self.pod.use
        for gpu in named or self.gpus:
            milli = use.share_milli or max(
                1, math.ceil(MILLI_PER_GPU * use.share_memory_mib / gpu.memory_mib)
            )
            memory = use.share_memory_mib or gpu.memory_mib * milli // MILLI_PER_GPU
            if gpu.idx in self.used or gpu.partitioned:
                continue
            if gpu.free_milli >= milli and gpu.free_memory_mib >= memory:
                self.used.add(gpu.idx)
                request = GpuRequest(
                    cpu_milli=0, memory_mib=0, gpu_milli=milli, gpu_memory_mib=memory, team=EXTERNAL_TEAM
                )
                return HoldUnit(Assignment(self.pod.node, (gpu.idx,), milli, memory), request)
        return None

    def _slice(self, s: Row[Any]) -> HoldUnit:
        request = GpuRequest(cpu_milli=0, memory_mib=0, mig_profile=s.profile, team=EXTERNAL_TEAM)
        return HoldUnit(Assignment(self.pod.node, (s.gpu_idx,), 0, 0, mig_slice=s.slice_id), request)

    def take(self, unit: HoldUnit) -> None:
        """Take one unit out of the rows, if a concurrent grant did not take it first."""
        conn, a, rid = self.tx.conn, unit.assignment, f"ext-{uuid.uuid4().hex}"
        if a.mig_slice is not None:
            took = conn.execute(
                sql.TAKE_MIG, {"at_node": a.node, "at_slice": a.mig_slice, "rid": rid}
            ).rowcount
        else:
            took = conn.execute(
                sql.TAKE_GPUS,
                {
                    "at_node": a.node,
                    "indices": list(a.gpu_indices),
                    "milli": a.milli_per_gpu,
                    "gmem": a.gpu_memory_mib,
                },
            ).rowcount
        if took != 1:
            return
        self.record(a, unit.request, "", rid)

    def record(self, a: Assignment, request: GpuRequest, message: str, rid: str | None = None) -> None:
        tx, pod = self.tx, self.pod
        rid = rid or f"ext-{uuid.uuid4().hex}"
        tx.conn.execute(
            sql.TAKE_NODE,
            {"at_node": a.node, "cpu": 0, "mem": 0, "training": 0, "inference": 0, "new_version": tx.version},
        )
        tx.conn.execute(
            insert(schema.reservations).values(
                id=rid,
                holder=EXTERNAL_HOLDER_PREFIX + pod.key,
                request=json.dumps(request.to_dict(), sort_keys=True),
                priority=0,
                seq=tx.version,
                state=EXTERNAL,
                team=EXTERNAL_TEAM,
                workload_class=request.workload_class.value,
                created_at=tx.now,
                deadline=tx.now,
                ttl=0.0,
                overtakes=0,
                granted_at=tx.now,
                node=a.node,
                gpu_indices=json.dumps(list(a.gpu_indices)),
                milli_per_gpu=a.milli_per_gpu,
                gpu_memory_mib=a.gpu_memory_mib,
                mig_slice=a.mig_slice,
                message=message or None,
                pod_namespace=pod.namespace,
                pod_name=pod.name,
                pod_uid=pod.uid,
                bound_at=tx.now,
            )
        )
        if a.gpu_indices or a.mig_slice is not None:
            tx.nodes[a.node] = allocate(tx.nodes[a.node], request, a)
            self.taken.append(a)
        self.rows.append(rid)
        tx.dirty = True

    def note(self, message: str) -> None:
        """Say on the pod's first row what fell short, so a relist tries again."""
        r = schema.reservations.c
        self.tx.conn.execute(update(schema.reservations).where(r.id == self.rows[0]).values(message=message))


def _wholly_free(gpu: Row[Any]) -> bool:
    return not gpu.partitioned and gpu.free_milli == MILLI_PER_GPU and gpu.free_memory_mib == gpu.memory_mib
