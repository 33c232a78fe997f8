"""Grants and releases under the shared lock, where no queue decision is needed (PostgreSQL).

A reserve or release that needs no queue decision (nothing waits, or the queue gate lets it
pass, and no lease is overdue) places on this process's copy of the capacity and commits under
the shared lock, alongside others (see :mod:`airflow_gpupool.ledger.postgres.functions`); so does a
request that fits no node and joins waiting requests no smaller than it. When the
database function says the queue must decide, the call answers None and the serialized path
(:class:`~airflow_gpupool.ledger.grants.serialized.LedgerGrants`) runs it.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection

from airflow_gpupool.exceptions import NoCapacityError
from airflow_gpupool.ledger.db.models import ReleaseResult, Reservation, ReservationState
from airflow_gpupool.ledger.grants.no_fit import refuse_if_never_fits, waits_as_it_is
from airflow_gpupool.ledger.grants.reserve_args import ReserveArgs
from airflow_gpupool.ledger.grants.serialized import granted, new_grant, released
from airflow_gpupool.ledger.postgres.concurrent import ConcurrentPath
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.cache import classes_from_counts
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore
from airflow_gpupool.ledger.teams.plan import governed
from airflow_gpupool.placement.accounting import allocate, deallocate
from airflow_gpupool.placement.verdict import NoFit

__all__ = ["ConcurrentGrants"]

log = logging.getLogger(LOGGER_NAME)

# Nodes a concurrent grant tries before it takes the serialized path (each try is one round trip).
_CONCURRENT_ATTEMPTS = 4
# How old the capacity copy may be when a concurrent grant places on it. Older copies are
# refreshed first; a wrong guess costs one more try, never a wrong grant.
_CACHE_FRESH_FOR_S = 0.5


class ConcurrentGrants:
    """Grants and releases under the shared lock, where no queue decision is needed (PostgreSQL).

    Each call answers None when it changed nothing and the serialized path must decide.
    """

    def __init__(self, store: LedgerStore, path: ConcurrentPath, cycle: WriteCycle) -> None:
        self._store = store
        self._path = path
        self._cycle = cycle

    def reserve(self, args: ReserveArgs) -> Reservation | None:
        """Grant the request if it fits now; None: take the serialized path.

        Placement runs on this process's copy of the capacity, refreshed when it is older
        than ``_CACHE_FRESH_FOR_S``; the database function checks the choice against the
        node's row. A node the copy had wrong is left out and the request placed again on a
        refreshed copy, a few times at most.
        """
        store = self._store
        cache = store.cache
        with store.cache_lock, self._path.connect() as conn:
            store.check_schema(conn)
            skipped: set[str] = set()
            refreshed = False
            for _ in range(_CONCURRENT_ATTEMPTS):
                if not refreshed and not cache.fresh(_CACHE_FRESH_FOR_S):
                    cache.refresh(conn)
                    refreshed = True
                if governed(cache.quota_version):
                    # Under quotas the serialized path admits and orders. A copy older than the
                    # last quota change has an older inventory generation: its take answers
                    # ``serialize`` (applying quotas moves the generation).
                    return None
                # Not where the queue holds a node for a waiting request: that one drains for it.
                avoid = skipped | cache.held
                verdict = self._cycle.place(cache.nodes, args.request, avoid, cache.take_changes())
                if isinstance(verdict, NoFit):
                    if refreshed or avoid:
                        # Queued here if the gate stays as it is; else the serialized path
                        # queues it, or says it can never fit.
                        return None if skipped else self._wait(conn, args, held=bool(avoid))
                    cache.refresh(conn)
                    refreshed = True
                    continue
                # None: the function reads the database's clock, so every client agrees.
                injected = store.injected_clock() if store.injected_clock is not None else None
                outcome, taken, now = self._path.take(
                    conn,
                    args.reservation_id,
                    args.holder,
                    args.request,
                    verdict,
                    cache.gpu_model(verdict),
                    cache.generation,
                    injected,
                    args.ttl,
                    args.timeout,
                )
                if taken is not None:
                    store.requests.put(args.reservation_id, args.request)
                    node = cache.nodes[verdict.node]
                    cache.put(allocate(node, args.request, taken))
                    return granted(args, now, new_grant(store, taken, args, node.node_pool, now))
                if outcome == "serialize":
                    return None
                log.debug(
                    "Node %s no longer fits %s: refreshing and placing again",
                    verdict.node,
                    args.reservation_id,
                )
                skipped.add(verdict.node)
                refreshed = False
        return None

    def _wait(self, conn: Connection, args: ReserveArgs, *, held: bool) -> Reservation | None:
        """Queue a request that fits no node of the refreshed copy, where the gate stays as it is; None: serialize.

        :param held: the copy was placed on without the held nodes: place once more on every node
        """
        store, cache, request = self._store, self._store.cache, args.request
        if not waits_as_it_is(request, self._cycle.max_overtakes):
            return None
        if held and not isinstance(self._cycle.place(cache.nodes, request, frozenset(), set()), NoFit):
            return None
        try:  # one that can never fit is the serialized path's to refuse, on the exact inventory
            refuse_if_never_fits(store, self._cycle, cache.nodes.values(), request)
        except NoCapacityError:
            return None
        injected = store.injected_clock() if store.injected_clock is not None else None
        queued = self._path.wait(
            conn,
            args.reservation_id,
            args.holder,
            request,
            cache.generation,
            injected,
            args.ttl,
            args.timeout,
        )
        if queued is None:
            return None
        now, ahead = queued
        store.requests.put(args.reservation_id, request)
        log.debug("Queued %s without a pass: it fits no node, %d requests ahead", args.reservation_id, ahead)
        return Reservation(
            args.reservation_id,
            args.holder,
            ReservationState.WAITING,
            request,
            now,
            now + args.timeout,
            position=ahead + 1,
        )

    def release(self, reservation_id: str, reason: str) -> ReleaseResult | None:
        """Give a grant back; None: the serialized path must (queue, expiry, drain)."""
        store = self._store
        with self._path.connect() as conn:
            store.check_schema(conn)
            injected = store.injected_clock() if store.injected_clock is not None else None
            given = self._path.give_back(conn, reservation_id, injected, reason)
        if given is None:
            return None
        with store.cache_lock:
            node = store.cache.nodes.get(given.assignment.node)
            if node is not None:  # this process's copy gives it back too, until the next refresh
                classes = classes_from_counts(given.node_training, given.node_inference)
                node = deallocate(node, given.request, given.assignment, classes)
                if given.handed_to is not None:
                    _, request, taken = given.handed_to
                    node = allocate(node, request, taken)
                store.cache.put(node)
        if given.handed_to is not None:
            handed, _, taken = given.handed_to
            log.info(
                "Released %s: node %s handed to %s, the queue's first request, without a pass",
                reservation_id,
                taken.node,
                handed,
            )
        return released(reservation_id, ReservationState.GRANTED, reason)
