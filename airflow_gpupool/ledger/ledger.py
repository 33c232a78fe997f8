"""The GPU ledger: inventory, reservations with leases, and the waiting queue.

Every change is one transaction under the ledger's write lock (a PostgreSQL advisory lock, or
SQLite's ``BEGIN IMMEDIATE``): a request is granted whole or not at all, and the queue is served
by whichever client holds the lock when capacity changes. Each write transaction first expires
dead leases and overdue requests, so a pool heals itself while anyone uses it (:meth:`Ledger.reap`).

On PostgreSQL, a grant or release that needs no queue decision takes the lock in shared mode
instead (:mod:`airflow_gpupool.ledger.postgres.functions`); anything else takes it exclusively.

:class:`Ledger` is the one public face of rooms that each do one job (ARCHITECTURE.md maps
them; ``pyproject.toml`` keeps their imports running downward). It composes them, inherits
its reads, node methods, hand-on and queue ahead (``views.api``, ``nodes.api``, ``grants.hand_on``,
``grants.queue_ahead``) and picks the path of each grant and release: the concurrent one
(``grants.concurrent_grants``) where the database has it, else the serialized ``queue.cycle``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sqlalchemy import Connection

from airflow_gpupool import settings
from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.governance.runs import RunNeed
from airflow_gpupool.governance.victim_nodes import PreemptionRules
from airflow_gpupool.ledger.db.engine import transient_retry
from airflow_gpupool.ledger.db.models import ReapResult, ReleaseResult, Reservation
from airflow_gpupool.ledger.grants.concurrent_grants import ConcurrentGrants
from airflow_gpupool.ledger.grants.grant_reports import PodBinding, bind_pod, bind_pods, note_checkpoint
from airflow_gpupool.ledger.grants.hand_on import HandOns, LedgerHandOnApi
from airflow_gpupool.ledger.grants.priority import set_priority
from airflow_gpupool.ledger.grants.queue_ahead import LedgerQueueAheadApi, QueueAheads
from airflow_gpupool.ledger.grants.reserve_args import ReserveArgs
from airflow_gpupool.ledger.grants.revoke import revoke
from airflow_gpupool.ledger.grants.serialized import LedgerGrants
from airflow_gpupool.ledger.nodes.api import LedgerNodeApi
from airflow_gpupool.ledger.nodes.bindings import pool_bindings
from airflow_gpupool.ledger.nodes.external import LedgerExternalHolds
from airflow_gpupool.ledger.nodes.health import LedgerHealth
from airflow_gpupool.ledger.nodes.inventory import InventoryChange, LedgerInventory
from airflow_gpupool.ledger.nodes.suspects import LedgerSuspects
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LedgerStore, Tx
from airflow_gpupool.ledger.views.api import LedgerReadApi
from airflow_gpupool.ledger.views.ledger_views import LedgerViews
from airflow_gpupool.placement.policy import PlacementPolicy, get_policy
from airflow_gpupool.redact import redact_url
from airflow_gpupool.resources import GpuRequest

__all__ = ["InventoryChange", "Ledger", "Tx", "pool_bindings"]

T = TypeVar("T")


class Ledger(LedgerQueueAheadApi, LedgerHandOnApi, LedgerNodeApi, LedgerReadApi):
    """The shared record of who holds which GPU slice.

    :param url: SQLAlchemy URL (``sqlite:////path/ledger.db``, ``postgresql://user@host/db``);
        default from :func:`airflow_gpupool.settings.ledger_url`
    :param policy: placement policy name or instance; default ``[gpupool] placement_policy``
    :param clock: seconds since the epoch; tests pass a fake one. Without one, leases,
        deadlines and timeouts are measured on the database's clock on PostgreSQL (every
        client agrees, whatever its own clock says) and on this machine's clock on SQLite
    :param max_overtakes: the no-starvation bound, see :mod:`airflow_gpupool.placement.queue`
    :param concurrent: on PostgreSQL, grant and release under the shared lock when no queue
        decision is needed (see :mod:`airflow_gpupool.ledger.postgres.functions`); False makes
        every write take the exclusive lock, as on SQLite
    :param binding: the slice binding of node pools not in ``node_pool_bindings``
        (:mod:`airflow_gpupool.binding`); a request is placed only on a pool whose binding
        can express it. None (with no ``node_pool_bindings``): any pool takes any request
    :param node_pool_bindings: the binding of each named node pool
    :param max_connections: database connections this ledger may open (default ``[gpupool]
        max_connections_per_process``); hooks and triggers share one ledger per process
        (:func:`airflow_gpupool.ledger.shared.shared_ledger`)
    :param incremental_service: a pass over the queue tries only the requests that could fit
        what changed (:mod:`airflow_gpupool.ledger.queue.service`); False tries every request, as
        the property test compares
    :param min_runtime_seconds: a grant younger than this is never preempted (default
        ``[gpupool] min_runtime_seconds``)
    :param preemption_grace_seconds: a preemption victim's grace when its request names none
        (default ``[gpupool] preemption_grace_seconds``); see :mod:`~airflow_gpupool.ledger.teams.preempting`
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        policy: str | PlacementPolicy | None = None,
        clock: Callable[[], float] | None = None,
        max_overtakes: int | None = None,
        concurrent: bool = True,
        binding: str | None = None,
        node_pool_bindings: Mapping[str, str] | None = None,
        max_connections: int | None = None,
        incremental_service: bool = True,
        min_runtime_seconds: float | None = None,
        preemption_grace_seconds: float | None = None,
    ) -> None:
        self.url = settings.ledger_url(url)
        self._store = LedgerStore(
            self.url,
            clock=clock,
            synchronous_commit=settings.synchronous_commit(),
            concurrent=concurrent,
            max_connections=max_connections,
        )
        self._due_lock = threading.Lock()
        self._due_checked_at = -math.inf
        if policy is None or isinstance(policy, str):
            policy = get_policy(policy or settings.placement_policy())
        self._cycle = WriteCycle(
            self._store,
            policy,
            max_overtakes if max_overtakes is not None else settings.max_overtakes(),
            pool_bindings(binding, node_pool_bindings),
            incremental=incremental_service,
            min_runtime_seconds=(
                settings.min_runtime_seconds() if min_runtime_seconds is None else min_runtime_seconds
            ),
            preemption_grace_seconds=(
                settings.preemption_grace_seconds()
                if preemption_grace_seconds is None
                else preemption_grace_seconds
            ),
        )
        self._inventory = LedgerInventory(self._store, self._cycle)
        self._external = LedgerExternalHolds(self._store, self._cycle)
        self._grants = LedgerGrants(self._store, self._cycle)
        self._hand_ons = HandOns(self._store, self._cycle)
        self._queue_aheads = QueueAheads(self._store, self._cycle)
        path = self._store.concurrent
        self._concurrent = ConcurrentGrants(self._store, path, self._cycle) if path is not None else None
        self._views = LedgerViews(self._store, self._cycle)
        self._health = LedgerHealth(self._store, self._cycle)
        self._suspects = LedgerSuspects(self._store, self._cycle, self._health.reserve_again)

    @property
    def display_url(self) -> str:
        """The ledger's URL as it may be shown: its password hidden (:func:`~airflow_gpupool.redact.redact_url`)."""
        return redact_url(self.url)

    def __repr__(self) -> str:
        return f"Ledger({self.display_url!r})"

    @property
    def policy(self) -> PlacementPolicy:
        """Where requests go."""
        return self._cycle.policy

    @policy.setter
    def policy(self, policy: PlacementPolicy) -> None:
        self._cycle.policy = policy

    @property
    def max_overtakes(self) -> int:
        """The no-starvation bound, see :mod:`airflow_gpupool.placement.queue`."""
        return self._cycle.max_overtakes

    @max_overtakes.setter
    def max_overtakes(self, value: int) -> None:
        self._cycle.max_overtakes = value

    @property
    def preemption_rules(self) -> PreemptionRules:
        """Who may be preempted when, and with what grace (the forecast's replay preempts by them)."""
        cycle = self._cycle
        return PreemptionRules(cycle.min_runtime_seconds, cycle.preemption_grace_seconds, cycle.bindings)

    @classmethod
    def create(cls, url: str | None = None, **options: Any) -> Ledger:
        """Open the ledger at ``url``, creating or migrating its schema first."""
        ledger = cls(url, **options)
        ledger.migrate()
        return ledger

    def migrate(self) -> list[int]:
        """Create the schema or bring it up to date; return the versions applied."""
        return self._store.migrate()

    def close(self) -> None:
        """Close the database connections."""
        self._store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now(self) -> float:
        """Return the ledger's clock (seconds since the epoch): what leases and timeouts are measured on.

        The injected clock if any, else the database's on PostgreSQL (one query), else this machine's.
        """
        return self._store.clock()

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._store.dialect

    # -- transactions, for records kept beside the ledger's own (task attempts) ----------

    def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one transaction under the ledger's write lock; return what it returns.

        The transaction first expires the leases and requests that are due, as every write does.
        ``fn`` works on ``tx.conn``, reads the clock from ``tx.now``, and may run more than once
        (a transient error or a stale capacity copy): it must change nothing outside the database.
        """
        return self._cycle.write(fn)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one read-only transaction that sees one consistent state; return what it returns."""
        return self._store.read(fn)

    # -- reservations ---------------------------------------------------------------------

    def reserve(
        self,
        request: GpuRequest,
        holder: str,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        reservation_id: str | None = None,
        not_before: float | None = None,
        run_need: RunNeed | None = None,
        task_key: str | None = None,
    ) -> Reservation:
        """Grant ``request`` now, or queue it. Idempotent by ``reservation_id`` (an existing id: its state).
        A ``gang`` waits as one entry, granted its ``min_members`` all or nothing (its leader is returned).

        :param holder: who holds it (task instance, host, process), for operators and the UI
        :param ttl: lease seconds (default ``[gpupool] lease_ttl_seconds``)
        :param timeout: seconds it may wait in the queue (default ``[gpupool] reservation_timeout_seconds``)
        :param not_before: ledger time (:attr:`now`) before which it is not granted: it waits in its place
        :param run_need: a run's first GPU step, granted once its run's peak is served (too big: RunTooLargeError)
        :param task_key: the step's task key: a slice handed on or a request queued ahead for it is taken over
        :raises NoCapacityError: it can never fit a node of the inventory, nor a scalable pool's new one
        :raises InvalidRequestError: bad arguments, nothing written (InvalidGangError: a gang's id too long)
        """
        times = {"ttl": ttl, "timeout": timeout, "not_before": not_before}
        args = ReserveArgs.check(request, holder, reservation_id=reservation_id, run_need=run_need, **times)
        return self._reserve(args) if task_key is None else self._claim_or_reserve(args, task_key)

    def _reserve(self, args: ReserveArgs) -> Reservation:
        if self._concurrent is not None and args.concurrent:  # singles, not queued ahead, alone
            granted = self._reserve_concurrently(args)
            if granted is not None:
                return granted
        return self._grants.reserve(args)

    # Each path retries on its own: a lost connection on the concurrent one, before the serialized one.
    @transient_retry
    def _reserve_concurrently(self, args: ReserveArgs) -> Reservation | None:
        assert self._concurrent is not None
        return self._concurrent.reserve(args)

    @transient_retry
    def _release_concurrently(self, reservation_id: str, reason: str) -> ReleaseResult | None:
        assert self._concurrent is not None
        return self._concurrent.release(reservation_id, reason)

    def renew(self, reservation_id: str, ttl: float | None = None) -> Reservation:
        """Extend a grant's lease by ``ttl`` seconds from now (default: its own TTL).

        A gang's lease is one: renewing any of its members renews every member that holds.

        :raises GrantPreemptedError: the grant is a preemption victim: its pod must end by the
            deadline the error carries, then the grant be released
        :raises LeaseExpiredError: the grant already ended (expired, released)
        :raises UnknownReservationError: no such id
        """
        return self._grants.renew(reservation_id, ttl)

    def adopt(self, reservation_id: str, holder: str, ttl: float | None = None) -> Reservation:
        """Take over a grant (orphaned or not) for ``holder`` and renew its lease.

        A retry that re-attaches to the pod of an earlier try (``durable=True``) adopts that try's
        grant: one grant in the history, released once. Adopting a gang's member adopts every member.

        :raises LeaseExpiredError: the grant already ended
        :raises UnknownReservationError: no such id
        :raises InvalidRequestError: an empty or too long holder
        """
        return self._grants.renew(reservation_id, ttl, holder=holder)

    def release(
        self, reservation_id: str, *, reason: str = "released by holder", keep_queued_ahead: bool = False
    ) -> ReleaseResult:
        """Give a grant back, or withdraw a waiting request. Idempotent (a second release says so).
        A gang's leader ends every member and withdraws its growth; another member, that one alone.

        :param keep_queued_ahead: its step succeeded: requests queued ahead of it stay (else withdrawn)
        :raises UnknownReservationError: no such id
        """
        if self._concurrent is not None:  # declines a grant with requests queued ahead of it
            released = self._release_concurrently(reservation_id, reason)
            if released is not None:
                return released
        return self._grants.release(reservation_id, reason, keep_queued_ahead)

    def set_priority(self, reservation_id: str, priority: int) -> Reservation:
        """Give a waiting request (a gang: every member) a new priority and serve the queue in its new order.

        :raises UnknownReservationError: no such id
        :raises InvalidRequestError: the priority is out of range, or the request no longer waits
        """
        return set_priority(self._store, self._cycle, reservation_id, priority)

    def revoke(
        self, reservation_id: str, *, by: str, grace: float | None = None
    ) -> Reservation | ReleaseResult:
        """Take a grant back: a pod on it gets ``grace`` to end first (:mod:`~airflow_gpupool.ledger.grants.revoke`); none: released."""
        victim = revoke(self._cycle, reservation_id, by=by, grace=grace)
        return victim if victim is not None else self.release(reservation_id, reason=f"revoked by {by}")

    def bind(self, reservation_id: str, *, namespace: str, name: str, uid: str | None = None) -> Reservation:
        """Record the pod of a grant: once bound, its slice outlives an expired lease (``orphaned``).

        Bind by name before creating the pod (``uid`` None), then again with the uid the server
        gave it: a worker that dies in between leaves an orphan, not a pod on a freed slice.
        Idempotent; binding another pod replaces the first (last bind wins, logged).

        :raises UnknownReservationError: no such id
        :raises LeaseExpiredError: the reservation holds nothing (ended, or still waiting)
        :raises InvalidRequestError: an empty or too long namespace, name or uid
        """
        binding = PodBinding(reservation_id, namespace, name, uid)
        return bind_pod(self._cycle, self._store, binding)

    def bind_many(
        self, pods: Mapping[str, tuple[str, str, str | None]]
    ) -> dict[str, Reservation | GpuPoolError]:
        """Record the pods of many grants in one transaction, as :meth:`bind` does for each.

        What the gatekeeper calls for all the pods it admits in a pass: one write, however many.

        :param pods: ``(namespace, name, uid)`` by reservation id
        :return: by reservation id, the bound reservation, or the error :meth:`bind` would have
            raised for it (``LeaseExpiredError``, ``UnknownReservationError``; nothing written for it)
        :raises InvalidRequestError: an empty or too long namespace, name or uid; nothing is written
        """
        bindings = [PodBinding(rid, namespace, name, uid) for rid, (namespace, name, uid) in pods.items()]
        return bind_pods(self._cycle, self._store, bindings)

    def note_checkpoint(self, reservation_id: str, at: float) -> bool:
        """Record when the grant's newest valid checkpoint was written (only a newer time is kept).

        A preemption takes victims that lose the least work first: the GPU-seconds since this
        time (since the grant's start without one).

        :param at: the checkpoint's time, seconds since the epoch on the ledger's clock
        :return: whether the grant still holds (False: it ended; nothing written)
        :raises UnknownReservationError: no such id
        :raises InvalidRequestError: ``at`` is not a number
        """
        return note_checkpoint(self._cycle, reservation_id, at)

    def reap(self) -> ReapResult:
        """Expire dead leases and overdue requests, then serve the queue.

        A lease with a pod bound to it is orphaned instead: its slice stays held.
        """
        return self._cycle.reap()

    def reap_if_due(self, min_interval: float = 0.0) -> ReapResult | None:
        """Reap only if a lease or a wait is overdue, and at most once per ``min_interval`` seconds.

        What a waiting client calls instead of :meth:`reap`: nothing due costs a read, no write
        (None). Every user of this ledger object shares the interval.
        """
        checked = time.monotonic()
        with self._due_lock:
            if checked - self._due_checked_at < min_interval:
                return None
            self._due_checked_at = checked
        return self._cycle.reap_due()

    @property
    def listener_budget(self) -> int:
        """Connections of this ledger's budget kept for listening to grants (PostgreSQL): 0 or 1."""
        return self._store.budget.listener
