"""Equivalence classes of nodes: placement need only look at one node per class.

Two nodes whose free capacity, totals, labels, pool, health and workload classes are all
equal are interchangeable for any request (like the kube-scheduler's old equivalence
cache). A large, mostly idle cluster has few classes, so the ledger hands the policy one
representative of each, the first in inventory order, and a decision over thousands of
nodes costs what a few dozen cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState


def node_signature(node: NodeState) -> tuple[Any, ...]:
    """Return what makes two nodes interchangeable: everything but the name and slice ids."""
    gpus = tuple(
        (
            g.index,
            g.model,
            g.memory_mib,
            g.free_milli,
            g.free_memory_mib,
            g.partitioned,
            tuple(sorted(profile for _, profile in g.mig_free)),
        )
        for g in node.gpus
    )
    return (
        node.cpu_milli,
        node.memory_mib,
        node.cpu_free,
        node.memory_free,
        gpus,
        node.labels,
        node.classes,
        node.schedulable,
        node.node_pool,
    )


class EquivalenceIndex:
    """Remembers each (immutable) NodeState's class number, so a snapshot is deduplicated cheaply."""

    def __init__(self) -> None:
        self._class_of: dict[int, tuple[NodeState, int]] = {}
        self._classes: dict[tuple[Any, ...], int] = {}

    def class_of(self, node: NodeState) -> int:
        """Return the number of ``node``'s equivalence class."""
        cached = self._class_of.get(id(node))
        if cached is not None and cached[0] is node:
            return cached[1]
        number = self._classes.setdefault(node_signature(node), len(self._classes))
        self._class_of[id(node)] = (node, number)
        return number

    def representatives(self, nodes: Iterable[NodeState]) -> ClusterSnapshot:
        """Return a snapshot of the first node of each equivalence class, in the given order."""
        nodes = list(nodes)
        if len(self._class_of) > 4 * len(nodes) + 1024:
            # Forget states no longer in use; class numbers restart.
            self._class_of.clear()
            self._classes.clear()
        seen: set[int] = set()
        out = []
        for node in nodes:
            number = self.class_of(node)
            if number not in seen:
                seen.add(number)
                out.append(node)
        return ClusterSnapshot(tuple(out))
