"""Database engines for the ledger, the write lock, bounded waits, and retries of transient errors."""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from tenacity import Retrying, before_sleep_log, retry_if_exception, stop_after_delay, wait_exponential_jitter

from airflow_gpupool import settings
from airflow_gpupool.exceptions import (
    ConfigurationError,
    LedgerBusyError,
    LedgerConnectionRefusedError,
    LedgerUnavailableError,
)
from airflow_gpupool.redact import redact_url

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: Key of the PostgreSQL advisory lock that serializes the ledger's writers.
ADVISORY_LOCK_KEY = 7243000
#: The database's clock in seconds since the epoch (PostgreSQL): what every client measures on.
DATABASE_NOW = "extract(epoch FROM clock_timestamp())::float8"
_SQLITE_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
# A file SQLite cannot open or write, or one that is not a database: no retry changes these.
_SQLITE_REFUSED_CODES = {sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_NOTADB}
# serialization_failure, deadlock_detected, admin/crash shutdown, cannot_connect_now,
# idle_in_transaction_session_timeout (this session was ended), connection exceptions
_PG_TRANSIENT = ("40001", "40P01", "57P01", "57P02", "57P03", "25P03", "08")
# lock_not_available (lock_timeout), query_canceled (statement_timeout)
_PG_BUSY = {"55P03", "57014"}
# What the server answers a connection no retry will let in (libpq gives these no SQLSTATE).
_PG_REFUSED = re.compile(
    r"FATAL:\s+(database \"[^\"]*\" does not exist|role \"[^\"]*\" does not exist"
    r"|password authentication failed[^\n]*|no pg_hba\.conf entry[^\n]*)"
)


def normalize_url(url: str) -> str:
    """Return ``url`` with the psycopg 3 driver for PostgreSQL; reject unsupported databases."""
    try:
        parsed = make_url(url)
    except Exception as e:
        raise ConfigurationError(
            f"ledger URL {redact_url(url)!r} is not a SQLAlchemy URL: use sqlite:////path/ledger.db or "
            "postgresql://user@host:5432/db"
        ) from e
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ConfigurationError(
            f"ledger URL {redact_url(url)!r}: port {parsed.port} is not between 1 and 65535"
        )
    backend = parsed.get_backend_name()
    # As written: get_driver_name() loads the dialect, which fails for an unknown one. Another
    # driver is refused, not swapped for ours; psycopg2 (Airflow's own URLs) is psycopg 3's dialect.
    driver = parsed.drivername.partition("+")[2]
    if backend == "postgresql" and driver in ("", "psycopg", "psycopg2"):
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if backend == "sqlite" and driver in ("", "pysqlite"):
        return url
    if backend in ("postgresql", "sqlite"):
        ours = "postgresql+psycopg://" if backend == "postgresql" else "sqlite:///"
        raise ConfigurationError(
            f"ledger URL {redact_url(url)!r}: driver {driver!r} is not supported: write {ours}"
        )
    raise ConfigurationError(
        f"ledger URL {redact_url(url)!r}: only sqlite and postgresql ledgers are supported"
    )


@dataclass(frozen=True)
class ConnectionBudget:
    """How one ledger's connections in a process are split (``[gpupool] max_connections_per_process``).

    :param main: the pool of serialized writes and reads
    :param concurrent: the pool of the concurrent path (PostgreSQL); 0: no concurrent path
    :param listener: the connection that listens for grants (PostgreSQL, opened by a waiter)
    """

    main: int
    concurrent: int
    listener: int

    @classmethod
    def split(
        cls, total: int, *, postgresql: bool, concurrent: bool, pooled: bool = False
    ) -> ConnectionBudget:
        """Split ``total`` connections: one listener from 3 on (PostgreSQL, not through a
        transaction pooler, which cannot keep a LISTEN), then half the rest for the concurrent path.
        """
        listener = 1 if postgresql and not pooled and total >= 3 else 0
        rest = total - listener
        shared = rest // 2 if postgresql and concurrent and rest >= 2 else 0
        return cls(rest - shared, shared, listener)

    @property
    def total(self) -> int:
        """Every connection of the budget."""
        return self.main + self.concurrent + self.listener


