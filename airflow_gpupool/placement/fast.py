"""The fast path of a scored policy: each node's best choice kept per request shape.

A policy's cost of placing a request on a node depends on that node's state only (and on
the policy's fixed parameters), and a new snapshot usually differs from the last one in a
node or two. So for each request shape seen, the best choice on every node (its cost, the
GPU, the MIG slice) is kept, and a decision rescores only the nodes changed since that shape
was last placed, then takes the cheapest node, ties going to the seeded node order exactly
as the reference scoring of :class:`~airflow_gpupool.placement.scored.ScoredPolicy` does.
Inside a node, the reference keeps the candidate of lowest primary, then secondary cost,
then GPU position; so does this. ``tests/unit/placement/test_fast_path.py`` checks that the
decisions are identical on random snapshots.

Nodes in the same state (same capacity, free capacity, labels, classes: :class:`NodeClasses`)
cost the same for every request, so a refresh of many rows scores one node per state and
copies its choice to the others: the first decision of a shape on an empty cluster of 1,213
nodes scores 15 nodes, not 1,213.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_gpupool.resources import GpuRequest

if TYPE_CHECKING:
    from airflow_gpupool.placement.scored import Candidates
    from airflow_gpupool.placement.snapshot import NodeState

__all__ = ["BestPerNode", "NodeClasses", "ShapeCache", "pick", "shape_of"]

#: Request shapes kept; the least recently used goes first beyond it.
MAX_SHAPES = 4096
#: Fewer stale rows than this are scored as they are (grouping them costs more than it saves).
GROUP_FROM = 16
#: Up to this many stale rows are scored one by one in Python when the policy can (numpy's
#: cost per call dominates below it).
FEW_ROWS = 24


def state_of(node: NodeState) -> tuple[Any, ...]:
    """Return everything of a node that placement reads, except its name and its position."""
    return (
        node.cpu_milli,
        node.memory_mib,
        node.gpus,
        node.cpu_free,
        node.memory_free,
        node.labels,
        node.classes,
        node.schedulable,
        node.node_pool,
    )


class NodeClasses:
    """An id per node row such that rows with equal ids are nodes in the same state.

    Ids are only compared within one refresh, so they are renumbered freely when the
    table of states grows large. Changed rows are noted and their ids computed only when
    a refresh groups rows (most refreshes score a few rows and never ask).
    """

    def __init__(self) -> None:
        self._ids = np.zeros(0, dtype=np.int64)
        self._known: dict[tuple[Any, ...], int] = {}
        self._nodes: Sequence[NodeState] = ()
        self._pending: set[int] | None = None  # None: every row

    def note(self, nodes: Sequence[NodeState], changed: np.ndarray | None) -> None:
        """Record that the ``changed`` rows (None: every row) now hold ``nodes``' states."""
        self._nodes = nodes
        if changed is None or len(self._ids) != len(nodes) or self._pending is None:
            self._pending = None
        elif len(changed):
            self._pending.update(changed.tolist())

    def ids(self) -> np.ndarray:
        """Return the id of every row."""
        nodes = self._nodes
        if self._pending is None or len(self._known) > 4 * len(nodes) + 1024:
            self._known.clear()
            self._ids = np.fromiter((self._id(n) for n in nodes), dtype=np.int64, count=len(nodes))
        else:
            for i in self._pending:
                self._ids[i] = self._id(nodes[i])
        self._pending = set()
        return self._ids

    def _id(self, node: NodeState) -> int:
        return self._known.setdefault(state_of(node), len(self._known))


def shape_of(request: GpuRequest) -> tuple[Any, ...]:
    """Return what placement reads of a request (priority, team... do not change where it goes)."""
    return (
        request.cpu_milli,
        request.memory_mib,
        request.gpus,
        request.gpu_milli,
        request.gpu_memory_mib,
        request.mig_profile,
        request.gpu_models,
        request.node_labels,
        request.workload_class,
    )


@dataclass
class BestPerNode:
    """The best choice of one request shape on each node, as of ``version``.

    :param primary: the node's best primary cost (``inf``: the request does not fit there)
    :param secondary: its secondary cost
    :param gpu: its GPU column (-1 for whole GPUs or none)
    :param mig: its MIG slice by node row (MIG requests only)
    """

    version: int
    primary: np.ndarray
    secondary: np.ndarray
    gpu: np.ndarray
    mig: dict[int, str]


Scorer = Callable[[GpuRequest, "np.ndarray | None"], "tuple[Candidates, np.ndarray, np.ndarray]"]
#: Scores a request on a few rows: ``(row, primary, secondary, GPU column)`` of each row it fits.
FewScorer = Callable[[GpuRequest, list[int]], list[tuple[int, float, float, int]]]


