"""The ledger's public reads: reservations, gangs, the queue, why a request waits, snapshots, invariants.

:class:`~airflow_gpupool.ledger.Ledger` inherits them; each is one read transaction of :mod:`.ledger_views`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_gpupool.ledger.db.models import Gang, LedgerSnapshot, Reservation, ReservationState
    from airflow_gpupool.ledger.views.ledger_views import LedgerViews
    from airflow_gpupool.placement.snapshot import ClusterSnapshot

__all__ = ["LedgerReadApi"]


class LedgerReadApi:
    """What can be read of the ledger, each in one consistent read."""

    _views: LedgerViews

    def get(self, reservation_id: str) -> Reservation:
        """Return a reservation's current state (read-only).

        :raises UnknownReservationError: no such id
        """
        return self._views.get(reservation_id)

    def get_or_none(self, reservation_id: str) -> Reservation | None:
        """Return a reservation's current state, or None when there is no such id."""
        return self._views.get_or_none(reservation_id)

    def gang(self, reservation_id: str) -> Gang:
        """Return the gang of a leader or member id: its spec and every member by index.

        :raises UnknownReservationError: no such id
        :raises InvalidGangError: the reservation is not part of a gang
        """
        return self._views.gang(reservation_id)

    def queue_positions(self) -> dict[str, int]:
        """Return the position of every waiting request, by id (1: next in line).

        One read for the whole queue: how a process's waiters learn, all at once, which of
        them no longer wait and where the others stand.
        """
        return self._views.queue_positions()

    def explain(self, reservation_id: str) -> str:
        """Say why a waiting reservation waits (its queue position and the closest nodes).

        :raises UnknownReservationError: no such id
        """
        return self._views.explain(reservation_id)

    def explain_many(self, reservation_ids: Iterable[str]) -> dict[str, str]:
        """Say why each waiting reservation waits, in one read (the GPU pool page's queue); unknown ids are left out."""
        return self._views.explain_many(reservation_ids)

    def history(
        self, states: Iterable[ReservationState] | None = None, limit: int = 100
    ) -> list[Reservation]:
        """Return the most recent reservations (newest first), optionally only in ``states``."""
        return self._views.history(states, limit)

    def empty_cluster(self) -> ClusterSnapshot:
        """Return the inventory as if nothing were granted: what a request could ever get."""
        return self._views.empty_cluster()

    def snapshot(self) -> LedgerSnapshot:
        """Return one consistent view: nodes, GPUs, free capacity, grants and the queue."""
        return self._views.snapshot()

    def check_invariants(self, core_v1_api: Any = None) -> list[str]:
        """Recompute every node's use from the grants; return each disagreement (empty: consistent).

        :param core_v1_api: a ``kubernetes.client.CoreV1Api``: also check the cluster's side, that
            no two live pods of reservations use one GPU beyond its capacity, or one MIG slice
        """
        return self._views.check_invariants(core_v1_api)
