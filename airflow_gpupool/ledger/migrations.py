"""Versioned schema migrations of the ledger.

Each migration has a number and runs once, in its own transaction, recorded in
``gpupool_schema_version``. Later versions append a :class:`Migration` whose ``upgrade``
alters the schema with alembic's :class:`~alembic.operations.Operations`, which speaks
both SQLite (batch mode) and PostgreSQL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Connection, Engine, insert, inspect, select, update

from airflow_gpupool.exceptions import LedgerSchemaError
from airflow_gpupool.ledger import pg_functions, schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migration:
    """One schema step: ``upgrade(op, conn)`` brings version ``version - 1`` to ``version``."""

    version: int
    description: str
    upgrade: Callable[[Operations, Connection], None]


def _v1(op: Operations, conn: Connection) -> None:
    tables = [schema.ledger_meta, schema.nodes, schema.gpus, schema.mig_slices, schema.reservations]
    schema.metadata.create_all(conn, tables=tables)
    conn.execute(
        insert(schema.ledger_meta),
        [{"key": "version", "value": 0}, {"key": "inventory_generation", "value": 0}],
    )


def _v2(op: Operations, conn: Connection) -> None:
    schema.metadata.create_all(conn, tables=[schema.task_attempts])


def _v3(op: Operations, conn: Connection) -> None:
    if conn.dialect.name != "postgresql":
        return  # SQLite has one writer at a time: it keeps the serialized path and its counter.
    # Node versions become transaction ids; counter values from v2 might exceed them.
    conn.execute(update(schema.nodes).values(version=0))
    pg_functions.install(conn)


# The columns v4 adds to reservations, taken from the table so the two never disagree.
_V4_COLUMNS = ("pod_namespace", "pod_name", "pod_uid", "bound_at", "orphaned_at")


def _v4(op: Operations, conn: Connection) -> None:
    # v1 creates the table as the code has it now, columns of later versions included.
    present = {c["name"] for c in inspect(conn).get_columns(schema.reservations.name)}
    for name in _V4_COLUMNS:
        if name in present:
            continue
        column = schema.reservations.c[name]
        op.add_column(schema.reservations.name, Column(name, column.type, nullable=True))


def _v5(op: Operations, conn: Connection) -> None:
    if conn.dialect.name == "postgresql":  # SQLite keeps its machine's clock
        pg_functions.reinstall(conn)


def _v6(op: Operations, conn: Connection) -> None:
    schema.metadata.create_all(conn, tables=[schema.quotas])  # checkfirst: v1 may have made it


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: inventory, reservations, queue", _v1),
    Migration(2, "task attempts: failure class, next request and escalation per task try", _v2),
    Migration(3, "PostgreSQL: concurrent grants and releases under a shared lock", _v3),
    Migration(4, "bound grants: the pod of each grant, and orphaned grants that keep their slice", _v4),
    Migration(
        5, "PostgreSQL: the concurrent path measures leases and deadlines on the database's clock", _v5
    ),
    Migration(6, "team quotas per resource flavor, with borrowing and lending limits", _v6),
)
LATEST = MIGRATIONS[-1].version


def current_version(conn: Connection) -> int:
    """Return the schema version of the database (0 when the ledger was never initialised)."""
    if not inspect(conn).has_table(schema.schema_version.name):
        return 0
    versions = conn.execute(select(schema.schema_version.c.version)).scalars().all()
    return max(versions, default=0)


#: Key of the PostgreSQL advisory lock that serializes migrations (beside the writers' one).
MIGRATION_LOCK_KEY = 7243001


@contextmanager
def _migration_transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction no other process migrates beside.

    PostgreSQL: an advisory lock per schema, taken first. SQLite: ``BEGIN IMMEDIATE`` (the
    engine's write transactions), so two first-time inits never both upgrade a read lock,
    which SQLite refuses at once with "database is locked" instead of waiting.
    """
    with engine.connect() as conn:
        conn.info["gpupool_write"] = True
        try:
            with conn.begin():
                if engine.dialect.name == "postgresql":
                    conn.exec_driver_sql(
                        f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY}, hashtext(current_schema()))"
                    )
                yield conn
        finally:
            conn.info["gpupool_write"] = False


def migrate(engine: Engine) -> list[int]:
    """Apply every migration the database lacks; return the versions applied.

    Safe when many processes initialise one ledger at once: each step runs under the
    migration lock and checks the version again once it holds it.
    """
    with _migration_transaction(engine) as conn:
        schema.schema_version.create(conn, checkfirst=True)
    applied = []
    for migration in MIGRATIONS:
        with _migration_transaction(engine) as conn:
            if migration.version <= current_version(conn):
                continue
            log.info("Migrating GPU ledger to schema v%d: %s", migration.version, migration.description)
            migration.upgrade(Operations(MigrationContext.configure(conn)), conn)
            conn.execute(
                insert(schema.schema_version).values(
                    version=migration.version, description=migration.description, applied_at=time.time()
                )
            )
            applied.append(migration.version)
    return applied


def require_current(conn: Connection, url: str) -> None:
    """Raise :class:`LedgerSchemaError` unless the database is at this code's schema version."""
    version = current_version(conn)
    if version == LATEST:
        return
    if version == 0:
        raise LedgerSchemaError(f"no GPU ledger at {url}: create it with `gpupool ledger init --url {url}`")
    if version < LATEST:
        raise LedgerSchemaError(
            f"the GPU ledger at {url} is at schema v{version}, this code needs v{LATEST}: "
            f"run `gpupool ledger init --url {url}` to migrate it"
        )
    raise LedgerSchemaError(
        f"the GPU ledger at {url} is at schema v{version}, newer than this code (v{LATEST}): upgrade airflow-gpupool"
    )
