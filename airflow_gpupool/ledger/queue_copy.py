"""A per-process copy of the waiting requests, kept by the queue's version.

Every serialized write used to read the queue again (the unspent requests, the shapes of the
spent ones, the first spent one), though most writes (a grant that fits at once, a release
that frees what no waiter can use) leave it as it was. A write that changes a waiting row
stamps ``queue_version`` in ``gpupool_meta`` with its own version, in the same transaction
(:meth:`~airflow_gpupool.ledger.store.Tx.queue_changed`); a process whose copy carries that
version reads nothing. Waiting rows change only under the exclusive write lock (the
concurrent path never touches them), so the version read under that lock says whether the
copy is current.
"""

from __future__ import annotations

import threading
from collections.abc import Container
from typing import Any, NamedTuple

from sqlalchemy import Connection

from airflow_gpupool.ledger import statements as sql

__all__ = ["QueueCopy", "QueuedRow", "WaitingRows"]


class QueuedRow(NamedTuple):
    """A request queued by the running transaction, as the queue's reads return its row."""

    id: str
    request: str
    seq: int
    overtakes: int


class WaitingRows:
    """The waiting requests at one queue version, split as a pass reads them.

    :param rows: every waiting row, in queue order
    :param spent: the overtake count at which a request's budget is spent
    """

    def __init__(self, rows: list[Any], spent: int) -> None:
        self.unspent = [row for row in rows if row.overtakes < spent]
        #: The spent rows by shape (request text), each list in queue order.
        self.spent_by_shape: dict[str, list[Any]] = {}
        self.first_spent: Any = None
        for row in rows:
            if row.overtakes >= spent:
                self.spent_by_shape.setdefault(row.request, []).append(row)
                if self.first_spent is None:
                    self.first_spent = row


class QueueCopy:
    """The waiting rows as of the last queue version this process read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[int, int] | None = None
        self._rows: WaitingRows | None = None
        #: Full reads of the queue (tests and profiles read it).
        self.reads = 0

    def rows(
        self, conn: Connection, version: int | None, spent: int, queued_here: Container[str]
    ) -> WaitingRows | None:
        """Return the waiting rows at ``version``, read only if this copy is older.

        :param version: the queue version the calling write transaction read under the write
            lock; None (never stamped, or not known): None, the caller reads what it needs itself
        :param queued_here: requests the calling transaction queued: not part of ``version``
        """
        if version is None:
            return None
        with self._lock:
            if self._key == (version, spent) and self._rows is not None:
                return self._rows
            read = conn.execute(sql.WAITING).all()
            rows = WaitingRows([row for row in read if row.id not in queued_here], spent)
            self._key, self._rows = (version, spent), rows
            self.reads += 1
            return rows

    def forget(self) -> None:
        """Drop the copy: the next pass reads the queue."""
        with self._lock:
            self._key = self._rows = None
