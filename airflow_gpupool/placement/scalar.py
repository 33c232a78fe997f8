"""The default policy's costs on a few nodes, in plain Python.

A decision of the fast path (:mod:`~airflow_gpupool.placement.fast`) usually rescores a
handful of nodes, and numpy's fixed cost per call (about 90 small array operations for
candidates, fragmentation and costs) then outweighs the arithmetic. This module computes
the very same costs as :meth:`~airflow_gpupool.placement.fgd.GpuPoolPolicy.costs` with
:func:`~airflow_gpupool.placement.scored.find_candidates`' rules, one node at a time, for
the policy's shipped configuration (FGD's sigmoid band, fit tie-break) and the request kinds
without MIG. The growth reaches the cost only through the integer band of the sigmoid, so
summing the fragmentation in another order than BLAS does (a last-bit difference, rounded
away at 1e-6 like the reference does) cannot change a decision short of an exact band edge.
``tests/unit/placement/test_fast_path.py`` checks the decisions against the reference.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING, NamedTuple

from airflow_gpupool.placement.fit import EXCLUSIVE_CLASSES
from airflow_gpupool.resources import MILLI_PER_GPU, GpuKind, GpuRequest

if TYPE_CHECKING:
    from airflow_gpupool.placement.fgd import GpuPoolPolicy
    from airflow_gpupool.placement.snapshot import GpuState, NodeState

#: One node's best choice: ``(row, primary cost, secondary cost, GPU column or -1)``.
Choice = tuple[int, float, float, int]

#: The sigmoid's exponent beyond which ``exp`` overflows (numpy gives inf, the band 0).
_EXP_MAX = 700.0


def node_takes(node: NodeState, request: GpuRequest) -> bool:
    """Whether the node's health, CPU, memory, workload classes and labels admit ``request``."""
    if not node.schedulable or node.cpu_free < request.cpu_milli or node.memory_free < request.memory_mib:
        return False
    conflicting = EXCLUSIVE_CLASSES.get(request.workload_class.value)
    if conflicting is not None and conflicting in node.classes:
        return False
    return not request.node_labels or set(request.node_labels).issubset(node.labels)


def whole_gpu_takes(gpu: GpuState, request: GpuRequest) -> bool:
    """Whether ``gpu`` can be one of the whole GPUs of ``request`` (free, allowed model, memory)."""
    models, need = request.gpu_models, request.gpu_memory_mib
    return (
        not gpu.partitioned
        and gpu.free_milli == MILLI_PER_GPU
        and (not models or gpu.model in models)
        and (need is None or gpu.memory_mib >= need)
    )


class _Row(NamedTuple):
    """What the costs read of one node row."""

    i: int
    cnt: list[int]
    amount: list[int]
    free: int
    value: float
    cpu_free: int
    cpu_cap: int
    gpus: int  # GPU count × 1000, at least 1000
    pressure: float


