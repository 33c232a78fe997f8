"""Pin a pod to its grant: node affinity, the slice's resources, labels, annotations, env."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubernetes.client import models as k8s

from airflow_gpupool import quantity
from airflow_gpupool.binding import PodBinding
from airflow_gpupool.checkpoints.manifest import RESUME_ENV
from airflow_gpupool.labels import (
    ANNOTATION_PREFIX,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    RESERVATION_LABEL,
    WORKLOAD_CLASS_LABEL,
)

if TYPE_CHECKING:
    from airflow_gpupool.ledger.models import Grant
    from airflow_gpupool.resources import GpuRequest

__all__ = ["DEVICE_ENV", "GPU_TOLERATION", "add_shm", "cpu_only", "grant_env", "pin_pod"]

GPU_TOLERATION = k8s.V1Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")


def grant_env(reservation_id: str, grant: Grant, checkpoint_dir: str | None) -> dict[str, str]:
    """Return the environment that tells the container which slice it runs on."""
    env = {
        "GPUPOOL_RESERVATION_ID": reservation_id,
        "GPUPOOL_NODE": grant.node,
        "GPUPOOL_GPU_INDICES": ",".join(map(str, grant.gpu_indices)),
        "GPUPOOL_GPU_UUIDS": ",".join(grant.gpu_uuids),
        "GPUPOOL_GPU_MILLI": str(grant.milli_per_gpu),
        "GPUPOOL_GPU_MEMORY_MIB": str(grant.gpu_memory_mib),
    }
    if grant.mig_profile:
        env["GPUPOOL_MIG_PROFILE"] = grant.mig_profile
        env["GPUPOOL_MIG_SLICE"] = str(grant.mig_slice)
    if checkpoint_dir:
        env["GPUPOOL_CHECKPOINT_DIR"] = checkpoint_dir
    return env


def _pin_to_node(pod: k8s.V1Pod, node: str) -> None:
    spec = pod.spec
    spec.affinity = spec.affinity or k8s.V1Affinity()
    node_affinity = spec.affinity.node_affinity = spec.affinity.node_affinity or k8s.V1NodeAffinity()
    required = node_affinity.required_during_scheduling_ignored_during_execution
    if required is None:
        required = node_affinity.required_during_scheduling_ignored_during_execution = k8s.V1NodeSelector(
            node_selector_terms=[]
        )
    if not required.node_selector_terms:
        required.node_selector_terms = [k8s.V1NodeSelectorTerm(match_expressions=[])]
    pin = k8s.V1NodeSelectorRequirement(key=HOSTNAME_LABEL, operator="In", values=[node])
    for term in required.node_selector_terms:
        # Terms are ORed: the pin must be in every one of them.
        term.match_expressions = [*(term.match_expressions or []), pin]


def _container(pod: k8s.V1Pod, name: str) -> k8s.V1Container:
    for container in pod.spec.containers:
        if container.name == name:
            return container
    return pod.spec.containers[0]


def _set_resources(container: k8s.V1Container, request: GpuRequest, binding: PodBinding) -> None:
    resources = container.resources or k8s.V1ResourceRequirements()
    if isinstance(resources, dict):
        # KPO passes a container_resources dict through to the container as it is.
        resources = k8s.V1ResourceRequirements(**resources)
    requests = dict(resources.requests or {})
    limits = dict(resources.limits or {})
    # The kube-scheduler must agree with the ledger on what the pod takes.
    requests.setdefault("cpu", f"{request.cpu_milli}m")
    requests.setdefault("memory", f"{request.memory_mib}Mi")
    limits.update(binding.limits)
    container.resources = k8s.V1ResourceRequirements(requests=requests, limits=limits or None)


#: The volume of a memory-backed ``/dev/shm``.
SHM_VOLUME = "gpupool-dshm"


def add_shm(pod: k8s.V1Pod, container: k8s.V1Container, shm_mib: int, memory_mib: int) -> None:
    """Mount a memory-backed ``/dev/shm`` of ``shm_mib`` and make the memory request hold it.

    PyTorch data loaders with several workers pass batches through ``/dev/shm``, whose default
    64 MiB makes them fail. Its pages are charged to the pod's memory, so the memory request
    becomes the request's (which counts it) and a memory limit grows by it.

    :param pod: the pod
    :param container: the main container
    :param shm_mib: the size of ``/dev/shm``
    :param memory_mib: the request's memory, ``/dev/shm`` included
    """
    from kubernetes.client import models as k8s

    volumes = [v for v in pod.spec.volumes or [] if v.name != SHM_VOLUME]
    volumes.append(
        k8s.V1Volume(
            name=SHM_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=f"{shm_mib}Mi")
        )
    )
    pod.spec.volumes = volumes
    mounts = [m for m in container.volume_mounts or [] if m.mount_path != "/dev/shm"]
    container.volume_mounts = [*mounts, k8s.V1VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm")]
    resources = container.resources
    requests = dict(resources.requests or {})
    requests["memory"] = f"{memory_mib}Mi"
    limits = dict(resources.limits or {})
    if "memory" in limits:
        limits["memory"] = f"{quantity.memory_mib(limits['memory']) + shm_mib}Mi"
    container.resources = k8s.V1ResourceRequirements(requests=requests, limits=limits or None)


#: What the container of a CPU fallback sees.
DEVICE_ENV = "GPUPOOL_DEVICE"


def cpu_only(pod: k8s.V1Pod, container_name: str) -> k8s.V1Pod:
    """Return ``pod`` as the CPU fallback runs it: unpinned, no GPU, ``GPUPOOL_DEVICE=cpu``.

    :param pod: the parent's pod (changed in place)
    :param container_name: the main container
    """
    _set_env(_container(pod, container_name), {DEVICE_ENV: "cpu"})
    return pod


def _set_env(container: k8s.V1Container, env: dict[str, str]) -> None:
    kept = [e for e in (container.env or []) if e.name not in env]
    container.env = kept + [k8s.V1EnvVar(name=k, value=v) for k, v in env.items()]


def pin_pod(
    pod: k8s.V1Pod,
    *,
    reservation_id: str,
    grant: Grant,
    request: GpuRequest,
    binding: PodBinding,
    container_name: str,
    checkpoint_dir: str | None,
    priority_class: str | None,
    resume_from: str | None = None,
    shm_mib: int = 0,
) -> k8s.V1Pod:
    """Return ``pod`` pinned to ``grant`` (the pod object is changed in place).

    :param resume_from: the checkpoint a retry resumes from (``GPUPOOL_RESUME_FROM``), if any
    :param shm_mib: mount a memory-backed ``/dev/shm`` of this size (0: none); ``request``'s
        memory already counts it
    """
    _pin_to_node(pod, grant.node)
    container = _container(pod, container_name)
    _set_resources(container, request, binding)
    if shm_mib:
        add_shm(pod, container, shm_mib, request.memory_mib)
    resume = {RESUME_ENV: resume_from} if resume_from is not None else {}
    _set_env(container, {**grant_env(reservation_id, grant, checkpoint_dir), **binding.env, **resume})
    meta = pod.metadata
    meta.labels = {
        **(meta.labels or {}),
        RESERVATION_LABEL: reservation_id,
        WORKLOAD_CLASS_LABEL: request.workload_class.value,
    }
    where = (
        f"{grant.mig_slice} ({grant.mig_profile})"
        if grant.mig_slice
        else ",".join(map(str, grant.gpu_indices))
    )
    meta.annotations = {
        **(meta.annotations or {}),
        **binding.annotations,
        f"{ANNOTATION_PREFIX}reservation-id": reservation_id,
        f"{ANNOTATION_PREFIX}node": grant.node,
        f"{ANNOTATION_PREFIX}gpus": where,
        f"{ANNOTATION_PREFIX}slice": request.describe(),
        f"{ANNOTATION_PREFIX}team": request.team,
    }
    if binding.scheduler_name:
        pod.spec.scheduler_name = binding.scheduler_name
    if priority_class and not pod.spec.priority_class_name:
        pod.spec.priority_class_name = priority_class
    if request.gpus or request.mig_profile:
        tolerations = list(pod.spec.tolerations or [])
        if not any(t.key == GPU_TOLERATION.key for t in tolerations):
            tolerations.append(GPU_TOLERATION)
        pod.spec.tolerations = tolerations
    return pod
