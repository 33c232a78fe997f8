"""Slice binding: how a granted slice becomes a pod spec, one small strategy per sharing mechanism.

- ``whole``: whole GPUs through the NVIDIA device plugin (``nvidia.com/gpu: n``).
- ``mig``: MIG mixed strategy (``nvidia.com/mig-<profile>: 1``); whole GPUs as ``whole``.
- ``hami``: HAMi vGPU (``nvidia.com/gpu: 1``, ``nvidia.com/gpumem`` MiB, ``nvidia.com/gpucores`` %).
- ``kai``: KAI scheduler fractions (``gpu-fraction`` annotation, ``kai-scheduler`` scheduler).
- ``device``: device pinning (``NVIDIA_VISIBLE_DEVICES=<GPU UUIDs>``), no device-plugin resource;
  only with UUIDs a node agent verified (:class:`~airflow_gpupool.exceptions.UnverifiedGpuUuidError`).
- ``dra``: Dynamic Resource Allocation (``resource.k8s.io/v1``, NVIDIA's DRA driver): a
  ResourceClaim selecting the granted GPUs, or MIG device, by the ``uuid`` attribute the driver
  publishes; the pod names it in ``spec.resourceClaims``. Verified UUIDs only, as ``device``.

Every strategy also pins the pod to the granted node (required node affinity on
``kubernetes.io/hostname``), which :mod:`airflow_gpupool.operators.pod.pod_spec` adds.

Pure, and below the hooks: a hook checks the strategy names of its connection with
:func:`check_binding_name` when it resolves it, the operator binds a grant with the strategy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpupool.exceptions import ConfigurationError, UnverifiedGpuUuidError
from airflow_gpupool.labels import (
    DRA_DRIVER,
    GPU_RESOURCE,
    HAMI_CORES_RESOURCE,
    HAMI_MEMORY_RESOURCE,
    MIG_RESOURCE_PREFIX,
)
from airflow_gpupool.resources import MILLI_PER_GPU, GpuKind, GpuRequest

__all__ = [
    "BINDINGS",
    "DevicePinningBinding",
    "DraBinding",
    "HamiBinding",
    "KaiBinding",
    "MigBinding",
    "PodBinding",
    "SliceBinding",
    "SliceFacts",
    "WholeGpuBinding",
    "binding_for",
    "check_binding_name",
]


@dataclass(frozen=True)
class PodBinding:
    """What a strategy adds to the base container and the pod."""

    limits: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None
    #: ``dra``: the ``spec`` of the ResourceClaim the pod's container claims (the operator creates it).
    resource_claim: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class SliceFacts:
    """The parts of a grant a binding needs.

    :param gpu_uuids_verified: whether a node agent reported ``gpu_uuids`` (device pinning needs it)
    """

    gpus: int
    gpu_uuids: tuple[str, ...]
    milli_per_gpu: int
    gpu_memory_mib: int
    mig_profile: str | None
    gpu_uuids_verified: bool = False
    mig_slice: str | None = None


class SliceBinding:
    """Base of the strategies: ``supports`` says which request kinds it can express."""

    name = ""
    supports: frozenset[GpuKind] = frozenset()

    def bind(self, facts: SliceFacts) -> PodBinding:
        """Return the pod changes for a granted slice."""
        raise NotImplementedError


class WholeGpuBinding(SliceBinding):
    """``nvidia.com/gpu: n`` through the NVIDIA device plugin."""

    name = "whole"
    supports = frozenset({GpuKind.WHOLE, GpuKind.NONE})

    def bind(self, facts: SliceFacts) -> PodBinding:
        return PodBinding(limits={GPU_RESOURCE: str(facts.gpus)} if facts.gpus else {})


class MigBinding(WholeGpuBinding):
    """MIG mixed strategy: ``nvidia.com/mig-<profile>: 1``."""

    name = "mig"
    supports = frozenset({GpuKind.MIG, GpuKind.WHOLE, GpuKind.NONE})

    def bind(self, facts: SliceFacts) -> PodBinding:
        if facts.mig_profile:
            return PodBinding(limits={f"{MIG_RESOURCE_PREFIX}{facts.mig_profile}": "1"})
        return super().bind(facts)


class HamiBinding(SliceBinding):
    """HAMi: a share of one GPU by memory (MiB) and cores (percent)."""

    name = "hami"
    supports = frozenset({GpuKind.FRACTION, GpuKind.WHOLE, GpuKind.NONE})

    def bind(self, facts: SliceFacts) -> PodBinding:
        if not facts.gpus:
            return PodBinding()
        if facts.milli_per_gpu >= MILLI_PER_GPU:
            return PodBinding(limits={GPU_RESOURCE: str(facts.gpus)})
        return PodBinding(
            limits={
                GPU_RESOURCE: "1",
                HAMI_MEMORY_RESOURCE: str(facts.gpu_memory_mib),
                HAMI_CORES_RESOURCE: str(max(1, facts.milli_per_gpu // 10)),
            }
        )


class KaiBinding(SliceBinding):
    """KAI scheduler: the ``gpu-fraction`` annotation, scheduled by ``kai-scheduler``."""

    name = "kai"
    supports = frozenset({GpuKind.FRACTION, GpuKind.WHOLE, GpuKind.NONE})
    scheduler = "kai-scheduler"

    def bind(self, facts: SliceFacts) -> PodBinding:
        if not facts.gpus:
            return PodBinding()
        if facts.milli_per_gpu >= MILLI_PER_GPU:
            return PodBinding(limits={GPU_RESOURCE: str(facts.gpus)}, scheduler_name=self.scheduler)
        fraction = f"{facts.milli_per_gpu / MILLI_PER_GPU:g}"
        return PodBinding(annotations={"gpu-fraction": fraction}, scheduler_name=self.scheduler)


class DevicePinningBinding(SliceBinding):
    """``NVIDIA_VISIBLE_DEVICES`` set to the granted GPUs' UUIDs; no device-plugin resource."""

    name = "device"
    supports = frozenset({GpuKind.FRACTION, GpuKind.WHOLE, GpuKind.NONE})

    def bind(self, facts: SliceFacts) -> PodBinding:
        if not facts.gpus:
            return PodBinding(env={"NVIDIA_VISIBLE_DEVICES": "void"})
        if not facts.gpu_uuids_verified:
            # The inventory's UUIDs are invented (``gpu-a100-1-gpu0``); a runtime selects none of them.
            raise UnverifiedGpuUuidError(facts.gpu_uuids)
        return PodBinding(env={"NVIDIA_VISIBLE_DEVICES": ",".join(facts.gpu_uuids)})


