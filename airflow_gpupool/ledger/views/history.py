"""The history of reservations: derived from the reservations table, filtered, and pruned by age.

Every fact the history shows is already a column of ``gpupool_reservations`` (asked for, when
requested, granted and ended, the holder that names the task try, the node whose pool it ran
in) or of ``gpupool_task_attempts`` (how a failed try failed), so no table of its own is kept:
a history row is a reservation read back. Retention deletes ended reservations older than
``[gpupool] history_retention_days`` with their failure records (:meth:`LedgerHistory.prune`,
run by the controller's periodic pass). What the deleted rows counted towards the cumulative
metrics is first added to carried-over totals in ``gpupool_meta``, so counters read by
:func:`~airflow_gpupool.ledger.views.counts.cumulative_counts` never go down when history is pruned.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, or_, select

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.models import ReservationState
from airflow_gpupool.ledger.teams.usage import carry_preemption_losses
from airflow_gpupool.ledger.views.counts import ENDED_STATES, carry, tally
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, Connection, Row

    from airflow_gpupool.ledger.store.access import LedgerAccess
    from airflow_gpupool.ledger.store.transactions import Tx

__all__ = ["HistoryEntry", "HistoryFilter", "LedgerHistory"]

#: Pruned rows delete at most this many reservations per transaction (short write locks).
PRUNE_BATCH = 2000
FACET_ROWS = 5000
#: The reservations one DAG run's chain reads at most (its tries and retries).
RUN_ROWS = 1000


def _like(text: str) -> str:
    """Escape ``text`` for a LIKE pattern with ``\\`` as the escape character."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@dataclass(frozen=True)
class HistoryFilter:
    """Which reservations a history shows; None or empty: any.

    :param team: the requesting team
    :param pool: the node pool it was granted in
    :param states: its state now (:class:`~airflow_gpupool.ledger.db.models.ReservationState` values)
    :param dag_id: the DAG whose task try holds (or held) it
    """

    team: str | None = None
    pool: str | None = None
    states: tuple[str, ...] = ()
    dag_id: str | None = None

    def __post_init__(self) -> None:
        known = [s.value for s in ReservationState]
        for state in self.states:
            if state not in known:
                raise InvalidRequestError("state", state, f"one of {', '.join(known)}")

    def where(self) -> list[ColumnElement[bool]]:
        """Return the SQL conditions on the reservations table (joined to nodes for the pool)."""
        r = schema.reservations.c
        conditions: list[ColumnElement[bool]] = []
        if self.team:
            conditions.append(r.team == self.team)
        if self.pool:
            conditions.append(schema.nodes.c.node_pool == self.pool)
        if self.states:
            conditions.append(r.state.in_(self.states))
        if self.dag_id:
            conditions.append(r.holder.startswith(f"{self.dag_id}/", autoescape=True))
        return conditions

    def to_dict(self) -> dict[str, Any]:
        """Return the filter as the page's query parameters spell it (``state``; empty ones left out)."""
        named = {"team": self.team, "pool": self.pool, "state": list(self.states), "dag_id": self.dag_id}
        return {k: v for k, v in named.items() if v}


@dataclass(frozen=True)
class HistoryEntry:
    """One reservation as the history shows it.

    :param requested: what it asked for, in words (``1 GPU (A100)``)
    :param waited: seconds from its request to its grant (or to its end, or to now)
    :param held: seconds it held its slice (None: never granted)
    :param try_number: the task try that holds (or held) it; 0 when the holder is no task try
    :param failure_class: how that try failed, from its failure record (None: none recorded)
    :param pool: the node pool it ran in (None: never granted, or the node is gone)
    :param gpu_indices: the GPUs it held on ``node`` (empty: never granted)
    :param mig_slice: the MIG slice it held (None: none)
    :param not_before: queued ahead: the time before which it is not granted (the ledger clears
        it once that time has come)
    :param run_peak_milli: admitted with its DAG run as a whole: the run's peak it waited for
    :param ahead_of: queued ahead of this upstream grant (kept once ``not_before`` clears)
        (milli-GPUs; None: admitted on its own)
    """

    id: str
    holder: str
    team: str
    state: str
    requested: str
    gpu_milli: int
    created_at: float
    granted_at: float | None
    ended_at: float | None
    waited: float
    held: float | None
    node: str | None
    pool: str | None
    dag_id: str | None
    task_id: str | None
    run_id: str | None
    map_index: int | None
    try_number: int
    failure_class: str | None
    message: str
    gpu_indices: tuple[int, ...] = ()
    mig_slice: str | None = None
    not_before: float | None = None
    run_peak_milli: int | None = None
    ahead_of: str | None = None

    @property
    def outcome(self) -> str:
        """The state, with the failure class when the try failed (``released, pod_failed``)."""
        return f"{self.state}, {self.failure_class}" if self.failure_class else self.state

    def to_dict(self) -> dict[str, Any]:
        """Return primitives (the JSON API's form)."""
        return {**asdict(self), "outcome": self.outcome}


