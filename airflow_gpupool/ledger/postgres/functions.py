"""PostgreSQL functions of the ledger's concurrent path (schema v3; v5 measures on the database's clock;
v7 skips quarantined GPUs; v13 passes waiting requests as the queue gate allows, :mod:`~airflow_gpupool.ledger.store.gate`;
v14 queues a request that fits no node and leaves the gate as it is; v15 hands an emptied node to
the queue's first request; v16 lowers the gate's unspent priority when a grant spends the last
unspent budget).

A grant or release that needs no queue decision does not have to wait for every other
writer: it takes the ledger lock in *shared* mode, locks only its node's row, and commits
on its own, so PostgreSQL commits many of them together. Each function is one round trip
and one transaction. When the queue must decide (requests wait and the gate the last pass left
does not let this grant or release pass them), a lease is overdue, the inventory
changed, or anything else needs the serialized path, a function changes nothing and
answers ``serialize``: the caller then takes the exclusive lock (see
:mod:`airflow_gpupool.ledger.grants.serialized`).

Why this is safe:

* Queue decisions, expiry and inventory changes hold the lock exclusively, so while one
  runs no function does, and a function sees everything they committed (it takes the
  shared lock before it reads anything).
* Every writer locks a node's row before it touches the node's GPUs or MIG slices, so
  the capacity a function checks cannot change before it commits. A grant whose chosen
  GPU or MIG slice was taken meanwhile takes an equivalent one on the same node; if the
  node no longer fits at all it answers ``stale`` and the caller places again.
* A request queued here (``gpupool_wait``) asks for no fewer whole GPUs, and no smaller a
  fraction, than a request already waiting: a release that could make it fit could make that
  one fit too, so the release's gate test sends it to the serialized path, whose pass sees the
  new request. The function checks that no node has what it asks for, on the committed rows
  under the shared lock: a release running meanwhile either passes the gate (its node then
  fits no waiting request of that size) or waits for the exclusive lock, behind this commit.
* A release that empties a node the queue's first request fits (the last pass marked the nodes
  it fits empty, ``head_fits``, for that request's shape, ``queue_head_shape``) grants it there
  (``gpupool_give_back``), as a pass would: no other node fits a waiting request (the gate), what
  it leaves of the node fits none either, and it overtakes nobody. If the pass held a node for
  it, the hold passes to the next request when a pass would hold that node for it too (spent, of
  the same shape). The first two requests are locked before the hold's meta row, and a grant
  that spends a budget reads the hold ``FOR SHARE`` once its counted rows are locked, so the two
  commit one after the other, never across.
* Rows are stamped with the writer's transaction id (``version``), so a reader finds what
  changed since its last look from the oldest transaction running then
  (:class:`airflow_gpupool.ledger.store.cache.CapacityCache`).

The SQL is kept in ``sql/<function>.sql`` beside this module (package data), one file per
function, so that it reads and diffs as SQL; :func:`ddl` loads a file once and fills in the lock key.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from sqlalchemy import Connection

from airflow_gpupool.ledger.db.engine import ADVISORY_LOCK_KEY

#: The functions in the order :func:`install` creates them; each one's DDL is ``sql/<name>.sql``.
NAMES = ("gpupool_take", "gpupool_give_back", "gpupool_wait")


@cache
def ddl(name: str) -> str:
    """The ``CREATE OR REPLACE FUNCTION`` statement of one of :data:`NAMES`, read once from its file.

    ``__LOCK_KEY__`` in the file becomes :data:`~airflow_gpupool.ledger.db.engine.ADVISORY_LOCK_KEY`:
    the functions take the shared side of the lock the serialized path takes exclusively, whose key
    is defined once, in Python.
    """
    if name not in NAMES:
        raise ValueError(f"no ledger function {name!r} in {__package__}/sql (there are {', '.join(NAMES)})")
    sql = (files(__package__) / "sql" / f"{name}.sql").read_text(encoding="utf-8")
    return sql.replace("__LOCK_KEY__", str(ADVISORY_LOCK_KEY))


# v5 renamed an argument and added a result column, which CREATE OR REPLACE refuses.
_DROP = (
    "DROP FUNCTION IF EXISTS gpupool_take",
    "DROP FUNCTION IF EXISTS gpupool_give_back",
    "DROP FUNCTION IF EXISTS gpupool_wait",
)


def reinstall(conn: Connection) -> None:
    """Drop the functions and create them again (a migration that changes their signatures)."""
    for drop in _DROP:
        conn.exec_driver_sql(drop)
    install(conn)


def install(conn: Connection) -> None:
    """Create or replace the functions in the ledger's schema (the first of the search path)."""
    for name in NAMES:
        conn.exec_driver_sql(ddl(name))
