"""A static inventory in YAML, for clusters without GPU Feature Discovery and for tests.

Format (every key but ``name`` optional; see README "Static inventory")::

    nodes:
      - name: gpu-a100-0
        cpu: 64               # cores (or cpu_milli: 64000)
        memory: 512Gi         # Kubernetes quantity (or memory_mib: 524288)
        node_pool: a100
        labels: {topology.kubernetes.io/zone: zone-a}
        health: healthy       # healthy | cordoned | draining | quarantined
        gpus:
          - model: NVIDIA-A100-SXM4-80GB
            memory: 80Gi      # or memory_mib: 81920
            count: 6          # six identical GPUs, indices assigned in order
          - model: NVIDIA-A100-SXM4-80GB
            memory: 80Gi
            mig: [3g.40gb, 2g.20gb, 1g.10gb]   # a MIG-partitioned GPU and its slices
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from airflow_gpupool import quantity
from airflow_gpupool.exceptions import InvalidInventoryError, InvalidRequestError
from airflow_gpupool.resources import GpuDevice, MigSlice, NodeInventory

_NODE_KEYS = {"name", "cpu", "cpu_milli", "memory", "memory_mib", "node_pool", "labels", "health", "gpus"}
_GPU_KEYS = {"model", "memory", "memory_mib", "count", "uuid", "mig"}


def memory_to_mib(where: str, value: Any) -> int:
    """Convert a Kubernetes memory quantity (``80Gi``, ``512Mi``, bytes) to MiB.

    :param where: what the value is, for the error
    :param value: the quantity
    :raises InvalidInventoryError: the value is not a memory quantity
    """
    try:
        return quantity.memory_mib(value)
    except ValueError:
        raise InvalidInventoryError(where, value, "a memory quantity such as 80Gi or 512Mi") from None


def _cpu_milli(where: str, spec: Mapping[str, Any]) -> int:
    if "cpu_milli" in spec:
        return _int(f"{where}.cpu_milli", spec["cpu_milli"])
    raw = spec.get("cpu", 0)
    try:
        return quantity.cpu_milli(raw)
    except ValueError:
        raise InvalidInventoryError(f"{where}.cpu", raw, "cores (64, 0.5) or milli-cores (500m)") from None


def _int(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInventoryError(where, value, "an integer")
    return value


def _gpus(where: str, node: str, specs: Any) -> list[GpuDevice]:
    if not isinstance(specs, list):
        raise InvalidInventoryError(f"{where}.gpus", specs, "a list of GPU groups")
    out: list[GpuDevice] = []
    for k, spec in enumerate(specs):
        at = f"{where}.gpus[{k}]"
        _check_gpu_keys(at, spec)
        memory = _int(f"{at}.memory_mib", spec["memory_mib"]) if "memory_mib" in spec else None
        if memory is None:
            memory = memory_to_mib(f"{at}.memory", spec.get("memory", "16Gi"))
        count = _int(f"{at}.count", spec.get("count", 1))
        if count < 1 or ("uuid" in spec and count != 1):
            raise InvalidInventoryError(f"{at}.count", count, "a positive integer (1 when uuid is given)")
        mig = spec.get("mig") or []
        if not isinstance(mig, list):
            raise InvalidInventoryError(f"{at}.mig", mig, "a list of MIG profiles such as [3g.40gb, 3g.40gb]")
        for _ in range(count):
            index = len(out)
            uuid = str(spec.get("uuid") or f"GPU-{node}-{index}")
            try:
                slices = tuple(MigSlice(f"gpu{index}-mig{j}", str(p)) for j, p in enumerate(mig))
                out.append(GpuDevice(index, uuid, str(spec["model"]), memory, slices))
            except InvalidRequestError as e:
                raise InvalidInventoryError(f"{at}: {e.field}", e.value, e.expected) from None
    return out


def _check_gpu_keys(at: str, spec: Any) -> None:
    if not isinstance(spec, Mapping):
        raise InvalidInventoryError(at, spec, "a mapping with model, memory and count")
    unknown = set(spec) - _GPU_KEYS
    if unknown:
        raise InvalidInventoryError(at, sorted(unknown), f"keys among {sorted(_GPU_KEYS)}")
    if "model" not in spec:
        raise InvalidInventoryError(f"{at}.model", None, "a GPU model name")


def _node(k: int, spec: Any) -> NodeInventory:
    where = f"nodes[{k}]"
    if not isinstance(spec, Mapping):
        raise InvalidInventoryError(where, spec, "a mapping with at least a name")
    unknown = set(spec) - _NODE_KEYS
    if unknown:
        raise InvalidInventoryError(where, sorted(unknown), f"keys among {sorted(_NODE_KEYS)}")
    name = spec.get("name")
    if not name:
        raise InvalidInventoryError(f"{where}.name", name, "a node name")
    memory = _int(f"{where}.memory_mib", spec["memory_mib"]) if "memory_mib" in spec else None
    if memory is None:
        memory = memory_to_mib(f"{where}.memory", spec.get("memory", 0))
    try:
        return NodeInventory(
            name=str(name),
            cpu_milli=_cpu_milli(where, spec),
            memory_mib=memory,
            gpus=tuple(_gpus(where, str(name), spec.get("gpus", []))),
            labels=spec.get("labels") or {},  # type: ignore[arg-type]
            node_pool=str(spec.get("node_pool", "default")),
            health=spec.get("health", "healthy"),
        )
    except InvalidRequestError as e:
        if e.field.startswith(where):
            raise
        raise InvalidInventoryError(f"{where}: {e.field}", e.value, e.expected) from None


def parse_inventory(text: str, source: str = "<inventory>") -> list[NodeInventory]:
    """Parse inventory YAML; raise :class:`InvalidInventoryError` naming the bad entry."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidInventoryError(source, str(e).splitlines()[0], "valid YAML") from e
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        raise InvalidInventoryError(source, type(data).__name__, "a mapping with a 'nodes' list")
    if not data["nodes"]:
        raise InvalidInventoryError(f"{source}: nodes", [], "at least one node")
    return [_node(k, spec) for k, spec in enumerate(data["nodes"])]


def load_inventory(path: str | Path) -> list[NodeInventory]:
    """Read and parse an inventory YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise InvalidInventoryError("inventory file", str(path), f"a readable file ({e.strerror})") from e
    return parse_inventory(text, str(path))
