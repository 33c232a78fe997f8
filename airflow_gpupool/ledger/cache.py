"""A per-process copy of the ledger's free capacity, refreshed by version.

Every write transaction stamps the rows it touches with a new ``version``; a writer that
holds the lock reads only the nodes changed since its copy was made, so a decision over
thousands of nodes does not reload them all.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, Row, select

from airflow_gpupool.ledger import schema
from airflow_gpupool.placement.snapshot import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.resources import MILLI_PER_GPU, NodeHealth, WorkloadClass


def classes_from_counts(n_training: int, n_inference: int) -> frozenset[str]:
    """Return the exclusive workload classes present on a node."""
    out = set()
    if n_training:
        out.add(WorkloadClass.TRAINING.value)
    if n_inference:
        out.add(WorkloadClass.INFERENCE.value)
    return frozenset(out)


class CapacityCache:
    """Nodes as :class:`NodeState`, plus the GPU UUIDs and MIG slices grants need."""

    def __init__(self) -> None:
        self.version = -1
        self.generation = -1
        self.nodes: dict[str, NodeState] = {}
        self.gpu_info: dict[tuple[str, int], tuple[str, str]] = {}
        self.mig_profiles: dict[tuple[str, str], str] = {}
        self.all_migs: dict[str, dict[int, tuple[tuple[str, str], ...]]] = {}
        self.health: dict[str, str] = {}

    def invalidate(self) -> None:
        """Forget everything; the next refresh reloads the whole inventory."""
        self.__init__()  # type: ignore[misc]

    def adopt(self, nodes: dict[str, NodeState], version: int) -> None:
        """Take the nodes a committed transaction computed as the state at ``version``."""
        self.nodes = nodes
        self.version = version

    def refresh(self, conn: Connection, version: int, generation: int) -> None:
        """Bring the copy to ``version``, reading only what changed since the last refresh."""
        if generation != self.generation:
            self.invalidate()
            self._load(conn, None)
        elif version != self.version:
            self._load(conn, self.version)
        self.version, self.generation = version, generation

    def _load(self, conn: Connection, since: int | None) -> None:
        query = select(schema.nodes)
        if since is not None:
            query = query.where(schema.nodes.c.version > since)
        node_rows = conn.execute(query.order_by(schema.nodes.c.name)).all()
        if not node_rows:
            return
        names = [r.name for r in node_rows]
        gpu_query = select(schema.gpus)
        mig_query = select(schema.mig_slices)
        if since is not None:
            gpu_query = gpu_query.where(schema.gpus.c.node.in_(names))
            mig_query = mig_query.where(schema.mig_slices.c.node.in_(names))
        gpus_by_node: dict[str, list[Row[Any]]] = defaultdict(list)
        for row in conn.execute(gpu_query):
            gpus_by_node[row.node].append(row)
        migs_by_node: dict[str, list[Row[Any]]] = defaultdict(list)
        for row in conn.execute(mig_query):
            migs_by_node[row.node].append(row)
        for row in node_rows:
            self.nodes[row.name] = self._node_state(row, gpus_by_node[row.name], migs_by_node[row.name])

    def _node_state(self, row: Row[Any], gpu_rows: Sequence[Row[Any]], mig_rows: Sequence[Row[Any]]) -> NodeState:
        free_migs: dict[int, list[tuple[str, str]]] = defaultdict(list)
        all_migs: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for mig in mig_rows:
            all_migs[mig.gpu_idx].append((mig.slice_id, mig.profile))
            self.mig_profiles[(row.name, mig.slice_id)] = mig.profile
            if mig.holder is None:
                free_migs[mig.gpu_idx].append((mig.slice_id, mig.profile))
        self.all_migs[row.name] = {idx: tuple(sorted(s)) for idx, s in all_migs.items()}
        gpus = []
        for g in sorted(gpu_rows, key=lambda r: r.idx):
            self.gpu_info[(row.name, g.idx)] = (g.uuid, g.model)
            gpus.append(
                GpuState(
                    index=g.idx,
                    model=g.model,
                    memory_mib=g.memory_mib,
                    free_milli=g.free_milli,
                    free_memory_mib=g.free_memory_mib,
                    mig_free=tuple(sorted(free_migs.get(g.idx, ()))),
                    partitioned=bool(g.partitioned),
                )
            )
        self.health[row.name] = row.health
        return NodeState(
            name=row.name,
            cpu_milli=row.cpu_milli,
            memory_mib=row.memory_mib,
            gpus=tuple(gpus),
            cpu_free=row.cpu_free,
            memory_free=row.memory_free,
            labels=tuple(sorted(json.loads(row.labels).items())),
            classes=classes_from_counts(row.n_training, row.n_inference),
            schedulable=row.health == NodeHealth.HEALTHY.value,
            node_pool=row.node_pool,
        )

    def empty_snapshot(self, nodes: Iterable[NodeState]) -> ClusterSnapshot:
        """Return the nodes as if nothing were granted: what a request could ever get.

        Cordoned and quarantined nodes count (they may come back); draining ones do not.
        """
        out = []
        for node in nodes:
            migs = self.all_migs.get(node.name, {})
            gpus = tuple(
                replace(
                    g,
                    free_milli=0 if g.partitioned else MILLI_PER_GPU,
                    free_memory_mib=g.memory_mib,
                    mig_free=migs.get(g.index, ()),
                )
                for g in node.gpus
            )
            healthy = self.health.get(node.name) != NodeHealth.DRAINING.value
            out.append(
                replace(
                    node,
                    gpus=gpus,
                    cpu_free=node.cpu_milli,
                    memory_free=node.memory_mib,
                    classes=frozenset(),
                    schedulable=healthy,
                )
            )
        return ClusterSnapshot(tuple(out))
