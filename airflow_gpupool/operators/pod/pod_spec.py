"""Pin a pod to its grant: node affinity, the slice's resources, labels, annotations, env.

The ``dra`` binding also needs an object of its own: :func:`pin_pod` names a ResourceClaim in the
pod and writes its spec in the ``gpupool.io/resource-claim`` annotation; :func:`with_resource_claim`
creates it just before the pod, and :func:`own_resource_claim` makes the pod its owner once the pod
has a uid, so Kubernetes deletes the claim with the pod.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kubernetes.client import models as k8s

from airflow_gpupool import quantity
from airflow_gpupool.binding import DRA_REQUEST, PodBinding, SliceFacts
from airflow_gpupool.checkpoints.manifest import RESUME_ENV
from airflow_gpupool.labels import (
    ANNOTATION_PREFIX,
    GANG_RESERVATION_ANNOTATION,
    GANG_RESERVATION_LABEL,
    GPU_RESOURCE,
    GPUS_ANNOTATION,
    HOSTNAME_LABEL,
    NODE_ANNOTATION,
    RESERVATION_LABEL,
    SCHEDULING_GATE,
    WORKLOAD_CLASS_LABEL,
)

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Grant
    from airflow_gpupool.resources import GpuRequest

__all__ = [
    "DEVICE_ENV",
    "GPU_TOLERATION",
    "RESOURCE_CLAIM_ANNOTATION",
    "add_shm",
    "cpu_only",
    "gang_template",
    "grant_env",
    "own_resource_claim",
    "pin_pod",
    "slice_facts",
    "with_resource_claim",
]

GPU_TOLERATION = k8s.V1Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")


def slice_facts(grant: Grant) -> SliceFacts:
    """Return what a binding needs of ``grant`` (a MIG slice counts no whole GPUs)."""
    return SliceFacts(
        gpus=len(grant.gpu_indices) if grant.mig_slice is None else 0,
        gpu_uuids=grant.gpu_uuids,
        milli_per_gpu=grant.milli_per_gpu,
        gpu_memory_mib=grant.gpu_memory_mib,
        mig_profile=grant.mig_profile,
        gpu_uuids_verified=grant.gpu_uuids_verified,  # issue 17 (agent): device pinning checks it
        mig_slice=grant.mig_slice,
    )


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
    if binding.resource_claim is not None:
        _claim_devices(pod, container, f"{reservation_id}-{DRA_REQUEST}", binding.resource_claim)
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


# -- a gang Job's pod template: one spec for every member --------------------------------------

#: What each member's container reads of the slice its pod was pinned to, through the downward
#: API: the annotations :func:`~airflow_gpupool.controller.gatekeeper.admission_patch` writes
#: before it removes the gate (environment variables cannot change on a created pod).
_MEMBER_ENV = {
    "GPUPOOL_RESERVATION_ID": f"{ANNOTATION_PREFIX}reservation-id",
    "GPUPOOL_NODE": NODE_ANNOTATION,
    "GPUPOOL_GPU_INDICES": GPUS_ANNOTATION,
}


def gang_template(
    template: k8s.V1PodTemplateSpec,
    *,
    leader_id: str,
    request: GpuRequest,
    binding: PodBinding,
    container_name: str,
    priority_class: str | None,
    extra_env: Sequence[k8s.V1EnvVar] = (),
) -> k8s.V1PodTemplateSpec:
    """Return a gang Job's pod template made ready for pinning (changed in place).

    Everything that must be in the pod from its creation is set here, the same for every member:
    the slice's resources, the GPU toleration, the ``gpupool.io/reservation`` scheduling gate, the
    gang's annotation and the environment (the member's own slice through the downward API).
    What differs per member (node, GPUs, reservation id) is patched onto each gated pod.

    :param template: the Job's pod template
    :param leader_id: the gang's leader reservation
    :param request: one member's request
    :param binding: how a member's slice is bound (the same for every member)
    :param container_name: the main container
    :param priority_class: the workload class's priority class, if any
    :param extra_env: more variables for the main container (the rendezvous)
    """
    spec, meta = template.spec, template.metadata
    container = _container(template, container_name)
    _set_resources(container, request, binding)
    _set_env(container, {"GPUPOOL_GANG_ID": leader_id, **binding.env})
    by_annotation = [
        k8s.V1EnvVar(
            name=name,
            value_from=k8s.V1EnvVarSource(
                field_ref=k8s.V1ObjectFieldSelector(field_path=f"metadata.annotations['{key}']")
            ),
        )
        for name, key in _MEMBER_ENV.items()
    ]
    names = {e.name for e in [*by_annotation, *extra_env]}
    container.env = [e for e in container.env or [] if e.name not in names] + by_annotation + list(extra_env)
    gates = [g for g in spec.scheduling_gates or [] if g.name != SCHEDULING_GATE]
    spec.scheduling_gates = [*gates, k8s.V1PodSchedulingGate(name=SCHEDULING_GATE)]
    meta.labels = {
        **(meta.labels or {}),
        WORKLOAD_CLASS_LABEL: request.workload_class.value,
        GANG_RESERVATION_LABEL: leader_id,
    }
    meta.annotations = {
        **(meta.annotations or {}),
        **binding.annotations,
        GANG_RESERVATION_ANNOTATION: leader_id,
        f"{ANNOTATION_PREFIX}reservation-id": leader_id,
        f"{ANNOTATION_PREFIX}slice": request.describe(),
        f"{ANNOTATION_PREFIX}team": request.team,
    }
    if binding.scheduler_name:
        spec.scheduler_name = binding.scheduler_name
    if priority_class and not spec.priority_class_name:
        spec.priority_class_name = priority_class
    if request.gpus or request.mig_profile:
        tolerations = list(spec.tolerations or [])
        if not any(t.key == GPU_TOLERATION.key for t in tolerations):
            tolerations.append(GPU_TOLERATION)
        spec.tolerations = tolerations
    return template


# -- the dra binding: a ResourceClaim per pod ---------------------------------------------------

#: On a pod of the ``dra`` binding: the spec of the ResourceClaim it names (JSON).
RESOURCE_CLAIM_ANNOTATION = f"{ANNOTATION_PREFIX}resource-claim"
_DRA = ("resource.k8s.io", "v1", "resourceclaims")


def _claim_devices(pod: k8s.V1Pod, container: k8s.V1Container, claim: str, spec: Any) -> None:
    """Name the claim in the pod (``spec.resourceClaims``) and in the container's ``resources.claims``."""
    kept = [c for c in pod.spec.resource_claims or [] if c.name != DRA_REQUEST]
    pod.spec.resource_claims = [*kept, k8s.V1PodResourceClaim(name=DRA_REQUEST, resource_claim_name=claim)]
    claims = [c for c in container.resources.claims or [] if c.name != DRA_REQUEST]
    container.resources.claims = [*claims, k8s.CoreV1ResourceClaim(name=DRA_REQUEST)]
    pod.metadata.annotations[RESOURCE_CLAIM_ANNOTATION] = json.dumps(spec, sort_keys=True)


