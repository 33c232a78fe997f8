"""The ledger's write cycle: expire what is due, apply the change, serve the queue.

Every write transaction first ends the leases nobody renewed and the requests that waited
too long, so a pool heals itself as long as anyone uses it. A change that frees capacity
or adds a request then serves the queue (:func:`airflow_gpupool.placement.queue.serve`),
all in the same transaction under the write lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any, TypeVar

from sqlalchemy import Row

from airflow_gpupool.governance.quotas import QuotaPlan
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.models import ReapResult, ReservationState
from airflow_gpupool.ledger.db.records import GRANTED
from airflow_gpupool.ledger.queue import ahead, gangs
from airflow_gpupool.ledger.queue.equivalence import EquivalenceIndex
from airflow_gpupool.ledger.queue.explain import WaitContext, blocked_message
from airflow_gpupool.ledger.queue.hand_over import publish_head
from airflow_gpupool.ledger.queue.holds import mark_holds
from airflow_gpupool.ledger.queue.service import PassMemo, ServiceMemo
from airflow_gpupool.ledger.queue.waiting import WaitingReader
from airflow_gpupool.ledger.store.cache import CapacityCache
from airflow_gpupool.ledger.store.ends import ReservationEnds
from airflow_gpupool.ledger.store.gate import QueueGate
from airflow_gpupool.ledger.store.take import grant_row
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.ledger.teams.admission import Governance, mark_headroom_loan, read_governance
from airflow_gpupool.ledger.teams.plan import PlanCache, governed
from airflow_gpupool.ledger.teams.preempting import preempt_for_waiting
from airflow_gpupool.ledger.teams.run_gate import RunGate, RunNodes
from airflow_gpupool.placement.gang import GangAssignment, hold_gang_nodes
from airflow_gpupool.placement.policy import PlacementPolicy
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.queue import QueueEntry, ServeOutcome, hold_node, is_due, serve
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFit
from airflow_gpupool.resources import GpuRequest

log = logging.getLogger(LOGGER_NAME)

T = TypeVar("T")


class WriteCycle(ReservationEnds):
    """Write transactions that expire what is due first, and the queue they serve.

    :param max_overtakes: the no-starvation bound, see :mod:`airflow_gpupool.placement.queue`
    :param bindings: the binding of each node pool: a request goes only where it can be expressed
    """

    def __init__(
        self,
        store: LedgerStore,
        policy: PlacementPolicy,
        max_overtakes: int,
        bindings: PoolBindings = UNCONSTRAINED,
        *,
        incremental: bool = True,
        min_runtime_seconds: float = 0.0,
        preemption_grace_seconds: float = 120.0,
    ) -> None:
        self.store = store
        #: A grant younger than this is never a preemption victim (no thrashing).
        self.min_runtime_seconds = min_runtime_seconds
        #: A victim's grace when its request names none.
        self.preemption_grace_seconds = preemption_grace_seconds
        self.policy = policy
        self.max_overtakes = max_overtakes
        self.bindings = bindings
        #: Serve incrementally (:mod:`~airflow_gpupool.ledger.queue.service`); False: every pass tries every request.
        self.incremental = incremental
        self._equivalence = EquivalenceIndex()
        self.run_nodes = RunNodes(store.cache, bindings)  # where a run admitted as a whole is counted
        self._service = ServiceMemo()
        self._plans = PlanCache()
        #: What a pass reads of the waiting requests (the spent ones copied per process).
        self.waiting = WaitingReader()
        # The hold the last pass logged: a hold is logged when it changes, not at every pass.
        self._logged_hold: tuple[str, tuple[str, ...]] | None = None

    def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one write transaction, after expiring the leases and requests that are due."""
        last: list[Tx] = []

        def run(tx: Tx) -> T:
            last[:] = [tx]
            self.expire_due(tx)
            return fn(tx)

        result = self.store.write(run)
        # Committed: what its last pass over the queue found guides the next one.
        self._service.commit(last[0].served if last else None, self._service_owner())
        if last:
            self._service.note_blocked(last[0].queued_blocked, last[0].nodes, self._service_owner())
        return result

    def _service_owner(self) -> tuple[int, int]:
        # A pass decided under another policy or overtake bound says nothing about the next one.
        return id(self.policy), self.max_overtakes

    def reap(self) -> ReapResult:
        """Expire dead leases and overdue requests, then serve the queue."""

        def run(tx: Tx) -> ReapResult:
            tx.queue_tracked = True
            # Every write transaction starts by expiring what is due; report what it did.
            self.serve(tx)
            return ReapResult(tuple(tx.expired), tuple(tx.timed_out), tuple(tx.granted), tuple(tx.orphaned))

        return self.write(run)

    def reap_due(self) -> ReapResult | None:
        """Reap if a lease or a wait is overdue; None, after one read and no write, when nothing is."""
        store = self.store
        return self.reap() if store.read(lambda conn: ahead.any_due(conn, store.clock(conn))) else None

    def place(
        self,
        nodes: dict[str, NodeState],
        request: GpuRequest,
        skipped: AbstractSet[str],
        changed: set[str] | None = None,
    ) -> Assignment | NoFit:
        """Place ``request`` on ``nodes`` but ``skipped``, one node of each kind tried.

        :param changed: the nodes changed since the last call (None: any may have)
        """
        snapshot = self._equivalence.representatives(nodes, skipped, changed)
        if not self.bindings.unconstrained:
            # The pool is part of a node's class, so leaving out representatives is exact.
            allows = self.bindings.allows
            snapshot = ClusterSnapshot(tuple(n for n in snapshot.nodes if allows(n.node_pool, request)))
        return self.policy.place(snapshot, request)

    def blocked_message(self, tx: Tx, row: Row[Any], cache: CapacityCache | None = None) -> str:
        """Say why the waiting reservation ``row`` waits (see :func:`~airflow_gpupool.ledger.queue.explain.blocked_message`).

        :param cache: a loaded capacity copy (default: the store's)
        """
        cache = cache or self.store.cache
        ctx = WaitContext(self.store, cache, self.policy, self.bindings, self.max_overtakes)
        request, version = self.store.request_of(row), tx.quota_version or cache.quota_version
        quota = None
        if governed(version):
            quota = read_governance(tx.conn, self.store, self._plans.plan(tx.conn, version or 0), tx.nodes)
        refusal = quota.refusal(request) if quota is not None else None
        runs = RunGate.read(tx, [row], RunNodes(cache, self.bindings))  # on the copy this look loaded
        refusal = refusal or runs.refusal(tx, row.id, request, quota)
        return blocked_message(ctx, tx, row, request, refusal)

    def expire_due(self, tx: Tx) -> None:
        """End the leases and waits overdue at ``tx.now`` (enter plans queued ahead), then serve the queue if any.

        A lease with a pod bound to it becomes ``orphaned``: its slice is held until reconcile sees the pod gone.
        """
        entered = ahead.enter_due(tx, self)  # plans queued ahead whose time to enter has come
        due = tx.conn.execute(sql.DUE, {"now": tx.now}).all()
        gangs_done: set[str] = set()
        # Lazily: one withdrawn with its upstream, due before it in this list, has ended already.
        for row in (r for r in due if r.id not in tx.withdrawn):
            if row.gang_id is not None and row.state == GRANTED:
                # A gang's lease is one: its first due member takes the whole gang with it.
                if row.gang_id not in gangs_done:
                    gangs_done.add(row.gang_id)
                    gangs.expire_gang(self, tx, row.gang_id)
            elif row.state == GRANTED and row.preempt_deadline is not None:
                self.end_preemption(tx, row)
            elif row.state == GRANTED and row.pod_name is not None:
                self.orphan(tx, row)
            elif row.state == GRANTED and ahead.unclaimed(row):  # granted ahead, idle past its bound
                ahead.step_back(tx, self, row)
            elif row.state == GRANTED:
                log.warning("Lease of %s (holder %s) expired: returning its slice", row.id, row.holder)
                self.end_grant(tx, row, ReservationState.EXPIRED, "lease expired without renewal")
                tx.expired.append(row.id)
            elif row.deadline >= tx.now:  # queued ahead, its not_before come: the pass may grant it
                log.info("Request %s queued ahead is due: it may be granted from now", row.id)
                tx.conn.execute(sql.CLEAR_NOT_BEFORE, {"rid": row.id})
            else:
                message = self.blocked_message(tx, row)
                log.warning("Reservation %s timed out: %s", row.id, message)
                self.end_waiting(tx, row, ReservationState.TIMED_OUT, message)
                tx.timed_out.append(row.id)
        if due or entered:
            self.serve(tx)

    def end_grant(self, tx: Tx, row: Row[Any], state: ReservationState, message: str) -> None:
        """End a grant; ended but not by success, withdraw what queued ahead of it (same transaction)."""
        super().end_grant(tx, row, state, message)
        if getattr(row, "ahead_planned", None) and row.id not in tx.keep_ahead:
            ahead.withdraw(tx, self, row, f"{state.value} ({message})")

    def serve(self, tx: Tx) -> None:
        """Grant what the queue can grant now, in its order (see :func:`~airflow_gpupool.placement.queue.serve`)."""
        # Under quotas every pass is a full one: a release elsewhere may admit a request here.
        under_quotas = governed(tx.quota_version)
        if under_quotas:
            self._service.forget()
        incremental = self.incremental and not under_quotas
        memo = self._service.begin(tx.nodes, tx.served, self._service_owner()) if incremental else None
        spent_shapes: list[str] = []
        rows = (
            self.waiting.read(tx, memo, spent_shapes, self.max_overtakes, self._fits(tx))
            if memo is not None
            else tx.conn.execute(sql.WAITING).all()
        )
        if not rows:
            mark_holds(tx, {})
            tx.gate = QueueGate(open=True, bound=self.max_overtakes)  # nobody waits: nothing to pass by
            return
        entries = [
            QueueEntry(row.id, self.store.request_of(row), row.seq, row.overtakes, row.not_before)
            for row in rows
        ]
        if memo is not None:
            entries.sort(key=lambda e: (-e.request.priority, e.seq, e.request_id))
        quota = self.governance(tx) if under_quotas else None  # read only when something waits
        runs = RunGate.read(tx, rows, self.run_nodes)  # a run's first step waits outside until admitted
        entries = runs.admitted(tx, entries, quota)
        if quota is not None:
            entries = quota.order([e for e in entries if not quota.refused_everywhere(e.request)])
        try_place = self._placer(tx, memo, quota)

        def hold(entry: QueueEntry, held: frozenset[str]) -> str | tuple[str, ...] | None:
            current = list(tx.nodes.values())
            empty = self.store.cache.empty_snapshot(current).nodes
            if entry.request.gang is not None:
                return hold_gang_nodes(current, empty, entry.request, held, self.bindings)
            return hold_node(current, empty, entry.request, held, self.bindings)

        tx.elastic_added = False
        outcome = serve(entries, try_place, self.max_overtakes, hold, now=tx.now)
        if memo is not None:
            tx.served = memo.found()
        self._hold_for_the_first_spent(entries, outcome, hold)
        self._record_pass(tx, entries, outcome)
        preemption_possible = preempt_for_waiting(self, tx, entries, quota)
        mark_holds(tx, outcome.holds)
        if tx.conn.dialect.name == "postgresql":  # for a release that empties a node (ledger.hand_over)
            self._publish_head(tx, entries, outcome, governed=quota is not None or bool(runs.needs))
        closed = under_quotas or preemption_possible or runs.keeps_gate_closed
        tx.gate = self._gate_after(entries, outcome, spent_shapes, may_skip=not closed)
        if tx.elastic_added:  # an elastic gang was admitted: its growth may fit what is left now
            self.serve(tx)

    def _publish_head(
        self, tx: Tx, entries: list[QueueEntry], outcome: ServeOutcome, *, governed: bool
    ) -> None:
        granted = {entry.request_id for entry, _ in outcome.granted}
        # Entries are in service order; under quotas the order is the teams' (and the gate closed).
        head = None if governed else next((e for e in entries if e.request_id not in granted), None)
        if head is not None and not is_due(head, tx.now):
            head = None  # queued ahead: a release must not hand it a node before its not_before
        current = list(tx.nodes.values())
        empty = self.store.cache.empty_snapshot(current).nodes
        publish_head(tx, head, current, empty, self.bindings, self.store.cache.generation)

    def _hold_for_the_first_spent(
        self,
        entries: list[QueueEntry],
        outcome: ServeOutcome,
        hold: Callable[[QueueEntry, frozenset[str]], str | tuple[str, ...] | None],
    ) -> None:
        """Hold a node for the first spent request the pass left without one (none came after it).

        The next pass would hold the same node before placing anything; holding it now lets the
        writers in between pass the queue by (:mod:`~airflow_gpupool.ledger.store.gate`).
        """
        if outcome.holds or outcome.barrier is not None:
            return
        granted = {entry.request_id for entry, _ in outcome.granted}
        spent = (
            e
            for e in entries
            if e.request_id not in granted
            and outcome.overtakes.get(e.request_id, e.overtakes) >= self.max_overtakes
        )
        first = next(spent, None)  # entries are in service order
        if first is None:
            return
        picked = hold(first, frozenset())
        if picked:
            outcome.holds[first.request_id] = (picked,) if isinstance(picked, str) else picked

    def _gate_after(
        self, entries: list[QueueEntry], outcome: ServeOutcome, spent_shapes: list[str], *, may_skip: bool
    ) -> QueueGate:
        """The gate a pass leaves (:mod:`~airflow_gpupool.ledger.store.gate`): every request it did not grant is blocked."""
        granted = {entry.request_id for entry, _ in outcome.granted}
        left = [e for e in entries if e.request_id not in granted]
        unspent = [
            e.request.priority
            for e in left
            if outcome.overtakes.get(e.request_id, e.overtakes) < self.max_overtakes
        ]
        shapes = [e.request for e in left] + [self.waiting.shape(text) for text in spent_shapes]
        # A spent request gets its hold when the pass looks past it; until one is held, every
        # grant must go through a pass, which will hold a node for it.
        unheld = len(unspent) < len(left) and not outcome.holds
        held_for = next((e for e in entries if e.request_id in outcome.holds), None)
        return QueueGate.after_pass(
            shapes,
            unspent,
            may_skip=may_skip and outcome.barrier is None and not unheld,
            bound=self.max_overtakes,
            hold=(held_for.request.priority, held_for.seq) if held_for is not None else None,
        )

    def _record_pass(self, tx: Tx, entries: list[QueueEntry], outcome: ServeOutcome) -> None:
        """Store the overtake counts a pass changed, and log its holds and barrier."""
        counts, stored = outcome.overtakes, {e.request_id: e.overtakes for e in entries}
        tx.spent_changed |= any(n >= self.max_overtakes > stored[rid] for rid, n in counts.items())
        if self.incremental:
            # Past the bound, a count decides nothing more (spent is spent): kept at the bound, a
            # spent request's row is not written again by every later backfill grant.
            counts = {rid: n for rid, n in counts.items() if min(n, self.max_overtakes) != stored[rid]}
            counts = {rid: min(n, self.max_overtakes) for rid, n in counts.items()}
        if counts:
            # One statement for all (a backfill grant overtakes every blocked request ahead of it).
            tx.conn.execute(
                sql.SET_OVERTAKES, [{"rid": rid, "overtake_count": n} for rid, n in counts.items()]
            )
        for rid, nodes in outcome.holds.items():
            if (rid, nodes) != self._logged_hold:
                self._logged_hold = (rid, nodes)
                log.info(
                    "Queue holds node(s) %s for %s: its overtake budget (%d) is spent",
                    ", ".join(nodes),
                    rid,
                    self.max_overtakes,
                )
        if outcome.barrier is not None:
            log.info(
                "Queue held for %s: its overtake budget is spent and no node can be held", outcome.barrier
            )

    def _fits(self, tx: Tx) -> Callable[[GpuRequest], bool]:
        return lambda request: not isinstance(self.place(tx.nodes, request, frozenset()), NoFit)

    def quota_plan(self, tx: Tx) -> QuotaPlan | None:
        """Return the stored quotas (None: none stored)."""
        return self._plans.plan(tx.conn, tx.quota_version or 0) if governed(tx.quota_version) else None

    def governance(self, tx: Tx) -> Governance:
        """Return the quotas and usage a pass under quotas works with (see :mod:`~airflow_gpupool.ledger.teams.admission`)."""
        assert tx.quota_version
        return read_governance(tx.conn, self.store, self._plans.plan(tx.conn, tx.quota_version), tx.nodes)

    def _placer(
        self, tx: Tx, memo: PassMemo | None, quota: Governance | None = None
    ) -> Callable[[QueueEntry, frozenset[str]], Assignment | None]:
        """Return the ``try_place`` of one pass: grant the entry if it fits (and its quota admits it), else None."""

        def try_place(entry: QueueEntry, held: frozenset[str]) -> Assignment | None:
            if memo is not None and memo.cannot_fit(entry, held):
                return None
            request = entry.request
            avoid = held | quota.refused(request, tx.nodes.values()) if quota is not None else held
            found: Assignment | GangAssignment | NoFit
            if request.gang is not None:
                found = gangs.place(tx, request, avoid, self.policy, self.bindings)
                if quota is not None and isinstance(found, GangAssignment):
                    found = found if quota.admits_gang(request, found) else NoFit(())
            else:
                found = self.place(tx.nodes, request, avoid)
            if isinstance(found, NoFit):
                if memo is not None:
                    memo.found_blocked(entry, held)
                return None
            if quota is not None:
                _count_grant(tx, quota, entry.request_id, request, found)
            if isinstance(found, Assignment):
                grant_row(tx, entry.request_id, request, found)
                verdict = found
            else:
                verdict = gangs.admit(tx, self.store, entry.request_id, request, found)
            tx.spent_changed |= entry.overtakes >= self.max_overtakes
            return verdict

        return try_place


def _count_grant(
    tx: Tx, quota: Governance, rid: str, request: GpuRequest, found: Assignment | GangAssignment
) -> None:
    """Count a grant in its team's quota and its pool's use; mark it when it takes lent headroom."""
    if isinstance(found, Assignment) and quota.on_loan(request, found, tx.nodes[found.node]):
        pool = tx.nodes[found.node].node_pool
        log.info("Granting %s on the headroom of pool %s, lent to preemptible work", rid, pool)
        mark_headroom_loan(tx.conn, rid)
    for one in found.members if isinstance(found, GangAssignment) else (found,):
        quota.record(request.member, one, tx.nodes[one.node])
