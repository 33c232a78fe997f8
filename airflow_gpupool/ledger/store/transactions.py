"""The ledger's store: its database connections, transactions and per-process caches.

A write runs as one transaction under the ledger's write lock, on this process's copy of
the capacity (:class:`~airflow_gpupool.ledger.store.cache.CapacityCache`); a read runs on one
consistent snapshot. Both check once per process that the schema is current, and retry
transient database errors (:func:`~airflow_gpupool.ledger.db.engine.transient_retry`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, insert

from airflow_gpupool import settings
from airflow_gpupool.exceptions import StaleCacheError
from airflow_gpupool.ledger.db import records, schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.engine import (
    DATABASE_NOW,
    ConnectionBudget,
    lock_holder,
    make_engine,
    normalize_url,
    read_transaction,
    transient_retry,
    write_transaction,
)
from airflow_gpupool.ledger.db.models import Reservation
from airflow_gpupool.ledger.postgres.concurrent import ConcurrentPath
from airflow_gpupool.ledger.postgres.notify import notify_waiters
from airflow_gpupool.ledger.store.cache import CapacityCache
from airflow_gpupool.ledger.store.gate import QueueGate
from airflow_gpupool.ledger.store.upgrade import migrate, require_current
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest

#: The logger of every part of the ledger: the name it had before the ledger was split
#: into modules, so that logging configured for it keeps working.
LOGGER_NAME = "airflow_gpupool.ledger.ledger"
#: How many parsed requests a process keeps, by reservation id. Well above the live
#: reservations of a large pool (a grant or a waiting request per few GPUs of a few
#: thousand), so the write cycle never parses a live one twice, while a long-running
#: scheduler that reads years of history keeps a few MiB at most.
REQUEST_CACHE_SIZE = 10_000

log = logging.getLogger(LOGGER_NAME)

T = TypeVar("T")


@dataclass
class Tx:
    """One write transaction: what a function run by :meth:`LedgerStore.write` works on.

    :param conn: the transaction's connection; it holds the ledger's write lock
    :param now: the ledger's clock when the transaction began
    :param version: the stamp rows written in this transaction carry
    :param nodes: the capacity as this transaction sees it, changed as it grants and returns
    """

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
    orphaned: list[str] = field(default_factory=list)
    # Waiting requests this transaction settled (granted or ended): their waiters are woken at commit.
    settled: list[str] = field(default_factory=list)
    # What this transaction's last pass over the queue found (:mod:`~airflow_gpupool.ledger.queue.service`).
    served: Any = None
    # The version of the spent requests as this transaction began (:mod:`~airflow_gpupool.ledger.queue.queue_copy`).
    spent_version: int | None = None
    # Whether every change this transaction makes to waiting rows is recorded in ``spent_changed``
    # (the ledger's own grants, releases and reaps); any other write counts as changing them.
    queue_tracked: bool = False
    # Whether a request's budget became spent, or a spent request was granted or ended.
    spent_changed: bool = False
    # Requests this transaction queued.
    queue_inserted: set[str] = field(default_factory=set)
    # Requests it queued without a pass, found to fit no node (ledger.gate): a pass need not try them
    # again until a node changes.
    queued_blocked: list[str] = field(default_factory=list)
    # Whether a gang admitted in this transaction queued members to grow by: the queue is served again.
    elastic_added: bool = False
    # The quotas' version as this transaction began (None or 0: no quota stored, see ledger.admission).
    quota_version: int | None = None
    # The queue gate as this transaction began, the one its last pass over the queue leaves
    # (None: no pass), and whether its changes keep the gate true without a pass (ledger.gate).
    gate_at_start: QueueGate = field(default_factory=QueueGate)
    gate_stored: Mapping[str, int | None] = field(default_factory=dict)
    gate: QueueGate | None = None
    gate_kept: bool = False
    # The nodes the queue holds once this transaction commits (None: unchanged by it).
    held: frozenset[str] | None = None
    # Grants ending by success here (a hand-on, the success release): what queued ahead of them stays.
    keep_ahead: set[str] = field(default_factory=set)
    #: requests queued ahead withdrawn in this transaction (a due list read before must skip them)
    withdrawn: set[str] = field(default_factory=set)

    @property
    def current_gate(self) -> QueueGate:
        """The gate as it stands in this transaction so far."""
        return self.gate if self.gate is not None else self.gate_at_start

    def spent_rows_changed(self) -> bool:
        """Whether the spent waiting requests differ once this transaction commits."""
        return self.spent_changed or not self.queue_tracked

    def woken_at_commit(self) -> list[str]:
        """The settled requests someone may wait for: not those queued in this transaction."""
        return [rid for rid in self.settled if rid not in self.queue_inserted]

    def snapshot(self) -> ClusterSnapshot:
        """Return the capacity as this transaction sees it now."""
        return ClusterSnapshot(tuple(self.nodes.values()))


class RequestCache:
    """Parsed requests by reservation id, the least recently used dropped beyond ``size``.

    A request never changes once reserved but for a waiting one's priority (the console's
    :func:`~airflow_gpupool.ledger.grants.priority.set_priority`): an entry whose priority differs
    from the row's ``priority`` column is parsed again. The bound only keeps a long-running
    process from keeping every request it ever read. Threads sharing a ledger share the cache.

    :param size: how many requests to keep (default :data:`REQUEST_CACHE_SIZE`)
    """

    def __init__(self, size: int | None = None) -> None:
        size = REQUEST_CACHE_SIZE if size is None else size
        if size < 1:
            raise ValueError(f"a request cache keeps at least one request, not {size}")
        self.size = size
        self._requests: OrderedDict[str, GpuRequest] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._requests)

    def put(self, reservation_id: str, request: GpuRequest) -> None:
        """Remember the request of ``reservation_id``."""
        with self._lock:
            self._requests[reservation_id] = request
            self._requests.move_to_end(reservation_id)
            if len(self._requests) > self.size:
                self._requests.popitem(last=False)

    def of(self, row: Any) -> GpuRequest:
        """Return the request of a reservation row (``id`` and ``request`` columns), parsing it once."""
        with self._lock:
            request = self._requests.get(row.id)
            if request is not None and getattr(row, "priority", request.priority) == request.priority:
                self._requests.move_to_end(row.id)
                return request
        request = GpuRequest.from_dict(json.loads(row.request))
        self.put(row.id, request)
        return request


class LedgerStore:
    """The ledger's database: transactions, the capacity copy and the parsed requests.

    :param url: the ledger's SQLAlchemy URL
    :param clock: seconds since the epoch, injected (tests); None: the database's clock on
        PostgreSQL, so every client measures leases, deadlines and timeouts on one clock, and
        the local clock on SQLite (one machine); see :meth:`clock`
    :param synchronous_commit: see :func:`~airflow_gpupool.ledger.db.engine.write_transaction`
    :param concurrent: on PostgreSQL, open the connections of the concurrent path
        (:attr:`concurrent`); elsewhere there is none
    :param max_connections: the connections this store may open, split by
        :meth:`ConnectionBudget.split` (default ``[gpupool] max_connections_per_process``)
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] | None = None,
        synchronous_commit: bool = True,
        concurrent: bool = True,
        max_connections: int | None = None,
    ) -> None:
        self.url = url
        #: The injected clock, which wins over the database's; None when there is none.
        self.injected_clock = clock
        postgresql = normalize_url(url).startswith("postgresql")
        #: How this store's connections are split between its pools and the grant listener.
        self.budget = ConnectionBudget.split(
            max_connections if max_connections is not None else settings.max_connections_per_process(),
            postgresql=postgresql,
            concurrent=concurrent,
            pooled=settings.transaction_pooling(),
        )
        self.engine = make_engine(url, pool_size=self.budget.main)
        self.synchronous_commit = synchronous_commit
        self.cache = CapacityCache()
        # The copy of the capacity is changed outside the database lock by concurrent grants:
        # threads sharing this store take turns with it.
        self.cache_lock = threading.RLock()
        self.requests = RequestCache()
        self._schema_checked = False
        #: The calls of the concurrent path (PostgreSQL), None where every write is serialized.
        self.concurrent = (
            ConcurrentPath(url, synchronous_commit, pool_size=self.budget.concurrent)
            if self.budget.concurrent
            else None
        )

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    def clock(self, conn: Connection | None = None) -> float:
        """Return the ledger's time: the injected clock, else the database's (PostgreSQL), else local.

        :param conn: an open connection to read the database's clock on (else one from the pool)
        """
        if self.injected_clock is not None:
            return self.injected_clock()
        if self.dialect != "postgresql":
            return time.time()
        if conn is not None:
            return float(conn.exec_driver_sql(f"SELECT {DATABASE_NOW}").scalar_one())
        return self._database_now()

    @transient_retry
    def _database_now(self) -> float:
        with self.engine.connect() as conn:
            return float(conn.exec_driver_sql(f"SELECT {DATABASE_NOW}").scalar_one())

    def _tx_now(self, conn: Connection) -> float:
        """The clock of a write transaction: the database's, read as it took the lock, unless injected."""
        database_now = conn.info.pop("gpupool_now", None)
        if self.injected_clock is not None or database_now is None:
            return self.clock()
        return float(database_now)

    def lock_holder(self) -> str | None:
        """Say who holds the ledger's write lock (PostgreSQL), or None when unknown."""
        return lock_holder(self.engine)

    @transient_retry
    def migrate(self) -> list[int]:
        """Create the schema or bring it up to date; return the versions applied."""
        applied = migrate(self.engine)
        self._schema_checked = True
        return applied

    def close(self) -> None:
        """Close the database connections."""
        self.engine.dispose()
        if self.concurrent is not None:
            self.concurrent.close()

    def check_schema(self, conn: Connection) -> None:
        """Fail unless the schema is current; checked once per process.

        :raises LedgerSchemaError: the schema is missing or older than this code
        """
        if not self._schema_checked:
            require_current(conn, self.url)
            self._schema_checked = True

    @transient_retry
    def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one write transaction and return what it returns.

        A function that finds the capacity copy wrong raises :class:`StaleCacheError`: the
        copy is reloaded and the whole transaction runs again, a few times at most. ``fn``
        may therefore run more than once, and must change nothing but the database and
        its :class:`Tx`.
        """
        for attempt in range(2):
            try:
                return self._write_once(fn)
            except StaleCacheError:
                log.warning("Capacity cache disagreed with the ledger; reloading (attempt %d)", attempt + 1)
                with self.cache_lock:
                    self.cache.invalidate()
        return self._write_once(fn)

    def _write_once(self, fn: Callable[[Tx], T]) -> T:
        try:
            return self._write_in_transaction(fn)
        except BaseException:
            # The cache may hold rows of the rolled-back transaction: start over next time.
            with self.cache_lock:
                self.cache.invalidate()
            raise

    def _write_in_transaction(self, fn: Callable[[Tx], T]) -> T:
        with self.cache_lock:
            with write_transaction(self.engine, self.synchronous_commit) as conn:
                self.check_schema(conn)
                stamp = self.cache.refresh(conn, writing=True)
                tx = Tx(conn, self._tx_now(conn), stamp.version, dict(self.cache.nodes))
                tx.spent_version = stamp.spent_version
                tx.quota_version = stamp.quota_version
                tx.gate_at_start, tx.gate_stored = stamp.gate, stamp.gate_stored
                result = fn(tx)
                if tx.spent_rows_changed():
                    self._stamp_spent(conn, tx.version, stamp.spent_version is None)
                    tx.dirty = True  # on SQLite, the next writer then gets another version
                self._publish_gate(conn, tx)
                woken = tx.woken_at_commit()
                if woken and not stamp.counter:  # PostgreSQL: delivered at commit
                    notify_waiters(conn, woken)
                if tx.dirty and stamp.counter:
                    self._bump(conn, "version", tx.version)
                if tx.inventory_changed:
                    self._bump(conn, "inventory_generation", stamp.generation + 1)
            if tx.dirty and tx.exact and not tx.inventory_changed:
                self.cache.adopt(tx.nodes, stamp.watermark_after_commit, tx.held)
            return result

    @staticmethod
    def _bump(conn: Connection, key: str, value: int) -> None:
        conn.execute(sql.BUMP_META, {"meta_key": key, "meta_value": value})

    @staticmethod
    def _publish_gate(conn: Connection, tx: Tx) -> None:
        """Store the gate this transaction's pass left; close it after any other change (see ledger.gate)."""
        if tx.gate is not None:
            gate = tx.gate
        elif tx.dirty and not tx.gate_kept:
            gate = QueueGate()
        else:
            return
        for key, value in gate.to_meta().items():  # only what changed: mostly one or two keys
            stored = tx.gate_stored.get(key)
            if stored is None:
                conn.execute(insert(schema.ledger_meta).values(key=key, value=value))
            elif stored != value:
                conn.execute(sql.BUMP_META, {"meta_key": key, "meta_value": value})

    @staticmethod
    def _stamp_spent(conn: Connection, version: int, missing: bool) -> None:
        """Stamp the spent requests' version with this transaction's (the key is added on the first change)."""
        if missing:
            # Under the write lock: no other writer adds the key meanwhile.
            conn.execute(insert(schema.ledger_meta).values(key=sql.SPENT_VERSION_KEY, value=version))
        else:
            conn.execute(sql.BUMP_META, {"meta_key": sql.SPENT_VERSION_KEY, "meta_value": version})

    @transient_retry
    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one read-only transaction (one consistent state) and return what it returns."""
        with read_transaction(self.engine) as conn:
            self.check_schema(conn)
            return fn(conn)

    @transient_retry
    def analyze(self) -> None:
        """Refresh the planner's statistics, so lookups by version and node use the indexes at once."""
        with self.engine.connect() as conn, conn.begin():
            conn.exec_driver_sql("ANALYZE gpupool_nodes, gpupool_gpus, gpupool_mig_slices")

    def request_of(self, row: Any) -> GpuRequest:
        """Return the request of a reservation row, parsed once per process."""
        return self.requests.of(row)

    def reservation(self, conn: Connection, row: Row[Any]) -> Reservation:
        """Return the reservation of ``row`` (see :func:`~airflow_gpupool.ledger.db.records.reservation_of`)."""
        return records.reservation_of(conn, row, self.request_of(row))
