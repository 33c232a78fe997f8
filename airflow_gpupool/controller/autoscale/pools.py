"""Scalable node pools: the shape of the empty node a pool's autoscaler can add (pure).

A pool is declared in ``[gpupool] scalable_node_pools`` as JSON, one entry a pool::

    {"a100-burst": {"gpu_model": "NVIDIA-A100-SXM4-80GB", "gpus": 8, "gpu_memory_mib": 81920,
                    "cpu": "96", "memory": "1024Gi", "labels": {"gpupool.io/pool": "a100-burst"}}}

``mig`` (``{"1g.10gb": 7}``, slices of the mixed strategy) is optional. The empty node is judged
as the ledger judges a real one: the pool's shape is written as the Node that GPU Feature
Discovery and the device plugin would show, read by
:func:`~airflow_gpupool.inventory.nodes.node_from_kubernetes`, labelled with its capacity type
like every synced node, and handed to placement with everything free. So "fits an empty node of
the pool" uses placement's own rules, never a second copy of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpupool import quantity
from airflow_gpupool.exceptions import ConfigurationError, GpuPoolError, InvalidInventoryError
from airflow_gpupool.governance.capacity import with_capacity_type
from airflow_gpupool.inventory.nodes import node_from_kubernetes
from airflow_gpupool.labels import (
    COUNT_LABEL,
    GPU_RESOURCE,
    MEMORY_LABEL,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY_LABEL,
    POOL_LABEL,
    POOL_LABELS,
    PRODUCT_LABEL,
)
from airflow_gpupool.placement import GpuState, NodeState
from airflow_gpupool.resources import MIG_PROFILES, NodeInventory, normalize_labels

__all__ = ["OPTION", "ScalablePool", "empty_node", "parse_scalable_pools"]

OPTION = "[gpupool] scalable_node_pools"
_KEYS = {"gpu_model", "gpus", "gpu_memory_mib", "mig", "labels", "cpu", "memory"}


@dataclass(frozen=True)
class ScalablePool:
    """A node pool its autoscaler can grow, and the shape of one empty node of it.

    :param name: the pool's name (its nodes' pool label, unless ``labels`` name another)
    :param gpu_model: the GPU model, as GFD's ``nvidia.com/gpu.product`` says it
    :param gpus: GPUs per node
    :param gpu_memory_mib: memory of one GPU
    :param cpu: allocatable CPU of a node (a Kubernetes quantity)
    :param memory: allocatable memory of a node (a Kubernetes quantity)
    :param mig: MIG slices per profile a node advertises (mixed strategy)
    :param labels: labels its nodes carry, which the scale-up's pods select
    """

    name: str
    gpu_model: str
    gpus: int
    gpu_memory_mib: int
    cpu: str = "8"
    memory: str = "32Gi"
    mig: tuple[tuple[str, int], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def as_node(self) -> dict[str, Any]:
        """Return the Node a new, empty node of this pool would be, as GFD and the device plugin label it."""
        labels = {
            PRODUCT_LABEL: self.gpu_model,
            MEMORY_LABEL: str(self.gpu_memory_mib),
            COUNT_LABEL: str(self.gpus),
            MIG_STRATEGY_LABEL: "mixed" if self.mig else "none",
            **({} if any(k in dict(self.labels) for k in POOL_LABELS) else {POOL_LABEL: self.name}),
            **dict(self.labels),
        }
        allocatable = {"cpu": self.cpu, "memory": self.memory, GPU_RESOURCE: str(self.gpus)}
        allocatable.update({f"{MIG_RESOURCE_PREFIX}{p}": str(n) for p, n in self.mig})
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"{self.name}-empty", "labels": labels},
            "spec": {},
            "status": {
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }


def empty_node(pool: ScalablePool, spot_pools: frozenset[str] = frozenset()) -> NodeState:
    """Return an empty node of ``pool`` as placement sees it, everything free.

    :param pool: the pool
    :param spot_pools: node pools configured as spot (``[gpupool] spot_node_pools``)
    """
    inventory = node_from_kubernetes(pool.as_node())
    assert inventory is not None  # a pool has GPUs: checked when parsed
    return _all_free(with_capacity_type(inventory, spot_pools))


def _all_free(node: NodeInventory) -> NodeState:
    gpus = tuple(
        GpuState(
            index=g.index,
            model=g.model,
            memory_mib=g.memory_mib,
            mig_free=tuple(sorted((s.slice_id, s.profile) for s in g.mig_slices)),
            partitioned=bool(g.mig_slices),
        )
        for g in node.gpus
    )
    return NodeState(
        node.name, node.cpu_milli, node.memory_mib, gpus, labels=node.labels, node_pool=node.node_pool
    )


def parse_scalable_pools(text: str) -> tuple[ScalablePool, ...]:
    """Read ``[gpupool] scalable_node_pools``; empty text declares none.

    :param text: the option's JSON
    :raises ConfigurationError: bad JSON or a bad entry; the message names the pool and key
    """
    if not text.strip():
        return ()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigurationError(
            f'{OPTION}: not valid JSON ({e}); expected {{"pool": {{"gpus": 8, ...}}}}'
        ) from None
    if not isinstance(data, Mapping):
        raise ConfigurationError(
            f"{OPTION}: expected a JSON object of pool name to shape, got {type(data).__name__}"
        )
    return tuple(_pool(str(name), entry) for name, entry in data.items())


def _pool(name: str, entry: Any) -> ScalablePool:
    where = f"{OPTION} {name!r}"
    if not isinstance(entry, Mapping):
        raise ConfigurationError(f"{where}: expected an object with gpu_model, gpus and gpu_memory_mib")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise ConfigurationError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(_KEYS)}")
    for key in ("gpu_model", "gpus", "gpu_memory_mib"):
        if key not in entry:
            raise ConfigurationError(f"{where}: missing key {key!r}")
    _check_values(where, entry)
    gpus, memory, mig = entry["gpus"], entry["gpu_memory_mib"], entry.get("mig") or {}
    try:
        labels = normalize_labels("labels", entry.get("labels"), InvalidInventoryError)
        pool = ScalablePool(
            name=name,
            gpu_model=str(entry["gpu_model"]),
            gpus=gpus,
            gpu_memory_mib=memory,
            cpu=str(entry.get("cpu", "8")),
            memory=str(entry.get("memory", "32Gi")),
            mig=tuple(sorted((str(p), int(n)) for p, n in mig.items())),
            labels=labels,
        )
        empty_node(pool)
    except (GpuPoolError, ValueError, TypeError) as e:
        raise ConfigurationError(f"{where}: {e}") from None
    return pool


def _check_values(where: str, entry: Mapping[str, Any]) -> None:
    """Refuse a pool entry's counts, MIG profiles or quantities, naming the key.

    :param where: the option and pool, for messages
    :param entry: the pool's entry
    """
    gpus, memory = entry["gpus"], entry["gpu_memory_mib"]
    for key, value, low in (("gpus", gpus, 1), ("gpu_memory_mib", memory, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigurationError(f"{where}.{key}: {value!r} is not an integer of at least {low}")
    mig = entry.get("mig") or {}
    if not isinstance(mig, Mapping) or any(p not in MIG_PROFILES for p in mig):
        raise ConfigurationError(
            f"{where}.mig: {mig!r}; expected profile counts among {sorted(MIG_PROFILES)}"
        )
    for key in ("cpu", "memory"):
        if key in entry:
            try:
                quantity.parse_quantity(str(entry[key]))
            except (ValueError, GpuPoolError):
                raise ConfigurationError(
                    f"{where}.{key}: {entry[key]!r} is not a Kubernetes quantity"
                ) from None
