"""Which waiting requests need a new node, and of which pool (pure).

A waiting request asks the autoscaler for a node only when it fits no current node (its free
capacity, as the ledger's snapshot shows it) but fits an empty node of a scalable pool: a
request that waits for its turn, a quota or a node being freed needs no new node, and one no
pool can take would only make the autoscaler add nodes it cannot use. A gang asks as one, for
all its waiting members, when the cluster cannot take them all now.

Never more than the demand needs: requests are read in the queue's order, and a request that
fits what an earlier scale-up of this pass will add (an empty node placed on, as placement does)
rides on it instead of asking for a node of its own. Every judgement is placement's own
(:func:`~airflow_gpupool.placement.choices`, :func:`~airflow_gpupool.placement.gang.members_that_fit`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from airflow_gpupool.controller.autoscale.pools import ScalablePool
from airflow_gpupool.placement import ClusterSnapshot, NodeState, NoFitReason, choices
from airflow_gpupool.placement.accounting import allocate
from airflow_gpupool.placement.gang import members_that_fit, node_capacity
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.resources import GpuKind, GpuRequest

__all__ = ["ScaleUp", "Waiting", "scale_ups"]


@dataclass(frozen=True)
class Waiting:
    """One waiting request, or the waiting members of one gang.

    :param key: the reservation id (a gang's: its leader's), which names what is created for it
    :param request: the request (one member's shape, for a gang)
    :param count: how many of that shape wait (1, or the gang's waiting members)
    """

    key: str
    request: GpuRequest
    count: int = 1


@dataclass(frozen=True)
class ScaleUp:
    """A scale-up asked for a waiting request.

    :param key: the reservation id it is for
    :param pool: the pool whose empty node takes it
    :param request: the shape of each pod
    :param count: how many pods of that shape (a gang's members)
    :param nodes: how many empty nodes of the pool they need
    """

    key: str
    pool: ScalablePool
    request: GpuRequest
    count: int
    nodes: int


def _fits(node: NodeState, request: GpuRequest, bindings: PoolBindings) -> NodeState | None:
    """Return the node after placing ``request`` on it, or ``None`` when it does not fit."""
    options = choices(node, request, bindings)
    if isinstance(options, NoFitReason):
        return None
    return allocate(node, request, options[0])


def scale_ups(
    cluster: ClusterSnapshot,
    waiting: Iterable[Waiting],
    pools: Sequence[tuple[ScalablePool, NodeState]],
    bindings: PoolBindings = UNCONSTRAINED,
) -> list[ScaleUp]:
    """Return the scale-ups the waiting demand needs, in queue order.

    :param cluster: the ledger's snapshot of free capacity
    :param waiting: the waiting requests, in queue order
    :param pools: each scalable pool with its empty node (:func:`~.pools.empty_node`), in the
        order they are preferred
    :param bindings: the slice binding of each node pool
    """
    planned: list[NodeState] = []  # what this pass's single-request scale-ups will add
    out: list[ScaleUp] = []
    for entry in waiting:
        request = entry.request
        if request.kind is GpuKind.NONE:
            continue  # a CPU request never asks for a GPU node
        if entry.count > 1 or request.gang is not None:
            scale_up = _gang_scale_up(cluster, entry, pools, bindings)
            if scale_up is not None:
                out.append(scale_up)
            continue
        if any(_fits(node, request, bindings) is not None for node in cluster.nodes):
            continue
        for index, node in enumerate(planned):
            after = _fits(node, request, bindings)
            if after is not None:
                planned[index] = after
                break
        else:
            for pool, empty in pools:
                after = _fits(empty, request, bindings)
                if after is not None:
                    planned.append(after)
                    out.append(ScaleUp(entry.key, pool, request, 1, 1))
                    break
    return out


def _gang_scale_up(
    cluster: ClusterSnapshot,
    entry: Waiting,
    pools: Sequence[tuple[ScalablePool, NodeState]],
    bindings: PoolBindings,
) -> ScaleUp | None:
    """Return the one scale-up for all of a gang's waiting members, or ``None`` when none is needed."""
    if members_that_fit(cluster, entry.request, entry.count, bindings) >= entry.count:
        return None
    for pool, empty in pools:
        per_node, _ = node_capacity(empty, entry.request, entry.count, bindings)
        if per_node:
            return ScaleUp(entry.key, pool, entry.request, entry.count, math.ceil(entry.count / per_node))
    return None
