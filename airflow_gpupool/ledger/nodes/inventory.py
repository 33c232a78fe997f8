"""The ledger's inventory: nodes, their GPUs and MIG slices, health and heartbeats.

A node's capacity columns are kept consistent with the grants it holds: an upsert
recomputes what is free from the live grants, and refuses a change that would take away
a GPU or MIG slice a grant holds (drain the node first). Added capacity serves the queue
in the same transaction. Every node is kept with its ``gpupool.io/capacity-type`` label (spot
or on-demand, :func:`~airflow_gpupool.governance.capacity.with_capacity_type`), so a request
for one or the other is a node label like any other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select, update

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.governance.capacity import with_capacity_type
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.nodes.health import outranks
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.ends import Held, delete_node, held_on_node
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.resources import MILLI_PER_GPU, NodeHealth, NodeInventory, WorkloadClass
from airflow_gpupool.settings import spot_node_pools

log = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True)
class InventoryChange:
    """What an inventory upsert did, by node name."""

    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()


class LedgerInventory:
    """Add, change and remove the ledger's nodes (see :class:`~airflow_gpupool.ledger.Ledger`)."""

    def __init__(self, store: LedgerStore, cycle: WriteCycle) -> None:
        self._store = store
        self._cycle = cycle

    def upsert_nodes(self, inventory: Iterable[NodeInventory]) -> InventoryChange:
        """Add or update nodes, all in one transaction; unchanged nodes are left alone."""
        nodes = list(inventory)
        names = [n.name for n in nodes]
        for node in nodes:
            if not isinstance(node, NodeInventory):
                raise InvalidInventoryError("node", node, "a NodeInventory")
        spot_pools = spot_node_pools()
        nodes = [with_capacity_type(node, spot_pools) for node in nodes]
        if len(set(names)) != len(names):
            raise InvalidInventoryError(
                "nodes", sorted(n for n in names if names.count(n) > 1), "unique node names"
            )

        def run(tx: Tx) -> InventoryChange:
            added: list[str] = []
            updated: list[str] = []
            unchanged: list[str] = []
            for node in nodes:
                outcome = self._upsert_node(tx, node)
                {"added": added, "updated": updated, "unchanged": unchanged}[outcome].append(node.name)
            if added or updated:
                tx.dirty = tx.inventory_changed = True
                # Serve the queue on the nodes as they are now, not as the cache last saw them.
                self._store.cache.reload(tx.conn)
                tx.nodes = dict(self._store.cache.nodes)
                self._cycle.serve(tx)
            return InventoryChange(tuple(added), tuple(updated), tuple(unchanged))

        change = self._cycle.write(run)
        if change.added and self._store.dialect == "postgresql":
            self._store.analyze()
        return change

    def _upsert_node(self, tx: Tx, node: NodeInventory) -> str:
        conn = tx.conn
        existing = conn.execute(select(schema.nodes).where(schema.nodes.c.name == node.name)).first()
        old_gpus = {
            r.idx: r for r in conn.execute(select(schema.gpus).where(schema.gpus.c.node == node.name))
        }
        gpu_rows = [
            {
                "node": node.name,
                "idx": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "memory_mib": g.memory_mib,
                **_agent_columns(node.name, g.uuid, old_gpus.get(g.index)),
            }
            for g in node.gpus
        ]
        # Inventory sync never undoes a health set by the agent, the controller or an admin.
        health, source = node.health.value, "inventory"
        if existing is not None and not outranks("inventory", existing.health_source, existing.health):
            health, source = existing.health, existing.health_source
        mig_rows = [
            {"node": node.name, "slice_id": s.slice_id, "gpu_idx": g.index, "profile": s.profile}
            for g in node.gpus
            for s in g.mig_slices
        ]
        if existing is not None and _same_inventory(conn, existing, node, health, gpu_rows, mig_rows):
            return "unchanged"
        held = held_on_node(self._store, conn, node.name)
        _check_not_losing_grants(node, held, mig_rows)
        cpu_used = sum(h.request.cpu_milli for h in held)
        mem_used = sum(h.request.memory_mib for h in held)
        training = sum(1 for h in held if h.request.workload_class is WorkloadClass.TRAINING)
        inference = sum(1 for h in held if h.request.workload_class is WorkloadClass.INFERENCE)
        values = {
            "cpu_milli": node.cpu_milli,
            "memory_mib": node.memory_mib,
            "cpu_free": node.cpu_milli - cpu_used,
            "memory_free": node.memory_mib - mem_used,
            "labels": json.dumps(dict(node.labels), sort_keys=True),
            "node_pool": node.node_pool,
            "health": health,
            "health_source": source,
            "n_training": training,
            "n_inference": inference,
            "updated_at": tx.now,
            "version": tx.version,
        }
        if existing is None:
            conn.execute(insert(schema.nodes).values(name=node.name, remove_when_drained=False, **values))
        else:
            if existing.remove_when_drained:
                values["remove_when_drained"] = False
            conn.execute(update(schema.nodes).where(schema.nodes.c.name == node.name).values(**values))
            conn.execute(delete(schema.gpus).where(schema.gpus.c.node == node.name))
            conn.execute(delete(schema.mig_slices).where(schema.mig_slices.c.node == node.name))
        _insert_gpus(conn, gpu_rows, mig_rows, held)
        return "added" if existing is None else "updated"

    def remove_node(self, name: str) -> str:
        """Remove a node: ``removed``, ``draining`` (live grants keep it until released) or ``absent``."""

        def run(tx: Tx) -> str:
            row = tx.conn.execute(select(schema.nodes).where(schema.nodes.c.name == name)).first()
            if row is None:
                return "absent"
            if held_on_node(self._store, tx.conn, name):
                tx.conn.execute(
                    update(schema.nodes)
                    .where(schema.nodes.c.name == name)
                    .values(health=NodeHealth.DRAINING.value, remove_when_drained=True, version=tx.version)
                )
                tx.dirty, tx.exact = True, False
                log.info("Node %s holds live grants: draining it, it goes once they are released", name)
                return "draining"
            delete_node(tx, name)
            return "removed"

        return self._cycle.write(run)

    def heartbeat(self, name: str, at: float | None = None) -> None:
        """Record that a node's agent is alive."""

        def run(tx: Tx) -> None:
            stamp = at if at is not None else tx.now
            if not tx.conn.execute(
                update(schema.nodes).where(schema.nodes.c.name == name).values(heartbeat_at=stamp)
            ).rowcount:
                raise InvalidInventoryError("node", name, "a node of the inventory")

        self._cycle.write(run)


