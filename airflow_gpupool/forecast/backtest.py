"""Forecast backtest (issue 39 item 5): forecasts made when a request must wait, against its actual start.

:class:`Backtest` watches a queue simulation (:class:`~airflow_gpupool.sim.queue.QueueSim` or the
teams' :class:`~airflow_gpupool.sim.governed.TeamsSim`). When an arriving request must wait, it
forecasts that request's start as the controller does (:func:`~airflow_gpupool.forecast.replay.forecast_starts`
over the running tasks and the queue in service order, the simulation's own placement and
overtake bound, durations from :class:`~airflow_gpupool.forecast.durations.DurationModel` fed with
the runs ended so far), and three baselines in the same state:

- *declared* (Slurm-like): the same replay once, every task running for its mean duration (the
  history's mean of its task, its team and class, or the prior), whatever it has run so far;
- *naive*: position × the workload's mean run time / GPUs;
- *oracle*: the same replay once, given every task's true remaining time: the start the request
  would have had with no later arrival, the best a forecast of the queue as it stands can do.

Every replay starts with the overtakes each waiting request has counted (the simulation's).
The forecasts scored are calibrated as the controller's are (:class:`~airflow_gpupool.forecast.calibration.Calibration`,
grouped by team, fed with the starts seen so far, never later ones); ``replay_only`` scores the
same forecasts before the calibration widened them.

The forecast made at arrival is scored against the baselines; the forecasts made after it, at each
change of the queue or the grants while the request waits, are scored on their own
(``at_changes``: coverage, width and p50 error, each against the request's actual start). The
replay knows the queue rule, placement and (in the teams scenario) the quota rules and, under
``gpupool``'s policy, preemption as the ledger would apply it (:func:`sim_preemption`): each running
try as the ledger would hold it (its start, its newest periodic checkpoint, a checkpoint on SIGTERM
where its job writes one within the grace, its headroom loan, a victim's deadline), a preempted
try's retry not preempting in turn, and how long the victims so far took to end once told (the
ledger's :meth:`~airflow_gpupool.ledger.LedgerForecasts.victim_exits`). :meth:`Backtest.report`
returns ``gpupool simulate``'s ``forecast`` object.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from airflow_gpupool.forecast.calibration import Calibration
from airflow_gpupool.forecast.durations import DurationModel, RemainingTime, TaskKey
from airflow_gpupool.forecast.replay import Running, Waiting, forecast_starts
from airflow_gpupool.governance.preemption import VictimOrder
from airflow_gpupool.governance.queue_pass import Governance
from airflow_gpupool.governance.quotas import Headroom
from airflow_gpupool.governance.victim_nodes import PreemptionRules
from airflow_gpupool.ledger import FinishedRun
from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.queue import QueueEntry
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.governed import TeamsSim, last_checkpoint
from airflow_gpupool.sim.queue import MAX_OVERTAKES, QueueSim, by_priority
from airflow_gpupool.sim.replay import quick

__all__ = ["SAMPLES", "Backtest", "synthetic_backtest"]

#: Replays per forecast in the backtest (``--forecast-samples``).
SAMPLES = 32
#: The synthetic queue's tasks: (median seconds, GPUs).
TASKS = ((600.0, 1), (1200.0, 1), (1800.0, 2), (3600.0, 1), (900.0, 2))


def _fixed(seconds: float) -> RemainingTime:
    return RemainingTime("fixed", (max(seconds, 1.0),), 1.0)


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


class Backtest:
    """Forecasts made at arrival for the requests that wait, scored at the end.

    :param samples: replays per forecast
    """

    def __init__(self, *, samples: int = SAMPLES) -> None:
        self.samples = samples
        self.mean_run_s, self.gpus, self.warm_s = 3600.0, 1.0, 0.0
        self.keys: dict[int, TaskKey] = {}
        self.started_at: dict[int, float] = {}  # the simulation's starts, read at the end
        self.done: list[FinishedRun] = []  # newest first, as the ledger's history reads
        # k: (arrival, [p10, p50, p90], oracle, declared, naive, the replay's own (p10, p50, p90))
        self.made: dict[int, tuple[float, list[float], float, float, float, tuple[float, float, float]]] = {}
        # Forecasts after arrival, at each change of the queue or the grants:
        # (k, at, p10, p50, p90, the replay's own (p10, p50, p90)).
        self.later: list[tuple[int, float, float, float, float, tuple[float, float, float]]] = []
        self.calibration = Calibration()
        #: A durations model to use instead of the history's (the true distributions: a yardstick).
        self.known: DurationModel | None = None
        self._seen: tuple[frozenset[Any], frozenset[Any]] | None = None

    def start(self, *, mean_run_s: float, gpus: float, warm_s: float) -> None:
        """Set the workload's mean run time (the prior, *naive*'s run time), the GPUs, and the warm-up.

        Only requests arriving from ``warm_s`` on are scored; forecasts before it only teach the calibration.
        """
        self.mean_run_s, self.gpus, self.warm_s = max(mean_run_s, 1.0), max(gpus, 1e-9), warm_s

    def label(self, k: int, task: str, team: str, workload_class: str) -> None:
        """Name request ``k``'s task (what its history is looked up by)."""
        self.keys[k] = TaskKey("sim", task, team, workload_class)

    def ended(self, k: int, seconds: float) -> None:
        """Record that ``k`` ran ``seconds`` and succeeded."""
        key = self.keys[k]
        self.done.insert(0, FinishedRun(key.dag_id, key.task_id, key.team, key.workload_class, seconds))

    def waiting(
        self,
        now: float,
        sim: QueueSim,
        k: int,
        queue: Callable[[], Sequence[QueueEntry]],
        run_s: Callable[[int], float],
    ) -> None:
        """After the pass of an event about ``k``: forecast again if the queue or the grants changed.

        ``k``'s forecast at arrival (if it arrived at ``now`` and waits) is scored with the
        baselines; every other waiting request already forecast gets a later forecast.

        :param queue: lists the waiting requests in service order
        :param run_s: a request's true run time (for the oracle only)
        """
        self.started_at = sim.started_at
        seen = (frozenset(sim.waiting), frozenset(sim.running))
        if seen == self._seen:
            return  # nothing changed: every forecast stands
        self._seen = seen
        # Before the warm-up ends: forecast for the calibration to learn from, as a running
        # controller would, and score nothing.
        warming = now < self.warm_s
        arrived = not warming and str(k) in sim.waiting and sim.arrived_at.get(k) == now
        if not sim.waiting or not (warming or arrived or any(int(rid) in self.made for rid in sim.waiting)):
            return
        order = queue()
        model = self.known or DurationModel.from_runs(self.done, prior_seconds=self.mean_run_s)
        running = [
            _running(sim, j, now, model.sampler(self.keys[j], now - sim.started_at[j])) for j in sim.running
        ]
        waiting = [
            Waiting(
                e.request_id,
                _waiting_request(sim, e),
                model.sampler(self.keys[int(e.request_id)]),
                e.overtakes,
            )
            for e in order
        ]
        raw = self._replay(now, sim, running, waiting, self.samples)
        # Scored as the controller's Forecaster does: the starts so far, then this pass's ranges widened.
        self.calibration.observe(sim.waiting, lambda rid: sim.started_at.get(int(rid)))
        teams = {rid: self.keys[int(rid)].team or "" for rid in raw}
        mine = {f.reservation_id: f for f in self.calibration.calibrate(list(raw.values()), teams)}
        for rid, forecast in mine.items():
            j = int(rid)
            if j in self.made and j != k and forecast.p50 is not None:
                own = _range(raw[rid], now)
                self.later.append(
                    (j, now, forecast.p10 or now, forecast.p50, forecast.p90 or float("inf"), own)
                )
        if (
            arrived and str(k) in mine
        ):  # not in the queue the rule serves: a preemptor waiting for its victims
            self._arrival(now, sim, k, order, mine[str(k)], _range(raw[str(k)], now), run_s, model)

    def _replay(
        self, now: float, sim: QueueSim, running: list[Running], waiting: list[Waiting], samples: int
    ) -> dict[str, Any]:
        out = forecast_starts(
            now,
            sim.nodes,
            sim.empty,
            running,
            waiting,
            sim.place,
            sim.max_overtakes,
            samples=samples,
            governance=sim_governance(sim),
            preemption=sim_preemption(sim),
            victim_exits=sim.exits[:200] if isinstance(sim, TeamsSim) else (),
        )
        return {f.reservation_id: f for f in out}

    def _arrival(
        self,
        now: float,
        sim: QueueSim,
        k: int,
        order: Sequence[QueueEntry],
        mine: Any,
        own: tuple[float, float, float],
        run_s: Callable[[int], float],
        model: DurationModel,
    ) -> None:
        """Record ``k``'s forecast at arrival beside the oracle's, *declared*'s and *naive*'s."""

        def declared(j: int) -> float:
            return model.sampler(self.keys[j]).mean()

        oracle_running, declared_running = [], []
        for j in sim.running:
            elapsed = now - sim.started_at[j]
            oracle_running.append(_running(sim, j, now, _fixed(run_s(j) - elapsed)))
            declared_running.append(_running(sim, j, now, _fixed(declared(j) - elapsed)))
        seqs = [int(e.request_id) for e in order]
        oracle_waiting = [
            Waiting(str(j), _waiting_request(sim, e), _fixed(run_s(j)), e.overtakes)
            for j, e in zip(seqs, order, strict=True)
        ]
        declared_waiting = [
            Waiting(str(j), _waiting_request(sim, e), _fixed(declared(j)), e.overtakes)
            for j, e in zip(seqs, order, strict=True)
        ]
        best = self._replay(now, sim, oracle_running, oracle_waiting, 1)[str(k)]
        slurm = self._replay(now, sim, declared_running, declared_waiting, 1)[str(k)]
        if mine.p50 is None or best.p50 is None or slurm.p50 is None:
            return  # "never, on the current nodes": no time to score
        position = seqs.index(k) + 1
        self.made[k] = (
            now,
            [mine.p10 or now, mine.p50, mine.p90 or float("inf")],
            best.p50,
            slurm.p50,
            now + position * self.mean_run_s / self.gpus,
            own,
        )

    def report(self) -> dict[str, Any]:
        """Return the scores of the forecasts whose request started (``gpupool simulate``'s ``forecast``)."""
        started_at = self.started_at
        waits, widths, errors, oracle_errors, declared_errors, naive_errors = [], [], [], [], [], []
        covered = early = late = oracle_late = oracle_hit = covers_no_arrival = late_past_own_p90 = 0
        replay_covered, replay_widths, replay_errors = 0, [], []
        for k, (arrived, (p10, p50, p90), oracle, slurm, naive, (own10, own50, own90)) in self.made.items():
            if k not in started_at:
                continue
            actual = started_at[k]
            waits.append(actual - arrived)
            covered += p10 <= actual <= p90
            early += actual < p10
            late += actual > p90
            # The oracle's start is the start without later arrivals (the exact replay of the queue as it stood).
            oracle_late += actual > oracle + 1.0
            oracle_hit += abs(actual - oracle) <= 1.0
            covers_no_arrival += p10 <= oracle <= p90
            late_past_own_p90 += actual > p90 >= oracle
            widths.append(p90 - p10)
            replay_covered += own10 <= actual <= own90
            replay_widths.append(own90 - own10)
            replay_errors.append(abs(own50 - actual))
            errors.append(abs(p50 - actual))
            oracle_errors.append(abs(oracle - actual))
            declared_errors.append(abs(slurm - actual))
            naive_errors.append(abs(naive - actual))
        n = len(errors)

        def share(count: int) -> float | None:
            return round(count / n, 3) if n else None

        return {
            "requests": n,
            "samples": self.samples,
            "coverage_p10_p90": share(covered),
            "below_p10": share(early),
            "above_p90": share(late),
            "width_median_s": _median(widths),
            "p50_abs_error_median_s": _median(errors),
            "wait_median_s": _median(waits),
            # The same forecasts before calibration widened them (forecast/calibration.py).
            "replay_only": {
                "coverage_p10_p90": share(replay_covered),
                "width_median_s": _median(replay_widths),
                "p50_abs_error_median_s": _median(replay_errors),
            },
            "bounds": {
                # Every share below is of the same requests as coverage_p10_p90.
                "oracle_coverage": share(oracle_hit),
                "delayed_by_later_arrivals": share(oracle_late),
                "coverage_of_no_arrival_start": share(covers_no_arrival),
                "above_p90_by_later_arrivals": share(late_past_own_p90),
            },
            "baselines": {
                "declared": {"p50_abs_error_median_s": _median(declared_errors)},
                "naive": {"p50_abs_error_median_s": _median(naive_errors)},
                "oracle": {"p50_abs_error_median_s": _median(oracle_errors)},
            },
            "at_changes": self._later_report(),
        }

    def _later_report(self) -> dict[str, Any]:
        """Score the forecasts made after arrival, each against its request's actual start."""
        scored = [
            (at, p10, p50, p90, own, self.started_at[j])
            for j, at, p10, p50, p90, own in self.later
            if j in self.started_at
        ]
        n = len(scored)

        def share(count: int) -> float | None:
            return round(count / n, 3) if n else None

        return {
            "forecasts": n,
            "requests": len({j for j, *_ in self.later if j in self.started_at}),
            "coverage_p10_p90": share(sum(p10 <= start <= p90 for _, p10, _, p90, _, start in scored)),
            "width_median_s": _median([p90 - p10 for _, p10, _, p90, _, _ in scored]),
            "p50_abs_error_median_s": _median([abs(p50 - start) for _, _, p50, _, _, start in scored]),
            "remaining_wait_median_s": _median([start - at for at, *_, start in scored]),
            "replay_only": {
                "coverage_p10_p90": share(sum(own[0] <= start <= own[2] for *_, own, start in scored)),
                "width_median_s": _median([own[2] - own[0] for *_, own, _ in scored]),
                "p50_abs_error_median_s": _median([abs(own[1] - start) for *_, own, start in scored]),
            },
        }


