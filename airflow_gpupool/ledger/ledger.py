"""The GPU ledger: inventory, reservations with leases, and the waiting queue.

Every change is one transaction under the ledger's write lock (a PostgreSQL advisory
lock, or SQLite's ``BEGIN IMMEDIATE``): a request is granted whole or not at all, and the
queue is served by whichever client holds the lock when capacity changes. Each write
transaction first expires dead leases and overdue requests, so a pool heals itself as
long as anyone uses it; :meth:`Ledger.reap` does the same on demand.

On PostgreSQL, a grant or release that needs no queue decision (nothing waits, no lease
is overdue) takes the lock in shared mode instead and commits alongside others: see
:mod:`airflow_gpupool.ledger.pg_functions`. Anything else takes it exclusively.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, and_, delete, func, insert, or_, select, update

from airflow_gpupool import settings
from airflow_gpupool.exceptions import (
    InvalidInventoryError,
    InvalidRequestError,
    LeaseExpiredError,
    NoCapacityError,
    UnknownReservationError,
)
from airflow_gpupool.ledger import schema
from airflow_gpupool.ledger import statements as sql
from airflow_gpupool.ledger.cache import CapacityCache, classes_from_counts
from airflow_gpupool.ledger.concurrent import ConcurrentPath
from airflow_gpupool.ledger.engine import make_engine, read_transaction, transient_retry, write_transaction
from airflow_gpupool.ledger.equivalence import EquivalenceIndex
from airflow_gpupool.ledger.migrations import migrate, require_current
from airflow_gpupool.ledger.models import (
    Grant,
    LedgerSnapshot,
    NodeRecord,
    ReapResult,
    ReleaseResult,
    Reservation,
    ReservationState,
)
from airflow_gpupool.placement.accounting import allocate, deallocate
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.policy import PlacementPolicy, get_policy
from airflow_gpupool.placement.queue import QueueEntry, hold_node, serve
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFit, NoFitReason
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest, NodeHealth, NodeInventory, WorkloadClass

log = logging.getLogger(__name__)

T = TypeVar("T")
_WAITING = ReservationState.WAITING.value
_GRANTED = ReservationState.GRANTED.value
_MAX_HOLDER = 512
# Nodes a concurrent grant tries before it takes the serialized path (each try is one round trip).
_CONCURRENT_ATTEMPTS = 4
# How old the capacity copy may be when a concurrent grant places on it. Older copies are
# refreshed first; a wrong guess costs one more try, never a wrong grant.
_CACHE_FRESH_FOR_S = 0.5


class _StaleCacheError(Exception):
    """A conditional update found less capacity than the cache said: reload and redo."""


@dataclass
class _Tx:
    """State of one write transaction."""

    conn: Connection
    now: float
    version: int
    nodes: dict[str, NodeState]
    dirty: bool = False
    inventory_changed: bool = False
    # Whether ``nodes`` is exactly what the database holds once this transaction commits
    # (grants and releases only); then the cache adopts it instead of re-reading it.
    exact: bool = True
    granted: list[str] = field(default_factory=list)
    assignments: dict[str, Assignment] = field(default_factory=dict)
    expired: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(tuple(self.nodes.values()))


@dataclass(frozen=True)
class InventoryChange:
    """What an inventory upsert did, by node name."""

    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()


def _class_delta(request: GpuRequest) -> tuple[int, int]:
    if request.workload_class is WorkloadClass.TRAINING:
        return 1, 0
    if request.workload_class is WorkloadClass.INFERENCE:
        return 0, 1
    return 0, 0


def _assignment_of(row: Row[Any]) -> Assignment:
    return Assignment(
        node=row.node,
        gpu_indices=tuple(json.loads(row.gpu_indices or "[]")),
        milli_per_gpu=row.milli_per_gpu or 0,
        gpu_memory_mib=row.gpu_memory_mib or 0,
        mig_slice=row.mig_slice,
    )


class Ledger:
    """The shared record of who holds which GPU slice.

    :param url: SQLAlchemy URL (``sqlite:////path/ledger.db``, ``postgresql://user@host/db``);
        default from :func:`airflow_gpupool.settings.ledger_url`
    :param policy: placement policy name or instance; default ``[gpupool] placement_policy``
    :param clock: seconds since the epoch; tests pass a fake one
    :param max_overtakes: the no-starvation bound, see :mod:`airflow_gpupool.placement.queue`
    :param concurrent: on PostgreSQL, grant and release under the shared lock when no queue
        decision is needed (see :mod:`airflow_gpupool.ledger.pg_functions`); False makes
        every write take the exclusive lock, as on SQLite
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        policy: str | PlacementPolicy | None = None,
        clock: Callable[[], float] = time.time,
        max_overtakes: int | None = None,
        concurrent: bool = True,
    ) -> None:
        self.url = settings.ledger_url(url)
        self._engine = make_engine(self.url)
        if policy is None or isinstance(policy, str):
            policy = get_policy(policy or settings.placement_policy())
        self.policy = policy
        self._clock = clock
        self.max_overtakes = max_overtakes if max_overtakes is not None else settings.max_overtakes()
        self._synchronous_commit = settings.synchronous_commit()
        self._cache = CapacityCache()
        self._equivalence = EquivalenceIndex()
        # The copy of the capacity is changed outside the database lock by concurrent grants:
        # threads sharing this Ledger take turns with it.
        self._cache_lock = threading.RLock()
        self._requests: dict[str, GpuRequest] = {}
        self._schema_checked = False
        self._concurrent = (
            ConcurrentPath(self.url, self._synchronous_commit)
            if concurrent and self.dialect == "postgresql"
            else None
        )

    @classmethod
    def create(cls, url: str | None = None, **options: Any) -> Ledger:
        """Open the ledger at ``url``, creating or migrating its schema first."""
        ledger = cls(url, **options)
        ledger.migrate()
        return ledger

    def migrate(self) -> list[int]:
        """Create the schema or bring it up to date; return the versions applied."""
        applied = migrate(self._engine)
        self._schema_checked = True
        return applied

    def close(self) -> None:
        """Close the database connections."""
        self._engine.dispose()
        if self._concurrent is not None:
            self._concurrent.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now(self) -> float:
        """Return the ledger's clock (seconds since the epoch): what leases and timeouts are measured on."""
        return self._clock()

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    # -- transactions -------------------------------------------------------------------

    def _check_schema(self, conn: Connection) -> None:
        if not self._schema_checked:
            require_current(conn, self.url)
            self._schema_checked = True

    @transient_retry
    def _write(self, fn: Callable[[_Tx], T]) -> T:
        for attempt in range(2):
            try:
                return self._write_once(fn)
            except _StaleCacheError:
                log.warning("Capacity cache disagreed with the ledger; reloading (attempt %d)", attempt + 1)
                with self._cache_lock:
                    self._cache.invalidate()
        return self._write_once(fn)

    def _write_once(self, fn: Callable[[_Tx], T]) -> T:
        try:
            return self._write_in_transaction(fn)
        except BaseException:
            # The cache may hold rows of the rolled-back transaction: start over next time.
            with self._cache_lock:
                self._cache.invalidate()
            raise

    def _write_in_transaction(self, fn: Callable[[_Tx], T]) -> T:
        with self._cache_lock:
            with write_transaction(self._engine, self._synchronous_commit) as conn:
                self._check_schema(conn)
                stamp = self._cache.refresh(conn, writing=True)
                tx = _Tx(conn, self._clock(), stamp.version, dict(self._cache.nodes))
                self._expire_due(tx)
                result = fn(tx)
                if tx.dirty and stamp.counter:
                    self._bump(conn, "version", tx.version)
                if tx.inventory_changed:
                    self._bump(conn, "inventory_generation", stamp.generation + 1)
            if tx.dirty and tx.exact and not tx.inventory_changed:
                self._cache.adopt(tx.nodes, stamp.watermark_after_commit)
            return result

    @staticmethod
    def _bump(conn: Connection, key: str, value: int) -> None:
        conn.execute(sql.BUMP_META, {"meta_key": key, "meta_value": value})

    @transient_retry
    def _read(self, fn: Callable[[Connection], T]) -> T:
        with read_transaction(self._engine) as conn:
            self._check_schema(conn)
            return fn(conn)

    # -- inventory ------------------------------------------------------------------------

    def upsert_nodes(self, inventory: Iterable[NodeInventory]) -> InventoryChange:
        """Add or update nodes, all in one transaction; unchanged nodes are left alone.

        :raises InvalidInventoryError: a node is malformed, listed twice, or would lose a GPU
            or MIG slice that a live grant holds (drain the node first)
        """
        nodes = list(inventory)
        names = [n.name for n in nodes]
        for node in nodes:
            if not isinstance(node, NodeInventory):
                raise InvalidInventoryError("node", node, "a NodeInventory")
        if len(set(names)) != len(names):
            raise InvalidInventoryError(
                "nodes", sorted(n for n in names if names.count(n) > 1), "unique node names"
            )

        def run(tx: _Tx) -> InventoryChange:
            added: list[str] = []
            updated: list[str] = []
            unchanged: list[str] = []
            for node in nodes:
                outcome = self._upsert_node(tx, node)
                {"added": added, "updated": updated, "unchanged": unchanged}[outcome].append(node.name)
            if added or updated:
                tx.dirty = tx.inventory_changed = True
                # Serve the queue on the nodes as they are now, not as the cache last saw them.
                self._cache.reload(tx.conn)
                tx.nodes = dict(self._cache.nodes)
                self._serve(tx)
            return InventoryChange(tuple(added), tuple(updated), tuple(unchanged))

        change = self._write(run)
        if change.added and self.dialect == "postgresql":
            self._analyze()
        return change

    def _analyze(self) -> None:
        """Refresh the planner's statistics, so lookups by version and node use the indexes at once."""
        with self._engine.connect() as conn, conn.begin():
            conn.exec_driver_sql("ANALYZE gpupool_nodes, gpupool_gpus, gpupool_mig_slices")

    def _upsert_node(self, tx: _Tx, node: NodeInventory) -> str:
        conn = tx.conn
        existing = conn.execute(select(schema.nodes).where(schema.nodes.c.name == node.name)).first()
        gpu_rows = [
            {"node": node.name, "idx": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib}
            for g in node.gpus
        ]
        mig_rows = [
            {"node": node.name, "slice_id": s.slice_id, "gpu_idx": g.index, "profile": s.profile}
            for g in node.gpus
            for s in g.mig_slices
        ]
        if existing is not None and self._same_inventory(conn, existing, node, gpu_rows, mig_rows):
            return "unchanged"
        held = self._held_on_node(conn, node.name)
        self._check_not_losing_grants(node, held, mig_rows)
        cpu_used = sum(r["request"].cpu_milli for r in held)
        mem_used = sum(r["request"].memory_mib for r in held)
        training = sum(1 for r in held if r["request"].workload_class is WorkloadClass.TRAINING)
        inference = sum(1 for r in held if r["request"].workload_class is WorkloadClass.INFERENCE)
        values = {
            "cpu_milli": node.cpu_milli,
            "memory_mib": node.memory_mib,
            "cpu_free": node.cpu_milli - cpu_used,
            "memory_free": node.memory_mib - mem_used,
            "labels": json.dumps(dict(node.labels), sort_keys=True),
            "node_pool": node.node_pool,
            "health": node.health.value,
            "n_training": training,
            "n_inference": inference,
            "updated_at": tx.now,
            "version": tx.version,
        }
        if existing is None:
            conn.execute(insert(schema.nodes).values(name=node.name, remove_when_drained=False, **values))
        else:
            if existing.remove_when_drained:
                values["remove_when_drained"] = False
            conn.execute(update(schema.nodes).where(schema.nodes.c.name == node.name).values(**values))
            conn.execute(delete(schema.gpus).where(schema.gpus.c.node == node.name))
            conn.execute(delete(schema.mig_slices).where(schema.mig_slices.c.node == node.name))
        self._insert_gpus(conn, node, gpu_rows, mig_rows, held)
        return "added" if existing is None else "updated"

    @staticmethod
    def _same_inventory(
        conn: Connection,
        existing: Row[Any],
        node: NodeInventory,
        gpu_rows: list[dict[str, Any]],
        mig_rows: list[dict[str, Any]],
    ) -> bool:
        same_node = (
            existing.cpu_milli == node.cpu_milli
            and existing.memory_mib == node.memory_mib
            and json.loads(existing.labels) == dict(node.labels)
            and existing.node_pool == node.node_pool
            and existing.health == node.health.value
            and not existing.remove_when_drained
        )
        if not same_node:
            return False
        have_gpus = {
            (r.idx, r.uuid, r.model, r.memory_mib)
            for r in conn.execute(select(schema.gpus).where(schema.gpus.c.node == node.name))
        }
        want_gpus = {(g["idx"], g["uuid"], g["model"], g["memory_mib"]) for g in gpu_rows}
        have_migs = {
            (r.slice_id, r.gpu_idx, r.profile)
            for r in conn.execute(select(schema.mig_slices).where(schema.mig_slices.c.node == node.name))
        }
        want_migs = {(m["slice_id"], m["gpu_idx"], m["profile"]) for m in mig_rows}
        return have_gpus == want_gpus and have_migs == want_migs

    def _held_on_node(self, conn: Connection, node: str) -> list[dict[str, Any]]:
        rows = conn.execute(
            select(schema.reservations).where(
                schema.reservations.c.node == node, schema.reservations.c.state == _GRANTED
            )
        ).all()
        return [{"row": r, "request": self._request_of(r), "assignment": _assignment_of(r)} for r in rows]

    @staticmethod
    def _check_not_losing_grants(
        node: NodeInventory, held: list[dict[str, Any]], mig_rows: list[dict[str, Any]]
    ) -> None:
        gpus = {g.index: g for g in node.gpus}
        slices = {m["slice_id"]: (m["gpu_idx"], m["profile"]) for m in mig_rows}
        for h in held:
            a: Assignment = h["assignment"]
            missing = [i for i in a.gpu_indices if i not in gpus]
            slice_kept = a.mig_slice is None or slices.get(a.mig_slice) == (
                a.gpu_indices[0],
                h["request"].mig_profile,
            )
            if missing or not slice_kept:
                raise InvalidInventoryError(
                    f"node {node.name}",
                    f"GPUs {missing or a.mig_slice}",
                    f"to keep what grant {h['row'].id} holds; drain the node (remove it) before repartitioning",
                )
            if a.mig_slice is None and any(gpus[i].mig_slices for i in a.gpu_indices):
                raise InvalidInventoryError(
                    f"node {node.name}",
                    f"MIG on GPUs {list(a.gpu_indices)}",
                    f"no MIG partitioning while grant {h['row'].id} holds them; drain the node first",
                )

    @staticmethod
    def _insert_gpus(
        conn: Connection,
        node: NodeInventory,
        gpu_rows: list[dict[str, Any]],
        mig_rows: list[dict[str, Any]],
        held: list[dict[str, Any]],
    ) -> None:
        used_milli: dict[int, int] = {}
        used_mem: dict[int, int] = {}
        holders: dict[str, str] = {}
        for h in held:
            a: Assignment = h["assignment"]
            if a.mig_slice is not None:
                holders[a.mig_slice] = h["row"].id
                continue
            for i in a.gpu_indices:
                used_milli[i] = used_milli.get(i, 0) + a.milli_per_gpu
                used_mem[i] = used_mem.get(i, 0) + a.gpu_memory_mib
        partitioned = {m["gpu_idx"] for m in mig_rows}
        for row in gpu_rows:
            idx = row["idx"]
            row["partitioned"] = idx in partitioned
            row["free_milli"] = 0 if idx in partitioned else MILLI_PER_GPU - used_milli.get(idx, 0)
            row["free_memory_mib"] = row["memory_mib"] - used_mem.get(idx, 0)
        for m in mig_rows:
            m["holder"] = holders.get(m["slice_id"])
        if gpu_rows:
            conn.execute(insert(schema.gpus), gpu_rows)
        if mig_rows:
            conn.execute(insert(schema.mig_slices), mig_rows)

    def remove_node(self, name: str) -> str:
        """Remove a node: ``removed``, ``draining`` (live grants keep it until released) or ``absent``."""

        def run(tx: _Tx) -> str:
            row = tx.conn.execute(select(schema.nodes).where(schema.nodes.c.name == name)).first()
            if row is None:
                return "absent"
            if self._held_on_node(tx.conn, name):
                tx.conn.execute(
                    update(schema.nodes)
                    .where(schema.nodes.c.name == name)
                    .values(health=NodeHealth.DRAINING.value, remove_when_drained=True, version=tx.version)
                )
                tx.dirty, tx.exact = True, False
                log.info("Node %s holds live grants: draining it, it goes once they are released", name)
                return "draining"
            self._delete_node(tx, name)
            return "removed"

        return self._write(run)

    @staticmethod
    def _delete_node(tx: _Tx, name: str) -> None:
        tx.conn.execute(delete(schema.mig_slices).where(schema.mig_slices.c.node == name))
        tx.conn.execute(delete(schema.gpus).where(schema.gpus.c.node == name))
        tx.conn.execute(delete(schema.nodes).where(schema.nodes.c.name == name))
        tx.nodes.pop(name, None)
        tx.dirty = tx.inventory_changed = True

    def set_health(self, name: str, health: NodeHealth | str) -> None:
        """Set a node's health; only ``healthy`` nodes take new grants.

        :raises InvalidInventoryError: unknown node or health value
        """
        try:
            value = NodeHealth(health).value
        except ValueError:
            raise InvalidInventoryError("health", health, f"one of {[h.value for h in NodeHealth]}") from None

        def run(tx: _Tx) -> None:
            # Any health but draining cancels a pending removal: the operator wants the node back.
            changed = tx.conn.execute(
                update(schema.nodes)
                .where(schema.nodes.c.name == name)
                .values(
                    health=value, version=tx.version, remove_when_drained=value == NodeHealth.DRAINING.value
                )
            ).rowcount
            if not changed:
                raise InvalidInventoryError("node", name, "a node of the inventory")
            tx.dirty, tx.exact = True, False
            tx.nodes[name] = replace(tx.nodes[name], schedulable=value == NodeHealth.HEALTHY.value)
            self._serve(tx)

        self._write(run)

    def heartbeat(self, name: str, at: float | None = None) -> None:
        """Record that a node's agent is alive."""

        def run(tx: _Tx) -> None:
            stamp = at if at is not None else tx.now
            if not tx.conn.execute(
                update(schema.nodes).where(schema.nodes.c.name == name).values(heartbeat_at=stamp)
            ).rowcount:
                raise InvalidInventoryError("node", name, "a node of the inventory")

        self._write(run)

    # -- reservations ---------------------------------------------------------------------

    def reserve(
        self,
        request: GpuRequest,
        holder: str,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        reservation_id: str | None = None,
    ) -> Reservation:
        """Grant ``request`` now, or queue it.

        Idempotent by ``reservation_id``: reserving an id that exists returns its state.

        :param holder: who holds it (task instance, host, process), for operators and the UI
        :param ttl: lease seconds (default ``[gpupool] lease_ttl_seconds``)
        :param timeout: seconds it may wait in the queue (default ``[gpupool] reservation_timeout_seconds``)
        :raises NoCapacityError: it can never fit any node of the inventory
        :raises InvalidRequestError: bad arguments; nothing is written
        """
        if not isinstance(request, GpuRequest):
            raise InvalidRequestError("request", request, "a GpuRequest")
        if not isinstance(holder, str) or not holder or len(holder) > _MAX_HOLDER:
            raise InvalidRequestError(
                "holder", holder, f"a non-empty string of at most {_MAX_HOLDER} characters"
            )
        ttl = _positive_seconds("ttl", ttl, settings.lease_ttl_seconds)
        timeout = _positive_seconds("timeout", timeout, settings.reservation_timeout_seconds)
        rid = reservation_id or uuid.uuid4().hex
        if not isinstance(rid, str) or not 0 < len(rid) <= 64:
            raise InvalidRequestError("reservation_id", rid, "a string of 1 to 64 characters")
        if self._concurrent is not None:
            granted = self._reserve_concurrently(request, rid, holder, ttl, timeout)
            if granted is not None:
                return granted

        def run(tx: _Tx) -> Reservation:
            if reservation_id is not None:
                existing = tx.conn.execute(
                    select(schema.reservations).where(schema.reservations.c.id == rid)
                ).first()
                if existing is not None:
                    return self._reservation(tx.conn, existing)
            tx.conn.execute(
                insert(schema.reservations).values(
                    id=rid,
                    holder=holder,
                    request=json.dumps(request.to_dict(), sort_keys=True),
                    priority=request.priority,
                    seq=tx.version,
                    state=_WAITING,
                    team=request.team,
                    workload_class=request.workload_class.value,
                    created_at=tx.now,
                    deadline=tx.now + timeout,
                    ttl=ttl,
                    overtakes=0,
                )
            )
            self._requests[rid] = request
            tx.dirty = True
            self._serve(tx)
            if rid in tx.assignments:
                assignment = tx.assignments[rid]
                grant = self._new_grant(assignment, request, tx.nodes[assignment.node].node_pool, tx.now, ttl)
                return Reservation(
                    rid, holder, ReservationState.GRANTED, request, tx.now, tx.now + timeout, grant
                )
            self._refuse_if_never_fits(tx, request)
            row = tx.conn.execute(select(schema.reservations).where(schema.reservations.c.id == rid)).one()
            return self._reservation(tx.conn, row)

        return self._write(run)

    @transient_retry
    def _reserve_concurrently(
        self, request: GpuRequest, rid: str, holder: str, ttl: float, timeout: float
    ) -> Reservation | None:
        """Grant ``request`` under the shared lock if it fits now; None: take the serialized path.

        Placement runs on this process's copy of the capacity, refreshed when it is older
        than ``_CACHE_FRESH_FOR_S``; the database function checks the choice against the
        node's row. A node the copy had wrong is left out and the request placed again on a
        refreshed copy, a few times at most.
        """
        assert self._concurrent is not None
        with self._cache_lock, self._concurrent.connect() as conn:
            self._check_schema(conn)
            skipped: set[str] = set()
            refreshed = False
            for _ in range(_CONCURRENT_ATTEMPTS):
                if not refreshed and not self._cache.fresh(_CACHE_FRESH_FOR_S):
                    self._cache.refresh(conn)
                    refreshed = True
                verdict = self._place(self._cache.nodes, request, skipped, self._cache.take_changes())
                if isinstance(verdict, NoFit):
                    if refreshed or skipped:
                        return None  # the serialized path queues it, or says it can never fit
                    self._cache.refresh(conn)
                    refreshed = True
                    continue
                now = self._clock()
                model = self._cache.gpu_model(verdict)
                outcome, taken = self._concurrent.take(
                    conn,
                    rid,
                    holder,
                    request,
                    verdict,
                    model,
                    self._cache.generation,
                    now,
                    ttl,
                    now + timeout,
                )
                if taken is not None:
                    self._requests[rid] = request
                    node = self._cache.nodes[verdict.node]
                    self._cache.put(allocate(node, request, taken))
                    grant = self._new_grant(taken, request, node.node_pool, now, ttl)
                    return Reservation(
                        rid, holder, ReservationState.GRANTED, request, now, now + timeout, grant
                    )
                if outcome == "serialize":
                    return None
                log.debug("Node %s no longer fits %s: refreshing and placing again", verdict.node, rid)
                skipped.add(verdict.node)
                refreshed = False
        return None

    def _place(
        self,
        nodes: dict[str, NodeState],
        request: GpuRequest,
        skipped: AbstractSet[str],
        changed: set[str] | None = None,
    ) -> Assignment | NoFit:
        return self.policy.place(self._equivalence.representatives(nodes, skipped, changed), request)

    def _new_grant(
        self, assignment: Assignment, request: GpuRequest, node_pool: str, now: float, ttl: float
    ) -> Grant:
        info = [self._cache.gpu_info.get((assignment.node, i), ("", "")) for i in assignment.gpu_indices]
        return Grant(
            node=assignment.node,
            node_pool=node_pool,
            gpu_indices=assignment.gpu_indices,
            gpu_uuids=tuple(uuid for uuid, _ in info),
            gpu_model=info[0][1] if info else None,
            milli_per_gpu=assignment.milli_per_gpu,
            gpu_memory_mib=assignment.gpu_memory_mib,
            mig_slice=assignment.mig_slice,
            mig_profile=request.mig_profile,
            granted_at=now,
            expires_at=now + ttl,
        )

    def _refuse_if_never_fits(self, tx: _Tx, request: GpuRequest) -> None:
        empty = self._cache.empty_snapshot(tx.nodes.values())
        reasons = []
        for node in empty.nodes:
            verdict = choices(node, request)
            if not isinstance(verdict, NoFitReason):
                return
            reasons.append(verdict)
        # Raising rolls the whole transaction back: the request was never queued.
        raise NoCapacityError(request, sorted(reasons))

    def get(self, reservation_id: str) -> Reservation:
        """Return a reservation's current state (read-only).

        :raises UnknownReservationError: no such id
        """
        return self._read(lambda conn: self._reservation(conn, self._row(conn, reservation_id)))

    def explain(self, reservation_id: str) -> str:
        """Say why a waiting reservation waits (its queue position and the closest nodes)."""

        def run(conn: Connection) -> str:
            row = self._row(conn, reservation_id)
            if row.state != _WAITING:
                return f"reservation is {row.state}"
            cache = CapacityCache()
            cache.reload(conn)
            tx = _Tx(conn, self._clock(), 0, dict(cache.nodes))
            return self._blocked_message(tx, row)

        return self._read(run)

    def get_or_none(self, reservation_id: str) -> Reservation | None:
        """Return a reservation's current state, or None when there is no such id."""
        try:
            return self.get(reservation_id)
        except UnknownReservationError:
            return None

    @staticmethod
    def _row(conn: Connection, reservation_id: str) -> Row[Any]:
        row = conn.execute(sql.ROW_BY_ID, {"id": reservation_id}).first()
        if row is None:
            raise UnknownReservationError(reservation_id)
        return row

    def renew(self, reservation_id: str, ttl: float | None = None) -> Reservation:
        """Extend a grant's lease by ``ttl`` seconds from now (default: its own TTL).

        :raises LeaseExpiredError: the grant already ended (expired, released)
        :raises UnknownReservationError: no such id
        """

        def run(tx: _Tx) -> Reservation:
            row = self._row(tx.conn, reservation_id)
            if row.state != _GRANTED:
                raise LeaseExpiredError(reservation_id, row.state)
            seconds = _positive_seconds("ttl", ttl, lambda: float(row.ttl))
            tx.conn.execute(
                update(schema.reservations)
                .where(schema.reservations.c.id == reservation_id)
                .values(expires_at=tx.now + seconds)
            )
            return self._reservation(tx.conn, self._row(tx.conn, reservation_id))

        return self._write(run)

    def release(self, reservation_id: str, *, reason: str = "released by holder") -> ReleaseResult:
        """Give a grant back, or withdraw a waiting request. Idempotent.

        A second release, or a release after the lease expired, changes nothing and says so.

        :raises UnknownReservationError: no such id
        """
        if self._concurrent is not None and self._release_concurrently(reservation_id, reason):
            state = ReservationState.GRANTED
            return ReleaseResult(reservation_id, True, state, f"{state.value} reservation released: {reason}")

        def run(tx: _Tx) -> ReleaseResult:
            row = self._row(tx.conn, reservation_id)
            state = ReservationState(row.state)
            if state.ended:
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.ended_at or tx.now))
                return ReleaseResult(
                    reservation_id, False, state, f"nothing to release: reservation {state.value} at {when}"
                )
            if state is ReservationState.GRANTED:
                self._end_grant(tx, row, ReservationState.RELEASED, reason)
            else:
                self._end_waiting(tx, row, ReservationState.CANCELLED, reason)
            self._serve(tx)
            return ReleaseResult(reservation_id, True, state, f"{state.value} reservation released: {reason}")

        return self._write(run)

    @transient_retry
    def _release_concurrently(self, reservation_id: str, reason: str) -> bool:
        """Give a grant back under the shared lock; False: the serialized path must (queue, expiry, drain)."""
        assert self._concurrent is not None
        with self._concurrent.connect() as conn:
            self._check_schema(conn)
            given = self._concurrent.give_back(conn, reservation_id, self._clock(), reason)
        if given is None:
            return False
        with self._cache_lock:
            node = self._cache.nodes.get(given.assignment.node)
            if node is not None:  # this process's copy gives it back too, until the next refresh
                classes = classes_from_counts(given.node_training, given.node_inference)
                self._cache.put(deallocate(node, given.request, given.assignment, classes))
        return True

    def reap(self) -> ReapResult:
        """Expire dead leases and overdue requests, then serve the queue."""

        def run(tx: _Tx) -> ReapResult:
            # Every write transaction starts by expiring what is due; report what it did.
            self._serve(tx)
            return ReapResult(tuple(tx.expired), tuple(tx.timed_out), tuple(tx.granted))

        return self._write(run)

    # -- internals: grants, expiry, queue ------------------------------------------------------

    def _request_of(self, row: Any) -> GpuRequest:
        request = self._requests.get(row.id)
        if request is None:
            request = GpuRequest.from_dict(json.loads(row.request))
            self._requests[row.id] = request
        return request

    def _expire_due(self, tx: _Tx) -> None:
        due = tx.conn.execute(sql.DUE, {"now": tx.now}).all()
        for row in due:
            if row.state == _GRANTED:
                log.warning("Lease of %s (holder %s) expired: returning its slice", row.id, row.holder)
                self._end_grant(tx, row, ReservationState.EXPIRED, "lease expired without renewal")
                tx.expired.append(row.id)
            else:
                message = self._blocked_message(tx, row)
                log.warning("Reservation %s timed out: %s", row.id, message)
                self._end_waiting(tx, row, ReservationState.TIMED_OUT, message)
                tx.timed_out.append(row.id)
        if due:
            self._serve(tx)

    def _blocked_message(self, tx: _Tx, row: Row[Any]) -> str:
        request = self._request_of(row)
        verdict = self.policy.place(tx.snapshot(), request)
        waited = tx.now - row.created_at
        ahead = tx.conn.execute(
            select(func.count()).where(
                schema.reservations.c.state == _WAITING,
                or_(
                    schema.reservations.c.priority > row.priority,
                    and_(schema.reservations.c.priority == row.priority, schema.reservations.c.seq < row.seq),
                ),
            )
        ).scalar_one()
        if isinstance(verdict, NoFit):
            closest = "; ".join(verdict.summary(3)) or "the inventory is empty"
            blocked = f"no node fits {request.describe()}; closest: {closest}"
        else:
            blocked = f"it fits {verdict.node} now but {ahead} earlier request(s) hold the queue"
        return f"waited {waited:.0f}s with {ahead} request(s) ahead; {blocked}"

    def _end_waiting(self, tx: _Tx, row: Row[Any], state: ReservationState, message: str) -> None:
        tx.conn.execute(
            sql.END_ROW, {"rid": row.id, "new_state": state.value, "now": tx.now, "end_message": message}
        )
        tx.dirty = True

    def _end_grant(self, tx: _Tx, row: Row[Any], state: ReservationState, message: str) -> None:
        request = self._request_of(row)
        assignment = _assignment_of(row)
        d_train, d_infer = _class_delta(request)
        conn = tx.conn
        counts = conn.execute(
            sql.RETURN_NODE,
            {
                "at_node": row.node,
                "cpu": request.cpu_milli,
                "mem": request.memory_mib,
                "training": d_train,
                "inference": d_infer,
                "new_version": tx.version,
            },
        ).first()
        if assignment.mig_slice is not None:
            conn.execute(sql.RETURN_MIG, {"at_node": row.node, "at_slice": assignment.mig_slice})
        elif assignment.gpu_indices:
            conn.execute(
                sql.RETURN_GPUS,
                {
                    "at_node": row.node,
                    "indices": list(assignment.gpu_indices),
                    "milli": assignment.milli_per_gpu,
                    "gmem": assignment.gpu_memory_mib,
                },
            )
        conn.execute(
            sql.END_ROW, {"rid": row.id, "new_state": state.value, "now": tx.now, "end_message": message}
        )
        tx.dirty = True
        if counts is None:
            return
        if row.node in tx.nodes:
            classes = classes_from_counts(counts.n_training, counts.n_inference)
            tx.nodes[row.node] = deallocate(tx.nodes[row.node], request, assignment, classes)
        if counts.remove_when_drained and not self._held_on_node(conn, row.node):
            log.info("Node %s is drained: removing it from the inventory", row.node)
            self._delete_node(tx, row.node)

    def _grant(self, tx: _Tx, entry: QueueEntry, assignment: Assignment) -> None:
        request = entry.request
        conn = tx.conn
        d_train, d_infer = _class_delta(request)
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
            raise _StaleCacheError(node)
        if assignment.mig_slice is not None:
            taken_slice = {"at_node": node, "at_slice": assignment.mig_slice, "rid": entry.request_id}
            if conn.execute(sql.TAKE_MIG, taken_slice).rowcount != 1:
                raise _StaleCacheError(node)
        elif assignment.gpu_indices:
            args: dict[str, Any] = {
                "at_node": node,
                "indices": list(assignment.gpu_indices),
                "milli": assignment.milli_per_gpu,
                "gmem": assignment.gpu_memory_mib,
            }
            if conn.execute(sql.TAKE_GPUS, args).rowcount != len(assignment.gpu_indices):
                raise _StaleCacheError(node)
        granted = conn.execute(
            sql.GRANT_ROW,
            {
                "rid": entry.request_id,
                "now": tx.now,
                "granted_node": node,
                "indices_json": json.dumps(list(assignment.gpu_indices)),
                "milli": assignment.milli_per_gpu,
                "gmem": assignment.gpu_memory_mib,
                "granted_slice": assignment.mig_slice,
            },
        ).rowcount
        if granted != 1:
            raise _StaleCacheError(entry.request_id)
        tx.nodes[node] = allocate(tx.nodes[node], request, assignment)
        tx.granted.append(entry.request_id)
        tx.assignments[entry.request_id] = assignment
        tx.dirty = True

    def _serve(self, tx: _Tx) -> None:
        rows = tx.conn.execute(sql.WAITING).all()
        if not rows:
            return
        entries = [QueueEntry(row.id, self._request_of(row), row.seq, row.overtakes) for row in rows]

        def try_place(entry: QueueEntry, held: frozenset[str]) -> Assignment | None:
            verdict = self._place(tx.nodes, entry.request, held)
            if isinstance(verdict, NoFit):
                return None
            self._grant(tx, entry, verdict)
            return verdict

        def hold(entry: QueueEntry, held: frozenset[str]) -> str | None:
            current = list(tx.nodes.values())
            return hold_node(current, self._cache.empty_snapshot(current).nodes, entry.request, held)

        outcome = serve(entries, try_place, self.max_overtakes, hold)
        for rid, count in outcome.overtakes.items():
            tx.conn.execute(sql.SET_OVERTAKES, {"rid": rid, "overtake_count": count})
        for rid, node in outcome.holds.items():
            log.info(
                "Queue holds node %s for %s: its overtake budget (%d) is spent", node, rid, self.max_overtakes
            )
        if outcome.barrier is not None:
            log.info(
                "Queue held for %s: its overtake budget is spent and no node can be held", outcome.barrier
            )

    # -- reading ----------------------------------------------------------------------------

    def _reservation(self, conn: Connection, row: Row[Any]) -> Reservation:
        request = self._request_of(row)
        grant = None
        position = None
        if row.state == _GRANTED or (row.node is not None and row.state != _WAITING):
            grant = self._grant_of(conn, row)
        if row.state == _WAITING:
            r = schema.reservations.c
            position = (
                1
                + conn.execute(
                    select(func.count()).where(
                        r.state == _WAITING,
                        or_(r.priority > row.priority, and_(r.priority == row.priority, r.seq < row.seq)),
                    )
                ).scalar_one()
            )
        return Reservation(
            id=row.id,
            holder=row.holder,
            state=ReservationState(row.state),
            request=request,
            created_at=row.created_at,
            deadline=row.deadline,
            grant=grant,
            position=position,
            message=row.message or "",
            ended_at=row.ended_at,
        )

    def _grant_of(self, conn: Connection, row: Row[Any]) -> Grant:
        assignment = _assignment_of(row)
        info = {
            (g.idx): (g.uuid, g.model)
            for g in conn.execute(
                select(schema.gpus.c.idx, schema.gpus.c.uuid, schema.gpus.c.model).where(
                    schema.gpus.c.node == row.node
                )
            )
        }
        pool = conn.execute(select(schema.nodes.c.node_pool).where(schema.nodes.c.name == row.node)).scalar()
        profile = None
        if assignment.mig_slice is not None:
            profile = self._request_of(row).mig_profile
        uuids = tuple(info.get(i, ("", ""))[0] for i in assignment.gpu_indices)
        models = {info[i][1] for i in assignment.gpu_indices if i in info}
        return Grant(
            node=row.node,
            node_pool=pool or "default",
            gpu_indices=assignment.gpu_indices,
            gpu_uuids=uuids,
            gpu_model=next(iter(models)) if models else None,
            milli_per_gpu=assignment.milli_per_gpu,
            gpu_memory_mib=assignment.gpu_memory_mib,
            mig_slice=assignment.mig_slice,
            mig_profile=profile,
            granted_at=row.granted_at,
            expires_at=row.expires_at,
        )

    def history(
        self, states: Iterable[ReservationState] | None = None, limit: int = 100
    ) -> list[Reservation]:
        """Return the most recent reservations (newest first), optionally only in ``states``."""
        r = schema.reservations.c
        query = select(schema.reservations).order_by(r.seq.desc()).limit(limit)
        if states is not None:
            query = query.where(r.state.in_([ReservationState(s).value for s in states]))
        return self._read(lambda conn: [self._reservation(conn, row) for row in conn.execute(query)])

    def empty_cluster(self) -> ClusterSnapshot:
        """Return the inventory as if nothing were granted: what a request could ever get."""

        def run(conn: Connection) -> ClusterSnapshot:
            cache = CapacityCache()
            cache.reload(conn)
            return cache.empty_snapshot(cache.nodes.values())

        return self._read(run)

    def snapshot(self) -> LedgerSnapshot:
        """Return one consistent view: nodes, GPUs, free capacity, grants and the queue."""
        return self._read(self._snapshot)

    def _snapshot(self, conn: Connection) -> LedgerSnapshot:
        cache = CapacityCache()
        cache.reload(conn)
        gpu_rows: dict[str, list[dict[str, Any]]] = {}
        for g in conn.execute(select(schema.gpus).order_by(schema.gpus.c.node, schema.gpus.c.idx)):
            gpu_rows.setdefault(g.node, []).append(dict(g._mapping))
        records = []
        for row in conn.execute(select(schema.nodes).order_by(schema.nodes.c.name)):
            records.append(
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
                )
            )
        r = schema.reservations.c
        live = conn.execute(
            select(schema.reservations)
            .where(r.state.in_([_WAITING, _GRANTED]))
            .order_by(r.priority.desc(), r.seq)
        ).all()
        grants = tuple(self._reservation(conn, row) for row in live if row.state == _GRANTED)
        queue = tuple(self._reservation(conn, row) for row in live if row.state == _WAITING)
        capacity = sum(len(n.gpus) for n in records) * MILLI_PER_GPU
        allocated = sum(g.request.total_gpu_milli for g in grants)
        return LedgerSnapshot(
            taken_at=self._clock(),
            cluster=ClusterSnapshot(tuple(cache.nodes.values())),
            nodes=tuple(records),
            grants=grants,
            queue=queue,
            gpu_capacity_milli=capacity,
            gpu_allocated_milli=allocated,
        )

    def check_invariants(self) -> list[str]:
        """Recompute every node's use from the grants; return each disagreement (empty: consistent)."""
        from airflow_gpupool.ledger.invariants import find_violations

        return self._read(lambda conn: find_violations(conn, self._request_of))


def _positive_seconds(name: str, value: float | None, default: Callable[[], float]) -> float:
    if value is None:
        return default()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 366 * 86400:
        raise InvalidRequestError(name, value, "a number of seconds in (0, 31622400]")
    return float(value)
