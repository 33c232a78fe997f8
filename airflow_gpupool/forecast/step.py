"""The controller's forecast step: read the ledger, replay its queue, store each waiting request's forecast.

It runs on the leader only, at most once per ``[gpupool] forecast_interval_seconds``, and only
when the queue or the grants changed since its last pass (:class:`Forecaster`); readers (the
waiting triggers, ``gpupool explain`` and ``status``, the page and its API, the metrics) read
what it stored and never compute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_gpupool.forecast.calibration import Calibration
from airflow_gpupool.forecast.durations import DurationModel, TaskKey
from airflow_gpupool.forecast.replay import SAMPLES, SEED, Running, Waiting, forecast_starts
from airflow_gpupool.governance.queue_pass import Governance
from airflow_gpupool.ledger import LedgerForecasts, LedgerQuotas, StartForecast
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.settings import forecast_prior_seconds
from airflow_gpupool.sim.replay import quick
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow_gpupool.ledger import Grant, Ledger, LedgerSnapshot, Reservation
    from airflow_gpupool.placement.snapshot import NodeState

__all__ = ["Forecaster", "compute_forecasts", "refresh_forecasts"]

GANG_REASON = "gangs are not forecast yet"
#: Requests forecast per pass, the head of the queue: a pass visits the waiting requests after every
#: event of each replay (`gpupool bench forecast`, benchmarks/README.md); the rest say "unknown".
MAX_WAITING = 200


def _key(r: Reservation) -> TaskKey:
    ref = TaskTry.from_holder(r.holder)
    return TaskKey(
        ref.dag_id if ref else None,
        ref.task_id if ref else None,
        r.request.team,
        r.request.workload_class.value,
    )


def _assignment(g: Grant) -> Assignment:
    return Assignment(g.node, g.gpu_indices, g.milli_per_gpu, g.gpu_memory_mib, g.mig_slice)


def _governance(ledger: Ledger, snapshot: LedgerSnapshot, empty: Sequence[NodeState]) -> Governance | None:
    """The stored quotas and what the live grants hold, for the replay's passes (None: no quotas, no headroom)."""
    plan = LedgerQuotas(ledger).list()
    if not plan.quotas and not plan.headroom.active:
        return None
    held = [*snapshot.grants, *snapshot.external]  # pods this project did not make count for the headroom
    grants = [(g.request, _assignment(g.grant)) for g in held if g.grant is not None]
    return Governance.of_grants(plan, grants, {n.name: n for n in empty})


def compute_forecasts(
    ledger: Ledger,
    snapshot: LedgerSnapshot,
    *,
    samples: int = SAMPLES,
    seed: int = SEED,
    max_waiting: int = MAX_WAITING,
) -> list[StartForecast]:
    """Return a forecast for every request waiting in ``snapshot`` (nothing is written).

    :param ledger: the ledger (its history, inventory, policy and ``max_overtakes``)
    :param snapshot: its state, read once
    :param samples: replays
    :param seed: the replays' seed
    :param max_waiting: forecast at most this many single requests, the first in service order
    """
    now = snapshot.taken_at
    if not snapshot.queue:  # nothing to forecast: no history, inventory or replay to read
        return []
    model = DurationModel.from_runs(LedgerForecasts(ledger).successful_runs(), forecast_prior_seconds())
    running = [
        Running(
            g.id,
            g.request,
            _assignment(g.grant),
            model.sampler(_key(g), now - g.grant.granted_at),
            granted_at=g.grant.granted_at,
            checkpoint_at=g.checkpoint_at,
            on_headroom_loan=g.headroom_loan,
            ends_by=g.preempt_deadline,
            preempted_for=g.preempted_by,
        )
        for g in snapshot.grants
        if g.grant is not None
    ]
    all_singles = [r for r in snapshot.queue if r.gang_id is None]
    singles, beyond = all_singles[:max_waiting], all_singles[max_waiting:]
    # Each with the overtakes it has counted: a head past max_overtakes lets nothing pass in the replay either.
    waiting = [Waiting(r.id, r.request, model.sampler(_key(r)), r.overtakes) for r in singles]
    empty = ledger.empty_cluster().nodes
    rules = ledger.preemption_rules
    forecasts = forecast_starts(
        now,
        snapshot.cluster.nodes,
        empty,
        running,
        waiting,
        quick(ledger.policy),
        ledger.max_overtakes,
        samples=samples,
        seed=seed,
        governance=_governance(ledger, snapshot, empty),
        preemption=rules,
        victim_exits=LedgerForecasts(ledger).victim_exits(rules.grace_seconds),
    )
    positions = {r.id: i + 1 for i, r in enumerate(snapshot.queue)}
    total = len(snapshot.queue)
    out = [
        StartForecast(
            f.reservation_id, now, f.status, f.p10, f.p50, f.p90, positions[f.reservation_id], total, f.reason
        )
        for f in forecasts
    ]
    out += [
        StartForecast(r.id, now, "unknown", position=positions[r.id], queue_length=total, reason=GANG_REASON)
        for r in snapshot.queue
        if r.gang_id is not None
    ]
    far = f"only the first {max_waiting} waiting requests are forecast"
    out += [
        StartForecast(r.id, now, "unknown", position=positions[r.id], queue_length=total, reason=far)
        for r in beyond
    ]
    return out


