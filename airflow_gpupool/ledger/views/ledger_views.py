"""Read views of the ledger: one reservation, why it waits, history, snapshots, invariants.

Each view is one read-only transaction, so it sees one consistent state and never takes
the write lock. Views that need the capacity read it into a copy of their own: the
process's copy belongs to the writers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, select

from airflow_gpupool.exceptions import UnknownReservationError
from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.ledger.db import records, schema
from airflow_gpupool.ledger.db.models import Gang, LedgerSnapshot, NodeRecord, Reservation, ReservationState
from airflow_gpupool.ledger.db.records import EXTERNAL, HOLDING, WAITING
from airflow_gpupool.ledger.queue import gangs
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.cache import CapacityCache
from airflow_gpupool.ledger.store.transactions import LedgerStore, Tx
from airflow_gpupool.ledger.views.invariants import cluster_violations, find_violations
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.resources import MILLI_PER_GPU


class LedgerViews:
    """Read what the ledger holds (see :class:`~airflow_gpupool.ledger.Ledger`)."""

    def __init__(self, store: LedgerStore, cycle: WriteCycle) -> None:
        self._store = store
        self._cycle = cycle

    def get(self, reservation_id: str) -> Reservation:
        """Return a reservation's current state."""
        store = self._store
        return store.read(lambda conn: store.reservation(conn, records.row_by_id(conn, reservation_id)))

    def get_or_none(self, reservation_id: str) -> Reservation | None:
        """Return a reservation's current state, or None when there is no such id."""
        try:
            return self.get(reservation_id)
        except UnknownReservationError:
            return None

    def gang(self, reservation_id: str) -> Gang:
        """Return the gang of a leader or member id (see :func:`~airflow_gpupool.ledger.queue.gangs.gang_of`)."""
        store = self._store
        return store.read(lambda conn: gangs.gang_of(conn, store, reservation_id))

    def queue_positions(self) -> dict[str, int]:
        """Return the position of every waiting request, by id (1: next in line): one read."""
        r = schema.reservations.c
        query = select(r.id).where(r.state == WAITING).order_by(r.priority.desc(), r.seq, r.id)
        return self._store.read(lambda conn: {row.id: n for n, row in enumerate(conn.execute(query), 1)})

    def explain(self, reservation_id: str) -> str:
        """Say why a waiting reservation waits (its queue position and the closest nodes)."""

        def run(conn: Connection) -> str:
            row = records.row_by_id(conn, reservation_id)
            if row.state != WAITING:
                return f"reservation is {row.state}"
            cache = _loaded_cache(conn)
            tx = Tx(conn, self._store.clock(conn), 0, dict(cache.nodes))
            return self._cycle.blocked_message(tx, row, cache)

        return self._store.read(run)

    def explain_many(self, reservation_ids: Iterable[str]) -> dict[str, str]:
        """Say why each of ``reservation_ids`` waits, in one read: the capacity is loaded once.

        An id that is no longer in the ledger is left out.
        """
        ids = list(reservation_ids)

        def run(conn: Connection) -> dict[str, str]:
            cache = _loaded_cache(conn)
            now = self._store.clock(conn)
            out = {}
            for reservation_id in ids:
                try:
                    row = records.row_by_id(conn, reservation_id)
                except UnknownReservationError:
                    continue
                if row.state != WAITING:
                    out[reservation_id] = f"reservation is {row.state}"
                    continue
                out[reservation_id] = self._cycle.blocked_message(
                    Tx(conn, now, 0, dict(cache.nodes)), row, cache
                )
            return out

        return self._store.read(run) if ids else {}

    def history(
        self, states: Iterable[ReservationState] | None = None, limit: int = 100
    ) -> list[Reservation]:
        """Return the most recent reservations (newest first), optionally only in ``states``."""
        r = schema.reservations.c
        query = select(schema.reservations).order_by(r.seq.desc()).limit(limit)
        if states is not None:
            query = query.where(r.state.in_([ReservationState(s).value for s in states]))
        store = self._store
        return store.read(lambda conn: [store.reservation(conn, row) for row in conn.execute(query)])

    def empty_cluster(self) -> ClusterSnapshot:
        """Return the inventory as if nothing were granted: what a request could ever get."""

        def run(conn: Connection) -> ClusterSnapshot:
            cache = _loaded_cache(conn)
            return cache.empty_snapshot(cache.nodes.values())

        return self._store.read(run)

    def snapshot(self) -> LedgerSnapshot:
        """Return one consistent view: nodes, GPUs, free capacity, grants and the queue."""
        return self._store.read(self._snapshot)

    def _snapshot(self, conn: Connection) -> LedgerSnapshot:
        cache = _loaded_cache(conn)
        nodes = _node_records(conn)
        r = schema.reservations.c
        live = conn.execute(
            select(schema.reservations)
            .where(r.state.in_([WAITING, *HOLDING]))
            # The queue's own order, id last: requests entered in one write share a seq.
            .order_by(r.priority.desc(), r.seq, r.id)
        ).all()
        grants = tuple(
            self._store.reservation(conn, row)
            for row in live
            if row.state in HOLDING and row.state != EXTERNAL
        )
        external = tuple(self._store.reservation(conn, row) for row in live if row.state == EXTERNAL)
        queue = tuple(self._store.reservation(conn, row) for row in live if row.state == WAITING)
        return LedgerSnapshot(
            taken_at=self._store.clock(conn),
            cluster=ClusterSnapshot(tuple(cache.nodes.values())),
            nodes=nodes,
            grants=grants,
            queue=queue,
            gpu_capacity_milli=sum(len(n.gpus) for n in nodes) * MILLI_PER_GPU,
            gpu_allocated_milli=sum(g.request.total_gpu_milli for g in grants),
            external=external,
        )

    def check_invariants(self, core_v1_api: Any = None) -> list[str]:
        """Recompute every node's use from the grants; return each disagreement (empty: consistent).

        :param core_v1_api: a ``kubernetes.client.CoreV1Api``: also check that no two live pods
            of reservations use one GPU beyond its capacity, or one MIG slice
        """
        pods = _reservation_pods(core_v1_api) if core_v1_api is not None else []

        def run(conn: Connection) -> list[str]:
            return find_violations(conn, self._store.request_of) + cluster_violations(conn, pods)

        return self._store.read(run)


