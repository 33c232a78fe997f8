"""External holds: the GPUs that pods this project did not make hold, counted as the ledger's own.

The controller's pod watch (:mod:`~airflow_gpupool.controller.external_pods`) hands every live,
scheduled pod that holds GPUs here. A pod bound to a grant (by name, or labelled with a live
reservation or gang) is the ledger's already; any other becomes one ``external`` row per GPU or
MIG slice it holds, holder ``external:<namespace>/<name>``, until its pod is gone.

Which GPUs, in this order:

1. the GPUs its annotations name (HAMi's allocation), by UUID, and the GPUs its DRA
   ResourceClaims were allocated (``gpu-<index>``), by index;
2. else, for whole GPUs, the node's wholly free GPUs, lowest index first; for a share of a GPU,
   the lowest-indexed GPU with room for it; for MIG, the free slices of its profile, lowest GPU
   and slice id first;
3. an unreadable pod, or one asking for a MIG profile its node does not have, holds every free
   GPU and MIG slice of its node (better an idle GPU than two pods on one).

The node agent's report then corrects the choice: a hold moves onto the GPUs it shows the pod's
processes on (:mod:`~airflow_gpupool.ledger.nodes.external_move`).

What the node has not got free (a grant holds it: the books were wrong) is not held twice: the
row says what fell short, and each full relist tries again, so the pod takes its GPUs once the
grant on them ends.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row, and_, select

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.models import (
    EXTERNAL_HOLDER_PREFIX,
    Reservation,
    ReservationState,
)
from airflow_gpupool.ledger.db.records import HOLDING
from airflow_gpupool.ledger.nodes.external_take import CONSERVATIVE, SHORT, HoldTaker
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.pod_gpus import ExternalPod
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest

__all__ = ["ExternalSync", "LedgerExternalHolds"]

log = logging.getLogger(LOGGER_NAME)

EXTERNAL = ReservationState.EXTERNAL.value


@dataclass(frozen=True)
class ExternalSync:
    """What one pass over the pods did.

    :param counted: pods newly held (``namespace/name``)
    :param released: pods whose holds ended (gone, finished, or bound to a grant)
    :param kept: pods already held as they are
    :param ours: pods bound to a grant: the ledger's already (``namespace/name``)
    :param unknown_node: pods on nodes the ledger does not keep (not held; tried again at the next pass)
    :param short: pods held short of what they hold (the rest is granted: the books were wrong), or
        counted conservatively (unreadable: every free GPU of the node held)
    """

    counted: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    kept: int = 0
    ours: tuple[str, ...] = ()
    unknown_node: tuple[str, ...] = ()
    short: tuple[str, ...] = ()


@dataclass
class _Pass:
    counted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    kept: int = 0
    ours: list[str] = field(default_factory=list)
    unknown_node: list[str] = field(default_factory=list)
    short: list[str] = field(default_factory=list)

    def result(self) -> ExternalSync:
        return ExternalSync(
            tuple(self.counted),
            tuple(self.released),
            self.kept,
            tuple(self.ours),
            tuple(self.unknown_node),
            tuple(self.short),
        )


class LedgerExternalHolds:
    """Count pods this project did not make (see :class:`~airflow_gpupool.ledger.Ledger`)."""

    def __init__(self, store: LedgerStore, cycle: WriteCycle) -> None:
        self._store = store
        self._cycle = cycle

    def sync_external(
        self, pods: Iterable[ExternalPod], gone: Iterable[str] = (), *, complete: bool = False
    ) -> ExternalSync:
        """Hold the GPUs of ``pods`` not bound to a grant, release those of ``gone``, in one transaction.

        :param pods: live, scheduled pods that hold GPUs
        :param gone: ``namespace/name`` of pods that ended or were deleted
        :param complete: ``pods`` are all such pods of the cluster (a relist): every other hold ends
        """
        live = {pod.key: pod for pod in pods}
        ended = [key for key in gone if key not in live]

        def run(tx: Tx) -> ExternalSync:
            done = _Pass()
            held = _external_rows(tx.conn, None if complete else [*live, *ended])
            owned = _Owned.read(tx.conn) if live else _Owned()
            for key, pod in live.items():
                rows = held.pop(key, [])
                if owned.owns(pod):
                    done.ours.append(key)
                    self._end(tx, rows, key, "its pod is now bound to a grant", done)
                elif rows and all(r.pod_uid == pod.uid for r in rows) and not (complete and _short(rows)):
                    done.kept += 1
                else:
                    self._end(tx, rows, key, "its pod was replaced", done, quiet=True)
                    self._hold(tx, pod, done)
            for key in ended:
                self._end(tx, held.pop(key, []), key, "its pod is gone", done)
            if complete:
                for key, rows in held.items():
                    self._end(tx, rows, key, "its pod is gone (relist)", done)
            if done.released:
                self._cycle.serve(tx)
            return done.result()

        return self._cycle.write(run)

    def external_holds(self) -> list[Reservation]:
        """Return the live external holds, by pod then GPU."""
        r = schema.reservations.c
        query = select(schema.reservations).where(r.state == EXTERNAL).order_by(r.holder, r.gpu_indices)
        store = self._store
        return store.read(lambda conn: [store.reservation(conn, row) for row in conn.execute(query)])

    def _end(
        self, tx: Tx, rows: list[Row[Any]], key: str, why: str, done: _Pass, *, quiet: bool = False
    ) -> None:
        if not rows:
            return
        for row in rows:
            self._cycle.end_grant(tx, row, ReservationState.RELEASED, f"external hold released: {why}")
        if not quiet:
            log.info("External pod %s: %s; its GPUs are free in the ledger again", key, why)
            done.released.append(key)

    def _hold(self, tx: Tx, pod: ExternalPod, done: _Pass) -> None:
        if pod.node not in tx.nodes:
            done.unknown_node.append(pod.key)
            return
        taker = HoldTaker(tx, pod)
        units, shortfall = taker.choose()
        for unit in units:
            taker.take(unit)
        conservative = shortfall.startswith(CONSERVATIVE)
        message = shortfall if conservative else f"{SHORT}{shortfall}" if shortfall else ""
        if not taker.taken:  # keep the pod known (and re-tried at the next relist)
            taker.record(Assignment(pod.node, (), 0, 0), GpuRequest(cpu_milli=0, memory_mib=0), message)
        elif message:
            taker.note(message)
        what = ", ".join(_describe(a) for a in taker.taken) or "nothing"
        if shortfall:
            done.short.append(pod.key)
            log.warning("External pod %s on %s holds %s; %s", pod.key, pod.node, what, shortfall)
        else:
            log.info("External pod %s on %s counted: holds %s", pod.key, pod.node, what)
        done.counted.append(pod.key)


@dataclass
class _Owned:
    """The pods that grants are bound to, and the live reservations and gangs pods may be labelled with."""

    pods: set[str] = field(default_factory=set)
    reservations: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, conn: Connection) -> _Owned:
        r = schema.reservations.c
        rows = conn.execute(
            select(r.id, r.gang_id, r.pod_namespace, r.pod_name).where(
                and_(r.state.in_([*HOLDING, "waiting"]), r.state != EXTERNAL)
            )
        )
        owned = cls()
        for row in rows:
            owned.reservations.add(row.id)
            if row.gang_id is not None:
                owned.reservations.add(row.gang_id)
            if row.pod_name is not None:
                owned.pods.add(f"{row.pod_namespace}/{row.pod_name}")
        return owned

    def owns(self, pod: ExternalPod) -> bool:
        return (
            pod.key in self.pods
            or pod.reservation_id in self.reservations
            or pod.gang_reservation in self.reservations
        )


def _external_rows(conn: Connection, keys: list[str] | None) -> dict[str, list[Row[Any]]]:
    r = schema.reservations.c
    query = select(schema.reservations).where(r.state == EXTERNAL)
    if keys is not None:
        if not keys:
            return {}
        query = query.where(r.holder.in_([EXTERNAL_HOLDER_PREFIX + k for k in keys]))
    out: dict[str, list[Row[Any]]] = defaultdict(list)
    for row in conn.execute(query):
        out[row.holder.removeprefix(EXTERNAL_HOLDER_PREFIX)].append(row)
    return out


def _short(rows: list[Row[Any]]) -> bool:
    return any((row.message or "").startswith(SHORT) for row in rows)


def _describe(a: Assignment) -> str:
    if a.mig_slice is not None:
        return f"MIG slice {a.mig_slice}"
    share = "" if a.milli_per_gpu == MILLI_PER_GPU else f" ({a.milli_per_gpu} milli)"
    return f"GPU {a.gpu_indices[0]}{share}" if a.gpu_indices else "nothing"
