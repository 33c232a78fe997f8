"""A Kubernetes Node as the ledger's inventory: pure parsing, no I/O and no kubernetes import.

:func:`node_from_kubernetes` turns one core/v1 Node into a :class:`NodeInventory`.

What a Node says and how it is read:

* whole GPUs: allocatable ``nvidia.com/gpu``; MIG slices (mixed strategy): allocatable
  ``nvidia.com/mig-<profile>``, packed onto GPUs of 7 compute slices each, biggest profile first;
  the single strategy (``nvidia.com/mig.strategy=single``, product ``<model>-MIG-<profile>``) is read
  as that many slices of one profile;
* GPU count: the GFD label ``nvidia.com/gpu.count`` caps whole GPUs at ``count - MIG GPUs``
  (the emulator and some device-plugin versions advertise partitioned GPUs in ``nvidia.com/gpu``
  too), and allocatable can only lower it (the device plugin withdraws unhealthy GPUs);
* model and memory: GFD ``nvidia.com/gpu.product`` and ``nvidia.com/gpu.memory`` (MiB); without
  the memory label, the ``<n>GB`` in the product name, else the MIG family, else 16 GiB;
* GPU UUIDs are not in the Node object: GPUs get stable synthetic ids ``<node>-gpu<index>``
  (whole GPUs first, then MIG-partitioned ones) and slices ``mig-<profile>-<k>``; the NVML agent
  supplies real UUIDs;
* health: a ``NotReady`` node (or one tainted ``not-ready``/``unreachable``) is ``quarantined``; a
  cordoned node, or one with a ``NoSchedule``/``NoExecute`` taint that GPU pods do not tolerate
  (all but ``nvidia.com/gpu`` unless told otherwise) is ``cordoned``;
* node pool: ``gpupool.io/pool``, else the GKE, EKS, AKS or Karpenter pool label, else ``default``;
* labels: all of them but ``nvidia.com/gfd.timestamp``, which GFD rewrites every minute and which
  would make every sync an update.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from typing import Any

from airflow_gpupool import quantity
from airflow_gpupool.exceptions import InvalidInventoryError, InvalidRequestError
from airflow_gpupool.labels import (
    COUNT_LABEL,
    GFD_TIMESTAMP_LABEL,
    GPU_RESOURCE,
    MEMORY_LABEL,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY_LABEL,
    POOL_LABELS,
    PRODUCT_LABEL,
)
from airflow_gpupool.resources import MIG_PROFILES, GpuDevice, MigSlice, NodeHealth, NodeInventory

__all__ = ["DEFAULT_GPU_MEMORY_MIB", "DEFAULT_TOLERATED_TAINTS", "node_from_kubernetes", "node_name"]

log = logging.getLogger(__name__)

#: Taint keys that GPU pods tolerate, so they do not cordon a node.
DEFAULT_TOLERATED_TAINTS = frozenset({GPU_RESOURCE})
DEFAULT_GPU_MEMORY_MIB = 16 * 1024
_VOLATILE_LABELS = frozenset({GFD_TIMESTAMP_LABEL})
_UNREACHABLE_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
_HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_SLICES_PER_GPU = 7
_COUNT = re.compile(r"^[0-9]+$")
_SINGLE_MIG_PRODUCT = re.compile(r"^(?P<model>.+)-MIG-(?P<profile>[0-9]+g\.[0-9]+gb)$")
_GB_IN_PRODUCT = re.compile(r"(?<![0-9])(?P<gb>[0-9]{1,4})GB(?![A-Za-z0-9])", re.IGNORECASE)


def node_from_kubernetes(
    node: Mapping[str, Any] | Any,
    *,
    keep_cpu_nodes: bool = False,
    tolerated_taints: Collection[str] = DEFAULT_TOLERATED_TAINTS,
) -> NodeInventory | None:
    """Convert a core/v1 Node to the ledger's inventory; return None for a node without GPUs.

    :param node: a Node as a dict (the API's JSON) or a ``kubernetes.client.V1Node``
    :param keep_cpu_nodes: return GPU-less nodes too (for CPU-only requests)
    :param tolerated_taints: taint keys that do not cordon the node (GPU pods tolerate them)
    :raises InvalidInventoryError: the object is malformed; the error names the node and field
    """
    obj = _as_dict(node)
    metadata = _mapping("node metadata", obj.get("metadata"))
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInventoryError("node metadata.name", name, "a node name")
    where = f"node {name}"
    labels = _labels(where, metadata.get("labels"))
    spec = _mapping(f"{where} spec", obj.get("spec"))
    status = _mapping(f"{where} status", obj.get("status"))
    allocatable = _mapping(f"{where} status.allocatable", status.get("allocatable"))
    try:
        gpus = _gpus(name, allocatable, labels)
        if not gpus and not keep_cpu_nodes:
            return None
        return NodeInventory(
            name=name,
            cpu_milli=_cpu_milli(f"{where} status.allocatable.cpu", allocatable.get("cpu", 0)),
            memory_mib=_memory_mib(f"{where} status.allocatable.memory", allocatable.get("memory", 0)),
            gpus=gpus,
            labels=labels,  # type: ignore[arg-type]  # normalized to pairs by NodeInventory
            node_pool=next((labels[k] for k in POOL_LABELS if labels.get(k)), "default"),
            health=_health(where, spec, status, frozenset(tolerated_taints)),
        )
    except InvalidRequestError as e:
        if e.field.startswith(where):
            raise
        raise InvalidInventoryError(f"{where} {e.field}", e.value, e.expected) from e


def node_name(node: Mapping[str, Any] | Any) -> str:
    """Return a Node's name for messages, or ``<unnamed>`` when it has none (it may be malformed).

    :param node: a Node as a dict or a ``kubernetes.client.V1Node``
    """
    try:
        name = _as_dict(node).get("metadata", {}).get("name")
    except (InvalidInventoryError, AttributeError):
        name = None
    return name if isinstance(name, str) and name else "<unnamed>"


def _as_dict(node: Any) -> Mapping[str, Any]:
    if isinstance(node, Mapping):
        return node
    # V1Node.to_dict() uses Python attribute names, which equal the JSON names of every field read here.
    to_dict = getattr(node, "to_dict", None)
    if callable(to_dict):
        return _mapping("node", to_dict())
    raise InvalidInventoryError("node", type(node).__name__, "a core/v1 Node (a dict or a V1Node)")


def _mapping(where: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInventoryError(where, value, "a mapping")
    return value


def _labels(where: str, value: Any) -> dict[str, str]:
    labels = _mapping(f"{where} metadata.labels", value)
    for key, label in labels.items():
        if not isinstance(label, str):
            raise InvalidInventoryError(f"{where} metadata.labels[{key!r}]", label, "a string")
    return {k: v for k, v in labels.items() if k not in _VOLATILE_LABELS}


def _count(where: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _COUNT.match(value.strip()):
        return int(value)
    raise InvalidInventoryError(where, value, "a non-negative integer")


def _cpu_milli(where: str, value: Any) -> int:
    try:
        return quantity.cpu_milli(value)
    except ValueError:
        raise InvalidInventoryError(where, value, "a CPU quantity such as 64, 0.5 or 63500m") from None


def _memory_mib(where: str, value: Any) -> int:
    try:
        return quantity.memory_mib(value)
    except ValueError:
        raise InvalidInventoryError(where, value, "a memory quantity such as 80Gi or 512Mi") from None


def _health(
    where: str, spec: Mapping[str, Any], status: Mapping[str, Any], tolerated: frozenset[str]
) -> NodeHealth:
    taints = spec.get("taints") or []
    if not isinstance(taints, list) or not all(isinstance(t, Mapping) for t in taints):
        raise InvalidInventoryError(f"{where} spec.taints", taints, "a list of taints (key, effect)")
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list) or not all(isinstance(c, Mapping) for c in conditions):
        raise InvalidInventoryError(
            f"{where} status.conditions", conditions, "a list of conditions (type, status)"
        )
    hard = {t.get("key") for t in taints if t.get("effect") in _HARD_EFFECTS}
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    # No Ready condition at all: nothing says the node is down (hand-written objects, fresh nodes).
    if (ready is not None and ready.get("status") != "True") or hard & _UNREACHABLE_TAINTS:
        return NodeHealth.QUARANTINED
    if spec.get("unschedulable") or hard - tolerated:
        return NodeHealth.CORDONED
    return NodeHealth.HEALTHY


def _mig_profiles(name: str, allocatable: Mapping[str, Any]) -> list[str]:
    profiles: list[str] = []
    for key in sorted(allocatable):
        if not key.startswith(MIG_RESOURCE_PREFIX):
            continue
        count = _count(f"node {name} status.allocatable[{key!r}]", allocatable[key])
        profile = key[len(MIG_RESOURCE_PREFIX) :]
        if profile not in MIG_PROFILES:
            # Skipping is the safe side: the ledger never grants a slice it cannot describe.
            if count:
                log.warning("Node %s: ignoring %d slice(s) of unknown MIG profile %s", name, count, profile)
            continue
        profiles += [profile] * count
    return profiles


def _pack(profiles: list[str]) -> list[list[str]]:
    """Pack MIG profiles onto GPUs of 7 compute slices: first fit, biggest first."""
    gpus: list[list[str]] = []
    used: list[int] = []
    for profile in sorted(profiles, key=lambda p: (-MIG_PROFILES[p].compute_slices, p)):
        size = MIG_PROFILES[profile].compute_slices
        k = next((i for i, u in enumerate(used) if u + size <= _SLICES_PER_GPU), None)
        if k is None:
            gpus.append([])
            used.append(0)
            k = len(gpus) - 1
        gpus[k].append(profile)
        used[k] += size
    return gpus


def _gpu_memory(name: str, labels: Mapping[str, str], product: str, packed: list[list[str]]) -> int:
    if MEMORY_LABEL in labels:
        memory = _count(f"node {name} metadata.labels[{MEMORY_LABEL!r}]", labels[MEMORY_LABEL])
        if memory:
            return memory
    match = _GB_IN_PRODUCT.search(product)
    if match and int(match["gb"]):
        return int(match["gb"]) * 1024
    families = [MIG_PROFILES[p].family_gb for group in packed for p in group]
    return max(families) * 1024 if families else DEFAULT_GPU_MEMORY_MIB


def _gpus(name: str, allocatable: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[GpuDevice, ...]:
    whole = _count(f"node {name} status.allocatable[{GPU_RESOURCE!r}]", allocatable.get(GPU_RESOURCE, 0))
    product = labels.get(PRODUCT_LABEL) or "unknown"
    profiles = _mig_profiles(name, allocatable)
    single = _SINGLE_MIG_PRODUCT.match(product) if labels.get(MIG_STRATEGY_LABEL) == "single" else None
    if single and single["profile"] in MIG_PROFILES:
        # Single strategy: nvidia.com/gpu counts MIG devices of one profile, not GPUs.
        profiles, whole, product = [single["profile"]] * whole, 0, single["model"]
    packed = _pack(profiles)
    if COUNT_LABEL in labels and not single:
        total = _count(f"node {name} metadata.labels[{COUNT_LABEL!r}]", labels[COUNT_LABEL])
        whole = max(0, min(whole, total - len(packed)))
    # Under the single strategy GFD's memory label describes one MIG device, not the GPU.
    memory = _gpu_memory(name, {} if single else labels, product, packed)
    devices = [GpuDevice(i, f"{name}-gpu{i}", product, memory) for i in range(whole)]
    devices += _partitioned(name, packed, whole, product, memory)
    return tuple(devices)


def _partitioned(
    name: str, packed: list[list[str]], first: int, product: str, memory: int
) -> list[GpuDevice]:
    """Return the MIG-partitioned GPUs, indexed from ``first``, their slices numbered per profile."""
    devices: list[GpuDevice] = []
    ordinal: dict[str, int] = {}
    for k, group in enumerate(packed):
        slices = []
        for profile in group:
            slices.append(MigSlice(f"mig-{profile}-{ordinal.get(profile, 0)}", profile))
            ordinal[profile] = ordinal.get(profile, 0) + 1
        index = first + k
        devices.append(GpuDevice(index, f"{name}-gpu{index}", product, memory, tuple(slices)))
    return devices
