"""A per-process copy of the spent waiting requests, kept by their version.

Every serialized write reads the queue a pass needs (:class:`~airflow_gpupool.ledger.queue.waiting.WaitingReader`):
the requests whose overtake budget is not spent, and of the spent ones their shapes, those of
shapes that fit somewhere, and the first of the others. A long queue is mostly spent requests
(each backfill grant overtakes them all), and they change rarely: when a budget becomes spent, or a spent
request is granted or ends. A write that does one of those stamps ``spent_queue_version`` in
``gpupool_meta`` with its own version, in the same transaction
(:meth:`~airflow_gpupool.ledger.store.transactions.Tx.spent_rows_changed`); a process whose copy carries that
version reads no spent row. Waiting rows change only under the exclusive write lock (the
concurrent path never touches them), so the version read under that lock says whether the
copy is current.

A copy is read again only when the version it missed held still since the last pass: where
grants past the queue spend budgets between every two passes (a busy pool with a long queue),
reading every spent row at each pass would cost more than the few rows a pass needs, so the
pass reads those instead (the caller's path for no copy).
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Connection

from airflow_gpupool.ledger.db import statements as sql

__all__ = ["QueueCopy", "SpentRows"]


class SpentRows:
    """The spent waiting requests at one version, by shape.

    :param rows: every spent waiting row, in queue order
    """

    def __init__(self, rows: list[Any]) -> None:
        #: The rows by shape (request text), each list in queue order.
        self.spent_by_shape: dict[str, list[Any]] = {}
        for row in rows:
            self.spent_by_shape.setdefault(row.request, []).append(row)


class QueueCopy:
    """The spent waiting rows as of the last version this process read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[int, int] | None = None
        self._rows: SpentRows | None = None
        # The version the last call asked for: a copy is read when the next call asks for it again.
        self._asked: tuple[int, int] | None = None
        #: Reads of the spent rows (tests and profiles read it).
        self.reads = 0

    def rows(self, conn: Connection, version: int | None, spent: int) -> SpentRows | None:
        """Return the spent rows at ``version``; read only if this copy is older and the version held still.

        :param version: the version the calling write transaction read under the write lock;
            None (never stamped, or changed by the caller): None, the caller reads what it needs
        :param spent: the overtake count at which a budget is spent
        :returns: the rows; None when the caller must read what it needs (see the module docstring)
        """
        if version is None:
            return None
        key = (version, spent)
        with self._lock:
            if self._key == key and self._rows is not None:
                return self._rows
            asked, self._asked = self._asked, key
            if asked != key:  # changed since the last pass: it may change again before the next
                return None
            rows = SpentRows(list(conn.execute(sql.WAITING_SPENT, {"spent": spent}).all()))
            self._key, self._rows = key, rows
            self.reads += 1
            return rows
