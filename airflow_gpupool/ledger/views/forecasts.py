"""What the forecast reads of the history, and the forecasts it stores for waiting requests.

The controller's forecast step (:mod:`airflow_gpupool.forecast`) reads the newest successful
runs (:meth:`LedgerForecasts.successful_runs`: released reservations with no failed try, as
:meth:`~airflow_gpupool.ledger.views.history.LedgerHistory.typical_run_seconds` counts them), how
long the newest preemption victims took to end (:meth:`LedgerForecasts.victim_exits`), and
replaces every stored forecast in one write (:meth:`LedgerForecasts.replace`). Everyone else only
reads (:meth:`LedgerForecasts.get_many`): a waiting trigger never computes, so a thousand of
them cost one controller pass, not a thousand replays.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, insert, select

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.models import ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from airflow_gpupool.ledger.store.access import LedgerAccess
    from airflow_gpupool.ledger.store.transactions import Tx

__all__ = ["FORECAST_STATUSES", "FinishedRun", "LedgerForecasts", "StartForecast"]

#: ``forecast``: quantiles known; ``never``: it cannot start on the current nodes; ``unknown``: see the reason.
FORECAST_STATUSES = ("forecast", "never", "unknown")


@dataclass(frozen=True)
class FinishedRun:
    """One successful run as the duration model sees it (``dag_id``/``task_id`` None: no task try)."""

    dag_id: str | None
    task_id: str | None
    team: str
    workload_class: str
    seconds: float


@dataclass(frozen=True)
class StartForecast:
    """When a waiting request is expected to start, on the ledger's clock.

    :param status: one of :data:`FORECAST_STATUSES`
    :param p10: the start time it has a 10 % chance to beat (None unless ``status`` is ``forecast``)
    :param p50: the median start time
    :param p90: the start time it is 90 % sure to have started by
    :param position: its 1-based place in service order when computed
    :param queue_length: how many requests waited then
    :param reason: why ``never`` or ``unknown``; how it was computed otherwise
    """

    reservation_id: str
    computed_at: float
    status: str
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    position: int | None = None
    queue_length: int | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in FORECAST_STATUSES:
            raise ValueError(
                f"forecast status {self.status!r}: expected one of {', '.join(FORECAST_STATUSES)}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Return primitives (the JSON API's form)."""
        return asdict(self)


class LedgerForecasts:
    """Read the history the forecast needs, and store or read the forecasts.

    :param ledger: the ledger
    """

    def __init__(self, ledger: LedgerAccess) -> None:
        self.ledger = ledger

    def successful_runs(self, limit: int = 5000) -> list[FinishedRun]:
        """Return the newest ``limit`` successful runs, newest first.

        :param limit: at most this many reservations are read
        """
        r, a = schema.reservations.c, schema.task_attempts.c
        query = (
            select(r.id, r.holder, r.team, r.request, r.granted_at, r.ended_at)
            .where(
                r.state == ReservationState.RELEASED.value,
                r.granted_at.is_not(None),
                r.ended_at.is_not(None),
                ~select(a.reservation_id).where(a.reservation_id == r.id).exists(),
            )
            .order_by(r.seq.desc())
            .limit(limit)
        )

        def run(conn: Connection) -> list[FinishedRun]:
            out = []
            for row in conn.execute(query):
                ref = TaskTry.from_holder(row.holder)
                workload = GpuRequest.from_dict(json.loads(row.request)).workload_class.value
                out.append(
                    FinishedRun(
                        dag_id=ref.dag_id if ref else None,
                        task_id=ref.task_id if ref else None,
                        team=row.team,
                        workload_class=workload,
                        seconds=float(row.ended_at - row.granted_at),
                    )
                )
            return out

        return self.ledger.read(run)

    def victim_exits(self, default_grace_seconds: float, limit: int = 200) -> list[float]:
        """Return how long the newest ``limit`` preemption victims took to end once told, newest first.

        A victim was told at its deadline less its grace (its request's, else ``default_grace_seconds``);
        it ended when its holder released it, or at the deadline. Each is clipped to [0, its grace].
        """
        r = schema.reservations.c
        query = (
            select(r.request, r.preempt_deadline, r.ended_at)
            .where(
                r.state == ReservationState.PREEMPTED.value,
                r.preempt_deadline.is_not(None),
                r.ended_at.is_not(None),
            )
            .order_by(r.seq.desc())
            .limit(limit)
        )

        def run(conn: Connection) -> list[float]:
            out = []
            for row in conn.execute(query):
                request = GpuRequest.from_dict(json.loads(row.request))
                grace = request.preemption_grace_seconds or default_grace_seconds
                took = float(row.ended_at) - (float(row.preempt_deadline) - grace)
                out.append(min(max(took, 0.0), grace))
            return out

        return self.ledger.read(run)

    def replace(self, forecasts: Sequence[StartForecast]) -> None:
        """Replace every stored forecast with ``forecasts`` (one write: readers see all or none)."""
        rows = [asdict(f) for f in forecasts]

        def run(tx: Tx) -> None:
            tx.conn.execute(delete(schema.forecasts))
            if rows:
                tx.conn.execute(insert(schema.forecasts), rows)

        self.ledger.write(run)

    def get_many(self, reservation_ids: Iterable[str] | None = None) -> dict[str, StartForecast]:
        """Return the stored forecasts of ``reservation_ids`` (None: all), by id; a missing id has none yet."""
        query = select(schema.forecasts)
        if reservation_ids is not None:
            query = query.where(schema.forecasts.c.reservation_id.in_(list(reservation_ids)))

        def run(conn: Connection) -> dict[str, StartForecast]:
            return {row.reservation_id: StartForecast(**row._asdict()) for row in conn.execute(query)}

        return self.ledger.read(run)

    def get(self, reservation_id: str) -> StartForecast | None:
        """Return the stored forecast of one waiting request, or None when none was computed yet."""
        return self.get_many([reservation_id]).get(reservation_id)
