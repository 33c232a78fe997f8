"""The Kubernetes API half of the emulator: kmock's ``KubernetesEmulator`` with its gaps filled.

On top of kmock 0.8 this serves what clients such as ``KubernetesPodOperator`` rely on:

* ``labelSelector`` and ``fieldSelector`` on lists and watches;
* ``uid``, ``creationTimestamp``, ``resourceVersion`` (one global counter) and ``status`` on
  create, ``generateName``, a new ``resourceVersion`` on every change;
* ``watch=true``, ``watch=True`` and ``watch=1`` as watches (JSON lines of ``{type, object}``),
  ``timeoutSeconds`` and ``resourceVersion`` honoured (:mod:`~airflow_gpupool.testing.api.watches`);
* ``GET pods/<name>/log`` as ``text/plain`` with ``container``, ``timestamps``, ``tailLines``,
  ``sinceSeconds``/``sinceTime``, ``limitBytes`` and ``follow`` (streams until the container ends);
* core/v1 ``events`` and ``nodes``;
* discovery as ``kubectl`` reads it (:mod:`~airflow_gpupool.testing.api.discovery`) and ``Table``
  answers for ``kubectl get`` (:mod:`~airflow_gpupool.testing.api.tables`);
* resource.k8s.io/v1 ``resourceclaims`` (Dynamic Resource Allocation), stored as sent; a claim a
  pod owns (``ownerReferences``) is deleted with the pod, as Kubernetes' garbage collector does;
* batch/v1 ``jobs``, run by a Job controller (:mod:`~airflow_gpupool.testing.cluster.jobs`): pods made from
  the template, status, deletion with ``propagationPolicy`` (``Foreground`` keeps the Job until its pods are gone);
* coordination.k8s.io/v1 ``leases`` (leader election): ``PUT`` replaces, refused with 409 Conflict
  when the ``resourceVersion`` sent is not the stored one;
* scheduling.k8s.io/v1 ``priorityclasses``, whose value a new pod naming one gets as
  ``spec.priority`` (:mod:`~airflow_gpupool.testing.api.priority`);
* core/v1 ``podtemplates`` and autoscaling.x-k8s.io/v1 ``provisioningrequests``, checked as the
  CRD's schema checks them (:mod:`~airflow_gpupool.testing.cluster.provisioning`) and answered by the node
  provisioner (:mod:`~airflow_gpupool.testing.cluster.provisioner`); a cluster built without the group
  leaves it out of discovery and answers 404;
* pod deletion as Kubernetes does it: a graceful ``DELETE`` answers at once with the pod
  ``Terminating``, removed once its containers exit or its grace ends
  (:mod:`~airflow_gpupool.testing.pods.termination`);
* a log of every request (:class:`RecordedRequest`).

The object store itself (stamping, versions, watch buses) is :mod:`~airflow_gpupool.testing.api.storage`.
The reads (lists, gets, logs) are served by :mod:`~airflow_gpupool.testing.api.api_reads`; what a
write is checked for and sets off, by :mod:`~airflow_gpupool.testing.api.api_writes`.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

import aiohttp.web
from kmock import action

from airflow_gpupool.testing.api.api_reads import ApiReads, KubernetesBadRequest
from airflow_gpupool.testing.api.api_writes import ApiWrites, KubernetesConflict
from airflow_gpupool.testing.api.discovery import (
    UNSERVED_BY_DEFAULT,
    discovery_document,
    kmock_resources,
    not_found,
    served,
)
from airflow_gpupool.testing.api.kinds import (
    JOBS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
)
from airflow_gpupool.testing.api.priority import admit_priority
from airflow_gpupool.testing.api.tables import table, wants_table
from airflow_gpupool.testing.api.watches import is_watch, serve_watch_stream
from airflow_gpupool.testing.cluster.jobs import JobController, propagation_policy
from airflow_gpupool.testing.cluster.provisioner import NodeProvisioner, ScalableNodePool
from airflow_gpupool.testing.pods.kubelet import SimulatedKubelet
from airflow_gpupool.testing.pods.termination import PodTerminations

__all__ = [
    "KubernetesApiEmulator",
    "KubernetesBadRequest",
    "KubernetesConflict",
    "RecordedRequest",
    "grace_period",
]


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request the emulator served.

    :param method: HTTP method, upper case
    :param path: URL path, e.g. ``/api/v1/namespaces/default/pods``
    :param query: query parameters
    :param body: the JSON-decoded body, or ``None``
    :param time: ``time.time()`` when it arrived
    """

    method: str
    path: str
    query: Mapping[str, str]
    body: Any
    time: float