def make_engine(url: str, *, pool_size: int | None = None, **options: Any) -> Engine:
    """Create the engine for a ledger URL, its waits bounded (see :func:`bound_waits`).

    On SQLite the connection runs in WAL mode with a busy timeout of ``[gpupool]
    lock_timeout_seconds``, and write transactions start with ``BEGIN IMMEDIATE`` so
    concurrent writers queue for the lock instead of failing with "database is locked"
    halfway through.

    :param pool_size: at most this many connections, a thread waiting up to ``[gpupool]
        lock_timeout_seconds`` for one (None: a small pool that may overflow)
    """
    url = normalize_url(url)
    if pool_size is not None:
        # A bounded pool: one process never holds more, however many hooks and triggers share it.
        options = {
            "pool_size": pool_size,
            "max_overflow": 0,
            "pool_timeout": settings.lock_timeout_seconds(),
            **options,
        }
    if url.startswith("sqlite"):
        if ":memory:" in url or url.rstrip("/") == "sqlite:":
            options = {
                k: v for k, v in options.items() if k not in ("pool_size", "max_overflow", "pool_timeout")
            }
        busy = settings.lock_timeout_seconds()
        engine = create_engine(url, connect_args={"timeout": busy, "isolation_level": None}, **options)

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
    options.setdefault("pool_size", 2)
    options.setdefault("max_overflow", 4)
    if settings.transaction_pooling():
        # A transaction pooler hands each transaction any server session: nothing prepared on
        # one session may be used on the next (psycopg prepares a statement run 5 times).
        options["connect_args"] = {"prepare_threshold": None, **options.get("connect_args", {})}
    # No pre-ping (a round trip per transaction): a dropped connection fails the transaction,
    # which transient_retry runs again on a fresh one.
    engine = create_engine(url, **options)
    bound_waits(engine)
    return engine


def session_timeouts() -> dict[str, int]:
    """Return the PostgreSQL timeouts of a ledger session, in milliseconds (see :func:`bound_waits`)."""
    timeouts = {
        "lock_timeout": settings.lock_timeout_seconds(),
        "statement_timeout": settings.statement_timeout_seconds(),
        "idle_in_transaction_session_timeout": settings.idle_in_transaction_timeout_seconds(),
    }
    return {name: max(1, round(seconds * 1000)) for name, seconds in timeouts.items()}


#: The timeouts set per transaction through a transaction pooler (it keeps no session settings).
def _local_timeouts_sql() -> str:
    return ", ".join(f"set_config('{name}', '{ms}', true)" for name, ms in session_timeouts().items())


