"""A numpy view of a cluster snapshot, refreshed by node identity.

Snapshots are immutable and a new one usually differs from the previous one in a node or
two, so a policy keeps one :class:`NodeTable` and, on each decision, rewrites only the rows
of the nodes that are not the very same :class:`NodeState` objects as last time. Scoring is
then a handful of vectorized operations over all nodes, which keeps a decision on a
thousand-node cluster well under a millisecond.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import is_not
from typing import TYPE_CHECKING

import numpy as np

from airflow_gpupool.resources import MILLI_PER_GPU, WorkloadClass

if TYPE_CHECKING:
    from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState

_TRAINING = WorkloadClass.TRAINING.value
_INFERENCE = WorkloadClass.INFERENCE.value


class NodeTable:
    """Per-node and per-GPU arrays of one snapshot.

    GPU arrays are ``(nodes, max GPUs per node)``; missing GPU slots hold ``-1`` free milli
    and model ``-1``. A MIG-partitioned GPU has 0 free milli (only MIG requests use it).
    """

    def __init__(self) -> None:
        self.nodes: tuple[NodeState, ...] = ()
        self.models: dict[str, int] = {}
        self.width = 0
        self._alloc(0, 0)

    def _alloc(self, n: int, width: int) -> None:
        self.width = width
        self.cpu_free = np.zeros(n, dtype=np.int64)
        self.cpu_cap = np.zeros(n, dtype=np.int64)
        self.mem_free = np.zeros(n, dtype=np.int64)
        self.mem_cap = np.zeros(n, dtype=np.int64)
        self.schedulable = np.zeros(n, dtype=bool)
        self.training = np.zeros(n, dtype=bool)
        self.inference = np.zeros(n, dtype=bool)
        self.has_mig = np.zeros(n, dtype=bool)
        self.node_model = np.full(n, -1, dtype=np.int64)
        self.gpu_free = np.full((n, width), -1, dtype=np.int64)
        self.gpu_model = np.full((n, width), -1, dtype=np.int64)
        self.gpu_mem_free = np.zeros((n, width), dtype=np.int64)
        self.gpu_mem_cap = np.zeros((n, width), dtype=np.int64)

    @property
    def size(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    def model_id(self, model: str) -> int:
        """Return the integer id of a GPU model name, assigning one when new."""
        found = self.models.get(model)
        if found is None:
            found = self.models[model] = len(self.models)
        return found

    def allowed_models(self, names: Iterable[str]) -> np.ndarray:
        """Return a boolean lookup by model id (last entry: the ``-1`` of an empty slot) of ``names``."""
        allowed = np.zeros(len(self.models) + 1, dtype=bool)
        for name in names:
            if name in self.models:
                allowed[self.models[name]] = True
        return allowed

    def sync(self, snapshot: ClusterSnapshot) -> np.ndarray | None:
        """Bring the arrays up to date with ``snapshot``.

        :return: indices of the rows rewritten, or None when the whole table was rebuilt
        """
        nodes = snapshot.nodes
        old = self.nodes
        if nodes is old:
            return np.zeros(0, dtype=np.int64)
        if len(old) != len(nodes):
            self._rebuild(nodes)
            return None
        base = snapshot.base
        if base is not None and base.nodes is old:
            # The snapshot says which positions differ from the one this table holds.
            rows = sorted({i for i in snapshot.changed if old[i] is not nodes[i]})
            changed = np.asarray(rows, dtype=np.int64)
        else:
            # map(is_not) runs in C: the identity scan of a thousand nodes costs microseconds.
            changed = np.flatnonzero(np.fromiter(map(is_not, old, nodes), dtype=bool, count=len(nodes)))
            rows = changed.tolist()
        for i in rows:
            node = nodes[i]
            if node.name != old[i].name or len(node.gpus) > self.width:
                self._rebuild(nodes)
                return None
        self.nodes = nodes
        for i in rows:
            self._fill(i, nodes[i])
        return changed

    def _rebuild(self, nodes: tuple[NodeState, ...]) -> None:
        self.nodes = nodes
        self._alloc(len(nodes), max((len(n.gpus) for n in nodes), default=0))
        for i, node in enumerate(nodes):
            self._fill(i, node)

    def _fill(self, i: int, node: NodeState) -> None:
        self.cpu_free[i] = node.cpu_free
        self.cpu_cap[i] = node.cpu_milli
        self.mem_free[i] = node.memory_free
        self.mem_cap[i] = node.memory_mib
        self.schedulable[i] = node.schedulable
        self.training[i] = _TRAINING in node.classes
        self.inference[i] = _INFERENCE in node.classes
        self.gpu_free[i] = -1
        self.gpu_model[i] = -1
        self.gpu_mem_free[i] = 0
        self.gpu_mem_cap[i] = 0
        mig = False
        for j, gpu in enumerate(node.gpus):
            self.gpu_free[i, j] = 0 if gpu.partitioned else gpu.free_milli
            self.gpu_model[i, j] = self.model_id(gpu.model)
            self.gpu_mem_free[i, j] = gpu.free_memory_mib
            self.gpu_mem_cap[i, j] = gpu.memory_mib
            mig = mig or gpu.partitioned
        self.has_mig[i] = mig
        self.node_model[i] = self.gpu_model[i, 0] if node.gpus else -1

    def gpu_total_free(self) -> np.ndarray:
        """Free milli-GPU of each node over its unpartitioned GPUs."""
        free: np.ndarray = np.where(self.gpu_free > 0, self.gpu_free, 0).sum(axis=1)
        return free

    def whole_free(self) -> np.ndarray:
        """Number of entirely free GPUs on each node."""
        whole: np.ndarray = (self.gpu_free == MILLI_PER_GPU).sum(axis=1)
        return whole

    def gpu_count(self) -> np.ndarray:
        """Number of GPUs on each node."""
        count: np.ndarray = (self.gpu_model >= 0).sum(axis=1)
        return count


def seeded_rank(size: int, seed: int) -> np.ndarray:
    """Return a fixed random rank of each node position, used to break ties between nodes.

    :param size: number of nodes
    :param seed: the seed; the same seed gives the same order
    """
    order = np.random.default_rng(seed).permutation(size)
    rank = np.empty(size, dtype=np.int64)
    rank[order] = np.arange(size)
    return rank
