"""Build Kubernetes Node objects for GPU nodes, as the NVIDIA device plugin and GFD label them.

A node built by :func:`gpu_node` carries:

* allocatable and capacity ``nvidia.com/gpu`` (whole GPUs) and ``nvidia.com/mig-<profile>``
  (MIG slices, mixed strategy) beside ``cpu``, ``memory`` and ``pods``;
* GPU Feature Discovery labels ``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory`` (MiB),
  ``nvidia.com/gpu.count``, ``nvidia.com/gpu.present``, ``nvidia.com/mig.strategy`` and, per
  MIG profile, ``nvidia.com/mig-<profile>.count``;
* ``kubernetes.io/hostname``, ``kubernetes.io/os`` and, with ``pool=``, ``gpupool.io/pool``;
* optional taints and ``spec.unschedulable`` (a cordoned node).

:func:`load_nodes` reads a YAML or JSON file holding either builder arguments or whole Node
objects (or a mix), as a list, a ``{"nodes": [...]}`` mapping or a Kubernetes ``List``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow_gpupool.labels import (
    COUNT_LABEL,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    MEMORY_LABEL,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY_LABEL,
    POOL_LABEL,
    PRODUCT_LABEL,
)
from airflow_gpupool.testing.api.discovery import KUBELET_VERSION

_NODE_ARGS = {
    "name",
    "gpus",
    "product",
    "memory_mib",
    "mig",
    "mig_strategy",
    "taints",
    "unschedulable",
    "labels",
    "pool",
    "cpu",
    "memory",
    "address",
}


def _taint(taint: Mapping[str, Any] | str) -> dict[str, Any]:
    """Return a taint dict from a dict or the ``key=value:Effect`` short form.

    :param taint: a taint, e.g. ``{"key": "nvidia.com/gpu", "effect": "NoSchedule"}`` or
        ``"nvidia.com/gpu=present:NoSchedule"``
    """
    if isinstance(taint, Mapping):
        return {key: value for key, value in taint.items() if value is not None}
    head, _, effect = taint.rpartition(":")
    if not head:
        raise ValueError(f"taint {taint!r} must look like 'key=value:Effect' or 'key:Effect'")
    key, _, value = head.partition("=")
    result = {"key": key, "effect": effect}
    if value:
        result["value"] = value
    return result


def gpu_node(
    name: str,
    *,
    gpus: int = 8,
    product: str = "NVIDIA-A100-SXM4-80GB",
    memory_mib: int = 81920,
    mig: Mapping[str, int] | None = None,
    mig_strategy: str | None = None,
    taints: Iterable[Mapping[str, Any] | str] = (),
    unschedulable: bool = False,
    labels: Mapping[str, str] | None = None,
    pool: str | None = None,
    cpu: str = "96",
    memory: str = "1024Gi",
    address: str | None = None,
) -> dict[str, Any]:
    """Return a core/v1 Node for a GPU node.

    :param name: node name, also its ``kubernetes.io/hostname`` label
    :param gpus: whole GPUs advertised as ``nvidia.com/gpu`` (and the ``gpu.count`` label)
    :param product: GFD ``nvidia.com/gpu.product`` label
    :param memory_mib: GFD ``nvidia.com/gpu.memory`` label (memory of one GPU, MiB)
    :param mig: MIG slices per profile, e.g. ``{"1g.10gb": 7}``, advertised as
        ``nvidia.com/mig-1g.10gb``
    :param mig_strategy: GFD ``nvidia.com/mig.strategy``; ``mixed`` with ``mig``, else ``none``
    :param taints: taints as dicts or ``key=value:Effect`` strings
    :param unschedulable: whether the node is cordoned
    :param labels: extra labels (they win over the generated ones)
    :param pool: value of the ``gpupool.io/pool`` label
    :param cpu: allocatable CPU
    :param memory: allocatable memory
    :param address: InternalIP; derived from the name when omitted
    """
    mig = dict(mig or {})
    node_labels: dict[str, str] = {
        HOSTNAME_LABEL: name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        PRODUCT_LABEL: product,
        MEMORY_LABEL: str(memory_mib),
        COUNT_LABEL: str(gpus),
        MIG_STRATEGY_LABEL: mig_strategy or ("mixed" if mig else "none"),
    }
    for profile, count in mig.items():
        node_labels[f"{MIG_RESOURCE_PREFIX}{profile}.count"] = str(count)
    if pool is not None:
        node_labels[POOL_LABEL] = pool
    node_labels.update(labels or {})
    resources: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": "110", GPU_RESOURCE: str(gpus)}
    resources.update({f"{MIG_RESOURCE_PREFIX}{profile}": str(count) for profile, count in mig.items()})
    return _node_object(name, node_labels, resources, [_taint(t) for t in taints], unschedulable, address)


def cpu_node(
    name: str, *, cpu: str = "32", memory: str = "128Gi", labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Return a core/v1 Node without GPUs.

    :param name: node name
    :param cpu: allocatable CPU
    :param memory: allocatable memory
    :param labels: extra labels
    """
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    return _node_object(name, node_labels, resources, [], False, None)