def grace_period(request: Any, pod: Mapping[str, Any]) -> float:
    """Return a pod delete's grace period, as the API server reads it.

    ``gracePeriodSeconds`` from the query, else from the body (``DeleteOptions``), else the pod's
    ``spec.terminationGracePeriodSeconds`` (30 by default).

    :param request: kmock's parsed request
    :param pod: the pod being deleted
    """
    body = request.data if request.body and isinstance(request.data, dict) else {}
    for value in (dict(request.params).get("gracePeriodSeconds"), body.get("gracePeriodSeconds")):
        if value is not None:
            try:
                return float(value)
            except (TypeError, ValueError):
                return 0.0
    return float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))


class KubernetesApiEmulator(ApiReads, ApiWrites):
    """An in-memory Kubernetes API server with a simulated kubelet and scheduler.

    Run it inside an aiohttp server (kmock's ``Server``); everything, the kubelet included,
    runs on that server's event loop. :class:`~airflow_gpupool.testing.KubernetesEmulatorServer`
    does that in a background thread.

    :param nodes: Node objects to start with
    :param default_duration_seconds: how long containers run unless told otherwise
    :param scalable_pools: node pools the provisioner grows and shrinks
        (:mod:`~airflow_gpupool.testing.cluster.provisioner`)
    :param unserved_groups: API groups this cluster lacks (``autoscaling.x-k8s.io``: no
        ProvisioningRequest CRD), absent from discovery and answered 404; by default
        ``karpenter.sh`` (name the groups to leave out, ``()`` for none, to serve it)
    """

    def __init__(
        self,
        *,
        nodes: Iterable[Mapping[str, Any]] = (),
        default_duration_seconds: float = 0.5,
        scalable_pools: Iterable[ScalableNodePool] = (),
        unserved_groups: Iterable[str] | None = None,
    ) -> None:
        super().__init__()
        self.recorded: list[RecordedRequest] = []
        self.kubelet = SimulatedKubelet(self, default_duration_seconds=default_duration_seconds)
        self.terminations = PodTerminations(self)
        self.jobs = JobController(self)
        self.provisioner = NodeProvisioner(self, scalable_pools)
        self.served = served(frozenset(UNSERVED_BY_DEFAULT if unserved_groups is None else unserved_groups))
        for key, info in kmock_resources(self.served).items():
            self.resources[key] = cast("Any", info)  # kmock takes the plain dict
        self.objects[NAMESPACES, None, "default"] = self._stamp(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
        )
        for node in nodes:
            self.objects[NODES, None, node["metadata"]["name"]] = self._stamp(copy.deepcopy(dict(node)))

    # -- request handling ----------------------------------------------------------------------

    def _record(self, request: Any) -> None:
        """Append a request to :attr:`recorded`.

        :param request: kmock's parsed request
        """
        body = request.data if request.body else None
        self.recorded.append(
            RecordedRequest(
                method=str(request.method.value).upper(),
                path=request.url.path,
                query=dict(request.params),
                body=copy.deepcopy(body),
                time=time.time(),
            )
        )

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Serve one HTTP request; namespaces are read here, as kmock cannot parse their paths.

        kmock reads ``/api/v1/namespaces/<x>`` as "namespace x" with no resource, so
        ``kubectl get namespaces`` (and ``describe``'s namespace look-ups) would fail.

        :param raw_request: aiohttp's request
        """
        parts = raw_request.path.strip("/").split("/")
        if (
            parts[:3] != ["api", "v1", "namespaces"]
            or len(parts) > 4
            or raw_request.method not in ("GET", "POST")
        ):
            return await super().__call__(raw_request)
        if raw_request.method == "POST":
            body = {"apiVersion": "v1", "kind": "Namespace", **await raw_request.json()}
            created = await self.put_object(NAMESPACES, {**body, "status": {"phase": "Active"}})
            return aiohttp.web.json_response(created, status=201)
        accept = raw_request.headers.get("Accept")
        found = self.list_objects(NAMESPACES)
        if len(parts) == 4:
            found = [ns for ns in found if ns["metadata"]["name"] == parts[3]]
            if not found:
                return aiohttp.web.json_response(not_found("namespaces", parts[3]), status=404)
        if wants_table(accept):
            doc = table("namespaces", found, resource_version=str(self._resource_version))
        elif len(parts) == 4:
            doc = found[0]
        else:
            doc = {"apiVersion": "v1", "kind": "NamespaceList", "metadata": {}, "items": found}
        return aiohttp.web.json_response(doc)

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        """Serve one request, then drop it from kmock's own request log (:meth:`_forget`).

        :param request: kmock's parsed request
        """
        try:
            return await self._serve(request)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        """Drop a served request from kmock's request log; :attr:`recorded` keeps our own.

        kmock matches each request against its reactions by walking every request it has
        served, so each answer cost more than the last (about 0.1 s after a thousand requests,
        growing without bound). Reactions that count or slice past requests (``[:1]``) are
        therefore not supported; reactions such as ``api["get /x"] << 500`` still are.

        :param request: kmock's parsed request
        """
        served = self._requests
        for index in range(len(served) - 1, -1, -1):  # the newest first: in-flight requests are few
            if served[index] is request:
                del served[index]
                return

    async def _serve(self, request: Any) -> aiohttp.web.StreamResponse:
        """Serve one request, handling what kmock lacks before delegating to it.

        :param request: kmock's parsed request
        """
        self._record(request)
        if (doc := discovery_document(request.url.path, self.served)) is not None:
            return aiohttp.web.json_response(doc, status=int(doc.get("code", 200)))
        if request.resource is None or request.resource.plural is None or not self._serves(request):
            return await self._serve_unnamed(request)
        if is_watch(request):
            return await serve_watch_stream(self, request, self._buses[request.resource])
        if request.resource == PODS and request.subresource == "log":
            return await self._serve_pod_log(request)
        if request.resource == LEASES and request.method.value == "PUT" and request.name:
            return aiohttp.web.json_response(await self._serve_replace(request))
        if (read := self._serve_read(request)) is not None:
            return read
        if (deleted := await self._serve_deletion(request)) is not None:
            return deleted
        deleted_job = self._deleted_job(request)
        self._before_write(request)
        response = await super()._handle(request)
        if response.status < 300:
            await self._after_success(request)
            if deleted_job is not None:
                await self.jobs.deleted(deleted_job, propagation_policy(request))
        return response

    async def _serve_deletion(self, request: Any) -> aiohttp.web.StreamResponse | None:
        """Serve the deletes that do not remove the object at once: a pod's, a Job's in the foreground
        (it stays until its pods are gone: :mod:`~airflow_gpupool.testing.cluster.jobs`); ``None`` for others.

        :param request: kmock's parsed request
        """
        if (deleted := await self._serve_pod_delete(request)) is not None:
            return deleted
        if self._deleted_job(request) is None or propagation_policy(request) != "Foreground":
            return None
        return aiohttp.web.json_response(
            await self.jobs.delete_in_foreground(request.namespace, request.name)
        )

    def _serves(self, request: Any) -> bool:
        """Return whether this cluster serves the request's resource (a CRD it lacks is not).

        :param request: kmock's parsed request, with a resource
        """
        res = request.resource
        return any(s.plural == res.plural and s.group == res.group for s in self.served)

    async def _serve_unnamed(self, request: Any) -> aiohttp.web.StreamResponse:
        """Serve a request for no resource (kmock's), or 404 for a resource this cluster does not serve.

        :param request: kmock's parsed request
        """
        if request.resource is None or request.resource.plural is None:
            return await super()._handle(request)
        return aiohttp.web.json_response(not_found(request.url.path), status=404)

    async def _serve_pod_delete(self, request: Any) -> aiohttp.web.StreamResponse | None:
        """Delete a pod as the API server does (:mod:`~airflow_gpupool.testing.pods.termination`); ``None``
        for other requests.

        A graceful delete answers at once with the pod ``Terminating``; it is removed once its
        containers have exited or its grace has run out.

        :param request: kmock's parsed request
        """
        if request.resource != PODS or request.action != action.DELETE or not request.name:
            return None
        if request.subresource is not None:
            return None
        pod = self.get_object(PODS, request.namespace, request.name)
        if pod is None:
            return None  # answered 404 by _serve_read
        answer = await self.terminations.delete(request.namespace, request.name, grace_period(request, pod))
        return aiohttp.web.json_response(answer if answer is not None else pod)

    def _deleted_job(self, request: Any) -> dict[str, Any] | None:
        """Return the Job a request deletes, read before kmock forgets it; ``None`` for other requests.

        :param request: kmock's parsed request
        """
        if request.resource != JOBS or request.action != action.DELETE or not request.name:
            return None
        return self.get_object(JOBS, request.namespace, request.name)

    # -- what controllers do as the API server does it -------------------------------------------

    def pod_bus(self) -> Any:
        """Return the watch bus of pods (kmock's), for controllers that react to pod changes."""
        return self._buses[PODS]

    async def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Create a pod as a ``POST`` does: stamped, defaulted and started by the kubelet.

        :param pod: the pod, with its name and namespace
        """
        self._stamp(pod)
        admit_priority(pod, self._priority_class)
        self.kubelet.prepare_new_pod(pod)
        created = await self.put_object(PODS, pod)
        self.kubelet.start(pod["metadata"].get("namespace"), pod["metadata"]["name"])
        return created

    async def remove_pod(self, namespace: str | None, name: str, how: str = "Deleted") -> None:
        """Remove a pod at once (a ``DELETE`` with no grace): its containers stop and what it owns goes with it.

        :param namespace: its namespace
        :param name: its name
        :param how: how its pod history ends if it still ran (``Killed``: past its grace)
        """
        if await self.delete_object(PODS, namespace, name) is not None:
            await self.kubelet.stopped(namespace, name, how)
            await self.collect_garbage(RESOURCE_CLAIMS, PODS)
