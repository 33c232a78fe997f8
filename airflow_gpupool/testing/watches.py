"""The emulator's list selection and watch streams, as the API server serves them.

``labelSelector``, ``fieldSelector``, namespace and name select what a list or a watch returns;
a watch (``watch=true``) streams JSON lines of ``{type, object}``, starting from every selected
object (``ADDED``) or from those changed since the ``resourceVersion`` asked for (``MODIFIED``),
until ``timeoutSeconds`` or the client leaves. :mod:`~airflow_gpupool.testing.apiserver` routes
requests here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import aiohttp.web

from airflow_gpupool.testing.selectors import parse_field_selector, parse_label_selector

if TYPE_CHECKING:
    from airflow_gpupool.testing.storage import StoredObjects

__all__ = ["DEFAULT_WATCH_SECONDS", "initial_watch_events", "is_watch", "selected_by", "serve_watch_stream"]

_WATCH_VALUES = {"true", "1", "yes"}
DEFAULT_WATCH_SECONDS = 1800.0


def is_watch(request: Any) -> bool:
    """Return whether a request is a watch (``watch=true``, ``watch=True`` or ``watch=1`` on a GET).

    :param request: kmock's parsed request
    """
    return str(request.params.get("watch", "")).lower() in _WATCH_VALUES and request.method.value == "GET"


def selected_by(request: Any) -> Callable[[Mapping[str, Any]], bool]:
    """Return a predicate for the objects a list or watch request selects.

    :param request: kmock's parsed request
    """
    by_label = parse_label_selector(request.params.get("labelSelector"))
    by_field = parse_field_selector(request.params.get("fieldSelector"))
    namespace, name = request.namespace, request.name

    def selected(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if namespace is not None and meta.get("namespace") != namespace:
            return False
        if name is not None and meta.get("name") != name:
            return False
        return by_label(obj) and by_field(obj)

    return selected


def initial_watch_events(
    store: StoredObjects, request: Any, selected: Callable[[Mapping[str, Any]], bool]
) -> list[dict[str, Any]]:
    """Return the events a new watch starts with.

    Without ``resourceVersion`` (or with ``0``) every selected object comes as ``ADDED``;
    with one, only objects changed since then, as ``MODIFIED``, and those deleted since then, as
    ``DELETED`` (a client that read a pod and then watches it misses no deletion in between).

    :param store: the emulator's objects
    :param request: kmock's parsed request
    :param selected: the selection predicate
    """
    try:
        since = int(request.params.get("resourceVersion") or 0)
    except ValueError:
        since = 0
    objs = [obj for obj in store.list_objects(request.resource, request.namespace) if selected(obj)]
    if since == 0:
        return [{"type": "ADDED", "object": obj} for obj in objs]
    changed = [
        {"type": "MODIFIED", "object": obj} for obj in objs if int(obj["metadata"]["resourceVersion"]) > since
    ]
    deleted = [
        {"type": "DELETED", "object": obj}
        for obj in store.deleted_since(request.resource, request.namespace, since)
        if selected(obj)
    ]
    return sorted(changed + deleted, key=lambda e: int(e["object"]["metadata"]["resourceVersion"]))


async def serve_watch_stream(store: StoredObjects, request: Any, bus: Any) -> aiohttp.web.StreamResponse:
    """Stream watch events as JSON lines until ``timeoutSeconds`` or the client leaves.

    :param store: the emulator's objects
    :param request: kmock's parsed request
    :param bus: the watch bus of the request's resource
    """
    selected = selected_by(request)
    timeout = float(request.params.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
    marker = await bus.mark()
    initial = initial_watch_events(store, request, selected)
    response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request._raw_request)
    events = cast("AsyncGenerator[dict[str, Any], None]", bus.stream(since=marker))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        for event in initial:
            await response.write(json.dumps(event).encode() + b"\n")
        while (remaining := deadline - loop.time()) > 0:
            try:
                event = await asyncio.wait_for(anext(events), remaining)
            except TimeoutError:
                break
            if selected(event.get("object") or {}):
                await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client went away
    finally:
        await events.aclose()
        await bus.unmark(marker)
    return response
