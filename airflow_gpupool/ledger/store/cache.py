"""A per-process copy of the ledger's free capacity, refreshed by version.

Every write stamps the node rows it touches with a ``version``, and a copy remembers a
*watermark*: rows stamped at or above it may have changed since the copy was made. A
refresh reads only those rows, so a decision over thousands of nodes does not reload
them all. On SQLite, where writers take turns, the version is a counter bumped by each
write transaction. On PostgreSQL, where grants and releases commit concurrently, it is
the writer's transaction id, and the watermark is the oldest transaction still running
when the copy was read: any change the copy could not see was made by a transaction at
or above it (the rule of queue readers built on ``txid_current_snapshot``, such as PgQ).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection, select, text

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.store.gate import GATE_KEYS, QueueGate
from airflow_gpupool.placement.snapshot import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import MILLI_PER_GPU, NodeHealth, WorkloadClass


def classes_from_counts(n_training: int, n_inference: int) -> frozenset[str]:
    """Return the exclusive workload classes present on a node."""
    out = set()
    if n_training:
        out.add(WorkloadClass.TRAINING.value)
    if n_inference:
        out.add(WorkloadClass.INFERENCE.value)
    return frozenset(out)


@dataclass(frozen=True)
class Stamp:
    """Where the ledger stood when a transaction began.

    :param generation: the inventory generation (nodes added or removed)
    :param watermark: a copy read now has seen every row stamped below this
    :param version: the stamp this transaction writes rows with (0 for readers)
    :param counter: whether versions are a counter (SQLite): an unchanged watermark then
        means nothing changed
    :param spent_version: the version of the last write that changed the spent waiting
        requests (None: none stamped yet), see :mod:`~airflow_gpupool.ledger.queue.queue_copy`
    :param quota_version: the version of the last quota change; None or 0: no quota stored
        (see :mod:`~airflow_gpupool.ledger.teams.admission`)
    :param gate: what the last pass over the queue lets writers skip (:mod:`~airflow_gpupool.ledger.store.gate`)
    :param gate_stored: the gate's ``gpupool_meta`` values as stored (None: absent)
    """

    generation: int
    watermark: int
    version: int
    counter: bool
    spent_version: int | None = None
    quota_version: int | None = None
    gate: QueueGate = field(default_factory=QueueGate)
    gate_stored: Mapping[str, int | None] = field(default_factory=dict)

    @property
    def watermark_after_commit(self) -> int:
        """The watermark of a copy that adopts this transaction's result once it commits."""
        # A counter moves on by this transaction; transaction ids are re-read from the old watermark.
        return self.version + 1 if self.counter else self.watermark


# One statement, so one snapshot: the stamp and every row that changed since ``since``.
_PG_CHANGES = """
SELECT
    (SELECT value FROM gpupool_meta WHERE key = 'inventory_generation') AS generation,
    (SELECT value FROM gpupool_meta WHERE key = 'spent_queue_version') AS spent_version,
    (SELECT value FROM gpupool_meta WHERE key = 'quota_version') AS quota_version,
    (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_open') AS queue_gate_open,
    (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_min_gpus') AS queue_gate_min_gpus,
    (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_min_milli') AS queue_gate_min_milli,
    (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_unspent_priority') AS queue_gate_unspent_priority,
    (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_bound') AS queue_gate_bound,
    (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_hold_priority') AS queue_gate_hold_priority,
    (SELECT value FROM gpupool_meta WHERE key = 'queue_gate_hold_seq') AS queue_gate_hold_seq,
    pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS watermark,
    {version} AS version,
    (SELECT json_agg(n ORDER BY n.name) FROM gpupool_nodes n WHERE n.version >= :since) AS nodes,
    (SELECT json_agg(g) FROM gpupool_gpus g
     WHERE g.node = ANY (ARRAY(SELECT name FROM gpupool_nodes WHERE version >= :since))) AS gpus,
    (SELECT json_agg(m) FROM gpupool_mig_slices m
     WHERE m.node = ANY (ARRAY(SELECT name FROM gpupool_nodes WHERE version >= :since))) AS migs
"""
_PG_READ = text(_PG_CHANGES.format(version="0"))
_PG_WRITE = text(_PG_CHANGES.format(version="pg_current_xact_id()::text::bigint"))
_EVERYTHING = -(2**62)

# Rows as mappings: SQLAlchemy rows on SQLite, decoded JSON objects on PostgreSQL.
_Row = Mapping[Any, Any]
_Rows = Sequence[_Row]