def _range(forecast: Any, now: float) -> tuple[float, float, float]:
    """A forecast's (p10, p50, p90) (a missing one: now, or never)."""
    return (forecast.p10 or now, forecast.p50 or now, forecast.p90 or float("inf"))


def _running(sim: QueueSim, j: int, now: float, remaining: RemainingTime) -> Running:
    """Running task ``j`` as the ledger would hold it: in the teams scenario, what preemption reads of it too."""
    request, assignment, _ = sim.running[j]
    if not isinstance(sim, TeamsSim):
        return Running(str(j), request, assignment, remaining)
    attempt = sim.tries[j]
    job = attempt.job
    started = sim.started_at[j]
    return Running(
        str(j),
        # What the ledger reads of a step that opts in to a checkpoint on SIGTERM.
        replace(request, checkpoint_on_sigterm=sim.policy.grace and sim.saves_on_sigterm(job)),
        assignment,
        remaining,
        granted_at=started,
        checkpoint_at=last_checkpoint(started, now, job.checkpoint_interval_s),
        on_headroom_loan=attempt.on_loan,
        ends_by=attempt.deadline,
    )


def _waiting_request(sim: QueueSim, entry: QueueEntry) -> GpuRequest:
    """A waiting request as the ledger would hold it: a preempted try's retry does not preempt in turn."""
    if isinstance(sim, TeamsSim) and sim.tries[int(entry.request_id)].was_preempted:
        return replace(entry.request, preempts=False)
    return entry.request


