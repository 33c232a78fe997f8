"""Suspect nodes: the ledger's books of a node were found wrong, so it takes no grant until resynced.

A granted pod that the scheduler cannot place on its node for want of the GPUs the ledger called
free is evidence that something the ledger does not count holds them (a pod not made by this
project, a node whose devices changed). The operator that saw it marks the node suspect before it
releases its slice, so neither its retry nor a waiting request is granted there on the same wrong
books. The controller resyncs a suspect node at its next pass (not its next sync interval), and
the sync clears the mark; only a sync that read the node *after* the mark clears it, so a sync
already under way when the mark came cannot clear it on what it read before.

Schema v17 keeps the mark in ``gpupool_nodes.suspect_since`` (the ledger's clock) and
``suspect_reason``. Placement sees a suspect node as unschedulable, with its reason in ``explain``
(:func:`~airflow_gpupool.placement.fit.check_node`); PostgreSQL's concurrent grant and hand-over
check the column under the node's row lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from sqlalchemy import Connection, select, update

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx

__all__ = ["LedgerSuspects", "write_suspect"]

log = logging.getLogger(LOGGER_NAME)

#: The longest reason kept: the scheduler's message can list every node of a large cluster.
MAX_REASON_CHARS = 500


class LedgerSuspects:
    """Mark nodes suspect and clear them (see :class:`~airflow_gpupool.ledger.Ledger`).

    :param store: the ledger's store
    :param cycle: its write cycle
    :param reserve_again: reads the capacity again and serves the queue on it (a cleared node
        takes grants at once)
    """

    def __init__(self, store: LedgerStore, cycle: WriteCycle, reserve_again: Callable[[Tx], None]) -> None:
        self._store = store
        self._cycle = cycle
        self._reserve_again = reserve_again

    def mark(self, name: str, reason: str) -> float:
        """Mark a node suspect now; return the mark's time (the ledger's clock).

        A node marked again keeps the later time: only a sync that read it after the last
        report clears it.

        :param name: the node
        :param reason: what was seen (the scheduler's message), kept for ``explain``
        :raises InvalidInventoryError: the node is not in the inventory
        """

        def run(tx: Tx) -> float:
            if not write_suspect(tx, name, reason):
                raise InvalidInventoryError("node", name, "a node of the inventory")
            # Placement must see the node unschedulable: the capacity copy reads it again.
            self._store.cache.reload(tx.conn)
            tx.nodes = dict(self._store.cache.nodes)
            return tx.now

        return self._cycle.write(run)

    def suspects(self) -> dict[str, float]:
        """Return the suspect nodes and since when each is (the ledger's clock)."""
        nodes = schema.nodes

        def read(conn: Connection) -> dict[str, float]:
            rows = conn.execute(
                select(nodes.c.name, nodes.c.suspect_since).where(nodes.c.suspect_since.is_not(None))
            )
            return {str(name): float(since) for name, since in rows}

        return self._store.read(read)

    def clear(self, names: Iterable[str], *, read_at: float) -> list[str]:
        """Clear the marks of nodes an inventory sync read at ``read_at``; return those cleared.

        A mark made after ``read_at`` stays: what the sync read predates the report.

        :param names: the nodes the sync read and stored
        :param read_at: the ledger's clock just before the sync read them
        """
        wanted = sorted(set(names))
        if not wanted:
            return []
        nodes = schema.nodes
        due = nodes.c.name.in_(wanted) & nodes.c.suspect_since.is_not(None)

        def stale(conn: Connection) -> bool:
            return conn.execute(select(nodes.c.name).where(due).limit(1)).first() is not None

        if not self._store.read(stale):  # the common case: one read, no write
            return []

        def run(tx: Tx) -> list[str]:
            cleared = sorted(
                tx.conn.execute(
                    select(nodes.c.name).where(due & (nodes.c.suspect_since <= read_at))
                ).scalars()
            )
            if not cleared:
                return []
            tx.conn.execute(
                update(nodes)
                .where(nodes.c.name.in_(cleared))
                .values(suspect_since=None, suspect_reason=None, version=tx.version)
            )
            log.info(
                "Node%s %s resynced: no longer suspect", "s" if len(cleared) > 1 else "", ", ".join(cleared)
            )
            self._reserve_again(tx)
            return cleared

        return self._cycle.write(run)


def write_suspect(tx: Tx, name: str, reason: str) -> bool:
    """Mark a node suspect inside ``tx``; False when no such node. The caller reloads the capacity."""
    text = " ".join(reason.split())[:MAX_REASON_CHARS] or "reported"
    found = tx.conn.execute(
        update(schema.nodes)
        .where(schema.nodes.c.name == name)
        .values(suspect_since=tx.now, suspect_reason=text, version=tx.version)
    )
    if found.rowcount == 0:
        return False
    tx.dirty, tx.exact = True, False
    log.warning("Node %s is suspect until the controller resyncs it: %s", name, text)
    return True
