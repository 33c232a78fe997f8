"""Applying the ledger's migrations: one process at a time, each version recorded, checked on open.

The migrations themselves are in :mod:`~airflow_gpupool.ledger.store.migrations`, read from that
module when they run (tests stop a ledger at an old version by shortening its list).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, insert, inspect, select

from airflow_gpupool import settings
from airflow_gpupool.exceptions import LedgerSchemaError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.store import migrations
from airflow_gpupool.redact import redact_url

log = logging.getLogger(__name__)


def current_version(conn: Connection) -> int:
    """Return the schema version of the database (0 when the ledger was never initialised)."""
    if not inspect(conn).has_table(schema.schema_version.name):
        return 0
    versions = conn.execute(select(schema.schema_version.c.version)).scalars().all()
    return max(versions, default=0)


#: Key of the PostgreSQL advisory lock that serializes migrations (beside the writers' one).
MIGRATION_LOCK_KEY = 7243001

#: How long one migration step waits for the lock. Longer than a writer's ``[gpupool]
#: lock_timeout_seconds``: many processes initialise one ledger at once (a deploy's Jobs, every
#: worker's first open) and each waits out the others' steps, which SQLite does not queue fairly.
MIGRATION_LOCK_WAIT_SECONDS = 300.0


@contextmanager
def _migration_transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction no other process migrates beside.

    PostgreSQL: an advisory lock per schema, taken first. SQLite: ``BEGIN IMMEDIATE`` (the
    engine's write transactions), so two first-time inits never both upgrade a read lock,
    which SQLite refuses at once with "database is locked" instead of waiting. Either waits
    up to :data:`MIGRATION_LOCK_WAIT_SECONDS` for the lock.
    """
    wait = max(MIGRATION_LOCK_WAIT_SECONDS, settings.lock_timeout_seconds())
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        conn.info["gpupool_write"] = True
        driver: Any = conn.connection.driver_connection
        try:
            if sqlite:
                # On the driver, not through SQLAlchemy: a statement there would begin the transaction.
                driver.execute(f"PRAGMA busy_timeout = {round(wait * 1000)}")
            with conn.begin():
                if not sqlite:
                    conn.exec_driver_sql(
                        f"SELECT set_config('lock_timeout', '{round(wait * 1000)}', true), "
                        f"pg_advisory_xact_lock({MIGRATION_LOCK_KEY}, hashtext(current_schema()))"
                    )
                yield conn
        finally:
            conn.info["gpupool_write"] = False
            if sqlite:
                driver.execute(f"PRAGMA busy_timeout = {round(settings.lock_timeout_seconds() * 1000)}")


def migrate(engine: Engine) -> list[int]:
    """Apply every migration the database lacks; return the versions applied.

    Safe when many processes initialise one ledger at once: each step runs under the
    migration lock and checks the version again once it holds it.
    """
    with _migration_transaction(engine) as conn:
        schema.schema_version.create(conn, checkfirst=True)
    applied = []
    for migration in migrations.MIGRATIONS:
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
    if version == migrations.LATEST:
        return
    url = redact_url(url)
    if version == 0:
        raise LedgerSchemaError(f"no GPU ledger at {url}: create it with `gpupool ledger init --url {url}`")
    if version < migrations.LATEST:
        raise LedgerSchemaError(
            f"the GPU ledger at {url} is at schema v{version}, this code needs v{migrations.LATEST}: "
            f"run `gpupool ledger init --url {url}` to migrate it"
        )
    raise LedgerSchemaError(
        f"the GPU ledger at {url} is at schema v{version}, newer than this code (v{migrations.LATEST}): upgrade airflow-gpupool"
    )
