"""Node pools for the emulated cluster, each advertising what its slice binding needs.

A binding (:mod:`airflow_gpupool.binding`) turns a grant into pod resources; the scheduler can
only place the pod when the node advertises those resources. These builders make nodes that do:

* :func:`whole_gpu_pool`: ``nvidia.com/gpu`` (binding ``whole``);
* :func:`mig_pool`: ``nvidia.com/mig-<profile>`` per slice, GFD's mixed strategy (``mig``);
* :func:`hami_pool`: ``nvidia.com/gpu`` plus HAMi's ``nvidia.com/gpumem`` (MiB) and
  ``nvidia.com/gpucores`` (percent), which HAMi's device plugin adds (``hami``);
* :func:`kai_pool`: ``nvidia.com/gpu`` and KAI's node-pool label (``kai``; the emulated
  scheduler places ``kai-scheduler`` pods as KAI would).

Each returns a :class:`GpuPool`; :class:`~airflow_gpupool.testkit.cluster.GpuCluster` turns a
list of them into nodes plus the connection's ``node_pool_bindings``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from airflow_gpupool.labels import HAMI_CORES_RESOURCE, HAMI_MEMORY_RESOURCE
from airflow_gpupool.testing.cluster.nodes import gpu_node

A100 = "NVIDIA-A100-SXM4-80GB"
T4 = "Tesla-T4"
KAI_NODE_POOL_LABEL = "kai.scheduler/node-pool"


@dataclasses.dataclass(frozen=True)
class GpuPool:
    """A node pool: its nodes and the binding its slices are given through.

    :param name: the node pool (``gpupool.io/pool`` label)
    :param binding: the binding strategy for the pool (``whole``, ``mig``, ``hami``, ``kai``)
    :param nodes: the Node objects
    """

    name: str
    binding: str
    nodes: tuple[dict[str, Any], ...]


def _names(pool: str, nodes: int) -> list[str]:
    """Return node names ``<pool>-0``, ``<pool>-1``...

    :param pool: the pool name
    :param nodes: how many
    """
    if nodes < 1:
        raise ValueError(f"node pool {pool!r} needs at least one node, got nodes={nodes}")
    return [f"{pool}-{i}" for i in range(nodes)]


def whole_gpu_pool(
    name: str,
    *,
    nodes: int = 1,
    gpus: int = 8,
    product: str = A100,
    memory_mib: int = 81920,
    **node_args: Any,
) -> GpuPool:
    """Return a pool of nodes handing out whole GPUs (``nvidia.com/gpu``).

    :param name: the pool's name, and its nodes' name prefix
    :param nodes: how many nodes
    :param gpus: GPUs per node
    :param product: GFD product label
    :param memory_mib: memory of one GPU
    :param node_args: more :func:`~airflow_gpupool.testing.gpu_node` arguments (taints, labels...)
    """
    built = [
        gpu_node(n, gpus=gpus, product=product, memory_mib=memory_mib, pool=name, **node_args)
        for n in _names(name, nodes)
    ]
    return GpuPool(name, "whole", tuple(built))


def mig_pool(
    name: str,
    *,
    nodes: int = 1,
    gpus: int = 1,
    slices: Mapping[str, int] | None = None,
    product: str = A100,
    memory_mib: int = 81920,
    **node_args: Any,
) -> GpuPool:
    """Return a pool of MIG-partitioned nodes (mixed strategy: ``nvidia.com/mig-<profile>``).

    :param name: the pool's name
    :param nodes: how many nodes
    :param gpus: physical GPUs per node, all partitioned alike
    :param slices: MIG slices of one GPU per profile (default seven ``1g.10gb``)
    :param product: GFD product label
    :param memory_mib: memory of one GPU
    :param node_args: more :func:`~airflow_gpupool.testing.gpu_node` arguments
    """
    per_gpu = dict(slices or {"1g.10gb": 7})
    mig = {profile: count * gpus for profile, count in per_gpu.items()}
    built = [
        gpu_node(n, gpus=gpus, product=product, memory_mib=memory_mib, mig=mig, pool=name, **node_args)
        for n in _names(name, nodes)
    ]
    return GpuPool(name, "mig", tuple(built))


def hami_pool(
    name: str, *, nodes: int = 1, gpus: int = 2, product: str = T4, memory_mib: int = 15360, **node_args: Any
) -> GpuPool:
    """Return a pool of GPUs shared through HAMi: ``nvidia.com/gpumem`` and ``nvidia.com/gpucores`` advertised.

    Without those two resources on the node, a HAMi-bound pod cannot be scheduled (the scheduler
    says ``Insufficient nvidia.com/gpucores``): HAMi's device plugin advertises them, so do these nodes.

    :param name: the pool's name
    :param nodes: how many nodes
    :param gpus: GPUs per node
    :param product: GFD product label
    :param memory_mib: memory of one GPU
    :param node_args: more :func:`~airflow_gpupool.testing.gpu_node` arguments
    """
    built = []
    for n in _names(name, nodes):
        node = gpu_node(n, gpus=gpus, product=product, memory_mib=memory_mib, pool=name, **node_args)
        shared = {HAMI_MEMORY_RESOURCE: str(gpus * memory_mib), HAMI_CORES_RESOURCE: str(gpus * 100)}
        node["status"]["allocatable"].update(shared)
        node["status"]["capacity"].update(shared)
        built.append(node)
    return GpuPool(name, "hami", tuple(built))


def kai_pool(
    name: str,
    *,
    nodes: int = 1,
    gpus: int = 8,
    product: str = A100,
    memory_mib: int = 81920,
    **node_args: Any,
) -> GpuPool:
    """Return a pool scheduled by the KAI scheduler (fractions through the ``gpu-fraction`` annotation).

    :param name: the pool's name, also its ``kai.scheduler/node-pool`` label
    :param nodes: how many nodes
    :param gpus: GPUs per node
    :param product: GFD product label
    :param memory_mib: memory of one GPU
    :param node_args: more :func:`~airflow_gpupool.testing.gpu_node` arguments
    """
    labels = {KAI_NODE_POOL_LABEL: name, **node_args.pop("labels", {})}
    built = [
        gpu_node(n, gpus=gpus, product=product, memory_mib=memory_mib, pool=name, labels=labels, **node_args)
        for n in _names(name, nodes)
    ]
    return GpuPool(name, "kai", tuple(built))


def default_pools() -> list[GpuPool]:
    """Return the kit's default cluster: whole A100s, a MIG A100, and T4s shared through HAMi."""
    return [
        whole_gpu_pool("a100", gpus=4),
        mig_pool("a100-mig"),
        hami_pool("t4-shared"),
    ]