class FewRows:
    """Scores a request on a few rows of a :class:`GpuPoolPolicy`'s synced table."""

    def __init__(self, policy: GpuPoolPolicy) -> None:
        self.policy = policy
        self._shapes_for = -1
        self._by_model: list[list[tuple[int, int, int, float]]] = []
        self._thresholds: list[int] = policy.frag.thresholds.tolist()
        # The policy's parameters are fixed for its life.
        self._r = policy.cpu_per_milli * policy.strand_ratio
        self._strand = policy.strand_weight
        self._scarce = policy.scarce_weight

    @staticmethod
    def handles(policy: GpuPoolPolicy, request: GpuRequest) -> bool:
        """Whether this module computes the policy's costs for ``request`` exactly."""
        return policy.quantize == "sigmoid" and policy.tie == "fit" and request.kind is not GpuKind.MIG

    def _shapes(self) -> list[list[tuple[int, int, int, float]]]:
        """Per node model id (last: no GPU), the GPU shapes that model serves: ``(t, cpu, gpus, p)``."""
        table, frag = self.policy.table, self.policy.frag
        if self._shapes_for != len(table.models):
            okm = frag._model_ok(table)
            shapes = list(
                zip(
                    frag._t_idx.tolist(),
                    frag._cpu.tolist(),
                    frag._num.tolist(),
                    frag._p.tolist(),
                    strict=True,
                )
            )
            self._by_model = [[s for k, s in enumerate(shapes) if okm[m, k]] for m in range(len(okm))]
            self._shapes_for = len(table.models)
        return self._by_model

    def refresh(self, rows: list[int]) -> None:
        """Recompute the policy's fragmentation arrays for ``rows``, as ``Fragmentation.refresh`` does."""
        table, frag = self.policy.table, self.policy.frag
        thresholds = self._thresholds
        top = len(thresholds)
        for i in rows:
            node = table.nodes[i]
            # A GPU with v free counts at every threshold up to v: tally it at the first one above.
            count_at = [0] * (top + 1)
            amount_at = [0] * (top + 1)
            free = 0
            for g in node.gpus:
                v = 0 if g.partitioned else g.free_milli
                if v > 0:
                    free += v
                    k = bisect_right(thresholds, v)
                    count_at[k] += 1
                    amount_at[k] += v
            cnt = [0] * top
            amount = [0] * top
            run_count = run_amount = 0
            for k in range(top - 1, -1, -1):
                run_count += count_at[k + 1]
                run_amount += amount_at[k + 1]
                cnt[k], amount[k] = run_count, run_amount
            frag.cnt[i] = cnt
            frag.amount[i] = amount
            frag.free[i] = free
            frag.value[i] = self._value(i, node.cpu_free, free, cnt, amount)

    def _value(self, i: int, cpu_free: int, free: int, cnt: list[int], amount: list[int]) -> float:
        """Return the fragmentation of row ``i``'s node in the state given, as ``Fragmentation.evaluate``."""
        frag = self.policy.frag
        if not len(frag._p):
            return free * frag.weight_total
        used = 0.0
        for t, cpu_k, num_k, p_k in self._shapes()[int(self.policy.table.node_model[i])]:
            if cpu_free >= cpu_k and cnt[t] >= num_k:
                used += amount[t] * p_k
        return free * frag.weight_total - used

    def score(self, request: GpuRequest, rows: list[int]) -> list[Choice]:
        """Return the best choice of ``request`` on each of ``rows`` where it fits."""
        out: list[Choice] = []
        for i in rows:
            best = self._best_on(request, i)
            if best is not None:
                out.append(best)
        return out

    def _best_on(self, request: GpuRequest, i: int) -> Choice | None:
        node = self.policy.table.nodes[i]
        if not node_takes(node, request):
            return None
        kind = request.kind
        if kind is GpuKind.NONE:
            return (i, *self._cost(self._row(i), 0, 0, -1, request.cpu_milli), -1)
        if kind is GpuKind.WHOLE:
            if sum(1 for g in node.gpus if whole_gpu_takes(g, request)) < request.gpus:
                return None
            return (i, *self._cost(self._row(i), 0, request.gpus, -1, request.cpu_milli), -1)
        return self._best_fraction(request, i, node)

    def _best_fraction(self, request: GpuRequest, i: int, node: NodeState) -> Choice | None:
        milli = int(request.gpu_milli or 0)
        models, need = request.gpu_models, request.gpu_memory_mib
        seen: set[int] = set()
        best: Choice | None = None
        row: _Row | None = None
        for j, g in enumerate(node.gpus):
            free = 0 if g.partitioned else g.free_milli
            if free in seen or free < milli or (models and g.model not in models):
                continue
            if need is None:
                if g.free_memory_mib < milli * g.memory_mib // MILLI_PER_GPU:
                    continue
            elif g.free_memory_mib < need or g.memory_mib < need:
                continue
            seen.add(free)  # GPUs of equal free milli cost the same: the first one stands for all
            row = row or self._row(i)
            primary, secondary = self._cost(row, milli, 0, free, request.cpu_milli)
            if best is None or (primary, secondary) < (best[1], best[2]):
                best = (i, primary, secondary, j)
        return best

    def _row(self, i: int) -> _Row:
        """Return what the costs read of row ``i``, read once for all its candidates."""
        policy, table, frag = self.policy, self.policy.table, self.policy.frag
        return _Row(
            i,
            frag.cnt[i].tolist(),
            frag.amount[i].tolist(),
            int(frag.free[i]),
            float(frag.value[i]),
            int(table.cpu_free[i]),
            max(int(table.cpu_cap[i]), 1),
            max(int(policy._gpus[i]), 1) * 1000,
            float(policy._pressure[i]),
        )

    def _cost(self, row: _Row, milli: int, whole: int, gpu_free: int, cpu: int) -> tuple[float, float]:
        """Return (primary, secondary) as ``GpuPoolPolicy.costs`` computes them, for one candidate.

        :param milli: milli taken on the GPU of a fraction, whose free milli is ``gpu_free``
        :param whole: whole GPUs taken
        """
        policy = self.policy
        gpu_milli = milli + whole * MILLI_PER_GPU
        before_free = row.free
        free = before_free - gpu_milli
        if milli:
            cnt, amount = row.cnt.copy(), row.amount.copy()
            f, f2 = gpu_free, gpu_free - milli
            for k, t in enumerate(self._thresholds):
                if f2 < t <= f:
                    cnt[k] -= 1
                amount[k] += (f2 if t <= f2 else 0) - (f if t <= f else 0)
        elif whole:
            cnt = [c - whole for c in row.cnt]
            amount = [a - whole * MILLI_PER_GPU for a in row.amount]
        else:
            cnt, amount = row.cnt, row.amount
        cpu_free = row.cpu_free
        cpu_after = cpu_free - cpu
        after = self._value(row.i, cpu_after, free, cnt, amount)
        growth = round((after - row.value) * 1e6) / 1e6
        r = self._r
        if self._strand and r > 0:
            stranded = max(before_free - gpu_milli - cpu_after / r, 0.0) - max(
                before_free - cpu_free / r, 0.0
            )
            growth = growth + self._strand * stranded
        if self._scarce:
            if r > 0:
                taken = min(before_free, cpu_free / r) - min(before_free - gpu_milli, cpu_after / r)
            else:
                taken = gpu_milli
            growth = growth + self._scarce * (row.pressure * max(taken, 0.0))
        fit = ((before_free - gpu_milli) / row.gpus + cpu_after / row.cpu_cap) / 2
        x = growth / policy.scale
        band = 0.0 if x > _EXP_MAX else float(math.trunc(100.0 / (1.0 + math.exp(x))))
        primary = -band + 0.5 * fit
        primary = primary + policy.fit_weight * fit
        return primary, float(gpu_free if milli else 0)
