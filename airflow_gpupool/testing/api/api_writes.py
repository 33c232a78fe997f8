"""The writes of the Kubernetes API emulator: what the API server checks and does around a change.

Before a write: a created object is stamped (a pod defaulted, given its priority class's value,
its scheduling gates checked; a Job prepared), an update gets a new ``resourceVersion``, and a
pod or ProvisioningRequest patch the real API server refuses is refused. After one: the kubelet,
the Job controller and the gates hear of it. A ``PUT`` replace checks the ``resourceVersion``
sent, so two writers never both win.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from kmock import KubernetesError, KubernetesObjectNotFoundError, action
from kmock._internal.dicts import patch_dict  # the merge kmock applies: the object we check is the one stored

from airflow_gpupool.testing.api import gates
from airflow_gpupool.testing.api.kinds import JOBS, NODES, PODS, PRIORITY_CLASSES, PROVISIONING_REQUESTS
from airflow_gpupool.testing.api.priority import admit_priority
from airflow_gpupool.testing.api.storage import StoredObjects
from airflow_gpupool.testing.cluster import provisioning
from airflow_gpupool.testing.cluster.jobs import prepare_new_job

if TYPE_CHECKING:
    from airflow_gpupool.testing.cluster.jobs import JobController
    from airflow_gpupool.testing.pods.kubelet import SimulatedKubelet

__all__ = ["ApiWrites", "KubernetesConflict"]


class KubernetesConflict(KubernetesError):
    """A 409 answer to a replace whose ``resourceVersion`` is not the stored one.

    :param message: what is wrong
    """

    def __init__(self, message: str) -> None:
        super().__init__(status=409, reason="Conflict", message=message, details={})


class ApiWrites(StoredObjects):
    """The writes of :class:`~airflow_gpupool.testing.api.apiserver.KubernetesApiEmulator` (a base, not an emulator).

    ``kubelet`` and ``jobs`` are set by ``KubernetesApiEmulator.__init__``.
    """

    kubelet: SimulatedKubelet
    jobs: JobController

    def _priority_class(self, name: str) -> dict[str, Any] | None:
        return self.get_object(PRIORITY_CLASSES, None, name)

    def _before_write(self, request: Any) -> None:
        """Stamp a created object, and give an updated one a new resource version.

        :param request: kmock's parsed request
        """
        if request.resource == PROVISIONING_REQUESTS:
            self._check_provisioning_request(request)
        if request.action == action.CREATE and isinstance(request.data, dict):
            if request.resource == PODS:
                gates.check_pod_create(request.data)  # scheduling gates: testing/api/gates.py
                admit_priority(request.data, self._priority_class)
            self._stamp(request.data, request.namespace)
            if request.resource == PODS:
                self.kubelet.prepare_new_pod(request.data)
            elif request.resource == JOBS:
                prepare_new_job(request.data)
        elif request.action == action.UPDATE and request.resource == PODS and request.subresource is None:
            self._check_pod_update(request)  # scheduling gates: testing/api/gates.py
        if request.action == action.UPDATE and isinstance(request.data, dict) and request.name:
            request.data.setdefault("metadata", {})
            if isinstance(request.data["metadata"], dict):
                request.data["metadata"]["resourceVersion"] = self.next_resource_version()

    def _check_provisioning_request(self, request: Any) -> None:
        """Refuse a ProvisioningRequest, or a change of one, its CRD refuses.

        :param request: kmock's parsed request
        """
        if request.action == action.CREATE and isinstance(request.data, dict):
            provisioning.check_create(request.data)
        elif request.action == action.UPDATE and request.name and isinstance(request.data, dict | list):
            current = self.get_object(PROVISIONING_REQUESTS, request.namespace, request.name)
            if current is not None:
                provisioning.check_update(current, patch_dict(current, request.data))

    def _check_pod_update(self, request: Any) -> None:
        """Refuse a pod patch the real API server refuses (:func:`gates.check_pod_update`).

        :param request: kmock's parsed request
        """
        current = self.get_object(PODS, request.namespace, request.name) if request.name else None
        if current is not None and isinstance(request.data, dict | list):
            gates.check_pod_update(current, patch_dict(current, request.data))

    async def _after_success(self, request: Any) -> None:
        """Tell the kubelet about a pod or node request kmock served.

        :param request: kmock's parsed request
        """
        if request.resource == PODS:
            await self._after_pod_change(request)
        elif request.resource == JOBS and request.name is None and request.action == action.CREATE:
            meta = request.data["metadata"]
            await self.jobs.created(meta.get("namespace") or request.namespace, meta["name"])
        elif request.resource == JOBS and request.action == action.UPDATE and request.name:
            await self.jobs.updated(request.namespace, request.name)
        elif request.resource == NODES and request.action != action.FETCH:
            self.kubelet.notify()

    async def _after_pod_change(self, request: Any) -> None:
        """Start the kubelet's work on a created pod, or tell the gates of a patched one.

        Pod deletes never reach here: :meth:`_serve_pod_delete` serves them.

        :param request: kmock's parsed request
        """
        if request.action == action.CREATE:
            meta = request.data["metadata"]
            self.kubelet.start(meta.get("namespace") or request.namespace, meta["name"])
        elif request.action == action.UPDATE and request.name:
            gates.changed(self, request.namespace, request.name)  # scheduling gates: a gate may be gone

    async def _serve_replace(self, request: Any) -> dict[str, Any]:
        """Replace a whole object (``PUT``), checking its ``resourceVersion`` as the API server does.

        A body without ``resourceVersion`` replaces unconditionally; one with a different version
        than the stored object is refused, so two writers never both win.

        :param request: kmock's parsed request
        :raises KubernetesConflict: the version sent is not the stored one
        """
        current = self.get_object(request.resource, request.namespace, request.name)
        if current is None:
            raise KubernetesObjectNotFoundError()
        body = copy.deepcopy(request.data) if isinstance(request.data, dict) else {}
        meta = body.setdefault("metadata", {})
        sent, stored = meta.get("resourceVersion"), current["metadata"]["resourceVersion"]
        if sent and str(sent) != stored:
            raise KubernetesConflict(
                f'Operation cannot be fulfilled on {request.resource.plural} "{request.name}": the object '
                "has been modified; please apply your changes to the latest version and try again"
            )
        for owned in ("uid", "creationTimestamp", "generation"):
            meta[owned] = current["metadata"].get(owned)
        meta.update(name=request.name, namespace=request.namespace)
        return await self.put_object(request.resource, body)
