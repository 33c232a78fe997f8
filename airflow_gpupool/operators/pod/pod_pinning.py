"""How a ``GpuPodOperator`` try's pod is pinned to its grant: the pod's side of the operator.

The parent's pod is pinned to the granted node and devices through the slice's binding (a CPU
fallback's pod gets no GPU), and the grant is bound to the pod by name before it is created and
by uid once it exists (its DRA ResourceClaim created first and owned by the pod).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

from airflow_gpupool import settings
from airflow_gpupool.binding import binding_for
from airflow_gpupool.operators.pod.pod_spec import (
    cpu_only,
    own_resource_claim,
    pin_pod,
    slice_facts,
    with_resource_claim,
)
from airflow_gpupool.operators.request import shm_mib

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s

    from airflow_gpupool.checkpoints.manifest import CheckpointManifest
    from airflow_gpupool.hooks.gpupool import GpuPoolHook
    from airflow_gpupool.ledger import Grant
    from airflow_gpupool.resources import GpuRequest

__all__ = ["GpuPodPinning"]


class GpuPodPinning(KubernetesPodOperator):
    """The pod's side of :class:`~airflow_gpupool.operators.GpuPodOperator` (a base, not a task).

    The attributes below are set by ``GpuPodOperator.__init__``; ``_grant`` and ``_held_id`` once
    the slice is granted.
    """

    binding: str | None
    checkpoint_dir: str | None
    shm_size: str | None
    gpu_hook: GpuPoolHook
    _grant: Grant | None
    _held_id: str | None
    _cpu_fallback_active: bool
    _resume_from: CheckpointManifest | None
    _own_pod: tuple[str, str] | None
    _adopted: bool

    if TYPE_CHECKING:

        def gpu_request(self) -> GpuRequest:
            """This try's request (``GpuPodOperator``'s)."""

    def _binding_for(self, request: GpuRequest, grant: Grant) -> Any:
        options = self.gpu_hook.options
        name = self.binding or options.node_pool_bindings.get(grant.node_pool) or options.binding
        return binding_for(request, name, f"task {self.task_id} on node pool {grant.node_pool}")

    def build_pod_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Pod:
        """Build the parent's pod, then pin it to the granted slice."""
        pod = super().build_pod_request_obj(context, dry_run=dry_run)
        if self._grant is None or self._held_id is None:
            return cpu_only(pod, self.base_container_name) if self._cpu_fallback_active else pod
        request = self.gpu_request()
        grant = self._grant
        facts = slice_facts(grant)
        return pin_pod(
            pod,
            reservation_id=self._held_id,
            grant=grant,
            request=request,
            binding=self._binding_for(request, grant).bind(facts),
            container_name=self.base_container_name,
            checkpoint_dir=self.checkpoint_dir,
            priority_class=settings.workload_priority_classes().get(request.workload_class.value),
            resume_from=self._resume_from.location if self._resume_from is not None else None,
            shm_mib=shm_mib(self.shm_size),
        )

    def get_or_create_pod(self, pod_request_obj: k8s.V1Pod, context: Context) -> k8s.V1Pod:
        """Create (or find) the pod as the parent does, binding it to the grant before and after.

        The grant is bound by name before the pod is created and by uid once it exists, so a
        worker dying in between leaves an orphan (its slice held), never a pod on a freed
        slice. A bound grant whose lease expires keeps its slice (``orphaned``) while the pod
        may still run on it. Used by the sync and the deferrable path alike.
        """
        rid = self._held_id
        if rid is not None and not self._adopted:  # an adopted grant is bound to the pod already
            meta = pod_request_obj.metadata
            self.gpu_hook.bind_pod(rid, namespace=meta.namespace, name=meta.name)
        create = lambda: super(GpuPodPinning, self).get_or_create_pod(pod_request_obj, context)  # noqa: E731
        pod = with_resource_claim(self.client, pod_request_obj, create)  # dra: its ResourceClaim first
        if rid is None:
            return pod
        meta = pod.metadata
        if meta is None or not meta.uid:
            # The parent returns the request it sent, without the uid the server gave it.
            try:
                meta = self.pod_manager.read_pod(pod).metadata
            except Exception as e:
                # The pod is bound by name already; what KPO does next with an unreadable pod
                # (and what it raises) is KPO's, unchanged.
                self.log.warning("Could not read pod %s for its uid: %s", pod.metadata.name, type(e).__name__)
                self._own_pod = (pod.metadata.namespace, pod.metadata.name)
                return pod
        self._own_pod = (meta.namespace, meta.name)
        self.gpu_hook.bind_pod(rid, namespace=meta.namespace, name=meta.name, uid=meta.uid)
        own_resource_claim(self.client, pod_request_obj, meta)  # deleted with the pod
        self.log.info("GPU slice %s bound to pod %s/%s (uid %s)", rid, meta.namespace, meta.name, meta.uid)
        return pod
