"""Fragmentation-aware policies: ``fgd`` (the paper's) and ``gpupool`` (the project default).

Both need the workload's typical shapes (:func:`~airflow_gpupool.placement.frag.typical_shapes`
of a trace, in the simulator). They are fixed for the policy's life and never learned from the
requests placed: two workers sharing a ledger must score the same cluster the same way, so the
ledger's policy gets them from ``[gpupool] typical_shapes`` through
:func:`~airflow_gpupool.placement.policy.get_policy`. Given none, a policy uses
:data:`~airflow_gpupool.placement.frag.DEFAULT_SHAPES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from airflow_gpupool.placement.fast import FEW_ROWS, FewScorer
from airflow_gpupool.placement.frag import DEFAULT_SHAPES, Fragmentation, TypicalShape
from airflow_gpupool.placement.policy import register
from airflow_gpupool.placement.scalar import FewRows
from airflow_gpupool.placement.scored import Candidates, ScoredPolicy, first_per_free_value
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.resources import GpuKind, GpuRequest


class FragmentationPolicy(ScoredPolicy):
    """Base of the policies that score the growth of fragmentation.

    :param typical_shapes: the workload's typical shapes (None:
        :data:`~airflow_gpupool.placement.frag.DEFAULT_SHAPES`)
    :param seed: seed of the node order that breaks ties
    """

    name = "fragmentation"

    def __init__(
        self,
        *,
        typical_shapes: Sequence[TypicalShape] | None = None,
        seed: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(seed=seed, **options)
        self.frag = self.fragmentation(DEFAULT_SHAPES if typical_shapes is None else tuple(typical_shapes))

    def fragmentation(self, shapes: Sequence[TypicalShape]) -> Fragmentation:
        """Return the fragmentation measure this policy minimizes for ``shapes``."""
        return Fragmentation(shapes)

    def sync(self, snapshot: ClusterSnapshot) -> np.ndarray | None:
        """Sync the table and the per-node fragmentation of the changed nodes."""
        changed = super().sync(snapshot)
        self.refresh_fragmentation(changed)
        return changed

    def refresh_fragmentation(self, changed: np.ndarray | None) -> None:
        """Recompute the fragmentation of the ``changed`` rows (None: of every row)."""
        self.frag.refresh(self.table, changed)

    def reduce(self, cand: Candidates) -> Candidates:
        """Score one GPU per distinct free value on each node."""
        return first_per_free_value(self.table, cand)

    def growth(self, cand: Candidates) -> np.ndarray:
        """Return how much each candidate's node fragmentation grows, in milli-GPU."""
        milli = cand.milli if cand.kind is GpuKind.FRACTION else 0
        after = self.frag.after(self.table, cand.node, cand.gpu, milli, cand.whole, cand.cpu)
        # Rounded so that equal nodes tie exactly whatever order BLAS summed them in.
        out: np.ndarray = np.round(after - self.frag.value[cand.node], 6)
        return out


