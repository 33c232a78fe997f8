"""What GPUs a pod holds, read from its spec and annotations as the device plugins allocate them.

The controller's pod watch counts every live, scheduled pod that holds GPUs and is bound to no
grant as an *external hold* in the ledger (:mod:`~airflow_gpupool.ledger.nodes.external`). This
module reads a pod (its JSON, as the API server sends it) into what it holds:

* ``nvidia.com/gpu: N``: N whole GPUs (NVIDIA's device plugin);
* ``nvidia.com/mig-<profile>: N``: N MIG slices of that profile (the ``mixed`` strategy);
* HAMi: ``nvidia.com/gpu: N`` with ``nvidia.com/gpucores`` (percent of each GPU) and/or
  ``nvidia.com/gpumem`` (MiB of each GPU): a share of N GPUs; the GPUs HAMi chose are in the
  ``hami.io/vgpu-devices-allocated`` annotation;
* KAI Scheduler: the ``gpu-fraction`` annotation (a share of one GPU, or of
  ``gpu-fraction-num-devices`` GPUs) or ``gpu-memory`` (MiB of one GPU).

A pod's request for a resource is what Kubernetes counts: the larger of its containers' sum and
its largest init container, each container's request defaulting to its limit. A quantity that
cannot be read (not a whole number, negative, an unknown MIG profile name) makes the pod
*unreadable*: the ledger then holds every free GPU of its node (counted conservatively: better
an idle GPU than two pods on one), and says why.

Placeholder pods (labelled ``gpupool.io/scale-up-for``, made to ask the autoscaler for a node)
hold GPUs nobody uses and are not counted. DRA ResourceClaims are not read here: a pod whose GPUs come from a claim holds no
``nvidia.com`` resource and is not counted (see the README's "Pods the ledger did not grant").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpupool.labels import GANG_RESERVATION_LABEL, RESERVATION_LABEL, SCALE_UP_LABEL
from airflow_gpupool.quantity import parse_quantity

__all__ = ["ExternalPod", "GpuUse", "external_pod", "gpu_use", "holds_gpus_now"]

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_DEVICES_ANNOTATION = "hami.io/vgpu-devices-allocated"
KAI_FRACTION_ANNOTATION = "gpu-fraction"
KAI_FRACTION_DEVICES_ANNOTATION = "gpu-fraction-num-devices"
KAI_MEMORY_ANNOTATION = "gpu-memory"

# NVIDIA's MIG profile names: ``1g.10gb``, ``3g.40gb``, ``1g.10gb+me``, ``1c.3g.40gb``.
_MIG_PROFILE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb(\+me)?$")
_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F-]+")
_MILLI = 1000


@dataclass(frozen=True)
class GpuUse:
    """The GPUs one pod holds.

    :param whole: whole GPUs
    :param shared: GPUs the pod holds a share of (HAMi, KAI), each ``share_milli`` of compute and
        ``share_memory_mib`` of memory; ``share_milli`` None: as much compute as the memory's share
    :param mig: MIG slices by profile, as ``(profile, count)`` pairs
    :param devices: the UUIDs of the GPUs the pod holds, when its annotations say (HAMi)
    :param unreadable: why the pod's GPUs could not be read; then every free GPU of its node is held
    """

    whole: int = 0
    shared: int = 0
    share_milli: int | None = None
    share_memory_mib: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    devices: tuple[str, ...] = ()
    unreadable: str | None = None

    @property
    def any(self) -> bool:
        """Whether the pod holds any GPU (an unreadable pod counts as holding some)."""
        return bool(self.whole or self.shared or self.mig or self.unreadable)


@dataclass(frozen=True)
class ExternalPod:
    """A live pod on a node, with the GPUs it holds and the grant it may run under.

    :param reservation_id: its ``gpupool.io/reservation-id`` label: a pod this project launched
    :param gang_reservation: its ``gpupool.io/gang-reservation`` label: a gang Job's member
    """

    namespace: str
    name: str
    uid: str
    node: str
    use: GpuUse
    reservation_id: str | None = None
    gang_reservation: str | None = None

    @property
    def key(self) -> str:
        """``namespace/name``: the pod's identity as the ledger's holder names it."""
        return f"{self.namespace}/{self.name}"


def holds_gpus_now(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` occupies its node now: bound to a node and not finished (``Terminating`` included)."""
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    return bool(spec.get("nodeName")) and phase not in ("Succeeded", "Failed")


