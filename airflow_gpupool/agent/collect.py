"""Read a node's GPUs through NVML (``nvidia-ml-py``, ``import pynvml``) into a :class:`NodeReport`.

The backend is the ``pynvml`` module itself, or anything with its function names, return shapes
and errors (the testing kit's :class:`~airflow_gpupool.testing.fake_nvml.FakeNvml`). A reading a
GPU does not support (``NVMLError_NotSupported``: ECC on a consumer card, retired pages on
Ampere, which remaps rows instead) is None in the report, not an error; a GPU NVML calls lost
(``NVMLError_GpuIsLost``, fallen off the bus) is reported as lost. Critical XIDs come from NVML's
event API: an event set registered for ``nvmlEventTypeXidCriticalError`` on every GPU, drained
without waiting at each sample.

A process's pod is read from its cgroup (``/proc/<pid>/cgroup`` names ``pod<uid>`` under
``kubepods``), which is why the DaemonSet runs in the host's PID namespace.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_gpupool.exceptions import NoGpuError
from airflow_gpupool.ledger import GpuSample, MigSample, NodeReport, ProcessSample

__all__ = ["NvmlCollector", "pod_uid_from_cgroup"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: The NVML errors that mean "no GPU, or no driver, here" (error codes of ``nvidia-ml-py``).
_NO_GPU_CODES = {
    12: "the NVML library (libnvidia-ml.so) is not installed: no NVIDIA driver on this node",
    9: "the NVIDIA driver is not loaded",
    4: "no permission to use NVML (run the agent with the NVIDIA runtime)",
    6: "no GPU found",
}
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def pod_uid_from_cgroup(pid: int, proc: Path = Path("/proc")) -> str | None:
    """Return the uid of the pod a process runs in, from its cgroup path; None when it is in none."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-") if match else None