@register("fgd")
class FgdPolicy(FragmentationPolicy):
    """Fragmentation gradient descent: where the expected fragmentation grows least.

    Scores as the paper's simulator does, ``int(100 · sigmoid(−growth / 1000))`` (so close
    growths tie and the seeded node order decides); a fraction goes to the GPU with the best
    score, the lowest index among equals.
    """

    name = "fgd"

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return minus the integer FGD score, and no GPU preference beyond it."""
        score = np.trunc(100.0 / (1.0 + np.exp(self.growth(cand) / 1000.0)))
        return -score, np.zeros(len(cand))


@register("gpupool")
class GpuPoolPolicy(FragmentationPolicy):
    """The project default: FGD's score of fragmentation growth plus the GPU capacity it strands.

    Five changes to FGD, each measured (benchmarks/README.md):

    - a node's free GPU milli is usable only as far as its free CPU lasts at the typical
      shapes' CPU per GPU milli; the growth of the *stranded* rest (free GPU milli beyond
      what the CPU left can feed) is added to the fragmentation growth, ``strand_weight``
      times, before the score band is taken. It sends CPU-only and CPU-heavy pods to
      nodes with CPU to spare and keeps CPU on GPU-dense nodes (+0.5 points on the
      default trace);
    - the typical shapes are weighted 70 % by frequency and 30 % by GPU demand, so keeping
      room for rare multi-GPU tasks counts for what failing them costs;
    - among nodes in the same score band (FGD's sigmoid score), the fuller node (CPU and
      GPU left, as a share of the node) wins before the seeded order decides;
    - a fraction goes to the fullest GPU among those that score best;
    - capacity that only some typical shapes can use (a GPU model that a third of the
      work is constrained to, the only nodes with CPU for an 8-GPU task) is *needed*: the
      node's pressure (:meth:`node_pressure`) times what the placement takes there (GPU milli
      plus the GPU milli its CPU would feed) is added to the growth, ``scarce_weight`` times.
      Without it the stranding term and the fit tie-break fill the scarce nodes with work
      that fits anywhere, and FGD wins at 50-100 % arrived on model-constrained traces.
      The pressure also counts the requests too rare to be typical but as big as a whole node
      of each kind (:meth:`_whole_node_pressure`, ``whole_node_weight``): without them the
      CPU-rich 8-GPU nodes, the only ones with 120 cores for an 8-GPU task, fill with 1-GPU
      work by 83 % arrived on the default trace and such a task fails where FGD places it.

    Scoring the exact growth instead of the band was measured worse (benchmarks/README.md): the
    band's randomization among near-equal nodes spreads risk across node types.

    :param strand_weight: weight of the stranded-capacity growth (0: FGD's growth only)
    :param strand_ratio: multiplier of the typical CPU per GPU milli the stranding assumes
    :param fit_weight: weight of a best-fit term added across bands (0: inside bands only)
    :param demand_mix: share of the shape weights given by GPU demand instead of frequency
    :param quantize: ``sigmoid`` for FGD's integer score bands, ``none`` for exact growth
    :param bin_milli: with ``quantize="none"``, width of linear bands (0: none)
    :param tie: ``fit`` (fuller node first inside a band), ``growth`` or ``none``
    :param scale: milli-GPU of growth per unit of the sigmoid
    :param scarce_weight: weight of the needed capacity a placement takes (0: ignore scarcity)
    :param whole_node_weight: share of the shape weights given to one whole-node request per
        kind of node in the pressure (0: typical shapes only)
    """

    name = "gpupool"
    fast_default = True

    def __init__(
        self,
        *,
        strand_weight: float = 2.0,
        strand_ratio: float = 1.0,
        fit_weight: float = 0.0,
        demand_mix: float = 0.3,
        quantize: str = "sigmoid",
        bin_milli: float = 0.0,
        tie: str = "fit",
        scale: float = 1000.0,
        scarce_weight: float = 1.0,
        whole_node_weight: float = 0.2,
        **options: Any,
    ) -> None:
        self.whole_node_weight = float(whole_node_weight)
        self.strand_weight = float(strand_weight)
        self.strand_ratio = float(strand_ratio)
        self.cpu_per_milli = 0.0
        self.scale = float(scale)
        self.fit_weight = float(fit_weight)
        self.demand_mix = float(demand_mix)
        self.quantize = quantize
        self.bin_milli = float(bin_milli)
        self.tie = tie
        self.scarce_weight = float(scarce_weight)
        super().__init__(**options)
        self._gpus = np.zeros(0, dtype=np.int64)
        self._pressure = np.zeros(1)
        self._few = FewRows(self)

    def few_rows(self, request: GpuRequest) -> FewScorer | None:
        """Score a few rows in plain Python where :mod:`~airflow_gpupool.placement.scalar` can."""
        return self._few.score if FewRows.handles(self, request) else None

    def fragmentation(self, shapes: Sequence[TypicalShape]) -> Fragmentation:
        """Weigh shapes by a mix of their frequency and their GPU demand.

        Also derives the CPU per GPU milli of the typical GPU shapes (by frequency), the
        rate at which :meth:`stranded_growth` converts free CPU into usable GPU milli.
        """
        self.cpu_per_milli = cpu_per_gpu_milli(shapes)
        total = sum(s.weight for s in shapes) or 1.0
        demand = sum(s.weight * s.gpu_milli * s.gpus for s in shapes) or 1.0
        mix = self.demand_mix
        return Fragmentation(
            tuple(
                replace(
                    s, weight=(1 - mix) * s.weight / total + mix * s.weight * s.gpu_milli * s.gpus / demand
                )
                for s in shapes
            )
        )

    def sync(self, snapshot: ClusterSnapshot) -> np.ndarray | None:
        """Sync the table, the fragmentation and the GPU count of the changed nodes."""
        changed = super().sync(snapshot)
        if changed is None or len(self._gpus) != self.table.size:
            self._gpus = self.table.gpu_count()
            self._pressure = self.node_pressure()
        elif len(changed):
            nodes = self.table.nodes
            rows = changed.tolist()
            counts = self._gpus[changed].tolist()
            if any(len(nodes[i].gpus) != n for i, n in zip(rows, counts, strict=True)):
                # A node's GPUs changed: what fits where too, so every node's cost may have changed.
                self._gpus[changed] = [len(nodes[i].gpus) for i in rows]
                self._pressure = self.node_pressure()
                return None
        return changed

    def refresh_fragmentation(self, changed: np.ndarray | None) -> None:
        """Recompute the changed rows' fragmentation, a few of them in plain Python."""
        if (
            self.fast
            and changed is not None
            and 0 < len(changed) <= FEW_ROWS
            and len(self.frag.value) == self.table.size
        ):
            self._few.refresh(changed.tolist())
        else:
            super().refresh_fragmentation(changed)

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return the banded growth (fragmentation plus stranding) with the fit tie-break, and the GPU's free milli."""
        t = self.table
        growth = self.growth(cand)
        if self.strand_weight:
            growth = growth + self.strand_weight * self.stranded_growth(cand)
        if self.scarce_weight:
            growth = growth + self.scarce_weight * self.scarce_taken(cand)
        gpus = np.maximum(self._gpus[cand.node], 1) * 1000
        gpu_left = (self.frag.free[cand.node] - cand.gpu_milli) / gpus
        cpu_left = (t.cpu_free[cand.node] - cand.cpu) / np.maximum(t.cpu_cap[cand.node], 1)
        fit = (gpu_left + cpu_left) / 2
        if self.quantize == "sigmoid":
            primary = -np.trunc(100.0 / (1.0 + np.exp(growth / self.scale)))
        elif self.bin_milli > 0:
            primary = np.floor(growth / self.bin_milli)
        else:
            primary = growth
        if self.tie == "fit":
            primary = primary + 0.5 * fit
        elif self.tie == "growth":
            primary = primary + 0.5 / (1.0 + np.exp(-growth / 1000.0))
        primary = primary + self.fit_weight * fit
        return primary, self.best_fit_gpu(cand)

    def scarce_taken(self, cand: Candidates) -> np.ndarray:
        """Return the needed capacity each candidate takes, in milli-GPU.

        A node's usable GPU capacity is its free GPU milli as far as its free CPU feeds it
        (at the typical CPU per GPU milli, see :meth:`stranded_growth`); what a placement
        takes is how much that shrinks, times the node's pressure (:meth:`node_pressure`).
        CPU taken from a node with CPU to spare takes nothing.
        """
        free = self.frag.free[cand.node]
        cpu = self.table.cpu_free[cand.node]
        r = self.cpu_per_milli * self.strand_ratio
        if r > 0:
            before = np.minimum(free, cpu / r)
            after = np.minimum(free - cand.gpu_milli, (cpu - cand.cpu) / r)
        else:
            before, after = free, free - cand.gpu_milli
        out: np.ndarray = self._pressure[cand.node] * np.maximum(before - after, 0.0)
        return out

    def node_pressure(self) -> np.ndarray:
        """Return how much of each node only some typical shapes can use, in [0, 1] per node.

        A typical shape fits, when empty, only the nodes with enough CPU, GPUs and an accepted
        GPU model; its GPU demand falls on their capacity alone: each such node gets
        ``weight · demand / capacity of the nodes it fits``. A shape that fits every node adds
        the same to all of them and changes no ranking; one that fits few (a GPU model, eight
        GPUs with 120 cores) marks those few as needed. Placing other work there takes what that
        shape can get nowhere else, so it costs more. Normalized: 0 the least, 1 the most needed.

        It reads the nodes the policy is given: the simulator's whole cluster; in the ledger,
        one node per equivalence class, so there it weighs classes, not node counts.
        """
        t = self.table
        shapes = [s for s in self.frag.shapes if s.gpus > 0]
        if not shapes or t.size == 0:
            return np.zeros(t.size)
        total = sum(s.weight for s in self.frag.shapes) or 1.0
        gpus = self._gpus.astype(np.float64)
        pressure = np.zeros(t.size)
        for shape in shapes:
            fits = (t.cpu_cap >= shape.cpu_milli) & (self._gpus >= shape.gpus)
            if shape.models:
                fits &= t.allowed_models(shape.models)[t.node_model]
            capacity = float(gpus[fits].sum())
            if capacity > 0:
                pressure[fits] += shape.weight / total * shape.gpu_milli * shape.gpus / (capacity * 1000)
        pressure += self._whole_node_pressure(gpus)
        low, high = float(pressure.min()), float(pressure.max())
        out: np.ndarray = (pressure - low) / (high - low) if high > low else np.zeros(t.size)
        return out

    def _whole_node_pressure(self, gpus: np.ndarray) -> np.ndarray:
        """Return the pressure of the rare requests as big as a whole node of each kind.

        The typical shapes leave out the rarest requests, and the biggest of them (8 GPUs with
        120 cores on the default trace: 0.06 % of the pods) fit only the few biggest nodes.
        Each kind of node (CPU, GPUs) stands for one such request, ``whole_node_weight`` shared
        among the kinds; its demand falls on the nodes that can host it, like a typical shape's.
        """
        t = self.table
        pressure = np.zeros(t.size)
        if not self.whole_node_weight:
            return pressure
        kinds = sorted(
            {(c, g) for c, g in zip(t.cpu_cap.tolist(), self._gpus.tolist(), strict=True) if g > 0}
        )
        for cpu, count in kinds:
            fits = (t.cpu_cap >= cpu) & (self._gpus >= count)
            capacity = float(gpus[fits].sum())
            pressure[fits] += self.whole_node_weight / len(kinds) * count / capacity
        return pressure

    def stranded_growth(self, cand: Candidates) -> np.ndarray:
        """Return how much each candidate grows its node's stranded GPU milli.

        A node's free GPU milli is usable only as far as its free CPU lasts at the typical
        shapes' CPU per GPU milli; the rest is stranded: ``max(free − cpu_free / r, 0)``.
        A CPU-only pod on a node with CPU to spare strands nothing; on a GPU-dense node
        whose CPU is short it strands what its CPU would have fed.
        """
        r = self.cpu_per_milli * self.strand_ratio
        if r <= 0:
            return np.zeros(len(cand))
        free = self.frag.free[cand.node]
        cpu = self.table.cpu_free[cand.node]
        before = np.maximum(free - cpu / r, 0.0)
        after = np.maximum(free - cand.gpu_milli - (cpu - cand.cpu) / r, 0.0)
        out: np.ndarray = after - before
        return out


def cpu_per_gpu_milli(shapes: Sequence[TypicalShape]) -> float:
    """Return the CPU milli per GPU milli of the GPU shapes, by frequency (0: no GPU shape)."""
    gpu = [s for s in shapes if s.gpus > 0]
    milli = sum(s.weight * s.gpu_milli * s.gpus for s in gpu)
    return sum(s.weight * s.cpu_milli for s in gpu) / milli if milli else 0.0
