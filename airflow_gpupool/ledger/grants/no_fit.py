"""What becomes of a request that fits no node now: refused if it never could, or queued without a pass."""

from __future__ import annotations

from collections.abc import Iterable

from airflow_gpupool.exceptions import NoCapacityError
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LedgerStore
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.gang import place_gang
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.placement.verdict import NoFit, NoFitReason
from airflow_gpupool.resources import GpuRequest

__all__ = ["refuse_if_never_fits", "waits_as_it_is"]


def refuse_if_never_fits(
    store: LedgerStore, cycle: WriteCycle, nodes: Iterable[NodeState], request: GpuRequest
) -> None:
    """Raise :class:`NoCapacityError` if ``request`` fits none of ``nodes`` even with nothing granted."""
    empty = store.cache.empty_snapshot(nodes)
    if request.gang is not None:
        gang = place_gang(empty, request, request.gang.min_members, cycle.policy, cycle.bindings)
        if isinstance(gang, NoFit):
            raise NoCapacityError(request, gang.reasons)
        return
    reasons = []
    for node in empty.nodes:
        verdict = choices(node, request, cycle.bindings)
        if not isinstance(verdict, NoFitReason):
            return
        reasons.append(verdict)
    raise NoCapacityError(request, sorted(reasons))


def waits_as_it_is(request: GpuRequest, max_overtakes: int) -> bool:
    """Whether ``request``, fitting no node, may be queued without a pass: whole GPUs or a fraction.

    Gangs, MIG slices and CPU-only requests change what the queue gate can say; with no
    overtake allowed a request is spent on arrival, and a pass holds a node for it.
    """
    simple = request.gang is None and request.mig_profile is None
    return simple and bool(request.gpus or request.gpu_milli is not None) and max_overtakes > 0
