"""Admission of a DAG run as a whole: its first GPU step waits until the run's peak can be served.

A request reserved with a :class:`~airflow_gpupool.governance.runs.RunNeed` (an entry GPU step of a
run whose DAG or task group asks for ``gpu_admission="run"``) carries the run's key and peak on its
row (schema v23). A pass over the queue leaves it *outside* the pass, as a request its quota
refuses (it neither holds a node nor counts overtakes), until

- its run already holds a grant (another entry step of the run was admitted: one admission a run), or
- its team's quota admits the peak on the flavors of a node the step could be placed on
  (:meth:`~airflow_gpupool.governance.queue_pass.Governance.admits_milli`), for a team with quotas,
- else the free GPUs of those nodes (:class:`RunNodes`: the schedulable ones the step fits when
  empty), all together, cover the peak.

It is then placed as any request; the run's later steps reserve as usual. While such a request
waits, every write runs a pass (the gate stays closed, :attr:`RunGate.keeps_gate_closed`): a
release anywhere may admit it. A run whose peak is more than its team's quota could ever give
(:func:`~airflow_gpupool.governance.runs.quota_ceiling_milli`) or more than every GPU of those nodes
is refused when reserved (:class:`~airflow_gpupool.exceptions.RunTooLargeError`), instead of
starting and stalling half-way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_gpupool.exceptions import RunTooLargeError
from airflow_gpupool.governance.queue_pass import Governance, node_flavors
from airflow_gpupool.governance.quotas import QuotaPlan, gpu_milli_of_mig
from airflow_gpupool.governance.runs import RunNeed, quota_ceiling_milli
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.store.cache import CapacityCache
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, Tx
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.pools import PoolBindings
from airflow_gpupool.placement.queue import QueueEntry
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest

__all__ = ["RunGate", "RunNodes", "refuse_if_too_large", "run_columns"]

log = logging.getLogger(LOGGER_NAME)


def run_columns(need: RunNeed | None) -> dict[str, Any]:
    """Return the reservation row's run admission columns for ``need`` (None: a step reserved alone)."""
    if need is None:
        return {"run_key": None, "run_peak_milli": None}
    return {"run_key": need.key, "run_peak_milli": need.peak_milli}


def free_milli(nodes: Iterable[NodeState]) -> int:
    """Return the free GPU compute of the schedulable ``nodes``, free MIG slices by their share."""
    total = 0
    for node in nodes:
        if not node.schedulable:
            continue
        total += node.gpu_free_milli
        total += sum(
            gpu_milli_of_mig(profile, g.model)
            for g in node.gpus
            if g.partitioned
            for _, profile in g.mig_free
        )
    return total


@dataclass(frozen=True)
class RunNodes:
    """The nodes a run is counted on: those its first step could ever be placed on (it fits them empty).

    Its pool is their GPUs, its quota their flavors' (a node of another model or pool is none of the run's).
    """

    cache: CapacityCache
    bindings: PoolBindings

    def of(self, tx: Tx, request: GpuRequest) -> list[NodeState]:
        """Return the transaction's nodes that ``request`` (a gang: one member) fits when empty."""
        member = request.member
        empty = self.cache.empty_snapshot(tx.nodes.values()).nodes
        fits = {n.name for n in empty if isinstance(choices(n, member, self.bindings), list)}
        return [n for n in tx.nodes.values() if n.name in fits]


def refuse_if_too_large(
    nodes: Sequence[NodeState], plan: QuotaPlan | None, request: GpuRequest, need: RunNeed
) -> None:
    """Raise :class:`RunTooLargeError` if ``need``'s peak is more than its team or its ``nodes`` could ever give."""
    pool = sum(len(n.gpus) for n in nodes) * MILLI_PER_GPU
    limit, what = pool, f"the pool's {pool / MILLI_PER_GPU:g} GPUs the run's first step fits"
    if plan is not None:
        ceilings = [quota_ceiling_milli(plan, request.team, node_flavors(n)) for n in nodes]
        if ceilings and None not in ceilings:  # every node is governed for the team
            best = max(c for c in ceilings if c is not None)
            if best < limit:
                limit, what = best, f"team {request.team}'s quota (nominal plus what it may borrow)"
    if need.peak_milli > limit:
        log.warning(
            "Run %s refused: %s, more than %s (%g GPUs)", need.key, need.describe(), what, limit / 1000
        )
        raise RunTooLargeError(need.key, request.team, need.peak_milli, need.steps, limit, what)


class RunGate:
    """The waiting requests of runs admitted as a whole, for one pass over the queue.

    :param needs: per waiting request id, its run's key and peak milli-GPU
    :param holding: the run keys that hold a grant now
    """

    def __init__(self, needs: dict[str, tuple[str, int]], holding: set[str], nodes: RunNodes) -> None:
        self.needs = needs
        self.holding = holding
        self.nodes = nodes
        #: A run waits for its admission: every write must serve the queue (a release anywhere may admit it).
        self.keeps_gate_closed = any(key not in holding for key, _ in needs.values())

    @classmethod
    def read(cls, tx: Tx, rows: Sequence[Any], nodes: RunNodes) -> RunGate:
        """Return the gate of a pass over ``rows`` (the waiting rows); it reads nothing when no run waits."""
        needs = {r.id: (r.run_key, r.run_peak_milli) for r in rows if r.run_peak_milli is not None}
        if not needs:
            return cls({}, set(), nodes)
        keys = sorted({key for key, _ in needs.values()})
        return cls(needs, set(tx.conn.execute(sql.RUNS_HOLDING, {"keys": keys}).scalars().all()), nodes)

    def admitted(self, tx: Tx, entries: list[QueueEntry], quota: Governance | None) -> list[QueueEntry]:
        """Return the ``entries`` this pass may grant: those of runs not yet admitted wait outside it."""
        return [e for e in entries if not self.waits(tx, e, quota)] if self.needs else entries

    def waits(self, tx: Tx, entry: QueueEntry, quota: Governance | None) -> bool:
        """Whether ``entry`` waits outside this pass: its run is not admitted, and its peak is not served now."""
        need = self.needs.get(entry.request_id)
        if need is None or need[0] in self.holding:
            return False
        why = self.refusal(tx, entry.request_id, entry.request, quota)
        if why is None:
            log.info("Run %s admitted: its peak of %g GPUs can be served now", need[0], need[1] / 1000)
            self.holding.add(need[0])
        else:  # every pass: debug only (the task's log says it once, and explain says why)
            log.debug("Request %s waits for its run %s to be admitted: %s", entry.request_id, need[0], why)
        return why is not None

    def refusal(self, tx: Tx, rid: str, request: GpuRequest, quota: Governance | None) -> str | None:
        """Say why waiting request ``rid``'s run is not admitted now; None if it is (or ``rid`` has no run)."""
        need = self.needs.get(rid)
        if need is None or need[0] in self.holding:
            return None
        key, peak = need
        nodes = [n for n in self.nodes.of(tx, request) if n.schedulable]
        if quota is not None and request.team in quota.teams:
            if any(quota.admits_milli(request.team, n, peak) for n in nodes):
                return None
            return (
                f"its run {key} is admitted as a whole: team {request.team}'s quota does not admit "
                f"the run's peak of {peak / 1000:g} GPUs now"
            )
        free = free_milli(nodes)
        if free >= peak:
            return None
        return (
            f"its run {key} is admitted as a whole: the nodes it fits have {free / 1000:g} GPUs free, "
            f"less than the run's peak of {peak / 1000:g}"
        )
