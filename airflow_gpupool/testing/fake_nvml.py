"""A fake NVML at the ``pynvml`` boundary: the functions the node agent calls, on GPUs from a YAML spec.

:class:`FakeNvml` has the same function names, argument order, return shapes and error types as
``nvidia-ml-py`` (``import pynvml``): strings where the real binding decodes them (names, UUIDs,
the driver version), structures with the real field names where it returns ctypes structures
(``nvmlMemory_t.total/free/used`` in bytes, ``nvmlUtilization_t.gpu/memory``, the PCI info's
``busId`` as bytes, as a ``c_char`` array reads), and the real ``pynvml.NVMLError`` subclasses
raised (``NVMLError_GpuIsLost`` for a GPU fallen off the bus, ``NVMLError_NotSupported``,
``NVMLError_Timeout`` from an event wait with nothing to deliver). Constants
(``NVML_TEMPERATURE_GPU``, ``nvmlEventTypeXidCriticalError``...) are the real module's.

The spec (one node)::

    driver_version: "550.54.15"
    gpus:
      - uuid: GPU-5c1e6c8a-0f6b-4b7e-9d2a-3f1c2b4a5d60
        bus_id: "00000000:07:00.0"
        name: NVIDIA A100-SXM4-80GB
        memory_mib: 81920
        utilization: {gpu: 35, memory: 20}
        temperature: 41            # °C; slowdown_temperature (default 90) is the threshold
        power_mw: 65000
        ecc: {corrected: 0, uncorrected: 0}
        retired_pages: {single_bit: 0, double_bit: 0}
        remapped_rows: {corrected: 0, uncorrected: 0, pending: false, failure: false}
        mig: [{uuid: MIG-..., memory_mib: 9856}]
        processes: [{pid: 4242, memory_mib: 1024, pod_uid: "..."}]
        lost: false                # true: every call on it raises NVMLError_GpuIsLost
    xid_events: [{id: 1, gpu: 0, xid: 79}]   # delivered once each by nvmlEventSetWait

The spec file may change while an agent runs (the emulator's kubelet writes a running pod's
processes into it, see :func:`add_process`): the fake reads it again when its modification
time moves, at each :meth:`FakeNvml.nvmlDeviceGetCount`. Writers replace the file atomically.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import tempfile
import threading
import uuid as uuid_module
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import yaml

__all__ = [
    "FakeNvml",
    "add_process",
    "fake_gpu_uuid",
    "inject_xid",
    "load_spec",
    "node_spec",
    "remove_processes",
    "write_spec",
]

MIB = 1024 * 1024


def fake_gpu_uuid(node: str, index: int) -> str:
    """Return a stable NVML-shaped UUID (``GPU-`` and 36 characters) for GPU ``index`` of ``node``."""
    return f"GPU-{uuid_module.uuid5(uuid_module.NAMESPACE_DNS, f'{node}/gpu{index}')}"


def node_spec(
    node: str, gpus: int, *, model: str = "NVIDIA A100-SXM4-80GB", memory_mib: int = 81920
) -> dict[str, Any]:
    """Return the spec of a node with ``gpus`` idle GPUs of one model (bus ids 07, 08, ...)."""
    return {
        "driver_version": "550.54.15",
        "gpus": [
            {
                "uuid": fake_gpu_uuid(node, i),
                "bus_id": f"00000000:{7 + i:02X}:00.0",
                "name": model,
                "memory_mib": memory_mib,
            }
            for i in range(gpus)
        ],
        "xid_events": [],
    }


def load_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a spec file; a clear ``ValueError`` when it is not a mapping with a ``gpus`` list."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict) or not isinstance(data.get("gpus", []), list):
        raise ValueError(f"{path}: a fake NVML spec is a mapping with a 'gpus' list")
    return data


def write_spec(path: str | os.PathLike[str], spec: dict[str, Any]) -> None:
    """Write a spec atomically (a reader sees the old file or the new one, never half of one)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(spec, f, sort_keys=False)
    os.replace(tmp, target)