def _agent_columns(node: str, uuid: str, old: Row[Any] | None) -> dict[str, Any]:
    """What the node agent and health sources set on a GPU, kept across an inventory upsert."""
    if old is None:
        return {
            "uuid_verified": False,
            "bus_id": None,
            "health": "healthy",
            "health_source": "inventory",
            "health_reason": None,
        }
    kept = {
        "health": old.health,
        "health_source": old.health_source,
        "health_reason": old.health_reason,
        "bus_id": old.bus_id,
    }
    if old.uuid_verified:
        if uuid != old.uuid and uuid.startswith(("GPU-", "MIG-")):
            log.warning(
                "Node %s: inventory says GPU %s, the node agent verified %s; keeping %s",
                node,
                uuid,
                old.uuid,
                old.uuid,
            )
        kept.update(uuid=old.uuid, uuid_verified=True)
    else:
        kept["uuid_verified"] = False
    return kept


def _same_inventory(
    conn: Connection,
    existing: Row[Any],
    node: NodeInventory,
    health: str,
    gpu_rows: list[dict[str, Any]],
    mig_rows: list[dict[str, Any]],
) -> bool:
    same_node = (
        existing.cpu_milli == node.cpu_milli
        and existing.memory_mib == node.memory_mib
        and json.loads(existing.labels) == dict(node.labels)
        and existing.node_pool == node.node_pool
        and existing.health == health
        and not existing.remove_when_drained
    )
    if not same_node:
        return False
    have_gpus = {
        (r.idx, r.uuid, r.model, r.memory_mib)
        for r in conn.execute(select(schema.gpus).where(schema.gpus.c.node == node.name))
    }
    want_gpus = {(g["idx"], g["uuid"], g["model"], g["memory_mib"]) for g in gpu_rows}
    have_migs = {
        (r.slice_id, r.gpu_idx, r.profile)
        for r in conn.execute(select(schema.mig_slices).where(schema.mig_slices.c.node == node.name))
    }
    want_migs = {(m["slice_id"], m["gpu_idx"], m["profile"]) for m in mig_rows}
    return have_gpus == want_gpus and have_migs == want_migs


def _check_not_losing_grants(node: NodeInventory, held: list[Held], mig_rows: list[dict[str, Any]]) -> None:
    gpus = {g.index: g for g in node.gpus}
    slices = {m["slice_id"]: (m["gpu_idx"], m["profile"]) for m in mig_rows}
    for h in held:
        a = h.assignment
        missing = [i for i in a.gpu_indices if i not in gpus]
        slice_kept = a.mig_slice is None or slices.get(a.mig_slice) == (
            a.gpu_indices[0],
            h.request.mig_profile,
        )
        if missing or not slice_kept:
            raise InvalidInventoryError(
                f"node {node.name}",
                f"GPUs {missing or a.mig_slice}",
                f"to keep what grant {h.row.id} holds; drain the node (remove it) before repartitioning",
            )
        if a.mig_slice is None and any(gpus[i].mig_slices for i in a.gpu_indices):
            raise InvalidInventoryError(
                f"node {node.name}",
                f"MIG on GPUs {list(a.gpu_indices)}",
                f"no MIG partitioning while grant {h.row.id} holds them; drain the node first",
            )


def _insert_gpus(
    conn: Connection,
    gpu_rows: list[dict[str, Any]],
    mig_rows: list[dict[str, Any]],
    held: list[Held],
) -> None:
    """Insert a node's GPUs and MIG slices, minus what its live grants hold."""
    used_milli: dict[int, int] = {}
    used_mem: dict[int, int] = {}
    holders: dict[str, str] = {}
    for h in held:
        a = h.assignment
        if a.mig_slice is not None:
            holders[a.mig_slice] = h.row.id
            continue
        for i in a.gpu_indices:
            used_milli[i] = used_milli.get(i, 0) + a.milli_per_gpu
            used_mem[i] = used_mem.get(i, 0) + a.gpu_memory_mib
    partitioned = {m["gpu_idx"] for m in mig_rows}
    for row in gpu_rows:
        idx = row["idx"]
        row["partitioned"] = idx in partitioned
        row["free_milli"] = 0 if idx in partitioned else MILLI_PER_GPU - used_milli.get(idx, 0)
        row["free_memory_mib"] = row["memory_mib"] - used_mem.get(idx, 0)
    for m in mig_rows:
        m["holder"] = holders.get(m["slice_id"])
    if gpu_rows:
        conn.execute(insert(schema.gpus), gpu_rows)
    if mig_rows:
        conn.execute(insert(schema.mig_slices), mig_rows)
