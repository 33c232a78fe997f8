"""The queue rule, shared by the ledger and the simulator.

Waiting requests are served in order: higher ``priority`` first, then first come first
served (``seq``). A request that does not fit is *blocked*; requests behind it may still
be granted (backfill), but each such grant counts as one overtake of every blocked
request ahead of it. Once a blocked request has been overtaken ``max_overtakes`` times,
nothing behind it is granted until it is: the capacity that frees up is kept for it, so a
large request is never starved by a stream of small ones (apache/airflow#29474).
A higher-priority request arriving later is served before, not "past", a blocked one, so
it never counts as an overtake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One waiting request as the queue rule sees it."""

    request_id: str
    request: GpuRequest
    seq: int
    overtakes: int = 0


@dataclass
class ServeOutcome:
    """What one pass over the queue decided.

    :param granted: requests to grant, in the order they were placed
    :param overtakes: new overtake counts of the requests that stayed blocked (changed ones only)
    :param barrier: the request id that stopped the pass (its overtake budget is spent), if any
    """

    granted: list[tuple[QueueEntry, Assignment]] = field(default_factory=list)
    overtakes: dict[str, int] = field(default_factory=dict)
    barrier: str | None = None


def queue_order(entries: Iterable[QueueEntry]) -> list[QueueEntry]:
    """Return entries in service order: priority descending, then arrival."""
    return sorted(entries, key=lambda e: (-e.request.priority, e.seq))


def serve(
    entries: Iterable[QueueEntry],
    try_place: Callable[[QueueEntry], Assignment | None],
    max_overtakes: int,
) -> ServeOutcome:
    """Run one pass of the queue rule.

    :param entries: the waiting requests, in any order
    :param try_place: places one request on the working snapshot and returns its assignment,
        or None when it does not fit now; it must apply a successful placement before returning
    :param max_overtakes: overtakes a blocked request tolerates before it blocks the queue
    """
    outcome = ServeOutcome()
    # A blocked request's overtakes are its count when blocked plus the grants since, so
    # each is kept as ``base = count − grants so far``: a grant then costs O(1), not O(blocked).
    blocked: list[tuple[QueueEntry, int]] = []
    grants = 0
    top = None  # the largest base among the blocked
    for entry in queue_order(entries):
        if top is not None and top + grants >= max_overtakes:
            outcome.barrier = next(e.request_id for e, base in blocked if base + grants >= max_overtakes)
            break
        assignment = try_place(entry)
        if assignment is None:
            base = entry.overtakes - grants
            blocked.append((entry, base))
            top = base if top is None else max(top, base)
            continue
        outcome.granted.append((entry, assignment))
        grants += 1
    outcome.overtakes = {e.request_id: base + grants for e, base in blocked if base + grants != e.overtakes}
    return outcome