def _reservation_pods(core_v1_api: Any) -> list[dict[str, Any]]:
    """List the pods labelled with a reservation id, in all namespaces, as JSON dicts."""
    pods: list[dict[str, Any]] = []
    token = None
    while True:
        response = core_v1_api.list_pod_for_all_namespaces(
            label_selector=RESERVATION_LABEL, limit=500, _continue=token, _preload_content=False
        )
        data = json.loads(response.data)
        pods += data.get("items") or []
        token = (data.get("metadata") or {}).get("continue")
        if not token:
            return pods


def _loaded_cache(conn: Connection) -> CapacityCache:
    cache = CapacityCache()
    cache.reload(conn)
    return cache


#: What the node agent's last report says of each GPU, shown beside the GPU's own columns.
_OBSERVED = ("memory_used_mib", "utilization", "leak", "processes", "warnings", "usage", "idle")


def _observed(agent_state: str | None) -> dict[int, dict[str, Any]]:
    """The ledger's judgement of each GPU at the last heartbeat (see ``ledger/health.py``)."""
    if not agent_state:
        return {}
    gpus = json.loads(agent_state).get("gpus") or {}
    return {int(idx): {k: g.get(k) for k in _OBSERVED} for idx, g in gpus.items()}


def _node_records(conn: Connection) -> tuple[NodeRecord, ...]:
    gpu_rows: dict[str, list[dict[str, Any]]] = {}
    for g in conn.execute(select(schema.gpus).order_by(schema.gpus.c.node, schema.gpus.c.idx)):
        gpu_rows.setdefault(g.node, []).append(dict(g._mapping))
    nodes = conn.execute(select(schema.nodes).order_by(schema.nodes.c.name)).all()
    for row in nodes:
        observed = _observed(row.agent_state)
        for gpu in gpu_rows.get(row.name, ()):
            gpu.update(observed.get(gpu["idx"], dict.fromkeys(_OBSERVED)))
    return tuple(
        NodeRecord(
            name=row.name,
            node_pool=row.node_pool,
            health=row.health,
            labels=json.loads(row.labels),
            cpu_milli=row.cpu_milli,
            memory_mib=row.memory_mib,
            cpu_free=row.cpu_free,
            memory_free=row.memory_free,
            heartbeat_at=row.heartbeat_at,
            gpus=tuple(gpu_rows.get(row.name, ())),
            health_source=row.health_source,
            health_reason=row.health_reason,
            heartbeat_interval=row.heartbeat_interval,
        )
        for row in nodes
    )
