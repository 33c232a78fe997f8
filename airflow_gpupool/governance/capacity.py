"""Headroom for urgent work, and on-demand versus spot capacity: which requests may use what.

**Headroom.** Per pool, a share of capacity (``headroom_share``, default 0.2; 0 turns it off)
that only urgent requests may use: priority at or above ``urgent_priority``, or the
``inference`` class. Others are placed only while the pool keeps that share free, unless the
pool *lends* its headroom to preemptible work (``lendable``): urgent work then takes it back by
preemption, so the headroom is not idle while no urgent work waits (what keeps allocation up
when urgent work is a small part of the load), at the cost of a victim's grace in urgent wait.
Nothing else may hold it: work that is neither urgent nor on loan stays out of it even while its
team is within its nominal quota, because capacity urgent work cannot take back is not headroom
(a team with nominal 8 on an 8-GPU pool with 25 % headroom could otherwise fill all 8 GPUs with
non-preemptible priority-0 work, and urgent and inference requests then wait). Nominal quotas of
a pool that add up to more than the pool less its headroom therefore promise what non-urgent work
cannot always get: ``gpupool quota apply`` warns (:func:`headroom_overcommit`).

**Spot.** A node pool is spot or on-demand, read from the labels cloud providers and Karpenter
set (``karpenter.sh/capacity-type``, ``cloud.google.com/gke-spot``, ``eks.amazonaws.com/capacityType``).
A request says ``capacity="on-demand" | "spot" | "any"``; by default (:func:`default_capacity`)
urgent work never goes to spot, and checkpointed, preemptible training prefers spot when it is
cheap enough for how long it runs: a price ratio to on-demand under 0.6 for less than an hour,
under 0.4 for longer (a long run on spot is evicted more often, so it must save more). Everything
else may use either.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import replace
from enum import Enum

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
from airflow_gpupool.resources import GpuRequest, NodeInventory

__all__ = [
    "CLOUD_CAPACITY_LABELS",
    "Capacity",
    "CapacityType",
    "apply_capacity",
    "capacity_type",
    "choose_capacity",
    "default_capacity",
    "fits_headroom",
    "headroom_overcommit",
    "is_urgent",
    "names_capacity",
    "with_capacity_type",
]

#: The labels Karpenter, GKE and EKS put on a node to say how it is bought.
CLOUD_CAPACITY_LABELS = (
    "karpenter.sh/capacity-type",
    "cloud.google.com/gke-spot",
    "eks.amazonaws.com/capacityType",
)

#: Below this price ratio (spot over on-demand), a run of under an hour prefers spot.
SHORT_RUN_RATIO = 0.6
#: Below this ratio, a run of an hour or more prefers spot.
LONG_RUN_RATIO = 0.4
_HOUR = 3600.0


class CapacityType(str, Enum):
    """How a node pool's nodes are bought."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"