def _entry(row: Row[Any], failure: str | None, now: float) -> HistoryEntry:
    request = GpuRequest.from_dict(json.loads(row.request))
    ref = TaskTry.from_holder(row.holder)
    waited_until = row.granted_at if row.granted_at is not None else (row.ended_at or now)
    held = None if row.granted_at is None else max(0.0, (row.ended_at or now) - row.granted_at)
    return HistoryEntry(
        id=row.id,
        holder=row.holder,
        team=row.team,
        state=row.state,
        requested=request.describe(),
        gpu_milli=request.total_gpu_milli,
        created_at=row.created_at,
        granted_at=row.granted_at,
        ended_at=row.ended_at,
        waited=max(0.0, waited_until - row.created_at),
        held=held,
        node=row.node,
        pool=row.node_pool,
        dag_id=ref.dag_id if ref else None,
        task_id=ref.task_id if ref else None,
        run_id=ref.run_id if ref else None,
        map_index=ref.map_index if ref else None,
        try_number=ref.try_number if ref else 0,
        failure_class=failure,
        message=row.message or "",
        gpu_indices=tuple(json.loads(row.gpu_indices or "[]")),
        mig_slice=row.mig_slice,
        not_before=row.not_before,
        run_peak_milli=row.run_peak_milli,
        ahead_of=row.ahead_of,
    )


def _failures(conn: Connection, ids: Sequence[str]) -> dict[str, str]:
    """The failure class of each reservation's latest failed try (an adopted grant may have several)."""
    if not ids:
        return {}
    a = schema.task_attempts.c
    query = select(a.reservation_id, a.failure_class).where(a.reservation_id.in_(ids)).order_by(a.try_number)
    return {row.reservation_id: row.failure_class for row in conn.execute(query)}


