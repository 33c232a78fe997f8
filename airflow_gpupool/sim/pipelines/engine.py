"""The pipelines simulation: DAG runs' chained steps on the governed queue, under four policies.

Each step is a try of :class:`~airflow_gpupool.sim.governed.TeamsSim` (the same quotas, fair
order, headroom, preemption and queue rule as the background's jobs); this module adds the DAG:

- ``per-task`` (today): a step asks for its slice when its upstream ends (plus the start gap);
- ``hand-on``: an ending step's grant passes the part of its slice the next step needs
  (:func:`~airflow_gpupool.placement.accounting.hand_on`: same node, within the slice) instead of
  releasing it; the next step claims it when it asks, and an unclaimed one (a skipped branch) is
  released ``handoff_s`` after the upstream's end;
- ``hand-on+queue-ahead``: a next step that cannot be handed on (bigger) is queued at its
  upstream's forecast end minus ``lead_s``, with ``not_before`` the forecast time it asks
  (:func:`~airflow_gpupool.placement.queue.serve` leaves it out before then, its place kept); a
  grant it cannot use yet is held at most ``idle_bound_s``, then it steps back to the queue,
  keeping its place, until its upstream has ended; a skipped step's request is withdrawn when its
  upstream ends;
- ``...+run-admission``: a run's first step is granted only when its team's quota admits the
  run's peak concurrent need.

The forecast of a running step's end is what the forecaster's task level answers (issue 39): the
mean duration of the step's own last runs (at least three), else the middle of its range.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_gpupool.governance.admission import QuotaState
from airflow_gpupool.placement.accounting import allocate, hand_on
from airflow_gpupool.placement.fit import EXCLUSIVE_CLASSES, choices
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.sim.governed import ARRIVE, FINISH, POLICIES, RELEASE, TeamsSim
from airflow_gpupool.sim.queue import whole_slots
from airflow_gpupool.sim.teams import Job

if TYPE_CHECKING:
    from collections.abc import Sequence

    from airflow_gpupool.placement.queue import QueueEntry
    from airflow_gpupool.placement.snapshot import NodeState
    from airflow_gpupool.resources import GpuRequest
    from airflow_gpupool.sim.pipelines.spec import PipelinesPlan, RunDraw

__all__ = ["PIPELINE_POLICIES", "YARDSTICKS", "PipelinePolicy", "PipelineSim", "StepState", "can_hand_on"]

RUN, READY, AHEAD, DUE, STEPBACK, EXPIRE = 3, 4, 5, 6, 7, 8  # after the background's event kinds
#: Runs of a step the forecast averages (the forecaster's per-task window) and the fewest it uses.
FORECAST_RUNS, FORECAST_MIN_RUNS = 20, 3
_EPS = 1e-6


@dataclass(frozen=True)
class PipelinePolicy:
    """Which pipeline rules a compared policy applies."""

    name: str
    hand_on: bool = False
    queue_ahead: bool = False
    run_admission: bool = False
    oracle: bool = False  # a yardstick: queue ahead from the upstream's start, knowing its end
    step_back: bool = True  # False, a yardstick: a grant ahead is held however long it waits


PIPELINE_POLICIES = {
    p.name: p
    for p in (
        PipelinePolicy("per-task"),
        PipelinePolicy("hand-on", hand_on=True),
        PipelinePolicy("hand-on+queue-ahead", hand_on=True, queue_ahead=True),
        PipelinePolicy(
            "hand-on+queue-ahead+run-admission", hand_on=True, queue_ahead=True, run_admission=True
        ),
    )
}
#: Ideal policies no scheduler can run, as yardsticks: what perfect forecasts and leads could give.
YARDSTICKS = {
    p.name: p
    for p in (
        PipelinePolicy("ideal-queue-ahead", hand_on=True, queue_ahead=True, oracle=True),
        PipelinePolicy("ideal-reserve", hand_on=True, queue_ahead=True, oracle=True, step_back=False),
    )
}


@dataclass
class StepState:
    """One step of one run as it goes (times in simulated seconds; None: not yet)."""

    run: int
    index: int
    work_s: float
    skipped: bool
    try_k: int | None = None
    ready: float | None = None  # when it asks for its slice: its upstream's end plus the start gap
    granted: float | None = None  # when its try got the slice it holds now
    started: float | None = None  # when its work began
    ended: float | None = None
    finish_at: float | None = None
    ahead: bool = False  # its slice comes by queue-ahead (else by hand-on or per-task)


def can_hand_on(node: NodeState, upstream: GpuRequest, downstream: GpuRequest) -> bool:
    """Return whether ``downstream`` fits the slice ``upstream`` takes on an empty ``node``."""
    found = choices(node, upstream)
    if not isinstance(found, list) or not found:
        return False
    taken = allocate(node, upstream, found[0])
    return hand_on(taken, upstream, found[0], downstream, frozenset()) is not None


class PipelineSim(TeamsSim):
    """The background's governed queue plus DAG runs of chained steps under one pipeline policy."""

    def __init__(
        self,
        nodes: list[NodeState],
        plan: PipelinesPlan,
        policy: PipelinePolicy,
        runs: Sequence[RunDraw],
        *,
        governance: str = "gpupool",
        warm: float,
        horizon: float,
    ) -> None:
        super().__init__(list(nodes), plan.teams, POLICIES[governance], warm)
        self.pplan, self.ppolicy, self.draws, self.horizon = plan, policy, list(runs), horizon
        self.steps: dict[tuple[int, int], StepState] = {}
        for r in self.draws:
            cut = r.skipped_from if r.skipped_from is not None else len(r.work_s)
            for i, work in enumerate(r.work_s):
                self.steps[(r.seq, i)] = StepState(r.seq, i, work, i >= cut)
        self.step_of: dict[int, tuple[int, int]] = {}
        self.history: dict[tuple[int, int], list[float]] = defaultdict(list)
        self.idle_held = {"hand-on": 0.0, "queue-ahead": 0.0}  # milli-GPU-seconds in the window
        self.bg_waits: list[float] = []
        blank = nodes[0]
        self.handable = {
            (p, i): can_hand_on(blank, s.steps[i - 1].request, s.steps[i].request)
            for p, s in enumerate(plan.pipelines)
            for i in range(1, len(s.steps))
        }

    # -- the loop --------------------------------------------------------------------------------

    def run(self, jobs: Sequence[Job]) -> None:
        """Replay the background's ``jobs`` and the runs until the horizon."""
        for job in jobs:
            heapq.heappush(self.events, (job.arrival, ARRIVE, job.seq))
        for r in self.draws:
            heapq.heappush(self.events, (r.arrival, RUN, r.seq))
        while self.events:
            now, kind, k = heapq.heappop(self.events)
            if now > self.horizon:
                break
            self.advance(now, self.warm)
            if kind == ARRIVE:
                self.enqueue(jobs[k], now, jobs[k].work_s)
            elif kind == RELEASE:
                self.release(k, now)
            elif kind == FINISH:
                if not self.finish(k, now):
                    continue
            else:
                self._pipeline_event(kind, k, now)
            self.pass_(now)
        self.advance(self.horizon, self.warm)
        self._close()

    def _close(self) -> None:
        """Count what is still held unused or still waiting at the horizon."""
        for step in self.steps.values():
            if step.try_k in self.running and step.started is None and step.granted is not None:
                self._idle(step, self.horizon)
        for rid in self.waiting:
            t = self.tries[int(rid)]
            if int(rid) not in self.step_of and t.queued_at >= self.warm:
                self.bg_waits.append(self.horizon - t.queued_at)

    def _pipeline_event(self, kind: int, k: int, now: float) -> None:
        if kind == RUN:
            self.steps[(k, 0)].ready = now
            self._ask(self.steps[(k, 0)], now, not_before=None)
        elif kind in (READY, AHEAD):
            step = self.steps[divmod(k, 8)]
            self._ready(step, now) if kind == READY else self._ahead(step, now)
        elif kind == STEPBACK:
            self._step_back(k, now)
        elif kind == EXPIRE:
            self._expire(k, now)
        # DUE: a not_before has come; the pass that follows serves it

    # -- steps -----------------------------------------------------------------------------------

    def _job(self, step: StepState, now: float) -> Job:
        spec = self.pplan.pipelines[self.draws[step.run].pipeline].steps[step.index]
        return Job(-1, spec.request.team or "", spec.request, now, step.work_s)

    def _slot(self, step: StepState) -> GpuRequest:
        """The request the step's try holds, as the governance sees it (whole slots in an Airflow pool)."""
        request = self._job(step, 0.0).request
        return whole_slots(request) if self.policy.whole_slots else request

    def _ask(self, step: StepState, now: float, not_before: float | None) -> int:
        """Queue ``step``'s request (with ``not_before`` when queued ahead); return its try."""
        k = self.next_try
        self.enqueue(self._job(step, now), now, step.work_s)
        if not_before is not None:
            self.waiting[str(k)] = replace(self.waiting[str(k)], not_before=not_before)
            heapq.heappush(self.events, (not_before, DUE, k))
        step.try_k, self.step_of[k] = k, (step.run, step.index)
        return k

    def _start(self, k: int, request: Any, assignment: Assignment, now: float) -> None:
        ref = self.step_of.get(k)
        if ref is None:
            if self.tries[k].queued_at >= self.warm:
                self.bg_waits.append(now - self.tries[k].queued_at)
            super()._start(k, request, assignment, now)
            return
        super()._start(k, request, assignment, now)  # its FINISH is stale unless the step is ready
        step = self.steps[ref]
        step.granted = now
        if step.ready is not None and step.ready <= now + _EPS:
            self._begin(step, now)
        elif step.ahead and self.ppolicy.step_back:
            heapq.heappush(self.events, (now + self.pplan.idle_bound_s, STEPBACK, k))

    def _begin(self, step: StepState, now: float) -> None:
        """The step's work begins on the slice its try holds."""
        self._idle(step, now)
        step.started, step.finish_at = now, now + step.work_s
        heapq.heappush(self.events, (step.finish_at, FINISH, step.try_k or 0))
        if self.ppolicy.queue_ahead:
            self._plan_ahead(step, now)

    def _idle(self, step: StepState, until: float) -> None:
        """Count the time the step's try held its slice unused, from its grant to ``until``."""
        if step.granted is None or step.try_k is None:
            return
        milli = self.running[step.try_k][0].total_gpu_milli
        low, high = max(step.granted, self.warm), min(until, self.horizon)
        if high > low:
            self.idle_held["queue-ahead" if step.ahead else "hand-on"] += milli * (high - low)
        step.granted = None

    def finish(self, k: int, now: float) -> bool:
        ref = self.step_of.get(k)
        if ref is None:
            return super().finish(k, now)
        step = self.steps[ref]
        if k not in self.running or step.finish_at is None or abs(step.finish_at - now) > _EPS:
            return False  # stale: pushed when granted ahead of its work
        step.ended = now
        key = (self.draws[step.run].pipeline, step.index)
        self.history[key] = [*self.history[key], now - (step.started or now)][-FORECAST_RUNS:]
        nxt = self.steps.get((step.run, step.index + 1))
        handed = self._handed(k, nxt) if nxt is not None and nxt.try_k is None else None
        self.end(k)
        if handed is not None and nxt is not None:
            # In the same instant as the end: no gap in which another request could take the slice.
            node, assignment = handed
            request = self._slot(nxt)
            self._take(node, request, assignment)
            self._start(self._ask(nxt, now, None), request, assignment, now)
            heapq.heappush(self.events, (now + self.pplan.handoff_s, EXPIRE, nxt.try_k or 0))
        self._hand_over(k, now)
        if nxt is None:
            return True
        if nxt.skipped and nxt.try_k is not None and handed is None:
            self._withdraw(nxt, now)
        if not nxt.skipped:
            heapq.heappush(self.events, (now + self.pplan.start_gap_s, READY, nxt.run * 8 + nxt.index))
        return True

    def _handed(self, k: int, nxt: StepState) -> tuple[int, Assignment] | None:
        if not self.ppolicy.hand_on:
            return None
        request, assignment, i = self.running[k]
        classes = self.nodes[i].classes
        workload = request.workload_class.value
        if workload in EXCLUSIVE_CLASSES and self.held[i][workload] <= 1:
            classes = classes - {workload}
        down = self._slot(nxt)
        handed = hand_on(self.nodes[i], request, assignment, down, classes)
        return None if handed is None else (i, handed)

    def _ready(self, step: StepState, now: float) -> None:
        """The step asks for its slice: claim the one it holds, free its queued request, or queue."""
        step.ready = now
        k = step.try_k
        if k is None:
            self._ask(step, now, None)
        elif k in self.running:
            self._begin(step, now)
        elif str(k) in self.waiting:
            self.waiting[str(k)] = replace(self.waiting[str(k)], not_before=None)

    # -- queue-ahead -----------------------------------------------------------------------------

    def forecast_s(self, pipeline: int, index: int) -> float:
        """Return the forecast duration of a step: its last runs' mean, else its range's middle."""
        runs = self.history.get((pipeline, index), [])
        if len(runs) >= FORECAST_MIN_RUNS:
            return sum(runs) / len(runs)
        return sum(self.pplan.pipelines[pipeline].steps[index].duration_s) / 2

    def _plan_ahead(self, step: StepState, now: float) -> None:
        """When a step's work begins, schedule its next step's queue-ahead if it cannot be handed on."""
        nxt = self.steps.get((step.run, step.index + 1))
        pipeline = self.draws[step.run].pipeline
        if nxt is None or (self.ppolicy.hand_on and self.handable[(pipeline, nxt.index)]):
            return
        ends = now + self.forecast_s(pipeline, step.index)
        at = now if self.ppolicy.oracle else max(now, ends - self.pplan.lead_s)
        heapq.heappush(self.events, (at, AHEAD, nxt.run * 8 + nxt.index))

    def _ahead(self, step: StepState, now: float) -> None:
        upstream = self.steps[(step.run, step.index - 1)]
        if upstream.ended is not None or step.try_k is not None:
            return  # its upstream ended first: it asks when ready, as per-task
        pipeline = self.draws[step.run].pipeline
        forecast = upstream.work_s if self.ppolicy.oracle else self.forecast_s(pipeline, upstream.index)
        forecast_end = (upstream.started or now) + forecast
        step.ahead = True
        not_before = forecast_end + self.pplan.start_gap_s if self.ppolicy.step_back else now
        self._ask(step, now, max(now, not_before))

    def _step_back(self, k: int, now: float) -> None:
        """A queued-ahead grant unused past the bound goes back; its request keeps its place."""
        step = self.steps[self.step_of[k]]
        if k not in self.running or step.started is not None or step.granted is None:
            return
        if step.granted + self.pplan.idle_bound_s > now + _EPS:
            return  # granted again since; its own bound comes later
        request = self.running[k][0]
        self._idle(step, now)
        self.end(k)
        self._hand_over(k, now)
        # Its place is its try's number and queue time, kept; it is due once its upstream has ended.
        self.arrive(k, request, self.tries[k].queued_at, request.total_gpu_milli, not_before=math.inf)
        self.tries[k].started_at = None

    def _withdraw(self, step: StepState, now: float) -> None:
        """A skipped step's queued-ahead request leaves the queue, or its early grant is released."""
        k = step.try_k
        if k is None:
            return
        if k in self.running:
            self._idle(step, now)
            self.end(k)
            self._hand_over(k, now)
        else:
            self.waiting.pop(str(k), None)
            self.pending.pop(k, None)
        step.try_k = None

    def _expire(self, k: int, now: float) -> None:
        """A handed slice unclaimed at the bound is released; a step not skipped then asks as per-task."""
        step = self.steps[self.step_of[k]]
        if k not in self.running or step.started is not None or step.try_k != k:
            return
        self._idle(step, now)
        self.end(k)
        self._hand_over(k, now)
        step.try_k = None

    # -- run admission ---------------------------------------------------------------------------

    def _try_place(self, entry: QueueEntry, held: frozenset[str]) -> Assignment | None:
        k = int(entry.request_id)
        ref = self.step_of.get(k)
        if self.ppolicy.run_admission and ref is not None and ref[1] == 0 and not self._admits_run(ref[0]):
            self.blocked.add(k)
            return None
        return super()._try_place(entry, held)

    def _admits_run(self, run: int) -> bool:
        """Whether the run's team quota (the pool, without quotas) serves its peak concurrent need."""
        pipeline = self.pplan.pipelines[self.draws[run].pipeline]
        peak = pipeline.peak_milli
        if not self.policy.quotas:
            return self.capacity - self.allocated_milli() >= peak
        used = {(team, self.plan.flavor): milli for team, milli in self.held_by.items()}
        return QuotaState(self.plan.quotas, used).admit(pipeline.team, [self.plan.flavor], peak).admitted
