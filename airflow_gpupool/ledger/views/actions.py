"""What people did to the pool from the console: one row per action, with who did it.

The console (:mod:`airflow_gpupool.plugins.console`) records each action after the ledger
carried it out; a release's or a cancel's own reason names the user too, so the reservation's
history says it without this table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, select

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.ledger.db import schema

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from airflow_gpupool.ledger.store.access import LedgerAccess
    from airflow_gpupool.ledger.store.transactions import Tx

__all__ = ["ACTIONS", "ConsoleAction", "LedgerActions"]

#: What the console may do: cancel a waiting request, release a grant, change a waiting
#: request's priority, cordon, drain or uncordon a node.
ACTIONS = ("cancel", "release", "priority", "cordon", "drain", "uncordon")
_MAX_NAME = 253


@dataclass(frozen=True)
class ConsoleAction:
    """One action: when (ledger clock), who, what, on which reservation or node, for which team."""

    at: float
    actor: str
    action: str
    target: str
    team: str | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """Return the action as JSON-ready values."""
        return asdict(self)


class LedgerActions:
    """Record the console's actions and read them back, newest first.

    :param ledger: the ledger they are kept in
    """

    def __init__(self, ledger: LedgerAccess) -> None:
        self.ledger = ledger

    def record(self, actor: str, action: str, target: str, *, team: str | None, detail: str) -> ConsoleAction:
        """Store one action, stamped with the ledger's clock.

        :raises InvalidRequestError: an empty actor or target, a name over 253 characters, or an
            action not in :data:`ACTIONS`
        """
        if action not in ACTIONS:
            raise InvalidRequestError("action", action, f"one of {', '.join(ACTIONS)}")
        for name, value in (("actor", actor), ("target", target)):
            if not value or len(value) > _MAX_NAME:
                raise InvalidRequestError(name, value, f"1 to {_MAX_NAME} characters")

        def run(tx: Tx) -> ConsoleAction:
            done = ConsoleAction(tx.now, actor, action, target, team, detail)
            tx.conn.execute(insert(schema.actions).values(**asdict(done)))
            return done

        return self.ledger.write(run)

    def entries(self, team: str | None = None, limit: int = 50) -> list[ConsoleAction]:
        """Return the newest ``limit`` actions (of ``team`` only, when given)."""
        a = schema.actions.c
        query = select(a.at, a.actor, a.action, a.target, a.team, a.detail)
        if team is not None:
            query = query.where(a.team == team)
        query = query.order_by(a.at.desc(), a.id.desc()).limit(limit)

        def run(conn: Connection) -> list[ConsoleAction]:
            return [ConsoleAction(**row._asdict()) for row in conn.execute(query)]

        return self.ledger.read(run)