def sim_preemption(sim: QueueSim) -> PreemptionRules | None:
    """The preemption rules a teams simulation applies, as the ledger would hold them (None: it does not, or not as the ledger does).

    Only ``gpupool``'s (victims losing the least work, a grace, with the ledger's quota rules).
    """
    if (
        not isinstance(sim, TeamsSim)
        or sim.policy.preemption is not VictimOrder.LEAST_WORK_LOST
        or not sim.policy.grace
        or sim_governance(sim) is None
    ):
        return None
    return PreemptionRules(sim.plan.min_runtime_s if sim.policy.min_runtime else 0.0, sim.plan.grace_s)


def sim_governance(sim: QueueSim) -> Governance | None:
    """The quota rules a teams simulation serves by, as the ledger would hold them (None: none).

    Only for a policy with the ledger's rules (quotas, fair order, headroom: ``gpupool``,
    ``no-preemption``); its plan's one flavor is every simulated node's (a ``pool:`` flavor
    names the nodes' pool here).
    """
    if not isinstance(sim, TeamsSim) or not (
        sim.policy.quotas and sim.policy.fair_order and sim.policy.headroom
    ):
        return None
    plan = sim.plan
    headroom = Headroom(
        share_milli=round(plan.headroom * 1000),
        lend_to_preemptible=plan.headroom_lent,
        urgent_priority=plan.urgent_priority,
    )
    pool = plan.flavor.name if plan.flavor.kind == "pool" else None
    nodes = {n.name: n if pool is None else replace(n, node_pool=pool) for n in sim.empty}
    grants = [(request, assignment) for request, assignment, _ in sim.running.values()]
    return Governance.of_grants(replace(plan.quotas, headroom=headroom), grants, nodes)


