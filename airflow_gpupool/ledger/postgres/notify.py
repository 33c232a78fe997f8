"""Wake-ups instead of polls (PostgreSQL): the writer that settles a waiting request says so.

A write transaction that grants a queued request, or ends one (timed out, withdrawn), sends
``NOTIFY`` on the channel of the ledger's schema with the ids as payload; PostgreSQL
delivers it when, and only if, the transaction commits, so a woken waiter always reads the
committed state. :class:`GrantListener` is the one connection of a process that listens
(``[gpupool] max_connections_per_process`` counts it); waiters still poll, slowly, in case
a notification is lost with a dropped connection. Through a transaction pooler (PgBouncer)
nothing can listen: the writer still notifies, waiters poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from airflow_gpupool.ledger.db.engine import normalize_url

__all__ = ["GrantListener", "notify_waiters"]

log = logging.getLogger(__name__)

#: The channel, per schema: ledgers in other schemas of the database don't wake each other.
CHANNEL_SQL = "'gpupool_' || current_schema()"
# A payload must stay under 8000 bytes: ids are at most 64 characters.
_IDS_PER_NOTIFY = 100
_NOTIFY = text(f"SELECT pg_notify({CHANNEL_SQL}, :payload)")


def notify_waiters(conn: Connection, reservation_ids: Sequence[str]) -> None:
    """Tell the listeners, at commit, that ``reservation_ids`` stopped waiting (PostgreSQL)."""
    for start in range(0, len(reservation_ids), _IDS_PER_NOTIFY):
        conn.execute(_NOTIFY, {"payload": ",".join(reservation_ids[start : start + _IDS_PER_NOTIFY])})


def libpq_url(url: str) -> str:
    """Return a ledger URL as libpq takes it (no SQLAlchemy driver name)."""
    return make_url(normalize_url(url)).set(drivername="postgresql").render_as_string(hide_password=False)


class GrantListener:
    """One connection that listens for the ids of settled requests (PostgreSQL, asyncio).

    :param url: the ledger URL
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: Any = None

    async def open(self) -> None:
        """Connect and ``LISTEN`` on the ledger's channel."""
        import psycopg

        name = f"gpupool listener {socket.gethostname()} pid {os.getpid()}"[:63]
        conn = await psycopg.AsyncConnection.connect(
            libpq_url(self._url), autocommit=True, application_name=name
        )
        try:
            cursor = await conn.execute(f"SELECT {CHANNEL_SQL}")
            row = await cursor.fetchone()
            assert row is not None
            channel = str(row[0]).replace('"', '""')
            await conn.execute(f'LISTEN "{channel}"')
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def ids(self) -> AsyncIterator[list[str]]:
        """Yield the ids of each notification as it comes; ends when the connection is lost."""
        assert self._conn is not None, "open() first"
        async for notify in self._conn.notifies():
            yield [rid for rid in notify.payload.split(",") if rid]

    async def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                await asyncio.shield(conn.close())
            except Exception:  # closing a lost connection: nothing left to do
                log.debug("Closing the grant listener failed", exc_info=True)
