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
hold GPUs nobody uses and are not counted.

Dynamic Resource Allocation: a pod may name ResourceClaims in ``spec.resourceClaims`` (by
``resourceClaimName``, or by ``resourceClaimTemplateName``, whose generated claim's name is in
``status.resourceClaimStatuses``). The caller hands in a *claim lookup* (the controller reads the
claims from the API server); each device NVIDIA's DRA driver (``gpu.nvidia.com``) was allocated
(``status.allocation.devices.results``) named ``gpu-<index>`` is that GPU of the pod's node, held
whole. A claim not found, not generated, not allocated or not reserved for the pod
(``status.reservedFor``) yet makes the pod *waiting*: not
counted yet (Kubernetes runs no pod before its claims are allocated), read again at its next
change. Any other device of that driver (a MIG device) makes the pod unreadable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from airflow_gpupool.labels import DRA_DRIVER, GANG_RESERVATION_LABEL, RESERVATION_LABEL, SCALE_UP_LABEL
from airflow_gpupool.quantity import parse_quantity

__all__ = [
    "ClaimLookup",
    "ExternalPod",
    "GpuUse",
    "claim_keys",
    "claimed_gpus",
    "external_pod",
    "gpu_use",
    "holds_gpus_now",
]

#: ``(namespace, name, pod uid)`` -> the ResourceClaim's JSON, or None when there is none.
ClaimLookup = Callable[[str, str, str], Mapping[str, Any] | None]

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
_DRA_GPU_DEVICE = re.compile(r"^gpu-(\d+)$")
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
    :param gpu_indices: the indices of the GPUs its ResourceClaims were allocated (held whole,
        counted in ``whole``)
    :param waiting: why the pod is not counted yet (a ResourceClaim not allocated, or not reserved
        for it, yet)
    """

    whole: int = 0
    shared: int = 0
    share_milli: int | None = None
    share_memory_mib: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    devices: tuple[str, ...] = ()
    unreadable: str | None = None
    gpu_indices: tuple[int, ...] = ()
    waiting: str | None = None

    @property
    def any(self) -> bool:
        """Whether the pod holds any GPU now (an unreadable pod counts as holding some; a waiting one none)."""
        return not self.waiting and bool(self.whole or self.shared or self.mig or self.unreadable)


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


def external_pod(pod: Mapping[str, Any], claims: ClaimLookup | None = None) -> ExternalPod | None:
    """Return the pod as the ledger counts it; None when it holds no GPU on a node now.

    :param claims: reads the pod's ResourceClaims; None: they are not read
    """
    if not holds_gpus_now(pod):
        return None
    meta = pod.get("metadata") or {}
    if SCALE_UP_LABEL in (meta.get("labels") or {}):
        return None  # a placeholder that asks the autoscaler for a node: nobody uses its GPUs
    use = gpu_use(pod, claims)
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


def gpu_use(pod: Mapping[str, Any], claims: ClaimLookup | None = None) -> GpuUse:
    """Return the GPUs ``pod`` holds, read from its resources, annotations and (with ``claims``) ResourceClaims."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        requests = _pod_requests(pod.get("spec") or {})
        use = _from_resources(requests)
        if not use.any:
            use = _from_kai(annotations)
        indices = claimed_gpus(pod, claims) if claims is not None else ()
    except _Unreadable as e:
        return GpuUse(unreadable=str(e))
    except _Waiting as e:
        return GpuUse(waiting=str(e))
    devices = tuple(_GPU_UUID.findall(str(annotations.get(HAMI_DEVICES_ANNOTATION) or "")))
    if devices and use.any:
        use = replace(use, devices=devices)
    if indices:
        use = replace(use, whole=use.whole + len(indices), gpu_indices=indices)
    return use


def claim_keys(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Return ``(namespace, name)`` of each ResourceClaim the pod names.

    :raises _Waiting: a template's claim is not generated yet
    """
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    generated = {s.get("name"): s for s in status.get("resourceClaimStatuses") or []}
    keys = []
    for ref in spec.get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            keys.append((namespace, str(ref["resourceClaimName"])))
        elif ref.get("resourceClaimTemplateName"):
            if ref.get("name") not in generated:
                raise _Waiting(
                    f"the ResourceClaim of template {ref['resourceClaimTemplateName']} is not made yet"
                )
            made = generated[ref.get("name")].get("resourceClaimName")
            if made:  # none: the template's claim is not needed (Kubernetes' own rule)
                keys.append((namespace, str(made)))
    return tuple(keys)


def claimed_gpus(pod: Mapping[str, Any], claims: ClaimLookup) -> tuple[int, ...]:
    """Return the indices of the GPUs the pod's ResourceClaims were allocated, in order.

    :raises _Waiting: a claim is not found or not allocated yet
    :raises _Unreadable: a device of NVIDIA's driver that is not a whole GPU (``gpu-<index>``)
    """
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    indices: list[int] = []
    for namespace, name in claim_keys(pod):
        claim = claims(namespace, name, uid)
        status = (claim or {}).get("status") or {}
        allocation = status.get("allocation")
        if not allocation:
            state = "not found" if claim is None else "not allocated yet"
            raise _Waiting(f"ResourceClaim {namespace}/{name} is {state}")
        if not any(r.get("uid") == uid for r in status.get("reservedFor") or []):
            # Kubernetes starts no pod on a claim not reserved for it (it may be another pod's still).
            raise _Waiting(f"ResourceClaim {namespace}/{name} is not reserved for the pod yet")
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != DRA_DRIVER:
                continue
            device = _DRA_GPU_DEVICE.match(str(result.get("device") or ""))
            if device is None:
                raise _Unreadable(
                    f"ResourceClaim {namespace}/{name}: device {result.get('device')!r} of {DRA_DRIVER} "
                    "is not a whole GPU (gpu-<index>)"
                )
            indices.append(int(device.group(1)))
    return tuple(sorted(set(indices)))


class _Waiting(Exception):
    """A ResourceClaim of a pod that is not allocated yet: the pod is not counted yet."""


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
