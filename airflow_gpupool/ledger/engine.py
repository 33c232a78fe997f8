"""Database engines for the ledger, the write lock, and retries of transient errors."""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import before_sleep_log, retry, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from airflow_gpupool.exceptions import ConfigurationError

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: Key of the PostgreSQL advisory lock that serializes the ledger's writers.
ADVISORY_LOCK_KEY = 7243000
_SQLITE_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
# serialization_failure, deadlock_detected, admin/crash shutdown, cannot_connect_now, connection exceptions
_PG_TRANSIENT = ("40001", "40P01", "57P01", "57P02", "57P03", "08")


def normalize_url(url: str) -> str:
    """Return ``url`` with the psycopg 3 driver for PostgreSQL; reject unsupported databases."""
    try:
        parsed = make_url(url)
    except Exception as e:
        raise ConfigurationError(
            f"ledger URL {url!r} is not a SQLAlchemy URL: use sqlite:////path/ledger.db or "
            "postgresql://user@host:5432/db"
        ) from e
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if backend == "sqlite":
        return url
    raise ConfigurationError(f"ledger URL {url!r}: only sqlite and postgresql ledgers are supported")


def make_engine(url: str, **options: Any) -> Engine:
    """Create the engine for a ledger URL.

    On SQLite the connection runs in WAL mode with a busy timeout, and write transactions
    start with ``BEGIN IMMEDIATE`` so concurrent writers queue for the lock instead of
    failing with "database is locked" halfway through.
    """
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 60, "isolation_level": None}, **options)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get("gpupool_write") else "BEGIN")

        return engine
    # No pre-ping (a round trip per transaction): a dropped connection fails the transaction,
    # which transient_retry runs again on a fresh one.
    return create_engine(url, pool_size=2, max_overflow=4, **options)


@contextmanager
def write_transaction(engine: Engine, synchronous_commit: bool = True) -> Iterator[Connection]:
    """Open a transaction that holds the ledger's write lock until it ends.

    :param synchronous_commit: on PostgreSQL, False commits without waiting for the WAL flush
        (``SET LOCAL synchronous_commit = off``): shorter lock holds, at the cost of losing the
        last few hundred milliseconds of ledger changes if the server crashes
    """
    with engine.connect() as conn:
        conn.info["gpupool_write"] = True
        try:
            with conn.begin():
                if engine.dialect.name == "postgresql":
                    # One lock per schema: ledgers in other schemas of the database don't wait on it.
                    conn.exec_driver_sql(
                        f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY}, hashtext(current_schema()))"
                    )
                    if not synchronous_commit:
                        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                yield conn
        finally:
            conn.info["gpupool_write"] = False


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """Open a transaction that sees one consistent state of the ledger."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is a lock timeout or a lost connection worth retrying."""
    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    orig = error.orig
    if isinstance(orig, sqlite3.OperationalError):
        return getattr(orig, "sqlite_errorcode", None) in _SQLITE_BUSY_CODES
    sqlstate = getattr(orig, "sqlstate", None) or ""
    if sqlstate.startswith(_PG_TRANSIENT):
        return True
    return isinstance(error, OperationalError) and not sqlstate


def transient_retry(fn: Callable[P, T]) -> Callable[P, T]:
    """Retry ``fn`` on transient database errors only, with jittered backoff; re-raise the last.

    The first call runs bare: on the hot path a retry policy costs more than the call.
    """
    retrying = retry(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(5),
        wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )(fn)

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            if not is_transient(error):
                raise
            log.warning("Transient database error in %s, retrying: %s", fn.__qualname__, error)
            return retrying(*args, **kwargs)

    return call
