"""What a database error means to the ledger: busy (typed at once), transient (retried), or neither."""

from __future__ import annotations

import sqlite3

import psycopg
from psycopg import errors as pg_errors
from sqlalchemy.exc import DBAPIError

from airflow_gpupool.ledger.db.engine import Kind, classify, is_transient


def wrapped(orig: Exception, invalidated: bool = False) -> DBAPIError:
    base = sqlite3.Error if isinstance(orig, sqlite3.Error) else psycopg.Error
    return DBAPIError.instance("SELECT 1", None, orig, base, connection_invalidated=invalidated)


def sqlite_error(message: str, code: int) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = code  # type: ignore[attr-defined]
    return error


def test_lock_and_statement_timeouts_are_busy_not_retried() -> None:
    assert (
        classify(wrapped(pg_errors.LockNotAvailable("canceling statement due to lock timeout"))) is Kind.BUSY
    )
    assert (
        classify(wrapped(pg_errors.QueryCanceled("canceling statement due to statement timeout")))
        is Kind.BUSY
    )
    locked = sqlite_error("database is locked", sqlite3.SQLITE_BUSY)
    assert classify(wrapped(locked)) is Kind.BUSY
    assert not is_transient(wrapped(locked))


def test_lost_connections_shutdowns_and_serialization_failures_are_transient() -> None:
    assert classify(wrapped(pg_errors.AdminShutdown("terminating connection"))) is Kind.TRANSIENT
    assert classify(wrapped(pg_errors.SerializationFailure("could not serialize"))) is Kind.TRANSIENT
    assert classify(wrapped(psycopg.OperationalError("connection refused"))) is Kind.TRANSIENT
    assert classify(wrapped(sqlite3.ProgrammingError("closed"), invalidated=True)) is Kind.TRANSIENT


def test_errors_of_the_callers_own_making_are_neither() -> None:
    assert classify(wrapped(pg_errors.UniqueViolation("duplicate key"))) is None
    assert classify(wrapped(sqlite_error("no such table: x", sqlite3.SQLITE_ERROR))) is None
    assert classify(ValueError("not a database error")) is None


def test_a_server_that_turns_the_connection_away_for_good_is_refused_not_retried() -> None:
    for answer in (
        'FATAL:  database "ledger" does not exist',
        'FATAL:  role "airflow" does not exist',
        'FATAL:  password authentication failed for user "airflow"',
        'FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "airflow", database "ledger", no encryption',
    ):
        message = f'connection failed: connection to server at "10.0.0.5", port 5432 failed: {answer}'
        assert classify(wrapped(psycopg.OperationalError(message))) is Kind.REFUSED
        assert not is_transient(wrapped(psycopg.OperationalError(message)))
    # The server not up yet (or restarting) is worth the retries.
    starting = "connection failed: FATAL:  the database system is starting up"
    assert classify(wrapped(psycopg.OperationalError(starting))) is Kind.TRANSIENT


def test_a_sqlite_file_that_cannot_be_opened_or_is_no_database_is_refused_not_retried() -> None:
    for error in (
        sqlite_error("unable to open database file", sqlite3.SQLITE_CANTOPEN),
        sqlite_error("attempt to write a readonly database", sqlite3.SQLITE_READONLY),
    ):
        assert classify(wrapped(error)) is Kind.REFUSED
    notadb = sqlite3.DatabaseError("file is not a database")
    notadb.sqlite_errorcode = sqlite3.SQLITE_NOTADB  # type: ignore[attr-defined]
    assert classify(wrapped(notadb)) is Kind.REFUSED
