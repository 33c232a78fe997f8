"""Each node's drift as the controller last computed it, stored for readers without cluster access.

The controller compares the ledger's books with the pods its watch has cached at every pass
(:func:`~airflow_gpupool.ledger.views.drift.ledger_drift`, no fresh list) and replaces these rows
in one write (:meth:`LedgerDriftRecords.replace`); the page reads them beside the ledger's own side,
so the Airflow API server shows what the cluster runs without Kubernetes access of its own.
``since`` is when the node began to drift, kept across passes while it drifts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import delete, insert, select

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.resources import MILLI_PER_GPU

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from airflow_gpupool.ledger.store.access import LedgerAccess
    from airflow_gpupool.ledger.store.transactions import Tx

__all__ = ["DriftRecord", "LedgerDriftRecords"]


@dataclass(frozen=True)
class DriftRecord:
    """One node's drift as the controller computed it, in GPUs.

    :param running: GPUs the cluster's live pods on the node hold
    :param drift: the sum over holders of ``|held − running|``
    :param mismatched: the holders that disagree, as ``holder: held → running``
    :param since: when the node began to drift (the ledger's clock); None: it agrees
    :param computed_at: when the controller computed it
    """

    node: str
    running: float
    drift: float
    mismatched: tuple[str, ...]
    since: float | None
    computed_at: float


class LedgerDriftRecords:
    """Store the controller's drift (one write a pass) and read it back (the page).

    :param ledger: the ledger
    """

    def __init__(self, ledger: LedgerAccess) -> None:
        self.ledger = ledger

    def replace(self, records: Sequence[DriftRecord]) -> None:
        """Replace every stored row with ``records`` (readers see one pass whole)."""
        rows = [
            {
                "node": r.node,
                "running_milli": round(r.running * MILLI_PER_GPU),
                "drift_milli": round(r.drift * MILLI_PER_GPU),
                "mismatched": json.dumps(list(r.mismatched)),
                "since": r.since,
                "computed_at": r.computed_at,
            }
            for r in records
        ]

        def run(tx: Tx) -> None:
            tx.conn.execute(delete(schema.node_drift))
            if rows:
                tx.conn.execute(insert(schema.node_drift), rows)

        self.ledger.write(run)

    def get(self) -> dict[str, DriftRecord]:
        """Return the stored rows by node (empty: the controller computed none yet)."""

        def run(conn: Connection) -> dict[str, DriftRecord]:
            return {
                row.node: DriftRecord(
                    row.node,
                    row.running_milli / MILLI_PER_GPU,
                    row.drift_milli / MILLI_PER_GPU,
                    tuple(json.loads(row.mismatched)),
                    row.since,
                    row.computed_at,
                )
                for row in conn.execute(select(schema.node_drift).order_by(schema.node_drift.c.node))
            }

        return self.ledger.read(run)
