"""What a pass over the queue reads of the waiting requests, leaving out those that change nothing.

A request whose overtake budget is spent keeps its count (at the bound) and is spent whatever
happens, so once it cannot be granted it matters only as the first spent one (it gets the pass's
hold, or stops the pass). A spent request of a shape that fits no node now, avoiding none,
cannot be granted in this pass (grants only shrink what nodes can take, holds only exclude
more): only the first of those is read. Once the pass grants the spent requests ahead of it
(of shapes that fit), it is the first spent one left, and gets the hold. Of a shape that fits,
the requests are one request many times over, served in their order: a pass grants at most as
many as the free capacity holds, and after the first that does not fit, none does. Only that
many are read, and a few more, so the first refused ones can still be offered victims. The pass
then decides what a pass over the whole queue decides, reading what it needs: a long queue of
one shape costs a pass what the free capacity holds, not the queue's length.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.queue.queue_copy import QueueCopy
from airflow_gpupool.ledger.queue.service import PassMemo
from airflow_gpupool.ledger.store.transactions import Tx
from airflow_gpupool.ledger.teams.preempting import PREEMPTORS_PER_PASS
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest

__all__ = ["WaitingReader", "most_granted"]

# Parsed shapes of spent requests kept per process (a queue has few distinct shapes).
_SHAPES_KEPT = 1000
# Read past those a pass may grant: the first refused one, and those offered victims after it.
_BEYOND_GRANTS = 1 + PREEMPTORS_PER_PASS


def most_granted(nodes: Iterable[NodeState], request: GpuRequest) -> int | None:
    """At most how many copies of ``request`` the free capacity of ``nodes`` could take (None: no bound known).

    Counts GPU compute only (memory, CPU, models and bindings only refuse more), so it never
    counts too few. Gangs, MIG slices and CPU-only requests are not counted.
    """
    if request.gang is not None or request.mig_profile is not None:
        return None
    if request.gpu_milli is not None:
        milli = request.gpu_milli
        return sum(g.free_milli // milli for n in nodes for g in n.gpus if not g.partitioned)
    if request.gpus:
        whole = (sum(1 for g in n.gpus if not g.partitioned and g.free_milli >= MILLI_PER_GPU) for n in nodes)
        return sum(free // request.gpus for free in whole)
    return None


class WaitingReader:
    """The waiting rows a pass reads, with this process's copy of the spent ones (:mod:`.queue_copy`)."""

    def __init__(self) -> None:
        self.copy = QueueCopy()
        self._shapes: dict[str, GpuRequest] = {}

    def read(
        self, tx: Tx, memo: PassMemo, spent_shapes: list[str], bound: int, fits: Callable[[GpuRequest], bool]
    ) -> list[Any]:
        """Return the waiting rows the pass must see; add the spent shapes to ``spent_shapes``.

        :param bound: the overtakes that spend a budget
        :param fits: whether a request fits one of the transaction's nodes now, avoiding none
        """
        conn, spent = tx.conn, {"spent": bound}
        rows = list(conn.execute(sql.WAITING_UNSPENT, spent).all())
        # The copy is the spent requests as this transaction found them: once it changed them,
        # a pass reads them.
        copy = self.copy.rows(conn, None if tx.spent_changed else tx.spent_version, bound)
        if copy is not None:
            shapes: list[str] = list(copy.spent_by_shape)
        else:
            shapes = list(conn.execute(sql.SPENT_SHAPES, spent).scalars().all())
        spent_shapes += shapes
        if not shapes:
            return rows
        fitting: dict[str, int | None] = {}
        for text in shapes:
            request = self.shape(text)
            if memo.shape_still_blocked(text, request) or not fits(request):
                memo.shapes_blocked.add(text)
            else:
                most = most_granted(tx.nodes.values(), request)
                fitting[text] = None if most is None else most + _BEYOND_GRANTS
        blocked = [text for text in shapes if text not in fitting]
        if copy is not None:
            rows += [row for text, limit in fitting.items() for row in copy.spent_by_shape[text][:limit]]
            heads = [copy.spent_by_shape[text][0] for text in blocked]
        else:
            for text, limit in fitting.items():
                rows += conn.execute(sql.WAITING_SPENT_OF.limit(limit), {**spent, "shapes": [text]}).all()
            heads = list(conn.execute(sql.FIRST_SPENT_OF, {**spent, "shapes": blocked})) if blocked else []
        # The first blocked one in service order, not the first spent one: a pass that grants the
        # spent ones ahead of it must still see it, to hold a node for it (an open gate without a
        # hold let grants pass a spent request by for good).
        first = min(heads, key=lambda row: (-row.priority, row.seq, row.id), default=None)
        if first is not None:
            rows.append(first)
        return rows

    def shape(self, text: str) -> GpuRequest:
        """Return the request a spent row's text stands for (parsed once per process)."""
        request = self._shapes.get(text)
        if request is None:
            request = self._shapes[text] = GpuRequest.from_dict(json.loads(text))
            if len(self._shapes) > _SHAPES_KEPT:
                self._shapes.pop(next(iter(self._shapes)))
        return request
