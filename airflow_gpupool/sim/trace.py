"""Read cluster and workload traces in the CSV columns of the Alibaba GPU trace 2023.

Nodes: ``sn, cpu_milli, memory_mib, gpu, model`` and optionally ``gpu_memory_mib`` (each
GPU's memory; default by model) and ``mig_profiles`` (the MIG slices every GPU of the node
is partitioned into, separated by ``|``: ``3g.40gb|2g.20gb|1g.10gb|1g.10gb``).
Pods: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` and optionally ``gpu_spec``
(allowed models separated by ``|``), ``qos``, ``creation_time`` and ``deletion_time``
(seconds; a deletion before the creation is an error), ``mig_profile`` (a MIG request:
``num_gpu`` 1 or 0, ``gpu_milli`` ignored) and ``gpu_memory_mib`` (the GPU memory a fraction
needs, or the least each whole GPU must have). A missing column or a bad row raises
:class:`~airflow_gpupool.exceptions.TraceFormatError` naming its line.

``airflow_gpupool/sim/examples/`` holds a small trace the project wrote (MIG and
GPU-memory requests included): :data:`EXAMPLE_NODES` and :data:`EXAMPLE_PODS`.

The Alibaba trace itself is third-party data and is not shipped: the named traces
(``nodes``, ``default``, ``gpuspec33``, ...) are read from ``$GPUPOOL_TRACE_DIR/alibaba-gpu-v2023/``,
else from the cache ``gpupool traces fetch`` fills (:mod:`airflow_gpupool.sim.fetch`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_gpupool.exceptions import InvalidRequestError, TraceFormatError
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.resources import MIG_PROFILES, MILLI_PER_GPU, GpuRequest
from airflow_gpupool.sim.fetch import TRACE_DIR_ENV, TRACE_SET, trace_root

__all__ = [
    "EXAMPLE_NODES",
    "EXAMPLE_PODS",
    "NODE_LIST",
    "TRACES",
    "TRACE_DIR_ENV",
    "TRACE_SET",
    "TracePod",
    "load_nodes",
    "load_pods",
    "named_trace",
]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")

#: The Alibaba pod lists by short name; the node list is shared.
TRACES = {
    "default": "openb_pod_list_default.csv",
    "gpushare100": "openb_pod_list_gpushare100.csv",
    "multigpu50": "openb_pod_list_multigpu50.csv",
    "gpuspec33": "openb_pod_list_gpuspec33.csv",
}
NODE_LIST = "openb_node_list_gpu_node.csv"
#: The project's own small example trace, shipped with the package.
EXAMPLES = Path(__file__).parent / "examples"
EXAMPLE_NODES = EXAMPLES / "mig_nodes.csv"
EXAMPLE_PODS = EXAMPLES / "mig_pods.csv"

#: GPU memory in MiB by model (from the FGD simulator); the undisclosed G1–G3 get 16 GiB.
GPU_MEMORY_MIB = {"P100": 16280, "T4": 15109, "V100M16": 16160, "V100M32": 32510, "A10": 22731, "A100": 81251}
DEFAULT_GPU_MEMORY_MIB = 16384

#: Priority of each QoS class: latency-sensitive first, best-effort last.
QOS_PRIORITY = {"LS": 2, "Burstable": 1, "Guaranteed": 1, "BE": 0}


@dataclass(frozen=True, slots=True)
class TracePod:
    """One task of a workload trace.

    :param name: the pod's name
    :param request: what it asks for (priority from its QoS class)
    :param qos: the QoS class (empty when the trace has none)
    :param creation_time: seconds, or None
    :param deletion_time: seconds, or None
    """

    name: str
    request: GpuRequest
    qos: str = ""
    creation_time: int | None = None
    deletion_time: int | None = None

    @property
    def gpu_milli(self) -> int:
        """GPU milli the pod asks for in total."""
        return self.request.total_gpu_milli


def _open(source: str | Path) -> tuple[str, io.TextIOBase]:
    path = Path(source)
    if not path.exists() and str(source) in TRACES:
        path = named_trace(TRACES[str(source)])
    elif not path.exists() and str(source) == "nodes":
        path = named_trace(NODE_LIST)
    try:
        return str(path), path.open(newline="")
    except OSError as e:
        raise TraceFormatError(str(path), 0, "-", f"cannot read the file: {e.strerror}") from e


def named_trace(filename: str) -> Path:
    """Return the path of one file of the Alibaba trace: under ``$GPUPOOL_TRACE_DIR``, else the cache.

    :raises ConfigurationError: neither holds it; the message says how to fetch it
        (``gpupool traces fetch``, see :mod:`airflow_gpupool.sim.fetch`)
    """
    return trace_root(filename) / filename


def _rows(
    name: str, handle: Iterable[str], required: tuple[str, ...]
) -> Iterable[tuple[int, dict[str, str]]]:
    reader = csv.DictReader(handle)
    header = reader.fieldnames or []
    for column in required:
        if column not in header:
            raise TraceFormatError(
                name, 0, column, f"missing column (the header has {', '.join(header) or 'nothing'})"
            )
    for row in reader:
        yield reader.line_num, row


def _int(name: str, line: int, row: dict[str, str], column: str, default: int | None = None) -> Any:
    raw = (row.get(column) or "").strip()
    if raw == "" and default is not None:
        return default
    try:
        return int(float(raw))
    except ValueError:
        raise TraceFormatError(name, line, column, f"expected a number, got {raw!r}") from None


def load_nodes(source: str | Path = "nodes") -> tuple[NodeState, ...]:
    """Return the nodes of a node-list CSV, every GPU free.

    :param source: a path, or ``nodes`` for the Alibaba node list (:func:`named_trace`)
    """
    name, handle = _open(source)
    nodes = []
    with handle:
        for line, row in _rows(name, handle, NODE_COLUMNS):
            gpus = _int(name, line, row, "gpu")
            model = (row.get("model") or "").strip()
            if gpus < 0 or (gpus and not model):
                raise TraceFormatError(
                    name, line, "gpu" if gpus < 0 else "model", "needs a GPU count >= 0 and a model"
                )
            memory = _int(
                name, line, row, "gpu_memory_mib", GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB)
            )
            sn = row["sn"].strip()
            profiles = _mig_profiles(name, line, row)
            nodes.append(
                NodeState(
                    name=sn,
                    cpu_milli=_int(name, line, row, "cpu_milli"),
                    memory_mib=_int(name, line, row, "memory_mib"),
                    gpus=tuple(_gpu(sn, k, model, memory, profiles) for k in range(gpus)),
                )
            )
    if not nodes:
        raise TraceFormatError(name, 0, "sn", "the node list is empty")
    return tuple(nodes)


def _mig_profiles(name: str, line: int, row: dict[str, str]) -> tuple[str, ...]:
    profiles = tuple(p.strip() for p in (row.get("mig_profiles") or "").split("|") if p.strip())
    for profile in profiles:
        if profile not in MIG_PROFILES:
            raise TraceFormatError(name, line, "mig_profiles", f"unknown MIG profile {profile!r}")
    return profiles


def _gpu(node: str, index: int, model: str, memory: int, profiles: tuple[str, ...]) -> GpuState:
    if not profiles:
        return GpuState(index, model, memory)
    slices = tuple((f"{node}-g{index}-m{k}", p) for k, p in enumerate(profiles))
    return GpuState(index, model, memory, free_milli=0, mig_free=slices, partitioned=True)


def _request(name: str, line: int, row: dict[str, str]) -> GpuRequest:
    num = _int(name, line, row, "num_gpu")
    milli = _int(name, line, row, "gpu_milli", 0)
    qos = (row.get("qos") or "").strip()
    fields: dict[str, Any] = {
        "cpu_milli": _int(name, line, row, "cpu_milli"),
        "memory_mib": _int(name, line, row, "memory_mib"),
        "gpu_models": frozenset(m for m in (row.get("gpu_spec") or "").split("|") if m),
        "priority": QOS_PRIORITY.get(qos, 1),
    }
    gpu_memory = _int(name, line, row, "gpu_memory_mib", 0)
    if gpu_memory > 0:
        fields["gpu_memory_mib"] = gpu_memory
    mig = (row.get("mig_profile") or "").strip()
    if mig:
        if num > 1:
            raise TraceFormatError(name, line, "num_gpu", f"a MIG request takes one slice: 0 or 1, got {num}")
        return _checked(name, line, {**fields, "mig_profile": mig, "gpu_memory_mib": None})
    if not 0 <= milli <= MILLI_PER_GPU or (num > 1 and 0 < milli < MILLI_PER_GPU):
        raise TraceFormatError(
            name, line, "gpu_milli", f"expected 0-1000, and 1000 (or 0) with num_gpu > 1, got {milli}"
        )
    if num == 1 and 0 < milli < MILLI_PER_GPU:
        fields["gpu_milli"] = milli
    else:
        fields["gpus"] = num
    return _checked(name, line, fields)


def _checked(name: str, line: int, fields: dict[str, Any]) -> GpuRequest:
    try:
        return GpuRequest(**fields)
    except InvalidRequestError as e:
        raise TraceFormatError(
            name, line, e.field, f"invalid value {e.value!r}: expected {e.expected}"
        ) from e


def _times(name: str, line: int, row: dict[str, str]) -> tuple[int | None, int | None]:
    creation = (row.get("creation_time") or "").strip()
    deletion = (row.get("deletion_time") or "").strip()
    created = _int(name, line, row, "creation_time") if creation else None
    deleted = _int(name, line, row, "deletion_time") if deletion else None
    if created is not None and deleted is not None and deleted < created:
        raise TraceFormatError(
            name,
            line,
            "deletion_time",
            f"{deleted} precedes creation_time {created}: a pod ends after it starts",
        )
    return created, deleted


def load_pods(source: str | Path = "default") -> list[TracePod]:
    """Return the pods of a pod-list CSV in file order.

    :param source: a path, or a trace name of :data:`TRACES` (:func:`named_trace`)
    """
    name, handle = _open(source)
    pods = []
    with handle:
        for line, row in _rows(name, handle, POD_COLUMNS):
            created, deleted = _times(name, line, row)
            pods.append(
                TracePod(
                    name=(row.get("name") or f"pod-{line}").strip(),
                    request=_request(name, line, row),
                    qos=(row.get("qos") or "").strip(),
                    creation_time=created,
                    deletion_time=deleted,
                )
            )
    if not pods:
        raise TraceFormatError(name, 0, "name", "the pod list is empty")
    return pods