#: NVIDIA's DRA driver's DeviceClasses: they select whole GPUs and MIG devices.
DRA_GPU_CLASS = "gpu.nvidia.com"
DRA_MIG_CLASS = "mig.nvidia.com"
#: The name of the request in the claim, and of the claim in the pod and its container.
DRA_REQUEST = "gpu"


class DraBinding(SliceBinding):
    """A ResourceClaim (``resource.k8s.io/v1``) for exactly the granted devices, selected by UUID.

    Whole GPUs: ``count`` devices of class ``gpu.nvidia.com`` whose ``uuid`` is one of the grant's.
    A MIG slice: the device of class ``mig.nvidia.com`` whose ``uuid`` is the slice's when the
    inventory knows it (a ``MIG-`` id), else the one of the granted profile on the granted GPU
    (``parentUUID`` and ``profile``): the ledger counts a GPU's slices of one profile as equals.
    """

    name = "dra"
    supports = frozenset({GpuKind.MIG, GpuKind.WHOLE, GpuKind.NONE})

    def bind(self, facts: SliceFacts) -> PodBinding:
        if not facts.gpus and not facts.mig_profile:
            return PodBinding()
        if not facts.gpu_uuids_verified:
            raise UnverifiedGpuUuidError(facts.gpu_uuids, selector="a ResourceClaim's CEL selector")
        attribute = f"device.attributes[{json.dumps(DRA_DRIVER)}]"
        if facts.mig_profile:
            device_class, count = DRA_MIG_CLASS, 1
            if facts.mig_slice and facts.mig_slice.startswith("MIG-"):
                expression = f"{attribute}.uuid == {json.dumps(facts.mig_slice)}"
            else:
                expression = (
                    f"{attribute}.parentUUID == {json.dumps(facts.gpu_uuids[0])} && "
                    f"{attribute}.profile == {json.dumps(facts.mig_profile)}"
                )
        else:
            device_class, count = DRA_GPU_CLASS, facts.gpus
            expression = f"{attribute}.uuid in {json.dumps(list(facts.gpu_uuids))}"
        exactly = {
            "deviceClassName": device_class,
            "allocationMode": "ExactCount",
            "count": count,
            "selectors": [{"cel": {"expression": expression}}],
        }
        return PodBinding(
            resource_claim={"devices": {"requests": [{"name": DRA_REQUEST, "exactly": exactly}]}}
        )


BINDINGS: dict[str, SliceBinding] = {
    b.name: b
    for b in (
        WholeGpuBinding(),
        MigBinding(),
        HamiBinding(),
        KaiBinding(),
        DevicePinningBinding(),
        DraBinding(),
    )
}


def check_binding_name(name: str, source: str) -> SliceBinding:
    """Return the strategy called ``name``; :class:`ConfigurationError` naming ``source`` if unknown."""
    try:
        return BINDINGS[name]
    except KeyError:
        raise ConfigurationError(
            f"{source}: unknown binding {name!r}; choose one of {sorted(BINDINGS)}"
        ) from None


def binding_for(request: GpuRequest, name: str, source: str) -> SliceBinding:
    """Return the strategy ``name`` if it can express ``request``, else a clear error."""
    binding = check_binding_name(name, source)
    if request.kind not in binding.supports:
        able = sorted(b.name for b in BINDINGS.values() if request.kind in b.supports)
        raise ConfigurationError(
            f"{source}: binding {name!r} cannot express a {request.kind.value} GPU request "
            f"({request.describe()}); use one of {able} for that node pool"
        )
    return binding