class Capacity(str, Enum):
    """What a request may run on."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    ANY = "any"

    @classmethod
    def of(cls, value: str) -> Capacity:
        """Read a request's ``capacity`` argument.

        :raises InvalidRequestError: not one of on-demand, spot, any
        """
        try:
            return cls(value)
        except ValueError:
            raise InvalidRequestError("capacity", value, "one of on-demand, spot, any") from None


def capacity_type(
    labels: Mapping[str, str], *, node_pool: str | None = None, spot_pools: Collection[str] = ()
) -> CapacityType:
    """Return whether a node is spot (default on-demand).

    Its own ``gpupool.io/capacity-type`` label wins; then a node pool configured as spot; then
    the labels Karpenter, GKE and EKS put on it.

    :param labels: the node's labels
    :param node_pool: the node's pool
    :param spot_pools: node pools configured as spot (``[gpupool] spot_node_pools``)
    """
    own = labels.get(CAPACITY_TYPE_LABEL, "").lower()
    if own in (CapacityType.SPOT.value, CapacityType.ON_DEMAND.value):
        return CapacityType(own)
    if node_pool is not None and node_pool in spot_pools:
        return CapacityType.SPOT
    karpenter_label, gke_label, eks_label = CLOUD_CAPACITY_LABELS
    karpenter = labels.get(karpenter_label, "").lower()
    gke = labels.get(gke_label, "").lower()
    eks = labels.get(eks_label, "").upper()
    if karpenter == "spot" or gke == "true" or eks == "SPOT":
        return CapacityType.SPOT
    return CapacityType.ON_DEMAND


def with_capacity_type(node: NodeInventory, spot_pools: Collection[str] = ()) -> NodeInventory:
    """Return the node with its ``gpupool.io/capacity-type`` label set (what :func:`capacity_type` says).

    :param node: a node as inventory sync or a static file describes it
    :param spot_pools: node pools configured as spot
    """
    labels = dict(node.labels)
    kind = capacity_type(labels, node_pool=node.node_pool, spot_pools=spot_pools).value
    if labels.get(CAPACITY_TYPE_LABEL) == kind:
        return node
    labels[CAPACITY_TYPE_LABEL] = kind
    return replace(node, labels=tuple(sorted(labels.items())))


def is_urgent(priority: int, workload_class: str, urgent_priority: int) -> bool:
    """Return whether a request may use the headroom (and never runs on spot by default)."""
    return priority >= urgent_priority or workload_class == "inference"


def fits_headroom(
    capacity_milli: int,
    free_milli: int,
    request_milli: int,
    share: float,
    *,
    urgent: bool,
    lendable: bool = False,
) -> bool:
    """Return whether a request may take ``request_milli`` of a pool with ``free_milli`` free.

    :param share: the pool's headroom share, 0 to 1 (0: no headroom)
    :param urgent: the request may use the headroom
    :param lendable: the pool lends its headroom to this request (it is preemptible: a loan)
    :raises InvalidRequestError: ``share`` outside [0, 1]
    """
    if (
        isinstance(share, bool)
        or not isinstance(share, int | float)
        or not math.isfinite(share)
        or not 0 <= share <= 1
    ):
        raise InvalidRequestError("headroom share", share, "a number from 0 to 1")
    if urgent or lendable:
        return request_milli <= free_milli
    return free_milli - request_milli >= math.ceil(share * capacity_milli)


def headroom_overcommit(pool: str, nominal_milli: int, capacity_milli: int, share: float) -> str | None:
    """Say when a pool's nominal quotas add up to more than the pool less its headroom (None: they do not).

    Work that is not urgent cannot use the headroom outright, so such quotas promise it capacity it
    cannot always get. Not an error: urgent work counts against nominal quotas too.

    :param pool: the node pool
    :param nominal_milli: the nominal quotas of the pool's flavor, added up
    :param capacity_milli: the pool's milli-GPU
    :param share: the pool's headroom share, 0 to 1
    """
    outside = capacity_milli - math.ceil(share * capacity_milli)
    if not share or nominal_milli <= outside:
        return None
    return (
        f"pool {pool}: nominal quotas add up to {nominal_milli / 1000:g} GPUs, above the {outside / 1000:g} GPUs "
        f"outside its {share:.0%} headroom: work that is not urgent may wait within its nominal"
    )


def default_capacity(
    *,
    urgent: bool,
    checkpointed: bool,
    preemptible: bool,
    workload_class: str,
    price_ratio: float | None,
    expected_seconds: float | None,
) -> Capacity:
    """Return where a request runs when it does not say: the rule in the module docstring.

    :param price_ratio: the spot pool's price over on-demand (None: unknown, no preference)
    :param expected_seconds: how long the run is expected to take (None: unknown, taken as long)
    """
    if urgent:
        return Capacity.ON_DEMAND
    if not (checkpointed and preemptible and workload_class == "training") or price_ratio is None:
        return Capacity.ANY
    limit = SHORT_RUN_RATIO if expected_seconds is not None and expected_seconds < _HOUR else LONG_RUN_RATIO
    return Capacity.SPOT if price_ratio < limit else Capacity.ANY


def names_capacity(node_labels: Collection[tuple[str, str]]) -> bool:
    """Return whether a request's own node labels choose the capacity type (ours or a cloud's label).

    Such a request keeps its choice: the default rule adds nothing beside it.
    """
    return any(key == CAPACITY_TYPE_LABEL or key in CLOUD_CAPACITY_LABELS for key, _ in node_labels)


def choose_capacity(
    request: GpuRequest,
    capacity: Capacity | None,
    *,
    checkpointed: bool,
    expected_seconds: float | None,
    urgent_priority: int,
    price_ratio: float | None,
) -> tuple[Capacity, bool]:
    """Return where a request runs and whether that is required (False: only preferred).

    :param request: the request (priority, class, preemptibility)
    :param capacity: what the task asked for, or None for :func:`default_capacity`
    :param checkpointed: whether the work writes checkpoints (its retry resumes)
    :param expected_seconds: how long a run is expected to take (None: unknown, taken as long)
    :param urgent_priority: the priority at and above which work is urgent
    :param price_ratio: spot's price over on-demand's (None: unknown)
    """
    if capacity is not None:
        return capacity, True
    chosen = default_capacity(
        urgent=is_urgent(request.priority, request.workload_class.value, urgent_priority),
        checkpointed=checkpointed,
        preemptible=request.preemptible,
        workload_class=request.workload_class.value,
        price_ratio=price_ratio,
        expected_seconds=expected_seconds,
    )
    return chosen, chosen is Capacity.ON_DEMAND


def apply_capacity(
    request: GpuRequest,
    capacity: Capacity | None,
    *,
    checkpointed: bool,
    expected_seconds: float | None,
    urgent_priority: int,
    price_ratio: float | None,
) -> GpuRequest:
    """Return the request with its capacity as a ``gpupool.io/capacity-type`` node label.

    Required (``node_labels``) or preferred (``prefer_node_labels``); nothing for ``any``. A request
    whose own node labels choose the capacity type (:func:`names_capacity`) is kept as it is when
    ``capacity`` is None. The parameters are :func:`choose_capacity`'s.
    """
    if capacity is None and names_capacity(request.node_labels):
        return request
    chosen, required = choose_capacity(
        request,
        capacity,
        checkpointed=checkpointed,
        expected_seconds=expected_seconds,
        urgent_priority=urgent_priority,
        price_ratio=price_ratio,
    )
    if chosen is Capacity.ANY:
        return request
    label = (CAPACITY_TYPE_LABEL, chosen.value)
    if required:
        return replace(request, node_labels=(*_without_capacity(request.node_labels), label))
    return replace(request, prefer_node_labels=(*_without_capacity(request.prefer_node_labels), label))


def _without_capacity(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(pair for pair in labels if pair[0] != CAPACITY_TYPE_LABEL)