def refresh_forecasts(ledger: Ledger, *, samples: int = SAMPLES, seed: int = SEED) -> int:
    """Compute and store every waiting request's forecast; return how many were stored."""
    forecasts = compute_forecasts(ledger, ledger.snapshot(), samples=samples, seed=seed)
    LedgerForecasts(ledger).replace(forecasts)
    return len(forecasts)


class Forecaster:
    """Refresh the forecasts when the queue, the grants or the nodes changed, or a forecast came due.

    An empty queue is one state, whatever the grants and nodes do: nothing to forecast.

    A forecast comes due once the ledger's clock passes its earliest p10: from then on it would
    show a start in the past, so the replay runs again from the state as it is.

    The stored ranges are calibrated (:class:`~airflow_gpupool.forecast.calibration.Calibration`):
    widened by how this controller's earlier forecasts for the same team turned out, scored against
    the grants it sees start. The scores live in this process: a new leader starts with the replay's own ranges
    until it has scored enough.

    :param ledger: the ledger
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.calibration = Calibration()
        self._seen: tuple[object, ...] | None = None
        self._due = float("inf")

    def __call__(self) -> int | None:
        """Refresh if anything changed; return how many forecasts were stored (None: nothing changed)."""
        snapshot = self.ledger.snapshot()
        queue = tuple(r.id for r in snapshot.queue)
        # While nothing waits, the grants and nodes change no forecast: one pass clears the stored
        # ones, then no pass (no read of the history, no write under the ledger's lock) until a request waits.
        seen: tuple[object, ...] = (
            (queue, tuple(g.id for g in snapshot.grants), tuple((n.name, n.health) for n in snapshot.nodes))
            if queue
            else ((),)
        )
        if seen == self._seen and snapshot.taken_at < self._due:
            return None
        # A request granted and ended between two passes is not in the snapshot: forgotten, not scored.
        granted_at = {g.id: g.grant.granted_at for g in snapshot.grants if g.grant is not None}
        self.calibration.observe({r.id for r in snapshot.queue}, granted_at.get)
        teams = {r.id: r.request.team or "" for r in snapshot.queue}
        forecasts = self.calibration.calibrate(compute_forecasts(self.ledger, snapshot), teams)
        LedgerForecasts(self.ledger).replace(forecasts)
        self._seen = seen
        self._due = min(
            (f.p10 for f in forecasts if f.p10 is not None and f.p10 > snapshot.taken_at),
            default=float("inf"),
        )
        return len(forecasts)