def _node_object(
    name: str,
    labels: dict[str, str],
    resources: dict[str, str],
    taints: list[dict[str, Any]],
    unschedulable: bool,
    address: str | None,
) -> dict[str, Any]:
    """Assemble the Node dict.

    :param name: node name
    :param labels: all labels
    :param resources: capacity, also used as allocatable
    :param taints: taint dicts
    :param unschedulable: cordon flag
    :param address: InternalIP or ``None`` to derive one from the name
    """
    if address is None:
        digest = sum(name.encode()) % 250
        address = f"10.0.{digest}.{len(name) % 250 + 1}"
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": _uid(name, "boot"),
                "containerRuntimeVersion": "containerd://1.7.0",
                "kernelVersion": "6.1.0-gpupool-emulator",
                "kubeProxyVersion": KUBELET_VERSION,
                "kubeletVersion": KUBELET_VERSION,
                "machineID": _uid(name, "machine").replace("-", ""),
                "operatingSystem": "linux",
                "osImage": "Ubuntu 22.04.4 LTS",
                "systemUUID": _uid(name, "system"),
            },
        },
    }


def _uid(name: str, purpose: str) -> str:
    """Return a stable UUID for a node.

    :param name: node name
    :param purpose: which identifier
    """
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{purpose}.{name}.gpupool.emulator"))


def default_nodes() -> list[dict[str, Any]]:
    """Return the small cluster used when no nodes are given: two A100 nodes (one with MIG) and an H100 node."""
    return [
        gpu_node("gpu-a100-0", gpus=8, pool="a100"),
        gpu_node("gpu-a100-1", gpus=7, mig={"1g.10gb": 7}, pool="a100"),
        gpu_node("gpu-h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, pool="h100"),
    ]


def node_from_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Return a Node from either a whole Node object or :func:`gpu_node` keyword arguments.

    :param spec: a Node (has ``metadata``) or builder arguments (has ``name``)
    """
    if "metadata" in spec:
        node: dict[str, Any] = json.loads(json.dumps(spec))
        node.setdefault("apiVersion", "v1")
        node.setdefault("kind", "Node")
        return node
    unknown = set(spec) - _NODE_ARGS
    if unknown:
        raise ValueError(f"unknown node fields {sorted(unknown)}; expected some of {sorted(_NODE_ARGS)}")
    kwargs = dict(spec)
    return gpu_node(kwargs.pop("name"), **kwargs)


def load_nodes(path: str | Path) -> list[dict[str, Any]]:
    """Load nodes from a YAML or JSON file.

    :param path: the file; a list of node specs, ``{"nodes": [...]}`` or a Kubernetes ``List``
    """
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if isinstance(data, Mapping):
        data = data.get("nodes", data.get("items"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of nodes, a 'nodes' key or a Kubernetes List")
    return [node_from_spec(item) for item in data]