@contextlib.contextmanager
def _editing(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Read, change and write a spec under a lock file, so two writers never lose an edit."""
    lock_path = f"{path}.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        spec = load_spec(path)
        yield spec
        write_spec(path, spec)


def add_process(
    path: str | os.PathLike[str], gpu_uuid: str, pid: int, memory_mib: int, pod_uid: str | None = None
) -> bool:
    """Show a compute process on the GPU ``gpu_uuid`` of the spec at ``path``; False if no such GPU."""
    with _editing(path) as spec:
        for gpu in spec["gpus"]:
            if gpu.get("uuid") == gpu_uuid:
                procs = [p for p in gpu.get("processes") or [] if p.get("pid") != pid]
                procs.append({"pid": pid, "memory_mib": memory_mib, "pod_uid": pod_uid})
                gpu["processes"] = procs
                return True
    return False


def remove_processes(path: str | os.PathLike[str], pod_uid: str) -> int:
    """Remove the processes of a pod from every GPU of the spec; return how many went."""
    removed = 0
    with _editing(path) as spec:
        for gpu in spec["gpus"]:
            procs = gpu.get("processes") or []
            kept = [p for p in procs if p.get("pod_uid") != pod_uid]
            removed += len(procs) - len(kept)
            gpu["processes"] = kept
    return removed


def inject_xid(path: str | os.PathLike[str], gpu_index: int, xid: int) -> int:
    """Queue one XID event on GPU ``gpu_index``; return its event id."""
    with _editing(path) as spec:
        events = spec.setdefault("xid_events", []) or []
        event_id = 1 + max((int(e.get("id", 0)) for e in events), default=0)
        events.append({"id": event_id, "gpu": gpu_index, "xid": xid})
        spec["xid_events"] = events
    return event_id


# -- the structures the real binding returns, with their field names ----------------------------


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _PciInfo:
    busId: bytes
    busIdLegacy: bytes
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int


@dataclass
class _ProcessInfo:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int
    computeInstanceId: int


@dataclass
class _EventData:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int


@dataclass(frozen=True)
class _Handle:
    """A device handle: the GPU's index, and the MIG device's index when it is one."""

    index: int
    mig: int | None = None


class _EventSet:
    def __init__(self) -> None:
        self.devices: set[int] = set()
        self.types = 0


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """The ``pynvml`` functions the agent uses, on the GPUs of a spec (a dict or a YAML file).

    Unknown attributes (constants, error classes) are the real ``pynvml``'s, so code written
    against the real module runs unchanged on this object.

    :param spec: the spec as a dict, or the path of a YAML file (read again when it changes)
    """

    def __init__(self, spec: dict[str, Any] | str | os.PathLike[str]) -> None:
        self._path = None if isinstance(spec, dict) else Path(spec)
        self._mtime = -1.0
        self._spec: dict[str, Any] = copy.deepcopy(spec) if isinstance(spec, dict) else {}
        self._initialised = 0
        self._delivered: set[int] = set()
        self._lock = threading.Lock()
        self._reload()

    def __getattr__(self, name: str) -> Any:
        # Constants and error classes are the real binding's.
        if name.startswith(("NVML", "nvmlEventType", "NVMLError")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # -- the spec --------------------------------------------------------------------------

    def _reload(self) -> None:
        if self._path is None:
            return
        try:
            mtime = self._path.stat().st_mtime_ns
        except FileNotFoundError:
            raise _error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) from None
        if mtime != self._mtime:
            self._spec = load_spec(self._path)
            self._mtime = mtime

    @property
    def spec(self) -> dict[str, Any]:
        """The spec as last read (tests change a dict spec through it)."""
        return self._spec

    def _gpus(self) -> list[dict[str, Any]]:
        return list(self._spec.get("gpus") or [])

    def _gpu(self, handle: _Handle) -> dict[str, Any]:
        self._check_init()
        gpus = self._gpus()
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = gpus[handle.index]
        if gpu.get("lost"):
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _check_init(self) -> None:
        if not self._initialised:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)

    # -- init ------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        """Start NVML; ``NVMLError_LibraryNotFound`` when the spec file is gone (no driver)."""
        self._reload()
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        """Stop NVML (reference counted, as the real library)."""
        self._check_init()
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        """The driver version."""
        self._check_init()
        return str(self._spec.get("driver_version", "550.54.15"))

    # -- devices ---------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        """How many GPUs; the spec file is read again first when it changed."""
        self._check_init()
        with self._lock:
            self._reload()
        return len(self._gpus())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        """The handle of GPU ``index``."""
        self._check_init()
        if not 0 <= index < len(self._gpus()):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        """The index of a GPU."""
        self._gpu(handle)
        return handle.index

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        """The product name (``NVIDIA A100-SXM4-80GB``)."""
        return str(self._gpu(handle).get("name", "NVIDIA A100-SXM4-80GB"))

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        """The GPU's UUID, or a MIG device's own ``MIG-`` UUID."""
        gpu = self._gpu(handle)
        if handle.mig is not None:
            return str(self._mig(gpu, handle)["uuid"])
        return str(gpu["uuid"])

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _PciInfo:
        """The PCI info; ``busId`` is bytes, as the real structure's ``c_char`` array reads."""
        bus_id = str(self._gpu(handle).get("bus_id", f"00000000:{7 + handle.index:02X}:00.0"))
        domain, bus, rest = bus_id.split(":")
        device = rest.split(".")[0]
        raw = bus_id.encode()
        return _PciInfo(raw, raw[:16], int(domain, 16), int(bus, 16), int(device, 16), 0x20B210DE, 0x134F10DE)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Memory:
        """Memory in bytes: total, free and used (the processes' memory plus a little for the driver)."""
        gpu = self._gpu(handle)
        if handle.mig is not None:
            mig = self._mig(gpu, handle)
            total = int(mig.get("memory_mib", 9856)) * MIB
            used = sum(int(p.get("memory_mib", 0)) for p in mig.get("processes") or []) * MIB
            return _Memory(total, total - used, used)
        total = int(gpu.get("memory_mib", 81920)) * MIB
        used_mib = sum(int(p.get("memory_mib", 0)) for p in gpu.get("processes") or [])
        used = min(total, (used_mib + int(gpu.get("reserved_mib", 0))) * MIB)
        return _Memory(total, total - used, used)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:
        """SM and memory utilization in percent; a GPU with processes defaults to busy."""
        gpu = self._gpu(handle)
        busy = 90 if gpu.get("processes") else 0
        util = gpu.get("utilization") or {}
        return _Utilization(int(util.get("gpu", busy)), int(util.get("memory", busy // 2)))

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        """The temperature in °C (only ``NVML_TEMPERATURE_GPU`` exists)."""
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._gpu(handle).get("temperature", 40))

    def nvmlDeviceGetTemperatureThreshold(self, handle: _Handle, threshold: int) -> int:
        """The slowdown (or shutdown) threshold in °C."""
        gpu = self._gpu(handle)
        if threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            return int(gpu.get("slowdown_temperature", 90))
        if threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
            return int(gpu.get("shutdown_temperature", 95))
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        """Power draw in milliwatts."""
        return int(self._gpu(handle).get("power_mw", 60000))

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, errorType: int, counterType: int) -> int:
        """ECC errors since the driver loaded (volatile) or over the GPU's life (aggregate)."""
        ecc = self._gpu(handle).get("ecc")
        if ecc is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        key = "uncorrected" if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        return int(ecc.get(key, 0))

    def nvmlDeviceGetRetiredPages(self, device: _Handle, sourceFilter: int) -> list[int]:
        """Addresses of retired pages for one cause (pre-Ampere GPUs; A100 and later remap rows)."""
        pages = self._gpu(device).get("retired_pages")
        if pages is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        key = (
            "double_bit"
            if sourceFilter == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
            else "single_bit"
        )
        return [0x1000 * (i + 1) for i in range(int(pages.get(key, 0)))]

    def nvmlDeviceGetRemappedRows(self, device: _Handle) -> tuple[int, int, int, int]:
        """``(corrected, uncorrected, pending, failure)`` row remappings (Ampere and later)."""
        rows = self._gpu(device).get("remapped_rows") or {}
        return (
            int(rows.get("corrected", 0)),
            int(rows.get("uncorrected", 0)),
            int(bool(rows.get("pending", False))),
            int(bool(rows.get("failure", False))),
        )

    # -- MIG -------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        """``[current, pending]`` MIG mode."""
        mode = int(bool(self._gpu(device).get("mig")))
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        """How many MIG devices the GPU may have (7)."""
        self._gpu(device)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _Handle:
        """The handle of MIG device ``index``; ``NVMLError_NotFound`` past the last one."""
        migs = self._gpu(device).get("mig") or []
        if not 0 <= index < len(migs):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(device.index, index)

    @staticmethod
    def _mig(gpu: dict[str, Any], handle: _Handle) -> dict[str, Any]:
        migs = gpu.get("mig") or []
        assert handle.mig is not None
        if handle.mig >= len(migs):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return dict(migs[handle.mig])

    # -- processes -------------------------------------------------------------------------

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_ProcessInfo]:
        """The compute processes on a GPU (or a MIG device), memory in bytes."""
        gpu = self._gpu(handle)
        source = self._mig(gpu, handle) if handle.mig is not None else gpu
        return [
            _ProcessInfo(int(p["pid"]), int(p.get("memory_mib", 0)) * MIB, 0xFFFFFFFF, 0xFFFFFFFF)
            for p in source.get("processes") or []
        ]

    def pod_uid_of(self, pid: int) -> str | None:
        """The pod of a process, as its cgroup would say (the spec's ``pod_uid``); not an NVML call."""
        for gpu in self._gpus():
            for p in gpu.get("processes") or []:
                if int(p.get("pid", -1)) == pid:
                    uid = p.get("pod_uid")
                    return None if uid is None else str(uid)
        return None

    # -- events ----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        """A new event set."""
        self._check_init()
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, eventTypes: int, eventSet: _EventSet) -> None:
        """Deliver events of ``eventTypes`` on this GPU to ``eventSet``."""
        self._gpu(handle)
        eventSet.devices.add(handle.index)
        eventSet.types |= eventTypes

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> _EventData:
        """The next undelivered XID of a registered GPU; ``NVMLError_Timeout`` when there is none.

        Never sleeps: a fake has nothing to wait for.
        """
        self._check_init()
        with self._lock:
            self._reload()
            for event in self._spec.get("xid_events") or []:
                event_id = int(event.get("id", id(event)))
                gpu = int(event.get("gpu", 0))
                wanted = eventSet.types & pynvml.nvmlEventTypeXidCriticalError
                if event_id in self._delivered or gpu not in eventSet.devices or not wanted:
                    continue
                self._delivered.add(event_id)
                return _EventData(_Handle(gpu), pynvml.nvmlEventTypeXidCriticalError, int(event["xid"]), 0, 0)
        raise _error(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        """Free an event set."""
        eventSet.devices.clear()