def _claim_of(pod: k8s.V1Pod) -> tuple[str, str, dict[str, Any]] | None:
    """Return the namespace, name and spec of the claim :func:`pin_pod` named, or None."""
    spec = ((pod.metadata and pod.metadata.annotations) or {}).get(RESOURCE_CLAIM_ANNOTATION)
    named = [c for c in pod.spec.resource_claims or [] if c.name == DRA_REQUEST]
    if not spec or not named:
        return None
    return pod.metadata.namespace or "default", named[0].resource_claim_name, json.loads(spec)


def with_resource_claim(core_v1_api: Any, pod: k8s.V1Pod, create_pod: Callable[[], k8s.V1Pod]) -> k8s.V1Pod:
    """Create the pod's ResourceClaim (``dra`` binding; nothing otherwise), then the pod.

    A claim already there (a retried launch, a re-attached worker) is kept; if the pod cannot be
    created, the claim is deleted, so none outlives its launch.

    :param core_v1_api: the operator's ``CoreV1Api``
    :param pod: the pod :func:`pin_pod` built
    :param create_pod: creates (or finds) the pod
    """
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    claim = _claim_of(pod)
    if claim is None:
        return create_pod()
    namespace, name, spec = claim
    api = CustomObjectsApi(core_v1_api.api_client)
    labels = {RESERVATION_LABEL: (pod.metadata.labels or {}).get(RESERVATION_LABEL, "")}
    body = {
        "apiVersion": "/".join(_DRA[:2]),
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }
    try:
        api.create_namespaced_custom_object(*_DRA[:2], namespace, _DRA[2], body)
    except ApiException as e:
        if e.status != 409:
            raise
    try:
        return create_pod()
    except BaseException:
        api.delete_namespaced_custom_object(*_DRA[:2], namespace, _DRA[2], name)
        raise


def own_resource_claim(core_v1_api: Any, pod: k8s.V1Pod, meta: k8s.V1ObjectMeta) -> None:
    """Make the created pod the owner of its ResourceClaim, so the claim is deleted with it.

    :param core_v1_api: the operator's ``CoreV1Api``
    :param pod: the pod :func:`pin_pod` built
    :param meta: the created pod's metadata (with its uid)
    """
    from kubernetes.client import CustomObjectsApi

    claim = _claim_of(pod)
    if claim is None or not meta.uid:
        return
    namespace, name, _ = claim
    owner = {"apiVersion": "v1", "kind": "Pod", "name": meta.name, "uid": meta.uid}
    patch = {"metadata": {"ownerReferences": [owner]}}
    CustomObjectsApi(core_v1_api.api_client).patch_namespaced_custom_object(
        *_DRA[:2], namespace, _DRA[2], name, patch
    )
