"""Incremental queue service: a pass tries only the requests whose shape could fit what changed.

A full pass over the queue places every waiting request on the whole inventory, so serving
costs the queue's length times the inventory's, on every release. Yet a request that was
blocked at the last pass can only fit now on a node whose state changed since (capacity
freed, a node added or made healthy), or on a node that was held for another request then
and is not now: grants only shrink what a node can take (placement is per node, and a
grant never makes a node fit a request it did not fit before). So a pass asks, for such a
request, whether it fits any of those few nodes (:func:`~airflow_gpupool.placement.fit.choices`,
no scoring); only if one does is it placed as a full pass would place it. Within one pass,
requests of one shape blocked with no more held nodes are not tried twice either.

Only ``try_place`` changes: the queue rule itself (:func:`~airflow_gpupool.placement.queue.serve`:
priority order, overtakes, holds) runs as before on the same answers, so a pass grants what
a full pass grants (checked by a property test against ``incremental=False``).

The pass also reads less of the queue (:mod:`~airflow_gpupool.ledger.queue.waiting`): an overtake count is kept at
the bound once spent (spent is spent: no decision changes), and of the spent requests whose
shape fits no node now only the first is read (it takes the pass's hold, or stops it), so a
long queue of requests that cannot run costs a few indexed reads, not a row each. Spent shapes
that fitted nothing at the last pass are checked on the changed nodes only.

What a committed pass found is kept per process (:class:`ServiceMemo`); a pass in a
transaction that rolls back leaves it as it was.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.queue import QueueEntry
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.placement.verdict import NoFitReason
from airflow_gpupool.resources import GpuRequest

__all__ = ["PassMemo", "ServiceMemo"]

# What one pass leaves: the node states after it, and the held nodes each blocked request saw.
# and the spent shapes (request texts) that fitted no node at its start.
_Found = tuple[dict[str, NodeState], dict[str, frozenset[str]], frozenset[str]]


class PassMemo:
    """What one pass knows from the previous one, and what it finds.

    :param nodes: the nodes as the pass begins (the transaction's working copy)
    :param previous: what the previous pass found; None: nothing known, try everything
    """

    def __init__(self, nodes: Mapping[str, NodeState], previous: _Found | None) -> None:
        self._nodes = nodes
        self._shapes_blocked: frozenset[str] = frozenset()
        if previous is None:
            self._changed: set[str] | None = None
            self._was_blocked: Mapping[str, frozenset[str]] = {}
        else:
            before, self._was_blocked, self._shapes_blocked = previous
            self._changed = {name for name, state in nodes.items() if before.get(name) is not state}
        #: Spent shapes found to fit no node at this pass's start.
        self.shapes_blocked: set[str] = set()
        self._shapes: dict[GpuRequest, frozenset[str]] = {}
        self.blocked: dict[str, frozenset[str]] = {}
        #: Requests answered without placing them (tests and the bench read it).
        self.skipped = 0

    def cannot_fit(self, entry: QueueEntry, held: frozenset[str]) -> bool:
        """Whether ``entry`` surely does not fit now, avoiding ``held``: a full placement would say so too."""
        shape = self._shapes.get(entry.request)
        if shape is None or not shape <= held:
            was_held = self._was_blocked.get(entry.request_id)
            if was_held is None or self._changed is None:
                return False
            for name in (self._changed | was_held) - held:
                node = self._nodes.get(name)
                if node is not None and not isinstance(choices(node, entry.request), NoFitReason):
                    return False
        self.skipped += 1
        self.found_blocked(entry, held)
        return True

    def shape_still_blocked(self, text: str, request: GpuRequest) -> bool:
        """Whether the spent shape ``text`` fitted no node at the last pass's start and no changed node fits it now."""
        if text not in self._shapes_blocked or self._changed is None:
            return False
        for name in self._changed:
            node = self._nodes.get(name)
            if node is not None and not isinstance(choices(node, request), NoFitReason):
                return False
        return True

    def found_blocked(self, entry: QueueEntry, held: frozenset[str]) -> None:
        """Record that ``entry`` did not fit, avoiding ``held``."""
        self.blocked[entry.request_id] = held
        self._shapes.setdefault(entry.request, held)

    def found(self) -> _Found:
        """What this pass leaves for the next one (call once it is over)."""
        return dict(self._nodes), self.blocked, frozenset(self.shapes_blocked)


class ServiceMemo:
    """What this process's last committed pass found; passes of one transaction chain on each other."""

    def __init__(self) -> None:
        self._committed: _Found | None = None
        self._owner: object = None

    def begin(self, nodes: Mapping[str, NodeState], pending: _Found | None, owner: object) -> PassMemo:
        """Start a pass on ``nodes``.

        :param pending: what an earlier pass of the same transaction found (None: none yet)
        :param owner: what decided the last committed pass (policy, overtake bound): another
            owner knows nothing from it
        """
        previous = pending if pending is not None else (self._committed if owner == self._owner else None)
        return PassMemo(nodes, previous)

    def commit(self, found: _Found | None, owner: object) -> None:
        """Keep what the last pass of a committed transaction found."""
        if found is not None:
            self._committed, self._owner = found, owner

    def note_blocked(self, request_ids: list[str], nodes: Mapping[str, NodeState], owner: object) -> None:
        """Record requests a committed write found to fit no node of ``nodes``, avoiding none, without a pass.

        Found later than the last pass, they are re-checked on every node changed since that
        pass: a superset of those changed since they were found. With no pass known, ``nodes``
        (as the write left them) is what they are checked against.
        """
        if not request_ids:
            return
        found = dict.fromkeys(request_ids, frozenset[str]())
        if self._committed is None or owner != self._owner:
            self._committed, self._owner = (dict(nodes), found, frozenset()), owner
            return
        before, blocked, shapes = self._committed
        self._committed = before, {**blocked, **found}, shapes

    def forget(self) -> None:
        """Know nothing: the next pass tries every request."""
        self._committed = None
