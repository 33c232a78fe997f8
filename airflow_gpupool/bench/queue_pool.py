"""The queue bench's pool: nodes of 8 A100 held but one GPU each, whole-node requests queued on
it, and whole nodes turned over (freed, then taken by a waiter or a whole-node task)."""

from __future__ import annotations

import json

from sqlalchemy import insert, select

from airflow_gpupool.bench.phases import Side
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.store.transactions import Tx
from airflow_gpupool.resources import GpuDevice, GpuRequest, NodeInventory

__all__ = [
    "GPUS_PER_NODE",
    "WAITER_SHAPE",
    "WAIT_S",
    "fill",
    "free_a_node",
    "inventory",
    "open_sides",
    "queue_waiters",
    "turn_over_a_node",
]

GPUS_PER_NODE = 8
#: What waits: a whole node, which only a freed node can take.
WAITER_SHAPE = GpuRequest(gpus=GPUS_PER_NODE, cpu_milli=32000, memory_mib=131072)
#: How long a waiter, a filler or a whole-node task may wait or hold: longer than any run.
WAIT_S = 3600.0
_NODE_LABEL = "bench.gpupool.io/node"


def inventory(count: int) -> list[NodeInventory]:
    """``count`` nodes of 8 A100, each labelled with its name so a filler can be pinned to it."""
    return [
        NodeInventory(
            f"q-{i:04d}",
            128000,
            1048576,
            tuple(GpuDevice(g, f"GPU-q{i}-{g}", "A100-SXM4-80GB", 81920) for g in range(GPUS_PER_NODE)),
            labels=((_NODE_LABEL, f"q-{i:04d}"),),
        )
        for i in range(count)
    ]


def queue_waiters(ledger: Ledger, count: int) -> list[str]:
    """Queue ``count`` whole-node requests in one transaction: what ``count`` reserves on a full
    pool leave (waiting, no overtakes), without the setup costing one reserve per request."""
    ids = [f"waiter-{i:06d}" for i in range(count)]
    request = WAITER_SHAPE.to_dict()

    def run(tx: Tx) -> None:
        rows = [
            {
                "id": rid,
                "holder": "bench-waiter",
                "request": json.dumps(request, sort_keys=True),
                "priority": 0,
                "seq": tx.version,
                "state": "waiting",
                "team": WAITER_SHAPE.team,
                "workload_class": WAITER_SHAPE.workload_class.value,
                "created_at": tx.now,
                "deadline": tx.now + WAIT_S,
                "ttl": WAIT_S,
                "overtakes": 0,
            }
            for rid in ids
        ]
        if rows:
            tx.conn.execute(insert(schema.reservations), rows)
        tx.dirty = True

    ledger.write(run)
    return ids


def fill(ledger: Ledger, nodes: int) -> dict[str, list[str]]:
    """Hold all GPUs but one of every node, whatever the policy; return the fillers by node."""
    fillers: dict[str, list[str]] = {}
    for node in inventory(nodes):
        filler = GpuRequest(gpus=1, cpu_milli=1000, memory_mib=1024, node_labels=node.labels)
        for _ in range(GPUS_PER_NODE - 1):
            fillers.setdefault(node.name, []).append(ledger.reserve(filler, "bench-filler", ttl=WAIT_S).id)
    return fillers


def free_a_node(ledger: Ledger, fillers: dict[str, list[str]], granted_nodes: list[str]) -> bool:
    """Free one whole node: the node a waiter was granted before, else a filler node; False: none left."""
    r = schema.reservations.c
    # The waiters' grants only, read as rows: the bench's own reads stay small beside the clients'.
    query = select(r.id, r.node).where(r.state == ReservationState.GRANTED.value, r.holder == "bench-waiter")
    granted = ledger.read(lambda conn: conn.execute(query).all())
    for row in granted:
        if row.node not in granted_nodes:
            granted_nodes.append(row.node)
    if len(granted_nodes) > 1:  # keep the newest waiter's node held a while: it is being woken
        node = granted_nodes.pop(0)
        for row in granted:
            if row.node == node:
                ledger.release(row.id, reason="bench: the waiter's work is done")
        return True
    for node, ids in fillers.items():
        if ids:
            for rid in ids:
                ledger.release(rid, reason="bench: node freed for a waiter")
            ids.clear()
            del fillers[node]
            return True
    return False


def turn_over_a_node(ledger: Ledger, fillers: dict[str, list[str]], granted_nodes: list[str]) -> bool:
    """Free a whole node and take it with a whole-node task, as a run with waiters does (no queue)."""
    if not free_a_node(ledger, fillers, granted_nodes):
        return False
    task = ledger.reserve(WAITER_SHAPE, "bench-waiter", ttl=WAIT_S, timeout=WAIT_S)
    if task.state is not ReservationState.GRANTED:  # a client took a GPU of it first: no waiting here
        ledger.release(task.id, reason="bench: the node was taken first")
    return True


def open_sides(urls: list[str], nodes: int, waiters: int) -> list[Side]:
    """A ledger per URL, filled; with waiters a freed node goes to the first of them (first URL
    only), without, a whole-node task takes it."""
    sides = []
    for k, side_url in enumerate(urls):
        ledger = Ledger.create(side_url)
        ledger.upsert_nodes(inventory(nodes))
        turn_over = free_a_node if waiters and k == 0 else turn_over_a_node
        sides.append(Side(ledger, fill(ledger, nodes), turn_over))
    return sides