class NvmlCollector:
    """Samples a node's GPUs through an NVML backend.

    :param nvml: the ``pynvml`` module, or a fake with its functions
    :param node: the node's name, as the ledger knows it
    :param pod_uid_of: the pod of a process (default: its cgroup)
    :param clock: seconds since the epoch, for ``collected_at``
    """

    def __init__(
        self,
        nvml: Any,
        node: str,
        *,
        pod_uid_of: Callable[[int], str | None] = pod_uid_from_cgroup,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.node = node
        self.pod_uid_of = pod_uid_of
        self.clock = clock
        self._events: Any = None
        self._open = False

    def open(self) -> None:
        """Start NVML and register for critical XID events.

        :raises NoGpuError: no driver, no GPU or no permission: what to do, not a traceback
        """
        nvml = self.nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            raise NoGpuError(self.node, _NO_GPU_CODES.get(e.value, f"NVML failed: {e}")) from e
        self._open = True
        if count == 0:
            raise NoGpuError(self.node, _NO_GPU_CODES[6])
        self._events = self._register_events(count)

    def _register_events(self, count: int) -> Any:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            log.warning("NVML events unavailable (%s): XIDs will not be seen", e)
            return None
        for i in range(count):
            try:
                nvml.nvmlDeviceRegisterEvents(
                    nvml.nvmlDeviceGetHandleByIndex(i), nvml.nvmlEventTypeXidCriticalError, events
                )
            except nvml.NVMLError as e:  # not supported on this GPU, or it is lost: sampled anyway
                log.warning("GPU %d: no XID events (%s)", i, e)
        return events

    def close(self) -> None:
        """Free the event set and stop NVML."""
        if not self._open:
            return
        nvml = self.nvml
        try:
            if self._events is not None:
                nvml.nvmlEventSetFree(self._events)
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:
            log.warning("NVML shutdown failed: %s", e)
        self._open = False

    def __enter__(self) -> NvmlCollector:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one sample ------------------------------------------------------------------------

    def sample(self, interval_s: float) -> NodeReport:
        """Read every GPU once, with the XIDs raised since the last sample."""
        nvml = self.nvml
        xids = self._drain_xids()
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            gpus.append(self._gpu(i, xids.get(i, ())))
        return NodeReport(
            node=self.node,
            collected_at=self.clock(),
            interval_s=interval_s,
            driver_version=self._optional(nvml.nvmlSystemGetDriverVersion) or "",
            gpus=tuple(gpus),
        )

    def _drain_xids(self) -> dict[int, tuple[int, ...]]:
        nvml = self.nvml
        out: dict[int, list[int]] = {}
        if self._events is None:
            return {}
        while True:
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as e:
                log.warning("NVML event wait failed: %s", e)
                break
            if event.eventType & nvml.nvmlEventTypeXidCriticalError:
                index = nvml.nvmlDeviceGetIndex(event.device)
                out.setdefault(index, []).append(int(event.eventData))
        return {i: tuple(x) for i, x in out.items()}

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call an NVML function; None when the GPU does not support it (or it failed)."""
        try:
            return fn(*args)
        except self.nvml.NVMLError_GpuIsLost:
            raise
        except self.nvml.NVMLError:
            return None

    def _gpu(self, index: int, xids: tuple[int, ...]) -> GpuSample:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            uuid = nvml.nvmlDeviceGetUUID(handle)
            bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError_GpuIsLost:
            return GpuSample(index=index, uuid="", bus_id="", lost=True, xids=xids)
        try:
            return self._readings(index, handle, _text(uuid), bus_id, xids)
        except nvml.NVMLError_GpuIsLost:
            return GpuSample(index=index, uuid=_text(uuid), bus_id=bus_id, lost=True, xids=xids)

    def _readings(self, index: int, handle: Any, uuid: str, bus_id: str, xids: tuple[int, ...]) -> GpuSample:
        nvml = self.nvml
        opt = self._optional
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = opt(nvml.nvmlDeviceGetUtilizationRates, handle)
        power = opt(nvml.nvmlDeviceGetPowerUsage, handle)
        rows = opt(nvml.nvmlDeviceGetRemappedRows, handle)
        sbe = opt(
            nvml.nvmlDeviceGetRetiredPages,
            handle,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        dbe = opt(
            nvml.nvmlDeviceGetRetiredPages, handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        return GpuSample(
            index=index,
            uuid=uuid,
            bus_id=bus_id,
            model=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mib=int(memory.total) // MIB,
            memory_used_mib=int(memory.used) // MIB,
            utilization_gpu=None if util is None else int(util.gpu),
            utilization_memory=None if util is None else int(util.memory),
            temperature_c=opt(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
            slowdown_temperature_c=opt(
                nvml.nvmlDeviceGetTemperatureThreshold, handle, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            power_w=None if power is None else power / 1000.0,
            ecc_corrected=opt(
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                nvml.NVML_VOLATILE_ECC,
            ),
            ecc_uncorrected=opt(
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            ),
            retired_pages=None if sbe is None and dbe is None else len(sbe or ()) + len(dbe or ()),
            remapped_rows_corrected=None if rows is None else int(rows[0]),
            remapped_rows_uncorrected=None if rows is None else int(rows[1]),
            remapping_failed=bool(rows and rows[3]),
            mig=self._migs(handle),
            processes=self._processes(handle),
            xids=xids,
        )

    def _migs(self, handle: Any) -> tuple[MigSample, ...]:
        nvml = self.nvml
        mode = self._optional(nvml.nvmlDeviceGetMigMode, handle)
        if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return ()
        out = []
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nvml.NVMLError_NotFound:
                continue
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            out.append(
                MigSample(
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    memory_total_mib=int(memory.total) // MIB,
                    memory_used_mib=int(memory.used) // MIB,
                    processes=self._processes(mig),
                )
            )
        return tuple(out)

    def _processes(self, handle: Any) -> tuple[ProcessSample, ...]:
        procs = self._optional(self.nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return tuple(
            ProcessSample(
                pid=int(p.pid),
                memory_mib=int(p.usedGpuMemory or 0) // MIB,
                pod_uid=self.pod_uid_of(int(p.pid)),
            )
            for p in procs
        )


def _text(value: Any) -> str:
    """NVML strings: ``str`` from the decorated functions, ``bytes`` from ``c_char`` fields."""
    return value.decode() if isinstance(value, bytes) else str(value)