class CapacityCache:
    """Nodes as :class:`NodeState`, plus the GPU UUIDs and MIG slices grants need."""

    def __init__(self) -> None:
        self.watermark = _EVERYTHING
        self.generation = -1
        #: The stamp's quota version at the last refresh (None or 0: no quota stored).
        self.quota_version: int | None = None
        self.refreshed_at = -math.inf
        # Names of the nodes whose state changed since the last take_changes(); None: unknown.
        self.changed: set[str] | None = None
        self.nodes: dict[str, NodeState] = {}
        # (uuid, model, uuid verified by the node agent) by (node, GPU index).
        self.gpu_info: dict[tuple[str, int], tuple[str, str, bool]] = {}
        self.mig_profiles: dict[tuple[str, str], str] = {}
        self.all_migs: dict[str, dict[int, tuple[tuple[str, str], ...]]] = {}
        self.health: dict[str, str] = {}
        #: The nodes the queue holds for a waiting request (ledger.gate): grants go elsewhere.
        self.held: set[str] = set()
        self._empty: dict[str, tuple[NodeState, str | None, NodeState]] = {}

    def invalidate(self) -> None:
        """Forget everything; the next refresh reloads the whole inventory."""
        self.__init__()  # type: ignore[misc]

    def adopt(self, nodes: dict[str, NodeState], watermark: int, held: frozenset[str] | None = None) -> None:
        """Take the nodes a committed transaction computed (see :attr:`Stamp.watermark_after_commit`).

        :param held: the nodes the queue holds once it committed (None: it changed no hold)
        """
        self.nodes = nodes
        self.watermark = watermark
        self.changed = None
        if held is not None:
            self.held = set(held)

    def put(self, state: NodeState) -> None:
        """Replace one node's state (after this process changed it)."""
        self.nodes[state.name] = state
        if self.changed is not None:
            self.changed.add(state.name)

    def take_changes(self) -> set[str] | None:
        """Return the nodes changed since the last call (None: any may have), and start over."""
        changed, self.changed = self.changed, set()
        return changed

    def refresh(self, conn: Connection, *, writing: bool = False) -> Stamp:
        """Bring the copy up to date, reading only what may have changed since the last refresh.

        :param writing: the caller writes in this transaction; the stamp then carries the
            version its rows get
        """
        since = self.watermark
        stamp = self._read(conn, writing, since)
        if stamp.generation != self.generation and since != _EVERYTHING:
            self.invalidate()  # nodes came or went: read them all
            stamp = self._read(conn, writing, _EVERYTHING)
        self.watermark, self.generation = stamp.watermark, stamp.generation
        self.quota_version = stamp.quota_version
        self.refreshed_at = time.monotonic()
        return stamp

    def gpu_model(self, assignment: Assignment) -> str | None:
        """The model of the first GPU an assignment takes (None for CPU-only work)."""
        if not assignment.gpu_indices:
            return None
        return self.gpu_info.get((assignment.node, assignment.gpu_indices[0]), ("", None))[1]

    def mark_stale(self) -> None:
        """Make the next :meth:`fresh` say no, so the copy is refreshed (by version) before it is used."""
        self.refreshed_at = -math.inf

    def fresh(self, seconds: float) -> bool:
        """Whether the copy was refreshed within the last ``seconds``."""
        return time.monotonic() - self.refreshed_at < seconds

    def reload(self, conn: Connection) -> Stamp:
        """Read the whole inventory again."""
        self.invalidate()
        return self.refresh(conn)

    def _read(self, conn: Connection, writing: bool, since: int) -> Stamp:
        """Read the stamp and apply the rows stamped at or above ``since``."""
        if conn.dialect.name == "postgresql":
            row = conn.execute(_PG_WRITE if writing else _PG_READ, {"since": since}).one()
            self._apply(row.nodes or [], row.gpus or [], row.migs or [])
            stored = {key: row._mapping[key] for key in GATE_KEYS}
            return Stamp(
                row.generation,
                row.watermark,
                row.version,
                False,
                row.spent_version,
                row.quota_version,
                QueueGate.from_meta(stored),
                stored,
            )
        meta = dict(
            conn.execute(sql.READ_META).all()
        )  # rows are tuples (Result.tuples() is deprecated in 2.1)
        version = meta["version"] + 1
        stamp = Stamp(
            meta["inventory_generation"],
            version,
            version if writing else 0,
            True,
            meta.get(sql.SPENT_VERSION_KEY),
            meta.get("quota_version"),
            QueueGate.from_meta(meta),
            {key: meta.get(key) for key in GATE_KEYS},
        )
        if since != version:  # on a counter, an unchanged watermark means nothing changed
            self._apply(*self._select(conn, None if since == _EVERYTHING else since))
        return stamp

    @staticmethod
    def _select(conn: Connection, since: int | None) -> tuple[_Rows, _Rows, _Rows]:
        query = select(schema.nodes).order_by(schema.nodes.c.name)
        if since is not None:
            query = query.where(schema.nodes.c.version >= since)
        nodes = [r._mapping for r in conn.execute(query)]
        if not nodes:
            return [], [], []
        gpu_query = select(schema.gpus)
        mig_query = select(schema.mig_slices)
        if since is not None:
            names = [r["name"] for r in nodes]
            gpu_query = gpu_query.where(schema.gpus.c.node.in_(names))
            mig_query = mig_query.where(schema.mig_slices.c.node.in_(names))
        return (
            nodes,
            [r._mapping for r in conn.execute(gpu_query)],
            [r._mapping for r in conn.execute(mig_query)],
        )

    def _apply(self, nodes: _Rows, gpus: _Rows, migs: _Rows) -> None:
        gpus_by_node: dict[str, list[_Row]] = defaultdict(list)
        for g in gpus:
            gpus_by_node[g["node"]].append(g)
        migs_by_node: dict[str, list[_Row]] = defaultdict(list)
        for m in migs:
            migs_by_node[m["node"]].append(m)
        for row in nodes:
            name = row["name"]
            self.nodes[name] = self._node_state(row, gpus_by_node[name], migs_by_node[name])
            if row.get("held_for") is not None:
                self.held.add(name)
            else:
                self.held.discard(name)
            if self.changed is not None:
                self.changed.add(name)

    def _node_state(self, row: _Row, gpu_rows: _Rows, mig_rows: _Rows) -> NodeState:
        free_migs: dict[int, list[tuple[str, str]]] = defaultdict(list)
        all_migs: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for mig in mig_rows:
            all_migs[mig["gpu_idx"]].append((mig["slice_id"], mig["profile"]))
            self.mig_profiles[(row["name"], mig["slice_id"])] = mig["profile"]
            if mig["holder"] is None:
                free_migs[mig["gpu_idx"]].append((mig["slice_id"], mig["profile"]))
        self.all_migs[row["name"]] = {idx: tuple(sorted(s)) for idx, s in all_migs.items()}
        gpus = []
        for g in sorted(gpu_rows, key=lambda r: r["idx"]):
            self.gpu_info[(row["name"], g["idx"])] = (g["uuid"], g["model"], bool(g.get("uuid_verified")))
            # A quarantined GPU (schema v7) is shown to placement as partitioned with no free MIG
            # slice: nothing fits it, and grants and releases on it keep it so (they never change
            # ``partitioned``), while its free columns stay what its grants leave.
            quarantined = g.get("health", "healthy") != "healthy"
            gpus.append(
                GpuState(
                    index=g["idx"],
                    model=g["model"],
                    memory_mib=g["memory_mib"],
                    free_milli=g["free_milli"],
                    free_memory_mib=g["free_memory_mib"],
                    mig_free=() if quarantined else tuple(sorted(free_migs.get(g["idx"], ()))),
                    partitioned=bool(g["partitioned"]) or quarantined,
                    quarantined=quarantined,
                )
            )
        self.health[row["name"]] = row["health"]
        return NodeState(
            name=row["name"],
            cpu_milli=row["cpu_milli"],
            memory_mib=row["memory_mib"],
            gpus=tuple(gpus),
            cpu_free=row["cpu_free"],
            memory_free=row["memory_free"],
            labels=tuple(sorted(json.loads(row["labels"]).items())),
            classes=classes_from_counts(row["n_training"], row["n_inference"]),
            schedulable=row["health"] == NodeHealth.HEALTHY.value,
            node_pool=row["node_pool"],
            health=row["health"],
        )

    def empty_snapshot(self, nodes: Iterable[NodeState]) -> ClusterSnapshot:
        """Return the nodes as if nothing were granted: what a request could ever get.

        Cordoned and quarantined nodes count (they may come back); draining ones do not.
        """
        out = []
        for node in nodes:
            health = self.health.get(node.name)
            # Kept per node state: the queue asks for it on every pass that holds a node.
            known = self._empty.get(node.name)
            if known is not None and known[0] is node and known[1] == health:
                out.append(known[2])
                continue
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
            healthy = health != NodeHealth.DRAINING.value
            empty = replace(
                node,
                gpus=gpus,
                cpu_free=node.cpu_milli,
                memory_free=node.memory_mib,
                classes=frozenset(),
                schedulable=healthy,
            )
            self._empty[node.name] = (node, health, empty)
            out.append(empty)
        return ClusterSnapshot(tuple(out))
