"""Versioned schema migrations of the ledger.

Each migration has a number and runs once, in its own transaction, recorded in
``gpupool_schema_version``. Later versions append a :class:`Migration` whose ``upgrade``
alters the schema with alembic's :class:`~alembic.operations.Operations`, which speaks
both SQLite (batch mode) and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from alembic.operations import Operations
from sqlalchemy import Column, Connection, Table, insert, inspect, select, text, update

from airflow_gpupool.governance.capacity import capacity_type
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.postgres import functions as pg_functions
from airflow_gpupool.settings import spot_node_pools


@dataclass(frozen=True)
class Migration:
    """One schema step: ``upgrade(op, conn)`` brings version ``version - 1`` to ``version``."""

    version: int
    description: str
    upgrade: Callable[[Operations, Connection], None]


def _v1(op: Operations, conn: Connection) -> None:
    # The queue-ahead plans too: every write cycle reads them, as it reads the reservations (v24 adds
    # them to a ledger made before).
    tables = [schema.ledger_meta, schema.nodes, schema.gpus, schema.mig_slices, schema.reservations]
    tables.append(schema.queue_ahead)
    schema.metadata.create_all(conn, tables=tables)
    conn.execute(
        insert(schema.ledger_meta),
        [{"key": "version", "value": 0}, {"key": "inventory_generation", "value": 0}],
    )


def _create(*tables: Table) -> Callable[[Operations, Connection], None]:
    """Return a step that creates ``tables`` (checkfirst: v1 creates every table the code has)."""
    return lambda op, conn: schema.metadata.create_all(conn, tables=list(tables))


def _v3(op: Operations, conn: Connection) -> None:
    if conn.dialect.name != "postgresql":
        return  # SQLite has one writer at a time: it keeps the serialized path and its counter.
    # Node versions become transaction ids; counter values from v2 might exceed them.
    conn.execute(update(schema.nodes).values(version=0))
    pg_functions.install(conn)


# The columns v4 adds to reservations, taken from the table so the two never disagree.
_V4_COLUMNS = ("pod_namespace", "pod_name", "pod_uid", "bound_at", "orphaned_at")


def _add_reservation_columns(
    op: Operations, conn: Connection, names: tuple[str, ...], table: Table = schema.reservations
) -> None:
    """Add the nullable columns ``names`` of ``table`` (the reservations) that the table lacks.

    v1 creates the table as the code has it now, columns of later versions included.
    """
    present = {c["name"] for c in inspect(conn).get_columns(table.name)}
    for name in names:
        if name not in present:
            op.add_column(table.name, Column(name, table.c[name].type, nullable=True))


def _v4(op: Operations, conn: Connection) -> None:
    _add_reservation_columns(op, conn, _V4_COLUMNS)


def _v5(op: Operations, conn: Connection) -> None:
    if conn.dialect.name == "postgresql":  # SQLite keeps its machine's clock
        pg_functions.reinstall(conn)


# The columns v7 adds (the node agent), with the value existing rows get.
_V7_COLUMNS: dict[str, tuple[tuple[str, object], ...]] = {
    schema.nodes.name: (
        ("health_source", "inventory"),
        ("health_reason", None),
        ("heartbeat_interval", None),
        ("heartbeat_streak_since", None),
        ("agent_state", None),
    ),
    schema.gpus.name: (
        ("uuid_verified", False),
        ("bus_id", None),
        ("health", "healthy"),
        ("health_source", "inventory"),
        ("health_reason", None),
    ),
}


def _v7(op: Operations, conn: Connection) -> None:
    # v1 creates the tables as the code has them now, so a column may already exist.
    for table_name, columns in _V7_COLUMNS.items():
        table = schema.metadata.tables[table_name]
        present = {c["name"] for c in inspect(conn).get_columns(table_name)}
        for name, default in columns:
            if name in present:
                continue
            column = table.c[name]
            server_default = None if default is None else sql_literal(default)
            op.add_column(
                table_name,
                Column(name, column.type, nullable=column.nullable, server_default=server_default),
            )
    if conn.dialect.name == "postgresql":  # the concurrent grant skips quarantined GPUs
        pg_functions.reinstall(conn)


# The columns and index v8 adds (gangs), taken from the table so the two never disagree.
_V8_COLUMNS = ("gang_id", "gang_index")
_V8_INDEX = "ix_gpupool_reservations_gang"


def _v8(op: Operations, conn: Connection) -> None:
    table = schema.reservations
    _add_reservation_columns(op, conn, _V8_COLUMNS)
    if _V8_INDEX not in {i["name"] for i in inspect(conn).get_indexes(table.name)}:
        op.create_index(_V8_INDEX, table.name, ["gang_id"])
    if conn.dialect.name == "postgresql":  # the concurrent release leaves gang members to the serialized path
        pg_functions.reinstall(conn)


def _v9(op: Operations, conn: Connection) -> None:
    """Stamp ``quota_version`` where quotas were applied before the queue applied them (v6-v8).

    Without the stamp the queue would not govern those quotas until the next ``gpupool quota
    apply``. The inventory generation moves too, as a quota apply moves it, so a capacity copy
    read before the migration sends its next concurrent grant to the serialized path.
    """
    del op
    if conn.execute(select(schema.quotas.c.team).limit(1)).first() is None:
        return
    meta = schema.ledger_meta
    values = {str(k): int(v) for k, v in conn.execute(select(meta.c.key, meta.c.value)).all()}
    if values.get(schema.QUOTA_VERSION_KEY):
        return
    stamp = max(values.get("version", 0), 1)
    if schema.QUOTA_VERSION_KEY in values:
        conn.execute(update(meta).where(meta.c.key == schema.QUOTA_VERSION_KEY).values(value=stamp))
    else:
        conn.execute(insert(meta).values(key=schema.QUOTA_VERSION_KEY, value=stamp))
    if "inventory_generation" in values:
        generation = values["inventory_generation"] + 1
        conn.execute(update(meta).where(meta.c.key == "inventory_generation").values(value=generation))


def _v10(op: Operations, conn: Connection) -> None:
    """Label every stored node ``gpupool.io/capacity-type``, as an inventory upsert now does.

    Without it a request for on-demand capacity (urgent work's by default) would fit no node of a
    ledger whose inventory is never synced again (a static one). Read from the node's own labels
    and ``[gpupool] spot_node_pools``; the inventory generation moves so capacity copies reload.
    """
    del op
    nodes = schema.nodes
    spot_pools = spot_node_pools()
    changed = 0
    for name, pool, raw in conn.execute(select(nodes.c.name, nodes.c.node_pool, nodes.c.labels)).all():
        labels = json.loads(raw or "{}")
        if CAPACITY_TYPE_LABEL in labels:
            continue
        labels[CAPACITY_TYPE_LABEL] = capacity_type(labels, node_pool=pool, spot_pools=spot_pools).value
        conn.execute(
            update(nodes).where(nodes.c.name == name).values(labels=json.dumps(labels, sort_keys=True))
        )
        changed += 1
    meta = schema.ledger_meta
    generation = conn.execute(select(meta.c.value).where(meta.c.key == "inventory_generation")).scalar()
    if changed and generation is not None:
        conn.execute(
            update(meta).where(meta.c.key == "inventory_generation").values(value=int(generation) + 1)
        )


# The columns v11 adds (preemption), taken from the table so the two never disagree.
_V11_COLUMNS = ("preempt_deadline", "preempted_by", "checkpoint_at")


def _v11(op: Operations, conn: Connection) -> None:
    _add_reservation_columns(op, conn, _V11_COLUMNS)


# The column v12 adds (headroom lent to preemptible work), beside its table of pool shares.
_V12_COLUMNS = ("headroom_loan",)


def _v12(op: Operations, conn: Connection) -> None:
    _add_reservation_columns(op, conn, _V12_COLUMNS)
    schema.metadata.create_all(conn, tables=[schema.headroom, schema.team_totals])


def _v13(op: Operations, conn: Connection) -> None:
    _add_reservation_columns(op, conn, ("held_for",), schema.nodes)
    index = next(i for i in schema.nodes.indexes if i.name == "ix_gpupool_nodes_held_for")
    if index.name not in {i["name"] for i in inspect(conn).get_indexes(schema.nodes.name)}:
        index.create(conn)
    if conn.dialect.name == "postgresql":  # the concurrent path passes waiters it cannot affect
        pg_functions.install(conn)


_V14_INDEXES = ("ix_gpupool_reservations_deadline", "ix_gpupool_reservations_unspent")


def _v14(op: Operations, conn: Connection) -> None:
    present = {i["name"] for i in inspect(conn).get_indexes(schema.reservations.name)}
    for index in schema.reservations.indexes:
        if index.name in _V14_INDEXES and index.name not in present:
            index.create(conn)
    if conn.dialect.name == "postgresql":  # a request that fits nowhere queues under the shared lock
        pg_functions.install(conn)


def _v15(op: Operations, conn: Connection) -> None:
    _add_reservation_columns(op, conn, ("head_fits",), schema.nodes)
    if conn.dialect.name == "postgresql":  # gpupool_give_back returns what it handed over: a new signature
        pg_functions.reinstall(conn)


def _v16(op: Operations, conn: Connection) -> None:
    if conn.dialect.name == "postgresql":  # a grant that spends the last unspent budget lowers the gate's key
        pg_functions.install(conn)


def _v17(op: Operations, conn: Connection) -> None:
    _add_reservation_columns(op, conn, ("suspect_since", "suspect_reason"), schema.nodes)
    if conn.dialect.name == "postgresql":  # the concurrent grant and hand-over skip suspect nodes
        pg_functions.install(conn)


def sql_literal(value: object) -> Any:
    """Return the server default that fills a migrated column on existing rows (a SQL literal)."""
    if isinstance(value, bool):
        # SQLite stores booleans as integers; PostgreSQL accepts '0'/'1' for booleans too.
        return text("'1'" if value else "'0'")
    return text(f"'{value}'")


#: The versions of the forecasts, the console's actions, the serialized revoke, the scalable pools and drift.
FORECASTS_VERSION, ACTIONS_VERSION, REVOKE_VERSION, SCALABLE_VERSION = 18, 19, 20, 21
#: Run admission's columns: their own migration, apart from any other branch's v23+.
RUN_ADMISSION_VERSION = SCALABLE_VERSION + 2
QUEUE_AHEAD_VERSION = RUN_ADMISSION_VERSION + 1


def _v24(op: Operations, conn: Connection) -> None:
    _add_reservation_columns(op, conn, ("ahead_of", "ahead_planned"))
    _create(schema.queue_ahead)(op, conn)
    if conn.dialect.name == "postgresql":  # a concurrent release leaves an upstream with plans to the cycle
        pg_functions.install(conn)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: inventory, reservations, queue", _v1),
    Migration(
        2,
        "task attempts: failure class, next request and escalation per task try",
        _create(schema.task_attempts),
    ),
    Migration(3, "PostgreSQL: concurrent grants and releases under a shared lock", _v3),
    Migration(4, "bound grants: the pod of each grant, and orphaned grants that keep their slice", _v4),
    Migration(
        5, "PostgreSQL: the concurrent path measures leases and deadlines on the database's clock", _v5
    ),
    Migration(
        6, "team quotas per resource flavor, with borrowing and lending limits", _create(schema.quotas)
    ),
    Migration(7, "node agent: heartbeats with reports, health with a source, verified GPU UUIDs", _v7),
    Migration(8, "gang reservations: the gang and member index of each reservation", _v8),
    Migration(9, "quotas applied before the queue governed them are stamped, so it governs them", _v9),
    Migration(10, "every node labelled gpupool.io/capacity-type: spot or on-demand", _v10),
    Migration(11, "preemption: a victim's grace deadline, its preemptor, its newest checkpoint", _v11),
    Migration(
        12,
        "headroom: each pool's share kept for urgent work, grants admitted on its loan; per-team totals of pruned history",
        _v12,
    ),
    Migration(
        13, "queue gate: held nodes marked; grants and releases that cannot matter to the queue skip it", _v13
    ),
    Migration(
        14,
        "the queue's deadlines and unspent requests indexed; PostgreSQL: a request that fits no node joins "
        "the queue without the exclusive lock",
        _v14,
    ),
    Migration(
        15,
        "PostgreSQL: a release that empties a node the queue's first request fits hands it over without "
        "the exclusive lock",
        _v15,
    ),
    Migration(
        16,
        "PostgreSQL: grants stop counting overtakes once no waiting request's budget is left unspent",
        _v16,
    ),
    Migration(
        17,
        "suspect nodes: a granted pod found the GPUs the ledger called free taken; no grant there until "
        "an inventory sync reads the node again",
        _v17,
    ),
    Migration(
        FORECASTS_VERSION,
        "forecasts: each waiting request's start-time quantiles, written by the controller",
        _create(schema.forecasts),
    ),
    Migration(
        ACTIONS_VERSION, "console actions: who did what to the pool, and when", _create(schema.actions)
    ),
    Migration(REVOKE_VERSION, "PostgreSQL: a preempted grant's release is serialized", _v5),
    Migration(
        SCALABLE_VERSION,
        "scalable pools' empty nodes (a request only a new node fits waits); each node's drift",
        _create(schema.scalable_pools, schema.node_drift),
    ),
    Migration(
        SCALABLE_VERSION + 1,
        "queued ahead: a waiting request not granted before its not_before",
        lambda op, conn: _add_reservation_columns(op, conn, ("not_before",)),
    ),
    Migration(
        RUN_ADMISSION_VERSION,
        "run admission: a DAG run's first GPU step waits until its team's quota or the pool serves its peak",
        lambda op, conn: _add_reservation_columns(op, conn, ("run_key", "run_peak_milli")),
    ),
    Migration(
        QUEUE_AHEAD_VERSION,
        "queue ahead: plans of downstream steps entering the queue before their upstream ends",
        _v24,
    ),
)
LATEST = MIGRATIONS[-1].version
