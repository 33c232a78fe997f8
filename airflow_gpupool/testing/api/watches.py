"""The emulator's list selection and watch streams, as the API server serves them.

``labelSelector``, ``fieldSelector``, namespace and name select what a list or a watch returns;
a watch (``watch=true``) streams JSON lines of ``{type, object}``, starting from every selected
object (``ADDED``) or from those changed since the ``resourceVersion`` asked for (``MODIFIED``),
until ``timeoutSeconds`` or the client leaves. :mod:`~airflow_gpupool.testing.api.apiserver` routes
requests here.

As the API server does: a watch from a ``resourceVersion`` the history no longer holds (after
:meth:`~airflow_gpupool.testing.api.storage.StoredObjects.compact`, as etcd compacts) gets one
``ERROR`` event with a ``410 Gone`` Status and ends; with ``allowWatchBookmarks=true`` the stream
carries a ``BOOKMARK`` (the kind and the current ``resourceVersion`` only) every
:data:`BOOKMARK_SECONDS` and just before it times out, so a client resumes from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import aiohttp.web

from airflow_gpupool.testing.api.selectors import parse_field_selector, parse_label_selector

if TYPE_CHECKING:
    from airflow_gpupool.testing.api.storage import StoredObjects

__all__ = [
    "BOOKMARK_SECONDS",
    "DEFAULT_WATCH_SECONDS",
    "initial_watch_events",
    "is_watch",
    "selected_by",
    "serve_watch_stream",
]

_WATCH_VALUES = {"true", "1", "yes"}
DEFAULT_WATCH_SECONDS = 1800.0
#: How often a watch that allows bookmarks gets one (the API server: about every minute).
BOOKMARK_SECONDS = 5.0


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
    since = _since(request)
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
    bookmarks = str(request.params.get("allowWatchBookmarks", "")).lower() in _WATCH_VALUES
    response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
    since = _since(request)
    if since and not store.replayable(request.resource, since):
        await response.prepare(request._raw_request)
        await response.write(json.dumps(_gone(since, store.compacted_version)).encode() + b"\n")
        await response.write_eof()
        return response
    marker = await bus.mark()
    initial = initial_watch_events(store, request, selected)
    await response.prepare(request._raw_request)
    events = cast("AsyncGenerator[dict[str, Any], None]", bus.stream(since=marker))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    next_bookmark = loop.time() + BOOKMARK_SECONDS
    kind = _kind_of(request)
    # One pending read of the bus, kept across bookmarks: cancelling a read would close the
    # generator mid-await, and the next read would end the stream with a 500 mid-response.
    pending: asyncio.Future[dict[str, Any]] | None = None
    try:
        for event in initial:
            await response.write(json.dumps(event).encode() + b"\n")
        while (remaining := deadline - loop.time()) > 0:
            wait = min(remaining, next_bookmark - loop.time()) if bookmarks else remaining
            pending = pending or asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=max(wait, 0.0))
            if not done:
                if bookmarks and loop.time() < deadline:
                    await response.write(json.dumps(_bookmark(kind, store.resource_version)).encode() + b"\n")
                    next_bookmark = loop.time() + BOOKMARK_SECONDS
                continue
            event, pending = pending.result(), None
            if selected(event.get("object") or {}):
                await response.write(json.dumps(event).encode() + b"\n")
        if bookmarks:
            await response.write(json.dumps(_bookmark(kind, store.resource_version)).encode() + b"\n")
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client went away
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        await events.aclose()
        await bus.unmark(marker)
    return response


def _since(request: Any) -> int:
    try:
        return int(request.params.get("resourceVersion") or 0)
    except ValueError:
        return 0


def _kind_of(request: Any) -> dict[str, str]:
    group, version = request.resource.group, request.resource.version
    plural = request.resource.plural or ""
    kind = plural[:-1].capitalize() if plural.endswith("s") else plural.capitalize()
    return {"apiVersion": f"{group}/{version}" if group else str(version or "v1"), "kind": kind}


def _bookmark(kind: Mapping[str, str], resource_version: int) -> dict[str, Any]:
    """A ``BOOKMARK``: the object's kind and the current resourceVersion, nothing else."""
    return {"type": "BOOKMARK", "object": {**kind, "metadata": {"resourceVersion": str(resource_version)}}}


def _gone(since: int, compacted: int) -> dict[str, Any]:
    """The ``ERROR`` event the API server sends to a watch from a compacted resourceVersion."""
    message = f"too old resource version: {since} ({compacted})"
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "Expired",
            "code": 410,
        },
    }
