"""The GPU map grouped by node pool: a summary per pool, the node cards of the pools opened.

At 1,000 nodes a card per node is megabytes of HTML every refresh; a pool's summary line
(nodes, GPUs, held, free, not schedulable, grants) is what a person scans first, and opening a
pool (``?open=<pool>``, or ``?open=*`` for all) draws its nodes. Small clusters open every pool.
The grants and free MIG slices of each node are indexed once per page, not searched per node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from airflow_gpupool.ledger import grant_milli, ledger_drift
from airflow_gpupool.plugins.page import UNHEALTHY, node_html

if TYPE_CHECKING:
    from airflow_gpupool.ledger import DriftRecord, LedgerSnapshot, NodeDrift, NodeRecord, Reservation

#: Clusters up to this many nodes show every pool open.
OPEN_ALL_UP_TO = 24


@dataclass
class SnapshotIndex:
    """A snapshot's grants and free MIG slices by node and GPU, and each node's books, built in one pass."""

    grants: dict[str, dict[int, list[Reservation]]] = field(default_factory=dict)
    mig_free: dict[str, dict[int, tuple[tuple[str, str], ...]]] = field(default_factory=dict)
    books: dict[str, NodeDrift] = field(default_factory=dict)
    cluster: dict[str, DriftRecord] = field(default_factory=dict)

    @classmethod
    def of(cls, snapshot: LedgerSnapshot, cluster: dict[str, DriftRecord] | None = None) -> SnapshotIndex:
        """Index ``snapshot``; ``cluster`` is the controller's stored drift by node."""
        index = cls(cluster=dict(cluster or {}))
        for r in snapshot.grants:
            if r.grant is not None:
                per_gpu = index.grants.setdefault(r.grant.node, {})
                for i in r.grant.gpu_indices:
                    per_gpu.setdefault(i, []).append(r)
        for state in snapshot.cluster.nodes:
            index.mig_free[state.name] = {g.index: g.mig_free for g in state.gpus}
        index.books = {row.node: row for row in ledger_drift(snapshot)}
        return index


@dataclass
class PoolSummary:
    """One node pool's figures."""

    name: str
    nodes: list[NodeRecord] = field(default_factory=list)
    gpus: int = 0
    held_milli: int = 0
    grants: int = 0

    @property
    def unschedulable(self) -> int:
        """Nodes quarantined, cordoned or draining."""
        return sum(1 for n in self.nodes if n.health in UNHEALTHY)


def pool_summaries(snapshot: LedgerSnapshot) -> list[PoolSummary]:
    """Return every node pool's summary, by name."""
    pools: dict[str, PoolSummary] = {}
    for n in snapshot.nodes:
        pool = pools.setdefault(n.node_pool, PoolSummary(n.node_pool))
        pool.nodes.append(n)
        pool.gpus += len(n.gpus)
    held: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in snapshot.grants:
        if r.grant is not None:
            held[r.grant.node_pool][0] += grant_milli(r.grant)
            held[r.grant.node_pool][1] += 1
    for name, (milli, count) in held.items():
        if name in pools:
            pools[name].held_milli, pools[name].grants = milli, count
    return [pools[name] for name in sorted(pools)]


def opened_pools(snapshot: LedgerSnapshot, asked: Sequence[str]) -> Collection[str] | None:
    """Return the pools to draw (None: all), from ``?open=`` values and the cluster's size."""
    if "*" in asked or len(snapshot.nodes) <= OPEN_ALL_UP_TO:
        return None
    return set(asked)


def _toggle(name: str, opened: Collection[str], query: dict[str, object]) -> str:
    now = set(opened)
    now ^= {name}
    return "?" + urlencode({**query, "open": sorted(now)}, doseq=True)


def map_html(
    snapshot: LedgerSnapshot,
    ui_base: str,
    asked: Sequence[str],
    query: dict[str, object],
    cluster: dict[str, DriftRecord] | None = None,
) -> str:
    """Return the GPU map: per node pool, its summary and, when open, its nodes.

    :param snapshot: a ledger snapshot
    :param ui_base: the Airflow UI's path prefix
    :param asked: the pools ``?open=`` names (``*``: all)
    :param query: the page's other query parameters, kept by the open/close links
    :param cluster: the controller's stored drift by node (the books line's cluster side)
    """
    opened = opened_pools(snapshot, asked)
    index = SnapshotIndex.of(snapshot, cluster) if opened is None or opened else SnapshotIndex()
    out = []
    for pool in pool_summaries(snapshot):
        is_open = opened is None or pool.name in opened
        used = pool.held_milli / (pool.gpus * 1000) if pool.gpus else 0.0
        bad = (
            f' · <span class="badge h-quarantined">{pool.unschedulable} not schedulable</span>'
            if pool.unschedulable
            else ""
        )
        figures = (
            f"{len(pool.nodes)} node{'s' if len(pool.nodes) != 1 else ''} · {pool.gpus} GPUs · {pool.held_milli / 1000:g} held ({used:.0%}) · "
            f"{pool.grants} grants{bad}"
        )
        toggle = (
            ""
            if opened is None
            else f' <a class="toggle" href="{escape(_toggle(pool.name, opened, query))}">{"close" if is_open else "open"}</a>'
        )
        nodes = "".join(node_html(n, snapshot, ui_base, index) for n in pool.nodes) if is_open else ""
        out.append(
            f'<div class="pool{" open" if is_open else ""}" data-pool="{escape(pool.name)}">'
            f'<div class="pool-head"><b>{escape(pool.name)}</b> <span class="meta">{figures}</span>{toggle}'
            f'<div class="poolbar"><div style="width:{min(used, 1.0) * 100:.1f}%"></div></div></div>'
            f"{f'<div class=nodes>{nodes}</div>' if nodes else ''}</div>"
        )
    return "".join(out) or '<p class="empty">No nodes.</p>'