class LedgerHistory:
    """Read and prune the history of a ledger's reservations.

    :param ledger: the ledger
    """

    def __init__(self, ledger: LedgerAccess) -> None:
        self.ledger = ledger

    def entries(
        self, where: HistoryFilter | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[HistoryEntry]:
        """Return reservations newest first, as the history shows them.

        :param where: which reservations (default: all)
        :param limit: at most this many
        :param offset: skip this many first (paging)
        """
        r, n = schema.reservations.c, schema.nodes.c
        query = (
            select(schema.reservations, n.node_pool)
            .select_from(schema.reservations.outerjoin(schema.nodes, n.name == r.node))
            .where(*(where or HistoryFilter()).where())
            .order_by(r.seq.desc())
            .limit(limit)
            .offset(offset)
        )

        def run(conn: Connection) -> list[HistoryEntry]:
            rows = conn.execute(query).all()
            failures = _failures(conn, [row.id for row in rows])
            now = self.ledger.now()
            return [_entry(row, failures.get(row.id), now) for row in rows]

        return self.ledger.read(run)

    def of_run(self, dag_id: str, run_id: str, *, limit: int = RUN_ROWS) -> list[HistoryEntry]:
        """Return the reservations of one DAG run's task tries, oldest first.

        :param dag_id: the DAG
        :param run_id: the DAG run
        :param limit: at most this many (the oldest)
        """
        r, n = schema.reservations.c, schema.nodes.c
        # The holder is ``dag/task/run/map-N/try-T@host``: the LIKE narrows by DAG and run, and
        # the parse below drops a run whose id merely ends like this one (``x/<run_id>``).
        pattern = f"{_like(dag_id)}/%/{_like(run_id)}/map-%"
        query = (
            select(schema.reservations, n.node_pool)
            .select_from(schema.reservations.outerjoin(schema.nodes, n.name == r.node))
            .where(r.holder.like(pattern, escape="\\"))
            .order_by(r.seq)
            .limit(limit)
        )

        def run(conn: Connection) -> list[HistoryEntry]:
            rows = [
                row
                for row in conn.execute(query).all()
                if (ref := TaskTry.from_holder(row.holder)) and (ref.dag_id, ref.run_id) == (dag_id, run_id)
            ]
            failures = _failures(conn, [row.id for row in rows])
            now = self.ledger.now()
            return [_entry(row, failures.get(row.id), now) for row in rows]

        return self.ledger.read(run)

    def count(self, where: HistoryFilter | None = None) -> int:
        """Return how many reservations ``where`` matches (for paging)."""
        r, n = schema.reservations.c, schema.nodes.c
        query = (
            select(func.count())
            .select_from(schema.reservations.outerjoin(schema.nodes, n.name == r.node))
            .where(*(where or HistoryFilter()).where())
        )
        return int(self.ledger.read(lambda conn: conn.execute(query).scalar_one()))

    def facets(self) -> dict[str, list[str]]:
        """Return the teams, node pools and DAGs the history can be filtered by, sorted.

        DAGs are those of the newest :data:`FACET_ROWS` reservations: holders are parsed here.
        """
        r = schema.reservations.c
        recent = select(r.holder).order_by(r.seq.desc()).limit(FACET_ROWS)

        def run(conn: Connection) -> dict[str, list[str]]:
            teams = sorted(conn.execute(select(r.team).distinct()).scalars())
            pools = sorted(conn.execute(select(schema.nodes.c.node_pool).distinct()).scalars())
            dags = {ref.dag_id for h in conn.execute(recent).scalars() if (ref := TaskTry.from_holder(h))}
            return {"team": teams, "pool": pools, "dag_id": sorted(dags)}

        return self.ledger.read(run)

    def typical_run_seconds(self, dag_id: str, task_id: str, *, runs: int = 5) -> tuple[float, int] | None:
        """Return the median seconds a task's recent successful runs held their slice, and how many there were.

        A successful run is a reservation of the task's that was released with no failed try
        recorded against it; the newest ``runs`` count. None when the task has none yet.

        :param dag_id: the task's DAG
        :param task_id: the task
        :param runs: how many of the newest successful runs to take
        """
        prefix = f"{dag_id}/{task_id}/"
        r = schema.reservations.c
        query = (
            select(r.id, r.granted_at, r.ended_at)
            .where(
                r.holder.startswith(prefix, autoescape=True),
                r.state == ReservationState.RELEASED.value,
                r.granted_at.is_not(None),
                r.ended_at.is_not(None),
            )
            .order_by(r.seq.desc())
            .limit(runs * 4)  # some of the newest may have failed
        )

        def run(conn: Connection) -> list[float]:
            rows = conn.execute(query).all()
            failed = _failures(conn, [row.id for row in rows])
            return [row.ended_at - row.granted_at for row in rows if row.id not in failed][:runs]

        held = self.ledger.read(run)
        return (float(statistics.median(held)), len(held)) if held else None

    def held_by(self, task: TaskTry) -> str | None:
        """Return the id of the newest reservation that try ``task`` holds or held, or None.

        A retry that re-attached to an earlier try's pod adopted that try's grant: the
        reservation keeps the earlier try's id and takes the retry's holder.

        :param task: the try (its host is ignored)
        """
        r = schema.reservations.c
        base = replace(task, host="").holder.rstrip("@")  # ``dag/task/run/map-N/try-T``
        query = (
            select(r.id)
            .where(or_(r.holder == base, r.holder.startswith(f"{base}@", autoescape=True)))
            .order_by(r.seq.desc())
            .limit(1)
        )
        return self.ledger.read(lambda conn: conn.execute(query).scalar())

    def prune(self, retention_seconds: float) -> int:
        """Delete ended reservations that ended more than ``retention_seconds`` ago; return how many.

        Live reservations are never touched. What the deleted rows counted (ended states,
        grants, waits, preemptions) is carried over first, in the same transaction.

        :param retention_seconds: how long ended reservations are kept
        :raises InvalidRequestError: a retention that is not a positive number
        """
        if not retention_seconds > 0:
            raise InvalidRequestError("retention_seconds", retention_seconds, "a positive number of seconds")
        r, a = schema.reservations.c, schema.task_attempts.c

        def run(tx: Tx) -> int:
            cutoff = tx.now - retention_seconds
            ids = list(
                tx.conn.execute(
                    select(r.id)
                    .where(r.state.in_(ENDED_STATES), r.ended_at < cutoff)
                    .order_by(r.ended_at)
                    .limit(PRUNE_BATCH)
                ).scalars()
            )
            if not ids:
                return 0
            carry(tx.conn, tally(tx.conn, r.id.in_(ids), a.reservation_id.in_(ids)))
            carry_preemption_losses(tx.conn, ids)
            tx.conn.execute(delete(schema.task_attempts).where(a.reservation_id.in_(ids)))
            tx.conn.execute(delete(schema.reservations).where(r.id.in_(ids)))
            return len(ids)

        total = 0
        while (pruned := self.ledger.write(run)) > 0:
            total += pruned
            if pruned < PRUNE_BATCH:
                break
        return total
