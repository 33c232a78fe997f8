"""What a node agent reports each interval, and what the ledger makes of it (pure).

:class:`NodeReport` is the report the agent (:mod:`airflow_gpupool.agent`) reads from NVML and
the ledger stores with each heartbeat. :func:`assess_gpu` turns one GPU's sample, the previous
report and the grants on it into a :class:`GpuAssessment`: quarantine it alone, warn its grants
(an emergency checkpoint), a memory leak, an idle grant, and how much of each grant is used.

Which XIDs act, and why (NVIDIA's XID catalogue, "Xid Errors", r550):

* quarantine the GPU: 48 (double-bit ECC error: data was lost), 63 (ECC page retirement or row
  remapping recorded: the bad memory is only fenced off after a GPU reset), 64 (page retirement
  or row remapping failed), 74 (NVLink error: multi-GPU work on it corrupts or hangs), 79 (the GPU
  fell off the bus), 95 (uncontained ECC error: every context on the GPU is affected);
* warn the grants on it (checkpoint now, the GPU keeps running): 92 (high single-bit ECC error
  rate, the usual precursor of 48) and 94 (contained ECC error: only the faulting context died);
* ignore (recorded in the report only): application faults such as 13, 31, 43 and 45, which say
  the program misbehaved, not the GPU.

A GPU that NVML says is lost (``NVMLError_GpuIsLost``), volatile uncorrected ECC errors, or a row
remapping failure also quarantine it; correctable ECC errors rising since the last report, or a
temperature within 5 °C of the slowdown threshold, warn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CRITICAL_XIDS",
    "WARNING_XIDS",
    "GpuAssessment",
    "GpuSample",
    "GrantOnGpu",
    "MigSample",
    "NodeReport",
    "ProcessSample",
    "assess_gpu",
]

#: XIDs that quarantine the GPU they happen on, with why.
CRITICAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping pending a GPU reset",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    95: "uncontained ECC error",
}
#: XIDs that ask the grants on the GPU for an emergency checkpoint.
WARNING_XIDS: dict[int, str] = {
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
}
#: How close to the slowdown threshold a temperature warns, in °C.
TEMPERATURE_MARGIN_C = 5


@dataclass(frozen=True)
class ProcessSample:
    """A compute process on a GPU: its pid, memory and (from its cgroup) its pod."""

    pid: int
    memory_mib: int
    pod_uid: str | None = None


@dataclass(frozen=True)
class MigSample:
    """A MIG device of a GPU, with its own ``MIG-`` UUID."""

    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    processes: tuple[ProcessSample, ...] = ()


@dataclass(frozen=True)
class GpuSample:
    """One GPU as NVML sees it; a field NVML does not support on this GPU is None.

    :param lost: NVML reported the GPU lost (fallen off the bus); the other readings are empty
    :param xids: critical XID events (NVML's event API) since the last report
    """

    index: int
    uuid: str
    bus_id: str
    model: str = ""
    memory_total_mib: int = 0
    memory_used_mib: int = 0
    utilization_gpu: int | None = None
    utilization_memory: int | None = None
    temperature_c: int | None = None
    slowdown_temperature_c: int | None = None
    power_w: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    retired_pages: int | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remapping_failed: bool = False
    mig: tuple[MigSample, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    lost: bool = False
    xids: tuple[int, ...] = ()

    @property
    def all_processes(self) -> tuple[ProcessSample, ...]:
        """The GPU's processes and those of its MIG devices."""
        return self.processes + tuple(p for m in self.mig for p in m.processes)


@dataclass(frozen=True)
class NodeReport:
    """What one agent read on its node in one interval."""

    node: str
    collected_at: float
    interval_s: float
    driver_version: str = ""
    gpus: tuple[GpuSample, ...] = ()
    agent_cpu_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (``--json``, the ledger's column)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeReport:
        """Rebuild a report from :meth:`to_dict` output."""
        gpus = []
        for g in data.get("gpus") or ():
            values = dict(g)
            values["processes"] = tuple(ProcessSample(**p) for p in values.get("processes") or ())
            values["mig"] = tuple(
                MigSample(**{**m, "processes": tuple(ProcessSample(**p) for p in m.get("processes") or ())})
                for m in values.get("mig") or ()
            )
            values["xids"] = tuple(values.get("xids") or ())
            gpus.append(GpuSample(**values))
        return cls(
            node=data["node"],
            collected_at=float(data["collected_at"]),
            interval_s=float(data["interval_s"]),
            driver_version=data.get("driver_version", ""),
            gpus=tuple(gpus),
            agent_cpu_s=data.get("agent_cpu_s"),
        )


@dataclass(frozen=True)
class GrantOnGpu:
    """A live grant on a GPU, as the assessment needs it."""

    reservation_id: str
    pod_uid: str | None
    team: str
    node_pool: str
    milli: int
    memory_mib: int
    granted_at: float


@dataclass(frozen=True)
class GpuAssessment:
    """What one GPU's sample means.

    :param quarantine: why the GPU must take no new grants (empty: it need not)
    :param warnings: why its grants should checkpoint now
    :param leak: a memory leak held past the grace: pids, MiB and since when (None: none)
    :param leak_since: since when processes hold memory no grant holds (None: they do not)
    :param idle: grants on the GPU showing no process and no utilization, with since when
    :param usage: per grant id: the memory its pod's processes use and the GPU's utilization
    """

    quarantine: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    leak: dict[str, Any] | None = None
    leak_since: float | None = None
    idle: dict[str, float] = field(default_factory=dict)
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)


def _health_reasons(sample: GpuSample, previous: GpuSample | None) -> tuple[list[str], list[str]]:
    critical: list[str] = []
    warnings: list[str] = []
    if sample.lost:
        critical.append("GPU lost (fallen off the bus)")
    for xid in sample.xids:
        if xid in CRITICAL_XIDS:
            critical.append(f"XID {xid}: {CRITICAL_XIDS[xid]}")
        elif xid in WARNING_XIDS:
            warnings.append(f"XID {xid}: {WARNING_XIDS[xid]}")
    if sample.ecc_uncorrected:
        critical.append(f"{sample.ecc_uncorrected} uncorrectable ECC error(s)")
    if sample.remapping_failed:
        critical.append("row remapping failed")
    before = previous.ecc_corrected if previous is not None else None
    if sample.ecc_corrected is not None and before is not None and sample.ecc_corrected > before:
        warnings.append(f"correctable ECC errors rising ({before} -> {sample.ecc_corrected})")
    hot, limit = sample.temperature_c, sample.slowdown_temperature_c
    if hot is not None and limit is not None and hot >= limit - TEMPERATURE_MARGIN_C:
        warnings.append(f"temperature {hot} °C near the slowdown threshold {limit} °C")
    return critical, warnings


def assess_gpu(
    sample: GpuSample,
    previous: GpuSample | None,
    previous_state: Mapping[str, Any],
    grants: Sequence[GrantOnGpu],
    *,
    now: float,
    leak_grace_s: float,
) -> GpuAssessment:
    """Judge one GPU's sample.

    A leak: processes hold memory on a GPU while no live grant holds it (or only processes of pods
    that no grant on it is bound to), for longer than ``leak_grace_s``.

    :param previous: the same GPU in the previous report (None: first report)
    :param previous_state: what the previous assessment stored (``leak_since``, ``idle``)
    :param grants: the live grants on the GPU
    """
    critical, warnings = _health_reasons(sample, previous)
    pods = {g.pod_uid for g in grants if g.pod_uid}
    stray = [
        p for p in sample.all_processes if not grants or (p.pod_uid is not None and p.pod_uid not in pods)
    ]
    stray_mib = sum(p.memory_mib for p in stray)
    leak_since = None
    leak = None
    if stray and stray_mib > 0:
        leak_since = float(previous_state.get("leak_since") or now)
        if now - leak_since >= leak_grace_s:
            leak = {"pids": sorted(p.pid for p in stray), "memory_mib": stray_mib, "since": leak_since}
    usage: dict[str, dict[str, Any]] = {}
    idle: dict[str, float] = {}
    before_idle = previous_state.get("idle") or {}
    for g in grants:
        used = sum(p.memory_mib for p in sample.all_processes if g.pod_uid and p.pod_uid == g.pod_uid)
        busy = bool(used) or bool(sample.utilization_gpu)
        usage[g.reservation_id] = {
            "memory_used_mib": used,
            "memory_reserved_mib": g.memory_mib,
            "milli": g.milli,
            # A shared GPU's utilization cannot be split by process: each fraction sees the whole.
            "utilization": sample.utilization_gpu if used or len(grants) == 1 else 0,
            "team": g.team,
            "node_pool": g.node_pool,
        }
        if not busy:
            idle[g.reservation_id] = float(before_idle.get(g.reservation_id) or max(g.granted_at, now))
    return GpuAssessment(tuple(critical), tuple(warnings), leak, leak_since, idle, usage)
