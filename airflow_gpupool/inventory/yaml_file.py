"""A static inventory in YAML, for clusters without GPU Feature Discovery and for tests.

Format (every key but ``name`` optional; see docs/concepts/ledger.md, "Static inventory")::

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
from airflow_gpupool.resources import MIG_PROFILES, GpuDevice, MigSlice, NodeInventory

_NODE_KEYS = {"name", "cpu", "cpu_milli", "memory", "memory_mib", "node_pool", "labels", "health", "gpus"}
_GPU_KEYS = {"model", "memory", "memory_mib", "count", "uuid", "mig"}


#: MiB in one (decimal) GB, as MIG profiles count their memory.
_MIB_PER_GB = 10**9 / 2**20
#: 1g.10gb exists on the 40 GB A100 too (two memory slices there).
_ALSO_ON_40GB = {"1g.10gb"}
_MIG_SLICES = 7
#: More GPUs than any node holds: a typo (``count: 80`` for 8) is refused, not expanded.
_MAX_GPUS_PER_GROUP = 64


def memory_to_mib(where: str, value: Any) -> int:
    """Convert a Kubernetes memory quantity with a unit (``80Gi``, ``512Mi``, ``1G``) to MiB.

    A number without a unit is refused: ``memory: 64`` would be 64 bytes, never what was meant
    (plain MiB go in ``memory_mib``).

    :param where: what the value is, for the error
    :param value: the quantity
    :raises InvalidInventoryError: the value is not a memory quantity with a unit
    """
    expected = "a memory quantity with a unit such as 80Gi or 512Mi (plain MiB: memory_mib)"
    if isinstance(value, int | float) or (
        isinstance(value, str) and value.strip().replace(".", "", 1).isdigit()
    ):
        raise InvalidInventoryError(where, value, expected)
    try:
        return quantity.memory_mib(value)
    except ValueError:
        raise InvalidInventoryError(where, value, expected) from None


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
        if not 1 <= count <= _MAX_GPUS_PER_GROUP or ("uuid" in spec and count != 1):
            raise InvalidInventoryError(
                f"{at}.count", count, f"an integer from 1 to {_MAX_GPUS_PER_GROUP} (1 when uuid is given)"
            )
        mig = spec.get("mig") or []
        if not isinstance(mig, list):
            raise InvalidInventoryError(f"{at}.mig", mig, "a list of MIG profiles such as [3g.40gb, 3g.40gb]")
        check_mig_layout(f"{at}.mig", [str(p) for p in mig], memory)
        for _ in range(count):
            index = len(out)
            uuid = str(spec.get("uuid") or f"GPU-{node}-{index}")
            try:
                slices = tuple(MigSlice(f"gpu{index}-mig{j}", str(p)) for j, p in enumerate(mig))
                out.append(GpuDevice(index, uuid, str(spec["model"]), memory, slices))
            except InvalidRequestError as e:
                raise InvalidInventoryError(f"{at}: {e.field}", e.value, e.expected) from None
    return out


def check_mig_layout(where: str, profiles: list[str], memory_mib: int) -> None:
    """Refuse a MIG layout a GPU cannot have: profiles of several families, or more than it holds.

    :param where: the layout, for the error
    :param profiles: the GPU's MIG profiles (names)
    :param memory_mib: the GPU's memory
    :raises InvalidInventoryError: unknown profile, mixed families, a family larger than the GPU,
        or more memory or compute slices than one GPU has
    """
    if not profiles:
        return
    unknown = sorted(set(profiles) - set(MIG_PROFILES))
    if unknown:
        raise InvalidInventoryError(where, unknown[0], f"MIG profiles among {sorted(MIG_PROFILES)}")
    families = set.intersection(
        *({MIG_PROFILES[p].family_gb} | ({40} if p in _ALSO_ON_40GB else set()) for p in profiles)
    )
    if not families:
        raise InvalidInventoryError(
            where, profiles, "profiles of one GPU family (40, 80 or 141 GB), not mixed"
        )
    family = min(families)
    if family * _MIB_PER_GB > memory_mib * 1.01:
        raise InvalidInventoryError(
            where,
            profiles,
            f"profiles that fit the GPU's {memory_mib} MiB ({family} GB profiles need a {family} GB GPU)",
        )
    memory_gb = sum(MIG_PROFILES[p].memory_gb for p in profiles)
    slices = sum(MIG_PROFILES[p].compute_slices for p in profiles)
    if memory_gb > family or slices > _MIG_SLICES:
        raise InvalidInventoryError(
            where,
            profiles,
            f"at most {family} GB and {_MIG_SLICES} compute slices in all (these take {memory_gb} GB, {slices} slices)",
        )


def _check_nulls(at: str, spec: Mapping[str, Any]) -> None:
    for key, value in spec.items():
        if value is None:
            raise InvalidInventoryError(f"{at}.{key}", None, "a value (leave the key out for its default)")
    for one, other in (("cpu", "cpu_milli"), ("memory", "memory_mib")):
        if one in spec and other in spec:
            # Two amounts of one resource: which one was meant cannot be guessed.
            raise InvalidInventoryError(at, [one, other], f"either {one} or {other}, not both")


def _check_gpu_keys(at: str, spec: Any) -> None:
    if not isinstance(spec, Mapping):
        raise InvalidInventoryError(at, spec, "a mapping with model, memory and count")
    unknown = set(spec) - _GPU_KEYS
    if unknown:
        raise InvalidInventoryError(at, sorted(unknown), f"keys among {sorted(_GPU_KEYS)}")
    _check_nulls(at, spec)
    if "model" not in spec:
        raise InvalidInventoryError(f"{at}.model", None, "a GPU model name")


def _node(k: int, spec: Any) -> NodeInventory:
    where = f"nodes[{k}]"
    if not isinstance(spec, Mapping):
        raise InvalidInventoryError(where, spec, "a mapping with at least a name")
    unknown = set(spec) - _NODE_KEYS
    if unknown:
        raise InvalidInventoryError(where, sorted(unknown), f"keys among {sorted(_NODE_KEYS)}")
    _check_nulls(where, spec)
    for key in ("name", "node_pool", "health"):
        if key in spec and not isinstance(spec[key], str):
            raise InvalidInventoryError(f"{where}.{key}", spec[key], "a string")
    labels = spec.get("labels", {})
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise InvalidInventoryError(f"{where}.labels", labels, "a mapping of label names to strings")
    name = spec.get("name")
    if not name:
        raise InvalidInventoryError(f"{where}.name", name, "a node name")
    memory = _int(f"{where}.memory_mib", spec["memory_mib"]) if "memory_mib" in spec else None
    if memory is None:
        memory = memory_to_mib(f"{where}.memory", spec["memory"]) if "memory" in spec else 0
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
    nodes = [_node(k, spec) for k, spec in enumerate(data["nodes"])]
    _check_unique(source, nodes)
    return nodes


def _check_unique(source: str, nodes: list[NodeInventory]) -> None:
    seen_nodes: set[str] = set()
    seen_uuids: dict[str, str] = {}
    for node in nodes:
        if node.name in seen_nodes:
            raise InvalidInventoryError(f"{source}: nodes", node.name, "each node name once")
        seen_nodes.add(node.name)
        for gpu in node.gpus:
            other = seen_uuids.setdefault(gpu.uuid, node.name)
            if other != node.name or sum(g.uuid == gpu.uuid for g in node.gpus) > 1:
                raise InvalidInventoryError(
                    f"{source}: nodes {other} and {node.name}", gpu.uuid, "each GPU UUID on one GPU only"
                )


def load_inventory(path: str | Path) -> list[NodeInventory]:
    """Read and parse an inventory YAML file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidInventoryError("inventory file", str(path), f"a readable file ({e.strerror})") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInventoryError(
            str(path), f"byte {data[e.start]:#04x} at offset {e.start}", "a UTF-8 text file"
        ) from None
    return parse_inventory(text, str(path))
