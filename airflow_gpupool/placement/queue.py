"""The queue rule, shared by the ledger and the simulator.

Waiting requests are served in order: higher ``priority`` first, then first come first
served (``seq``). A request that does not fit is *blocked*; requests behind it may still
be granted (backfill), but each such grant counts as one overtake of every blocked
request ahead of it. Once a blocked request has been overtaken ``max_overtakes`` times,
the first such request in service order gets a *hold* on one node, the one closest to
fitting it: requests behind it are no longer placed on that node, so the node drains for it
while the rest of the cluster keeps working (Slurm's backfill with a reservation for the top
job). Once it is granted, the next request whose budget is spent holds a node in turn, so a
large request is never starved by a stream of small ones (apache/airflow#29474), and the
pool is never idled for it beyond one node.
A higher-priority request arriving later is served before, not "past", a blocked one, so
it never counts as an overtake.

A request may carry ``not_before`` (a downstream step queued ahead of its upstream's forecast
end): a pass at an earlier ``now`` never places it, but it keeps its place (``seq``) and counts
as blocked, so its wait counts for no-starvation: grants behind it overtake it, and once its
budget is spent a node is held (drains) for it before it may be granted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFitReason
from airflow_gpupool.resources import GpuRequest


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One waiting request as the queue rule sees it."""

    request_id: str
    request: GpuRequest
    seq: int
    overtakes: int = 0
    not_before: float | None = None


def is_due(entry: QueueEntry, now: float | None) -> bool:
    """Return whether ``entry`` may be granted at ``now`` (always, without ``not_before`` or ``now``)."""
    return now is None or entry.not_before is None or entry.not_before <= now


@dataclass
class ServeOutcome:
    """What one pass over the queue decided.

    :param granted: requests to grant, in the order they were placed
    :param overtakes: new overtake counts of the requests that stayed blocked (changed ones only)
    :param holds: the nodes held for the first blocked request whose overtake budget is spent
        (one node, or the nodes a gang needs)
    :param barrier: a request whose budget is spent but that no node can be held for; the
        pass stopped there
    """

    granted: list[tuple[QueueEntry, Assignment]] = field(default_factory=list)
    overtakes: dict[str, int] = field(default_factory=dict)
    holds: dict[str, tuple[str, ...]] = field(default_factory=dict)
    barrier: str | None = None


def queue_order(entries: Iterable[QueueEntry]) -> list[QueueEntry]:
    """Return entries in service order: priority descending, then arrival."""
    return sorted(entries, key=lambda e: (-e.request.priority, e.seq))


def serve(
    entries: Iterable[QueueEntry],
    try_place: Callable[[QueueEntry, frozenset[str]], Assignment | None],
    max_overtakes: int,
    hold: Callable[[QueueEntry, frozenset[str]], str | tuple[str, ...] | None],
    *,
    now: float | None = None,
) -> ServeOutcome:
    """Run one pass of the queue rule.

    :param entries: the waiting requests, in any order
    :param try_place: places one request on the working snapshot, avoiding the held nodes
        given, and returns its assignment, or None when it does not fit now; it must apply a
        successful placement before returning
    :param max_overtakes: overtakes a blocked request tolerates before it holds a node
    :param hold: picks the node to hold for a blocked request (not one already held), the
        nodes for a gang, or None
    :param now: the pass's time, for requests with ``not_before`` (None: every request is due)
    """
    outcome = ServeOutcome()
    # A blocked request's overtakes are its count when blocked plus the grants since, so
    # each is kept as ``base = count − grants so far``: a grant then costs O(1), not O(blocked).
    blocked: list[tuple[QueueEntry, int]] = []
    grants = 0
    top = None  # the largest base among the blocked requests without a hold
    held: frozenset[str] = frozenset()
    for entry in queue_order(entries):
        if top is not None and top + grants >= max_overtakes:
            top, held = _take_holds(outcome, blocked, grants, max_overtakes, hold, held)
            if outcome.barrier is not None:
                break
        assignment = try_place(entry, held) if is_due(entry, now) else None
        if assignment is None:
            base = entry.overtakes - grants
            blocked.append((entry, base))
            top = base if top is None else max(top, base)
            continue
        outcome.granted.append((entry, assignment))
        grants += 1
    outcome.overtakes = {e.request_id: base + grants for e, base in blocked if base + grants != e.overtakes}
    return outcome


def _take_holds(
    outcome: ServeOutcome,
    blocked: list[tuple[QueueEntry, int]],
    grants: int,
    max_overtakes: int,
    hold: Callable[[QueueEntry, frozenset[str]], str | tuple[str, ...] | None],
    held: frozenset[str],
) -> tuple[int | None, frozenset[str]]:
    """Give the first blocked request whose budget is spent a held node; return the new ``top``.

    Once one node is held, later spent requests wait like any other (``top`` None: no more checks).
    """
    top = None
    for entry, base in blocked:
        if outcome.holds:
            return None, held
        if base + grants < max_overtakes:
            top = base if top is None else max(top, base)
            continue
        picked = hold(entry, held)
        if not picked:
            outcome.barrier = entry.request_id
            return top, held
        nodes = (picked,) if isinstance(picked, str) else picked
        outcome.holds[entry.request_id] = nodes
        held = held | set(nodes)
    return top, held


def hold_node(
    current: Iterable[NodeState],
    empty: Iterable[NodeState],
    request: GpuRequest,
    held: frozenset[str],
    bindings: PoolBindings = UNCONSTRAINED,
    fit: Callable[..., list[Assignment] | NoFitReason] = choices,
) -> str | None:
    """Return the node to hold for ``request``: of those that could hold it once emptied, the closest now.

    :param current: the nodes as they are
    :param empty: the same nodes, in the same order, with nothing granted
    :param request: the blocked request
    :param held: nodes already held for other requests
    :param bindings: the binding of each node pool: a node whose binding cannot express the
        request is never held for it
    :param fit: :func:`~airflow_gpupool.placement.fit.choices`, or a cache of it (the forecast's
        replays ask the same node and request again and again)
    """
    best: tuple[float, str] | None = None
    for node, blank in zip(current, empty, strict=True):
        if node.name in held or isinstance(fit(blank, request, bindings), NoFitReason):
            continue
        now = fit(node, request, bindings)
        shortfall = now.shortfall if isinstance(now, NoFitReason) else 0.0
        if best is None or shortfall < best[0]:
            best = (shortfall, node.name)
    return best[1] if best else None