def synthetic_backtest(
    *,
    seed: int = 42,
    nodes: int = 6,
    arrivals: int = 300,
    load: float = 0.9,
    samples: int = SAMPLES,
    warm_history: int = 0,
    known_distributions: bool = False,
) -> dict[str, Any]:
    """Run the backtest on a synthetic queue (``benchmarks/forecast_backtest.py``).

    ``nodes`` nodes of 4 GPUs, the five :data:`TASKS` with log-normal run times (σ 0.4) around
    their medians, Poisson arrivals at ``load`` of the capacity, served by :class:`QueueSim`.
    ``warm_history``: runs per task in the history before the first arrival (a separate seed).
    ``known_distributions``: the forecast draws from each task's true distribution (2,000 draws,
    a separate seed) instead of the history: what a forecast that knows every task's distribution,
    but not the run it will have, can do (*declared* then takes the true means too).
    """
    rng = np.random.default_rng(seed)
    empty = [
        NodeState(f"n{i}", 64000, 262144, tuple(GpuState(g, "A100", 81920, 1000, 81920) for g in range(4)))
        for i in range(nodes)
    ]
    picks = rng.integers(len(TASKS), size=arrivals)
    runs = np.array([TASKS[int(p)][0] * float(rng.lognormal(0.0, 0.4)) for p in picks])
    gpus = np.array([TASKS[int(p)][1] for p in picks])
    rate = load * 4 * nodes / float(np.mean(runs * gpus))
    times = np.cumsum(rng.exponential(1 / rate, arrivals))
    sim = QueueSim(list(empty), quick(get_policy("bestfit")), (), MAX_OVERTAKES)
    backtest = Backtest(samples=samples)
    backtest.start(mean_run_s=float(np.mean([m for m, _ in TASKS])), gpus=4 * nodes, warm_s=0.0)
    warm = np.random.default_rng(seed + 1000)
    backtest.done = [
        FinishedRun("sim", f"task{t}", "team", "batch", median * float(warm.lognormal(0.0, 0.4)))
        for _ in range(warm_history)
        for t, (median, _) in enumerate(TASKS)
    ]
    if known_distributions:
        truth = np.random.default_rng(seed + 2000)
        backtest.known = DurationModel(
            backtest.mean_run_s,
            {
                ("sim", f"task{t}"): list(median * truth.lognormal(0.0, 0.4, 2000))
                for t, (median, _) in enumerate(TASKS)
            },
        )
    events = [(float(t), 1, k) for k, t in enumerate(times)]
    heapq.heapify(events)
    while events:
        now, kind, k = heapq.heappop(events)
        if kind == 1:
            backtest.label(k, f"task{int(picks[k])}", "team", "batch")
            sim.arrive(k, GpuRequest(gpus=int(gpus[k])), now, 0)
        else:
            sim.depart(k)
            backtest.ended(k, float(runs[k]))
        for started in sim.serve(now):
            heapq.heappush(events, (now + float(runs[started]), 0, started))
        backtest.waiting(now, sim, k, by_priority(sim), lambda j: float(runs[j]))
    return {
        "seed": seed,
        "nodes": nodes,
        "arrivals": arrivals,
        "samples": samples,
        "warm_history": warm_history,
        "known_distributions": known_distributions,
        "forecast": backtest.report(),
    }