def bound_waits(engine: Engine) -> None:
    """Give each new PostgreSQL session of ``engine`` its timeouts, at no extra round trip.

    ``lock_timeout`` bounds how long a writer waits for the ledger's lock (then
    :class:`LedgerBusyError`), ``idle_in_transaction_session_timeout`` how long a stopped
    client may keep it (then the server ends its session and the lock is free), and
    ``statement_timeout`` any one statement. They travel as libpq ``options`` with the
    connection request; the application name says which host and process a session is.
    Through a transaction pooler (``[gpupool] transaction_pooling``), which refuses
    ``options`` and keeps no session settings, each transaction sets them instead
    (:func:`write_transaction`, :func:`read_transaction`): one more statement per read.
    """
    pooled = settings.transaction_pooling()
    ours = " ".join(f"-c {name}={ms}" for name, ms in session_timeouts().items())

    @event.listens_for(engine, "do_connect")
    def _session_options(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        if not pooled:
            cparams["options"] = f"{cparams.get('options', '')} {ours}".strip()
        cparams.setdefault("application_name", f"gpupool {socket.gethostname()} pid {os.getpid()}"[:63])
        cparams.setdefault("connect_timeout", 10)


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
                    _take_write_lock(engine, conn, synchronous_commit)
                yield conn
        finally:
            conn.info["gpupool_write"] = False


def _take_write_lock(engine: Engine, conn: Connection, synchronous_commit: bool = True) -> None:
    # Settings of this transaction first, in the same statement (the select list runs in order):
    # no extra round trip, and through a transaction pooler no session setting is relied on.
    local = [] if synchronous_commit else ["set_config('synchronous_commit', 'off', true)"]
    if settings.transaction_pooling():
        local.append(_local_timeouts_sql())
    # One lock per schema: ledgers in other schemas of the database don't wait on it.
    try:
        # The database's clock, read once the lock is held: the transaction's ``now``.
        row = conn.exec_driver_sql(
            f"SELECT {''.join(c + ', ' for c in local)}"
            f"pg_advisory_xact_lock({ADVISORY_LOCK_KEY}, hashtext(current_schema())), {DATABASE_NOW}"
        ).one()
        conn.info["gpupool_now"] = float(row[-1])
    except DBAPIError as error:
        if classify(error) is not Kind.BUSY:
            raise
        raise LedgerBusyError(settings.lock_timeout_seconds(), lock_holder(engine)) from error


#: Who holds the ledger's lock of this schema, other than the asking session.
_HOLDERS = f"""
SELECT a.pid, a.application_name, a.client_addr, a.state, l.mode
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = {ADVISORY_LOCK_KEY}
  AND l.objid = hashtext(current_schema())::oid AND l.pid <> pg_backend_pid()
ORDER BY l.mode DESC LIMIT 3
"""


def lock_holder(engine: Engine) -> str | None:
    """Say who holds the ledger's write lock on PostgreSQL (pid, application, client), or None."""
    if engine.dialect.name != "postgresql":
        return None
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(_HOLDERS).all()
    except (DBAPIError, PoolTimeoutError):  # a full pool: say nothing rather than wait for a connection
        return None
    described = [
        f"server pid {r.pid} ({r.application_name or 'no application name'}, client {r.client_addr or 'local'}, "
        f"{r.state}, {r.mode})"
        for r in rows
    ]
    return "; ".join(described) or None


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """Open a transaction that sees one consistent state of the ledger."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            if engine.dialect.name == "postgresql" and settings.transaction_pooling():
                conn.exec_driver_sql(f"SELECT {_local_timeouts_sql()}")
            yield conn


class Kind(Enum):
    """What a database error means to the ledger."""

    #: a lock or statement timeout: another client holds what this one needs
    BUSY = "busy"
    #: a lost or refused connection, a server restarting, a serialization failure: run it again
    TRANSIENT = "transient"
    #: the server turned the connection away: no such database or role, or bad credentials
    REFUSED = "refused"


def classify(error: BaseException) -> Kind | None:
    """Return what ``error`` means, or None for an error that is no one's to retry."""
    if not isinstance(error, DBAPIError):
        return None
    orig = error.orig
    code = getattr(orig, "sqlite_errorcode", None) if isinstance(orig, sqlite3.DatabaseError) else None
    if code in _SQLITE_BUSY_CODES or code in _SQLITE_REFUSED_CODES:
        return Kind.BUSY if code in _SQLITE_BUSY_CODES else Kind.REFUSED
    if isinstance(orig, sqlite3.OperationalError):
        return None
    sqlstate = getattr(orig, "sqlstate", None) or ""
    if sqlstate in _PG_BUSY:
        return Kind.BUSY
    if error.connection_invalidated or sqlstate.startswith(_PG_TRANSIENT):
        return Kind.TRANSIENT
    if isinstance(error, OperationalError) and not sqlstate:
        return Kind.REFUSED if _PG_REFUSED.search(str(orig)) else Kind.TRANSIENT
    return None


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is a lost connection or a serialization failure worth retrying."""
    return classify(error) is Kind.TRANSIENT


def _busy(error: DBAPIError, owner: object) -> LedgerBusyError:
    # The store knows its engine; the ledger's facade reaches it through its store.
    lookup = getattr(owner, "lock_holder", None) or getattr(
        getattr(owner, "_store", None), "lock_holder", None
    )
    holder = lookup() if callable(lookup) else None
    return LedgerBusyError(settings.lock_timeout_seconds(), holder if isinstance(holder, str) else None)


def _cause(error: BaseException) -> str:
    orig = getattr(error, "orig", None) or error
    text = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {text[0] if text else ''}"


def _refused(error: DBAPIError) -> LedgerConnectionRefusedError:
    if isinstance(error.orig, sqlite3.DatabaseError):
        notadb = getattr(error.orig, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB
        hint = "the file is something else" if notadb else "its folder must exist and be writable"
        return LedgerConnectionRefusedError(f"SQLite: {_cause(error)} ({hint})")
    found = _PG_REFUSED.search(str(error.orig))
    return LedgerConnectionRefusedError(found.group(1) if found else _cause(error))


def transient_retry(fn: Callable[P, T]) -> Callable[P, T]:
    """Retry ``fn`` on transient database errors, with jittered backoff, for a bounded time.

    Errors come out typed, never as SQLAlchemy's or the driver's: a lock that stays taken
    past ``[gpupool] lock_timeout_seconds`` is :class:`LedgerBusyError` (not retried: the
    wait was already that long); a connection that stays lost for ``[gpupool]
    ledger_retry_seconds`` is :class:`LedgerUnavailableError`; one the server turns away for good
    (no such database or role, bad credentials) is :class:`LedgerConnectionRefusedError` at once.
    The first call runs bare: on the hot path a retry policy costs more than the call.
    """

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except DBAPIError as error:
            kind = classify(error)
            if kind is None:
                raise
            if kind is Kind.BUSY:
                raise _busy(error, args[0] if args else None) from error
            if kind is Kind.REFUSED:
                raise _refused(error) from error
            log.warning("Transient database error in %s, retrying: %s", fn.__qualname__, _cause(error))
        return _retrying(fn, *args, **kwargs)

    return call


def _retrying(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    budget = settings.ledger_retry_seconds()
    retrying = Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_delay(budget),
        wait=wait_exponential_jitter(initial=0.05, max=2.0, jitter=0.1),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
    try:
        return retrying(fn, *args, **kwargs)
    except DBAPIError as error:
        kind = classify(error)
        if kind is Kind.BUSY:
            raise _busy(error, args[0] if args else None) from error
        if kind is Kind.TRANSIENT:
            raise LedgerUnavailableError(budget, _cause(error)) from error
        if kind is Kind.REFUSED:
            raise _refused(error) from error
        raise
