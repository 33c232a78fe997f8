"""The nodes the queue holds for waiting requests, marked on their rows (see :mod:`~airflow_gpupool.ledger.store.gate`).

A pass holds a node for the first request whose overtake budget is spent; the mark on the node's
row (``held_for``) is what the concurrent path and later writers read, so a grant between two
passes never lands where the queue drains capacity for that request.
"""

from __future__ import annotations

from sqlalchemy import Connection, select, update

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.store.transactions import Tx

__all__ = ["held_nodes", "mark_holds"]


def mark_holds(tx: Tx, holds: dict[str, tuple[str, ...]]) -> None:
    """Mark the nodes held for waiting requests on their rows, and unmark the others (see ledger.gate).

    A row whose mark changes takes the transaction's version, so every process's capacity copy
    reads the mark again (the concurrent path places nowhere the queue holds).
    """
    n = schema.nodes.c
    wanted = {node: rid for rid, nodes in holds.items() for node in nodes}
    marked = dict(tx.conn.execute(select(n.name, n.held_for).where(n.held_for.is_not(None))).all())
    for node in set(marked) | set(wanted):
        if marked.get(node) != wanted.get(node):
            tx.conn.execute(
                update(schema.nodes)
                .where(n.name == node)
                .values(held_for=wanted.get(node), version=tx.version)
            )
            tx.dirty = True
    tx.held = frozenset(wanted)


def held_nodes(conn: Connection) -> frozenset[str]:
    """Return the nodes the queue holds for waiting requests (their grants go through the queue)."""
    n = schema.nodes.c
    return frozenset(conn.execute(select(n.name).where(n.held_for.is_not(None))).scalars())