class ShapeCache:
    """Best choices per request shape, refreshed from the rows changed since each was computed."""

    def __init__(self) -> None:
        self.version = 0
        self._changed_at = np.zeros(0, dtype=np.int64)
        self._shapes: OrderedDict[tuple[Any, ...], BestPerNode] = OrderedDict()

    def note(self, changed: np.ndarray | None, size: int) -> None:
        """Record a sync: ``changed`` rows were rewritten (None: everything was)."""
        self.version += 1
        if changed is None or len(self._changed_at) != size:
            self._changed_at = np.full(size, self.version, dtype=np.int64)
            self._shapes.clear()
        elif len(changed):
            self._changed_at[changed] = self.version

    def best(
        self,
        request: GpuRequest,
        score: Scorer,
        classes: NodeClasses | None = None,
        few: FewScorer | None = None,
    ) -> BestPerNode:
        """Return the best choice of ``request``'s shape on every node, rescoring what changed.

        :param score: scores the candidates of the request on the given rows (None: all rows)
            and returns them with their primary and secondary costs
        :param classes: the rows' states (None: score every stale row)
        :param few: scores up to :data:`FEW_ROWS` rows without numpy (None: ``score`` does)
        """
        key = shape_of(request)
        kept = self._shapes.get(key)
        size = len(self._changed_at)
        if kept is None:
            kept = BestPerNode(
                -1,
                np.full(size, np.inf),
                np.zeros(size),
                np.full(size, -1, dtype=np.int64),
                {},
            )
            rows = None
        else:
            self._shapes.move_to_end(key)
            stale = np.flatnonzero(self._changed_at > kept.version)
            if len(stale) == 0:
                return kept
            rows = None if len(stale) * 4 > size else stale
        if few is not None and rows is not None and len(rows) <= FEW_ROWS:
            self._refresh_few(kept, request, rows.tolist(), few)
        elif classes is not None and request.mig_profile is None:
            # MIG slices carry per-node ids: such nodes never share a state, nothing to group.
            self._refresh_grouped(kept, request, rows, score, classes)
        else:
            self._refresh(kept, request, rows, score)
        self._shapes[key] = kept
        if len(self._shapes) > MAX_SHAPES:
            self._shapes.popitem(last=False)
        return kept

    def _refresh_few(self, kept: BestPerNode, request: GpuRequest, rows: list[int], few: FewScorer) -> None:
        for i in rows:
            kept.primary[i] = np.inf
            kept.gpu[i] = -1
            kept.mig.pop(i, None)
        for i, primary, secondary, gpu in few(request, rows):
            kept.primary[i] = primary
            kept.secondary[i] = secondary
            kept.gpu[i] = gpu
        kept.version = self.version

    def _refresh_grouped(
        self,
        kept: BestPerNode,
        request: GpuRequest,
        rows: np.ndarray | None,
        score: Scorer,
        classes: NodeClasses,
    ) -> None:
        every = np.arange(len(self._changed_at)) if rows is None else rows
        if len(every) < GROUP_FROM:
            self._refresh(kept, request, rows, score)
            return
        _, first, inverse = np.unique(classes.ids()[every], return_index=True, return_inverse=True)
        if len(first) * 2 > len(every):
            self._refresh(kept, request, rows, score)
            return
        reps = every[first]
        self._refresh(kept, request, reps, score)
        # Each row takes the choice of its state's representative.
        from_rep = reps[inverse]
        kept.primary[every] = kept.primary[from_rep]
        kept.secondary[every] = kept.secondary[from_rep]
        kept.gpu[every] = kept.gpu[from_rep]

    def _refresh(
        self, kept: BestPerNode, request: GpuRequest, rows: np.ndarray | None, score: Scorer
    ) -> None:
        cand, primary, secondary = score(request, rows)
        if rows is None:
            kept.primary.fill(np.inf)
            kept.gpu.fill(-1)
            kept.mig.clear()
        else:
            kept.primary[rows] = np.inf
            kept.gpu[rows] = -1
            for i in rows.tolist():
                kept.mig.pop(i, None)
        kept.version = self.version
        if len(cand) == 0:
            return
        # Per node, the candidate of lowest primary, then secondary cost, then GPU position.
        order = np.lexsort((cand.gpu, secondary, primary, cand.node))
        nodes = cand.node[order]
        starts = np.ones(len(nodes), dtype=bool)
        starts[1:] = nodes[1:] != nodes[:-1]
        first = order[starts]
        at = cand.node[first]
        kept.primary[at] = primary[first]
        kept.secondary[at] = secondary[first]
        kept.gpu[at] = cand.gpu[first]
        if cand.mig:
            for k in first.tolist():
                kept.mig[int(cand.node[k])] = cand.mig[k]


def pick(
    best: BestPerNode, rank: np.ndarray, prefer: Callable[[np.ndarray], np.ndarray] | None = None
) -> int | None:
    """Return the row of the cheapest node, ties to the lowest seeded rank; None when none fits.

    :param prefer: narrows tied rows to the preferred ones (the request's ``prefer_node_labels``)
    """
    if best.primary.size == 0:  # no node left to place on (every one skipped or held)
        return None
    low = best.primary.min()
    if not np.isfinite(low):
        return None
    ties = np.flatnonzero(best.primary == low)
    if prefer is not None and len(ties) > 1:
        ties = prefer(ties)
    if len(ties) == 1:
        return int(ties[0])
    return int(ties[np.argmin(rank[ties])])
