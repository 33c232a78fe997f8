"""What the ledger's companions (quotas, usage, history, failed tries) need of the ledger they are given.

They take the :class:`~airflow_gpupool.ledger.Ledger` facade as an argument, but the facade sits
above their rooms: typing them against this protocol keeps the imports running downward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from airflow_gpupool.ledger.db.models import LedgerSnapshot
    from airflow_gpupool.ledger.store.transactions import Tx

__all__ = ["LedgerAccess"]

T = TypeVar("T")


class LedgerAccess(Protocol):
    """A ledger's clock, transactions and snapshot: what :class:`~airflow_gpupool.ledger.Ledger` offers."""

    def now(self) -> float: ...

    def read(self, fn: Callable[[Connection], T]) -> T: ...

    def write(self, fn: Callable[[Tx], T]) -> T: ...

    def snapshot(self) -> LedgerSnapshot: ...
