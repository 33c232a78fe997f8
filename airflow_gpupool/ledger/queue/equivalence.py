"""Equivalence classes of nodes: placement need only look at one node per class.

Two nodes whose free capacity, totals, labels, pool, health and workload classes are all
equal are interchangeable for any request (like the kube-scheduler's old equivalence
cache). A large, mostly idle cluster has few classes, so the ledger hands the policy one
representative of each, the first in inventory order, and a decision over thousands of
nodes costs what a few dozen cost.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
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
            tuple(sorted(profile for _, profile in g.mig_free)) if g.mig_free else (),
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
    """The classes of the ledger's nodes, kept up to date as node states change.

    Node states are immutable and the ledger replaces a node's state when it changes, so a
    sync re-classifies only the nodes whose state object is new, and looks only at the
    nodes the caller names as changed when it knows them. Each class keeps its
    members in a heap by inventory position, with entries of members that left dropped
    when they reach the top; a representative is then found without a scan.
    """

    def __init__(self) -> None:
        self._synced: Mapping[str, NodeState] | None = None
        self._states: dict[str, NodeState] = {}
        self._class_of: dict[str, tuple[Any, ...]] = {}
        self._position: dict[str, int] = {}
        self._members: dict[tuple[Any, ...], list[tuple[int, str]]] = {}
        self._size: dict[tuple[Any, ...], int] = {}

    def representatives(
        self,
        nodes: Mapping[str, NodeState],
        skipped: AbstractSet[str] = frozenset(),
        changed: Iterable[str] | None = None,
    ) -> ClusterSnapshot:
        """Return the first node of each class, in inventory order, leaving out ``skipped`` nodes.

        :param changed: the nodes whose state changed since the last call with the same
            ``nodes`` mapping; None when unknown (every node is checked)
        """
        if changed is not None and nodes is self._synced:
            for name in changed:
                if self._states.get(name) is not nodes[name]:
                    self._classify(name, nodes[name])
        else:
            self._sync(nodes)
            self._synced = nodes
        firsts = []
        for signature, heap in self._members.items():
            first = self._first(signature, heap, skipped)
            if first is not None:
                firsts.append(first)
        firsts.sort()
        return ClusterSnapshot(tuple(nodes[name] for _, name in firsts))

    def _sync(self, nodes: Mapping[str, NodeState]) -> None:
        states = self._states
        for name, node in nodes.items():
            if states.get(name) is not node:
                self._classify(name, node)
        if len(states) != len(nodes):  # nodes left the inventory: start over
            self.__init__()  # type: ignore[misc]
            states = self._states
            for name, node in nodes.items():
                self._classify(name, node)

    def _classify(self, name: str, node: NodeState) -> None:
        self._states[name] = node
        signature = node_signature(node)
        old = self._class_of.get(name)
        if old == signature:
            return
        if old is not None:
            self._size[old] -= 1
            if not self._size[old]:
                del self._size[old], self._members[old]
        self._class_of[name] = signature
        position = self._position.setdefault(name, len(self._position))
        heap = self._members.setdefault(signature, [])
        self._size[signature] = self._size.get(signature, 0) + 1
        heapq.heappush(heap, (position, name))
        if len(heap) > 2 * self._size[signature] + 64:
            # Entries of members that left (or left and came back) pile up: keep one per member.
            members = {n: p for p, n in heap if self._class_of.get(n) == signature}
            heap[:] = sorted((p, n) for n, p in members.items())

    def _first(
        self, signature: tuple[Any, ...], heap: list[tuple[int, str]], skipped: AbstractSet[str]
    ) -> tuple[int, str] | None:
        while heap and self._class_of.get(heap[0][1]) != signature:
            heapq.heappop(heap)  # a member that moved to another class
        if not heap:
            return None
        if heap[0][1] not in skipped:
            return heap[0]
        for entry in sorted(heap):
            if entry[1] not in skipped and self._class_of.get(entry[1]) == signature:
                return entry
        return None
