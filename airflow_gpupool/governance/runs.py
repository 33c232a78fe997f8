"""Admission of a DAG run as a whole: its peak concurrent GPU need, and the need its first step carries.

Two GPU steps of a run may hold their slices at the same time unless a path of upstream/downstream
edges orders them. The run's peak concurrent need is therefore the heaviest *antichain* of its GPU
steps (a set of steps no path orders), each weighing its milli-GPU.

:func:`peak_need` computes it exactly by the weighted form of Dilworth's theorem: the heaviest
antichain weighs the total weight less the maximum flow of the bipartite network ``source -> v_out
(w(v)) -> u_in (unbounded, v before u) -> sink (w(u))``, and the steps whose ``out`` side the
source still reaches in the residual network, but not their ``in`` side, are that antichain. The
flow's cost grows with the number of ordered pairs, so past :data:`EXACT_STEPS_LIMIT` GPU steps the
need is the sum of every step (an upper bound: the run then waits for more than it may use), and
:attr:`RunNeed.exact` says so.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.governance.quotas import Flavor, QuotaPlan

__all__ = ["EXACT_STEPS_LIMIT", "RunNeed", "ordered_pairs", "peak_need", "quota_ceiling_milli"]

#: The most GPU steps whose peak is computed exactly; beyond, the sum of all of them (an upper bound).
EXACT_STEPS_LIMIT = 200
_MAX_KEY = 500


@dataclass(frozen=True)
class RunNeed:
    """What a run needs at its peak, and which steps make it up.

    :param key: the run's admission scope (DAG id, run id, task group): one admission per key
    :param peak_milli: the largest milli-GPU its GPU steps may hold at the same time
    :param steps: the steps of the peak (every step when not exact)
    :param exact: False when the peak is the sum of every step (too many steps to compute it)
    """

    key: str
    peak_milli: int
    steps: tuple[str, ...] = ()
    exact: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key or len(self.key) > _MAX_KEY:
            raise InvalidRequestError("run_need.key", self.key, f"a run key of 1 to {_MAX_KEY} characters")
        if isinstance(self.peak_milli, bool) or not isinstance(self.peak_milli, int) or self.peak_milli < 0:
            raise InvalidRequestError(
                "run_need.peak_milli", self.peak_milli, "a milli-GPU count of at least 0"
            )

    def describe(self) -> str:
        """Return ``4.5 GPUs at once (train_a, train_b)``, with ``at most`` when not exact."""
        how = "" if self.exact else "at most "
        return f"{how}{self.peak_milli / 1000:g} GPUs at once ({', '.join(self.steps) or 'no GPU step'})"


def ordered_pairs(steps: Iterable[str], downstream: Mapping[str, Iterable[str]]) -> set[tuple[str, str]]:
    """Return the pairs ``(a, b)`` of ``steps`` such that a path leads from ``a`` to ``b``.

    :param steps: the GPU steps
    :param downstream: every task's direct downstream tasks (GPU or not: a path may pass any task)
    """
    wanted = set(steps)
    pairs: set[tuple[str, str]] = set()
    for start in wanted:
        seen: set[str] = set()
        todo = deque(downstream.get(start, ()))
        while todo:
            task = todo.popleft()
            if task in seen:
                continue
            seen.add(task)
            if task in wanted:
                pairs.add((start, task))
            todo.extend(downstream.get(task, ()))
    return pairs


def peak_need(key: str, milli: Mapping[str, int], downstream: Mapping[str, Iterable[str]]) -> RunNeed:
    """Return the run's peak concurrent need: its heaviest antichain of GPU steps.

    :param key: the run's admission scope (:attr:`RunNeed.key`)
    :param milli: each GPU step's milli-GPU (a MIG slice: its compute share)
    :param downstream: every task's direct downstream tasks
    """
    steps = sorted(s for s, m in milli.items() if m > 0)
    if len(steps) > EXACT_STEPS_LIMIT:
        return RunNeed(key, sum(milli[s] for s in steps), tuple(steps), exact=False)
    chosen = _heaviest_antichain(steps, milli, ordered_pairs(steps, downstream))
    return RunNeed(key, sum(milli[s] for s in chosen), tuple(chosen))


def quota_ceiling_milli(plan: QuotaPlan, team: str, flavors: Iterable[Flavor]) -> int | None:
    """Return the most ``team`` could ever hold at once on a node of ``flavors``; None: no quota governs it there.

    Per governed flavor: its nominal quota, plus what it may borrow (at most its borrowing limit)
    of what the rest of its cohort could lend with nothing used (each member's nominal, at most
    its lending limit), as :class:`~airflow_gpupool.governance.admission.QuotaState` admits.
    """
    if not any(q.team == team for q in plan.quotas):
        return None
    cohort_of = next((q.cohort for q in plan.quotas if q.team == team and q.cohort), None)
    limits = []
    for flavor in set(flavors):
        quotas = [q for q in plan.quotas if q.flavor == flavor]
        if not quotas:
            continue
        own = next((q for q in quotas if q.team == team), None)
        cohort = own.cohort if own is not None else cohort_of
        nominal = own.nominal_milli if own is not None else 0
        lent = sum(
            q.nominal_milli if q.lending_limit_milli is None else min(q.nominal_milli, q.lending_limit_milli)
            for q in quotas
            if cohort is not None and q.cohort == cohort and q.team != team
        )
        limit = own.borrowing_limit_milli if own is not None else None
        limits.append(nominal + (lent if limit is None else min(lent, limit)))
    return min(limits) if limits else None


def _heaviest_antichain(
    steps: list[str], milli: Mapping[str, int], before: set[tuple[str, str]]
) -> list[str]:
    """Return the heaviest antichain of ``steps`` (weighted Dilworth, see the module's docstring)."""
    n = len(steps)
    index = {s: i for i, s in enumerate(steps)}
    source, sink = 2 * n, 2 * n + 1  # node i: step i's out side; n + i: its in side
    graph = _FlowGraph(2 * n + 2)
    for i, step in enumerate(steps):
        graph.add(source, i, milli[step])
        graph.add(n + i, sink, milli[step])
    unbounded = sum(milli[s] for s in steps) + 1
    for a, b in before:
        graph.add(index[a], n + index[b], unbounded)
    graph.max_flow(source, sink)
    reached = graph.reachable(source)
    return [s for i, s in enumerate(steps) if i in reached and n + i not in reached]


class _FlowGraph:
    """A flow network with integer capacities: Dinic's maximum flow, then the residual's reach."""

    def __init__(self, size: int) -> None:
        self.edges: list[list[int]] = [[] for _ in range(size)]  # node -> indices into to/cap
        self.to: list[int] = []
        self.cap: list[int] = []

    def add(self, a: int, b: int, capacity: int) -> None:
        self.edges[a].append(len(self.to))
        self.to.append(b)
        self.cap.append(capacity)
        self.edges[b].append(len(self.to))
        self.to.append(a)
        self.cap.append(0)

    def max_flow(self, source: int, sink: int) -> int:
        total = 0
        while True:
            level = self._levels(source)
            if sink not in level:
                return total
            nxt = [0] * len(self.edges)
            pushed = self._push(source, sink, 1 << 62, level, nxt)
            while pushed:
                total += pushed
                pushed = self._push(source, sink, 1 << 62, level, nxt)

    def reachable(self, source: int) -> set[int]:
        return set(self._levels(source))

    def _levels(self, source: int) -> dict[int, int]:
        level = {source: 0}
        todo = deque([source])
        while todo:
            node = todo.popleft()
            for e in self.edges[node]:
                if self.cap[e] > 0 and self.to[e] not in level:
                    level[self.to[e]] = level[node] + 1
                    todo.append(self.to[e])
        return level

    def _push(self, node: int, sink: int, limit: int, level: dict[int, int], nxt: list[int]) -> int:
        # A level path visits each node once: at most 2 * EXACT_STEPS_LIMIT + 2 calls deep.
        if node == sink:
            return limit
        while nxt[node] < len(self.edges[node]):
            e = self.edges[node][nxt[node]]
            to = self.to[e]
            if self.cap[e] > 0 and level.get(to) == level[node] + 1:
                pushed = self._push(to, sink, min(limit, self.cap[e]), level, nxt)
                if pushed:
                    self.cap[e] -= pushed
                    self.cap[e ^ 1] += pushed
                    return pushed
            nxt[node] += 1
        return 0
