"""The reads of the Kubernetes API emulator: lists, gets and container logs, as the API server answers them.

Lists honour the namespace and the ``labelSelector`` and ``fieldSelector``; a get of a missing
object answers the API server's ``pods "x" not found``; a client asking for a ``Table``
(``kubectl get``) gets one (:mod:`~airflow_gpupool.testing.api.tables`); ``GET pods/<name>/log`` is
served as ``text/plain``, followed while the container runs if asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aiohttp.web
from kmock import KubernetesError, KubernetesObjectNotFoundError, action

from airflow_gpupool.testing.api.discovery import SERVED, not_found
from airflow_gpupool.testing.api.kinds import PODS
from airflow_gpupool.testing.api.storage import StoredObjects
from airflow_gpupool.testing.api.tables import table, wants_table
from airflow_gpupool.testing.api.watches import selected_by

if TYPE_CHECKING:
    from airflow_gpupool.testing.pods.kubelet import SimulatedKubelet

__all__ = ["ApiReads", "KubernetesBadRequest"]

_KINDS = {res.plural: res.kind for res in SERVED}


class KubernetesBadRequest(KubernetesError):
    """A 400 answer, e.g. logs of a container that has not started.

    :param message: what is wrong
    """

    def __init__(self, message: str) -> None:
        super().__init__(status=400, reason="BadRequest", message=message, details={})


class ApiReads(StoredObjects):
    """The reads of :class:`~airflow_gpupool.testing.api.apiserver.KubernetesApiEmulator` (a base, not an emulator).

    ``kubelet`` is set by ``KubernetesApiEmulator.__init__``.
    """

    kubelet: SimulatedKubelet

    def _serve_read(self, request: Any) -> aiohttp.web.StreamResponse | None:
        """Serve a list, or a get or delete of a missing object; ``None`` for what kmock serves.

        A get of a missing object answers the API server's ``pods "x" not found``; a get asked
        as a ``Table`` (``kubectl get pod x``) is printed here.

        :param request: kmock's parsed request
        """
        if request.action == action.LIST:
            listed = self._serve_selected_list(request)
            return aiohttp.web.json_response(self._as_table(request, listed["items"]) or listed)
        if request.action not in (action.FETCH, action.DELETE) or not request.name:
            return None
        obj = self.get_object(request.resource, request.namespace, request.name)
        if obj is None:
            return aiohttp.web.json_response(not_found(request.resource.plural, request.name), status=404)
        shown = (
            self._as_table(request, [obj])
            if request.action == action.FETCH and not request.subresource
            else None
        )
        return aiohttp.web.json_response(shown) if shown else None

    def _serve_selected_list(self, request: Any) -> dict[str, Any]:
        """Return a ``<Kind>List`` honouring namespace and selectors.

        :param request: kmock's parsed request
        """
        selected = selected_by(request)
        live = self.live_objects(request.resource, request.namespace)  # serialized before the loop moves on
        items = [obj for obj in live if selected(obj)]
        plural = request.resource.plural or ""
        group = request.resource.group
        return {
            "apiVersion": f"{group}/{request.resource.version}" if group else "v1",
            "kind": _KINDS.get(plural, plural.capitalize()) + "List",
            "metadata": {"resourceVersion": str(self._resource_version)},
            "items": items,
        }

    def _as_table(self, request: Any, objects: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Return objects as a ``Table`` when the client asked for one (``kubectl get``), else ``None``.

        :param request: kmock's parsed request
        :param objects: the objects to print
        """
        if not wants_table(request.headers.get("Accept")):
            return None
        return table(
            request.resource.plural or "",
            objects,
            resource_version=str(self._resource_version),
            include_object=request.params.get("includeObject"),
        )

    async def _serve_pod_log(self, request: Any) -> aiohttp.web.StreamResponse:
        """Serve a container log as text, following it while the container runs if asked.

        :param request: kmock's parsed request
        """
        pod = self.get_object(PODS, request.namespace, request.name)
        if pod is None:
            raise KubernetesObjectNotFoundError()
        containers = [c["name"] for c in pod.get("spec", {}).get("containers", [])]
        container = request.params.get("container") or (containers[0] if containers else "")
        if container not in containers:
            raise KubernetesBadRequest(f"container {container} is not valid for pod {request.name}")
        log = self.kubelet.logs.get(pod["metadata"]["uid"], container)
        if log is None:
            reason = self.kubelet.waiting_reason(pod, container)
            raise KubernetesBadRequest(
                f'container "{container}" in pod "{request.name}" is waiting to start: {reason}'
            )
        params = request.params
        options = log.options(
            timestamps=str(params.get("timestamps", "")).lower() == "true",
            tail_lines=int(params["tailLines"]) if params.get("tailLines") else None,
            since_seconds=float(params["sinceSeconds"]) if params.get("sinceSeconds") else None,
            since_time=params.get("sinceTime"),
            limit_bytes=int(params["limitBytes"]) if params.get("limitBytes") else None,
        )
        if str(params.get("follow", "")).lower() != "true":
            return aiohttp.web.Response(text=log.render(options), content_type="text/plain")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request._raw_request)
        try:
            async for chunk in log.follow(options):
                await response.write(chunk.encode())
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return response
