"""What the emulator's pods ran on, and when: the cluster's side of "no GPU used twice at once".

The ledger can only say what it granted. Whether two live pods ever shared a GPU is a fact of
the cluster: this module records, per pod uid, the node it ran on, the GPUs (or MIG slice) it
was pinned to and when its containers started and ended, as the simulated kubelet sees them.
The GPUs are read from the pod the way ``pin_pod`` (``operators/pod/pod_spec.py``) writes them: the
container env ``GPUPOOL_GPU_INDICES`` / ``GPUPOOL_MIG_SLICE`` / ``GPUPOOL_GPU_MILLI``, else the
``gpupool.io/gpus`` annotation. :func:`gpu_overlaps` then checks that no GPU ever carried more
than its whole at once (two whole-GPU pods, or fractions summing past 1000 milli).

A pod uses its GPUs from the moment its containers run until it ends or is deleted; a pod that
is only ``Pending`` uses nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_gpupool.labels import ANNOTATION_PREFIX, RESERVATION_LABEL

__all__ = ["GpuUse", "PodHistory", "PodRecord", "gpu_overlaps", "pinned_gpus"]

WHOLE_GPU_MILLI = 1000
_GPUS_ANNOTATION = f"{ANNOTATION_PREFIX}gpus"


@dataclasses.dataclass(frozen=True)
class GpuUse:
    """The GPUs a pod was pinned to.

    :param devices: GPU indices as strings (``"0"``), or ``"mig:<slice>"`` for a MIG slice
    :param milli: the share of each device it takes (1000: all of it)
    """

    devices: tuple[str, ...] = ()
    milli: int = WHOLE_GPU_MILLI


@dataclasses.dataclass
class PodRecord:
    """One pod's life on the emulated cluster.

    :param uid: the pod uid
    :param namespace: its namespace
    :param name: its name
    :param reservation_id: its ``gpupool.io/reservation-id`` label, if any
    :param gpus: what it was pinned to
    :param created_at: ``time.time()`` at creation
    :param node: the node it ran on (once scheduled)
    :param started_at: when its containers started running
    :param ended_at: when it ended (terminated or deleted)
    :param end: ``Succeeded``, ``Failed`` or ``Deleted``
    :param labels: its labels at creation
    """

    uid: str
    namespace: str
    name: str
    reservation_id: str | None
    gpus: GpuUse
    created_at: float
    node: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    end: str | None = None
    labels: dict[str, str] = dataclasses.field(default_factory=dict)

    def running_between(self, now: float) -> tuple[float, float] | None:
        """Return ``(start, end)`` of its running time (``end`` is ``now`` while it runs), or ``None``."""
        if self.started_at is None:
            return None
        return self.started_at, self.ended_at if self.ended_at is not None else now

    def describe(self) -> str:
        """Return ``namespace/name (uid, reservation)`` for messages."""
        return f"{self.namespace}/{self.name} (uid {self.uid}, reservation {self.reservation_id})"


def pinned_gpus(pod: Mapping[str, Any]) -> GpuUse:
    """Return the GPUs a pod was pinned to, from its env (``pin_pod``) or its annotations.

    :param pod: the pod object
    """
    env: dict[str, str] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        for var in container.get("env") or []:
            if var.get("name", "").startswith("GPUPOOL_") and var.get("value") is not None:
                env.setdefault(var["name"], str(var["value"]))
    milli = int(env.get("GPUPOOL_GPU_MILLI") or WHOLE_GPU_MILLI)
    if env.get("GPUPOOL_MIG_SLICE"):
        return GpuUse((f"mig:{env['GPUPOOL_MIG_SLICE']}",), WHOLE_GPU_MILLI)
    indices = env.get("GPUPOOL_GPU_INDICES")
    if indices is None:
        indices = ((pod.get("metadata") or {}).get("annotations") or {}).get(_GPUS_ANNOTATION, "")
    devices = tuple(i.strip() for i in indices.split(",") if i.strip())
    return GpuUse(devices, milli)


class PodHistory:
    """Every pod the kubelet saw, by uid, kept after deletion.

    :param clock: wall clock (``time.time``)
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._records: dict[str, PodRecord] = {}

    def created(self, pod: Mapping[str, Any]) -> None:
        """Record a new pod.

        :param pod: the pod as stored
        """
        meta = pod.get("metadata") or {}
        self._records[meta["uid"]] = PodRecord(
            uid=meta["uid"],
            namespace=meta.get("namespace") or "default",
            name=meta["name"],
            reservation_id=(meta.get("labels") or {}).get(RESERVATION_LABEL),
            gpus=pinned_gpus(pod),
            created_at=self._clock(),
            labels=dict(meta.get("labels") or {}),
        )

    def started(self, uid: str, node: str) -> None:
        """Record that a pod's containers run on ``node``.

        :param uid: the pod uid
        :param node: its node
        """
        record = self._records.get(uid)
        if record is not None and record.started_at is None:
            record.node, record.started_at = node, self._clock()

    def ended(self, uid: str, how: str) -> None:
        """Record that a pod ended (the first end wins: a deleted finished pod stays finished).

        :param uid: the pod uid
        :param how: ``Succeeded``, ``Failed`` or ``Deleted``
        """
        record = self._records.get(uid)
        if record is not None and record.ended_at is None:
            record.ended_at, record.end = self._clock(), how

    def records(self) -> list[PodRecord]:
        """Return copies of every record, oldest first."""
        records = sorted(self._records.values(), key=lambda r: r.created_at)
        return [dataclasses.replace(r, labels=dict(r.labels)) for r in records]

    def clear(self) -> None:
        """Forget every pod."""
        self._records.clear()


def gpu_overlaps(records: Iterable[PodRecord], now: float | None = None) -> list[str]:
    """Return one message for each time a GPU carried more than its whole (empty: never).

    Two pods overlap when both ran on the same node, pinned to a common device, at the same
    time, and their shares of it sum past 1000 milli.

    :param records: pod records (:meth:`PodHistory.records`)
    :param now: the end of pods still running; ``time.time()`` when ``None``
    """
    now = time.time() if now is None else now
    by_device: dict[tuple[str, str], list[tuple[float, float, PodRecord]]] = {}
    for record in records:
        span = record.running_between(now)
        if span is None or record.node is None:
            continue
        for device in record.gpus.devices:
            by_device.setdefault((record.node, device), []).append((*span, record))
    problems = []
    for (node, device), uses in sorted(by_device.items()):
        problems.extend(_overlaps_on(node, device, sorted(uses, key=lambda u: u[0])))
    return problems


def _overlaps_on(node: str, device: str, uses: list[tuple[float, float, PodRecord]]) -> list[str]:
    """Return the overlaps on one device; ``uses`` sorted by start.

    :param node: the node
    :param device: the device
    :param uses: ``(start, end, record)`` of each pod on it
    """
    problems = []
    for i, (start, end, record) in enumerate(uses):
        live = [(s, e, r) for s, e, r in uses[:i] if e > start]
        if live and sum(r.gpus.milli for _, _, r in live) + record.gpus.milli > WHOLE_GPU_MILLI:
            others = ", ".join(f"{r.describe()} [{s:.2f}, {e:.2f}]" for s, e, r in live)
            problems.append(
                f"GPU {device} of node {node}: pod {record.describe()} ran [{start:.2f}, {end:.2f}] "
                f"while {others} still ran on it"
            )
    return problems