def external_pod(pod: Mapping[str, Any]) -> ExternalPod | None:
    """Return the pod as the ledger counts it; None when it holds no GPU on a node now."""
    if not holds_gpus_now(pod):
        return None
    meta = pod.get("metadata") or {}
    if SCALE_UP_LABEL in (meta.get("labels") or {}):
        return None  # a placeholder that asks the autoscaler for a node: nobody uses its GPUs
    use = gpu_use(pod)
    if not use.any:
        return None
    labels = meta.get("labels") or {}
    return ExternalPod(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str(pod["spec"]["nodeName"]),
        use=use,
        reservation_id=labels.get(RESERVATION_LABEL),
        gang_reservation=labels.get(GANG_RESERVATION_LABEL),
    )


def gpu_use(pod: Mapping[str, Any]) -> GpuUse:
    """Return the GPUs ``pod`` holds, read from its resources and annotations."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        requests = _pod_requests(pod.get("spec") or {})
        use = _from_resources(requests)
        if not use.any:
            use = _from_kai(annotations)
    except _Unreadable as e:
        return GpuUse(unreadable=str(e))
    devices = tuple(_GPU_UUID.findall(str(annotations.get(HAMI_DEVICES_ANNOTATION) or "")))
    if devices and use.any:
        use = GpuUse(use.whole, use.shared, use.share_milli, use.share_memory_mib, use.mig, devices)
    return use


class _Unreadable(ValueError):
    """A GPU quantity of a pod that cannot be read."""


def _count(resource: str, value: Any) -> int:
    try:
        quantity = parse_quantity(str(value))
    except (ValueError, TypeError):
        raise _Unreadable(f"{resource}: {value!r} is not a quantity") from None
    if quantity < 0 or quantity != int(quantity):
        raise _Unreadable(f"{resource}: {value!r} is not a whole, non-negative number")
    return int(quantity)


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {
        name: _count(name, value)
        for name, value in merged.items()
        if name.startswith(("nvidia.com/", MIG_RESOURCE_PREFIX))
    }


def _pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """The pod's effective request per GPU resource: max(sum of containers, largest init container)."""
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, n in _container_requests(container).items():
            total[name] = total.get(name, 0) + n
    for container in spec.get("initContainers") or []:
        for name, n in _container_requests(container).items():
            total[name] = max(total.get(name, 0), n)
    return total


def _from_resources(requests: Mapping[str, int]) -> GpuUse:
    mig = []
    for name, n in sorted(requests.items()):
        if name.startswith(MIG_RESOURCE_PREFIX) and n:
            profile = name.removeprefix(MIG_RESOURCE_PREFIX)
            if not _MIG_PROFILE.match(profile):
                raise _Unreadable(f"{name}: {profile!r} is not a MIG profile name")
            mig.append((profile, n))
    gpus = requests.get(GPU_RESOURCE, 0)
    cores, memory = requests.get(HAMI_CORES), requests.get(HAMI_MEMORY)
    if gpus and (cores is not None or memory is not None):
        if cores is not None and not 0 < cores <= 100:
            raise _Unreadable(f"{HAMI_CORES}: {cores} is not a percentage of a GPU (1 to 100)")
        milli = None if cores is None else cores * _MILLI // 100
        return GpuUse(shared=gpus, share_milli=milli, share_memory_mib=memory or 0, mig=tuple(mig))
    return GpuUse(whole=gpus, mig=tuple(mig))


def _from_kai(annotations: Mapping[str, Any]) -> GpuUse:
    fraction, memory = annotations.get(KAI_FRACTION_ANNOTATION), annotations.get(KAI_MEMORY_ANNOTATION)
    if fraction is None and memory is None:
        return GpuUse()
    devices = _count(KAI_FRACTION_DEVICES_ANNOTATION, annotations.get(KAI_FRACTION_DEVICES_ANNOTATION, 1))
    if fraction is None:
        return GpuUse(shared=max(devices, 1), share_memory_mib=_count(KAI_MEMORY_ANNOTATION, memory))
    try:
        share = float(str(fraction))
    except ValueError:
        raise _Unreadable(f"{KAI_FRACTION_ANNOTATION}: {fraction!r} is not a number") from None
    if not 0 < share <= 1:
        raise _Unreadable(f"{KAI_FRACTION_ANNOTATION}: {fraction!r} is not a fraction of a GPU (0 to 1]")
    milli = max(1, round(share * _MILLI))
    if milli == _MILLI:
        return GpuUse(whole=max(devices, 1))
    return GpuUse(shared=max(devices, 1), share_milli=milli)
