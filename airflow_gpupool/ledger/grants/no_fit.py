"""What becomes of a request that fits no node now: refused if it never could, or queued without a pass.

"Never" counts the nodes an autoscaler can add: a request no node of the inventory could take,
even empty, waits when the empty node of a stored scalable pool would
(:mod:`~airflow_gpupool.ledger.store.scalable`), and the controller asks for that node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from airflow_gpupool.exceptions import NoCapacityError
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.scalable import ScalableShape, no_empty_node_fits, pool_that_fits
from airflow_gpupool.ledger.store.transactions import LedgerStore
from airflow_gpupool.placement.snapshot import NodeState
from airflow_gpupool.resources import GpuRequest

__all__ = ["refuse_if_never_fits", "waits_as_it_is"]


def refuse_if_never_fits(
    store: LedgerStore,
    cycle: WriteCycle,
    nodes: Iterable[NodeState],
    request: GpuRequest,
    scalable: Callable[[], Sequence[ScalableShape]] = tuple,
) -> str | None:
    """Raise :class:`NoCapacityError` if ``request`` fits none of ``nodes`` even with nothing granted, nor a new node.

    :param scalable: reads the stored scalable pools (only when no node of ``nodes`` would do)
    :returns: None when a node of ``nodes`` could take it; else the scalable pool it waits for
    :raises NoCapacityError: neither; the reasons name every node and pool's empty node
    """
    empty = store.cache.empty_snapshot(nodes)
    reasons = no_empty_node_fits(empty, request, cycle.policy, cycle.bindings)
    if reasons is None:
        return None
    pool, pool_reasons = pool_that_fits(scalable(), request, cycle.bindings)
    if pool is not None:
        return pool
    raise NoCapacityError(request, sorted([*reasons, *pool_reasons]))


def waits_as_it_is(request: GpuRequest, max_overtakes: int) -> bool:
    """Whether ``request``, fitting no node, may be queued without a pass: whole GPUs or a fraction.

    Gangs, MIG slices and CPU-only requests change what the queue gate can say; with no
    overtake allowed a request is spent on arrival, and a pass holds a node for it.
    """
    simple = request.gang is None and request.mig_profile is None
    return simple and bool(request.gpus or request.gpu_milli is not None) and max_overtakes > 0
