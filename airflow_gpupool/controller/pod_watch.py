"""One list-and-watch of every pod in the cluster, kept as a client-go informer keeps it.

The controller holds one :class:`PodWatch` (not one per pass): it lists the pods (in pages),
then watches from the list's ``resourceVersion`` with bookmarks, so a watch that ends (the
server's timeout, a dropped connection) resumes where the last event or bookmark left it. A
``410 Gone`` (the history was compacted) or any other error starts over with a new list, after a
backoff that grows to :attr:`PodWatch.max_backoff_seconds`; and every :attr:`PodWatch.relist_seconds`
it lists again anyway, a safety net for an event lost on the way.

Each list hands every pod to ``on_list``; each watch event hands ``(type, pod)`` to ``on_event``.
Pods are plain JSON dicts (no model objects: with thousands of pods, decoding them as models costs
more than the rest of the work).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from airflow_gpupool.exceptions import WatchExpiredError

__all__ = ["PodWatch", "WatchStats"]

log = logging.getLogger(__name__)

PodJson = dict[str, Any]


@dataclass
class WatchStats:
    """What the watch has done since it started (read by tests and ``gpupool controller run`` logs)."""

    lists: int = 0
    events: int = 0
    bookmarks: int = 0
    gone: int = 0
    errors: int = 0
    resource_version: str | None = None


class PodWatch:
    """List and watch every pod, calling back for each list and each event, until stopped.

    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param on_list: called with every pod after each (re)list
    :param on_event: called with ``("ADDED" | "MODIFIED" | "DELETED", pod)`` for each watch event
    :param relist_seconds: list again at least this often, whatever the watch says
    :param watch_seconds: the server-side timeout of each watch request
    :param page_size: pods per list page
    """

    max_backoff_seconds = 30.0

    def __init__(
        self,
        core_v1_api: Any,
        on_list: Callable[[list[PodJson]], None],
        on_event: Callable[[str, PodJson], None],
        *,
        relist_seconds: float = 300.0,
        watch_seconds: int = 240,
        page_size: int = 500,
    ) -> None:
        self._api = core_v1_api
        self._on_list = on_list
        self._on_event = on_event
        self.relist_seconds = relist_seconds
        self.watch_seconds = watch_seconds
        self.page_size = page_size
        self.stats = WatchStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The open streams: one, but a run still ending may hold another (see start()).
        self._responses: set[Any] = set()

    def start(self) -> None:
        """Run the watch on a daemon thread of its own."""
        # A fresh event per run: a thread of the run before, still ending, keeps the event that
        # stopped it; clearing a shared one would set that thread watching again, for good.
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.run, args=(self._stop,), name="gpupool-pod-watch", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the watch (closing an open stream) and wait for its thread."""
        self._stop.set()
        # Read after the set: a stream opened before it is closed here; one opened after it sees
        # the event as soon as it is stored (_stream), so neither outlives the stop.
        for response in list(self._responses):
            try:
                # shutdown() wakes a read blocked on the socket in the watch's thread; close() would not.
                getattr(response, "shutdown", response.close)()
            except Exception:  # closing a stream that already ended
                log.debug("Pod watch: closing the stream failed", exc_info=True)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("Pod watch: its thread did not end within %.0f s of the stop", timeout)

    def run(self, stop: threading.Event | None = None) -> None:
        """List, then watch, until stopped; errors are logged and followed by a relist after a backoff.

        :param stop: the event that ends this run (default: the watch's current one)
        """
        stop = stop or self._stop
        backoff = 0.0
        while not stop.is_set():
            try:
                version = self.list_now()
                backoff = 0.0
                self.watch_from(version, stop)
            except WatchExpiredError as e:
                log.info("Pod watch: %s; listing again", e)
            except Exception as e:
                if stop.is_set():
                    break  # stop() closed the stream under the read
                self.stats.errors += 1
                backoff = min(max(1.0, backoff * 2), self.max_backoff_seconds)
                log.warning(
                    "Pod watch failed (%s: %s); listing again in %.0f s", type(e).__name__, e, backoff
                )
                stop.wait(backoff)

    def list_now(self) -> str:
        """List every pod (in pages), hand them to ``on_list`` and return the list's ``resourceVersion``."""
        pods: list[PodJson] = []
        token: str | None = None
        version = ""
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            page = json.loads(self._api.list_pod_for_all_namespaces(**kwargs).data)
            pods.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue")
            if not token:
                break
        self.stats.lists += 1
        self.stats.resource_version = version
        self._on_list(pods)
        return version

    def watch_from(self, version: str, stop: threading.Event | None = None) -> None:
        """Watch from ``version``, resuming after each server timeout, until stopped.

        :param stop: the event that ends the watch (default: the watch's current one)
        :raises WatchExpiredError: the server answered ``410 Gone`` (or another error event), or a relist is due
        """
        stop = stop or self._stop
        relist_at = time.monotonic() + self.relist_seconds
        while not stop.is_set():
            if time.monotonic() >= relist_at:
                raise WatchExpiredError(f"{self.relist_seconds:.0f} s since the last list")
            timeout = max(1, min(self.watch_seconds, int(relist_at - time.monotonic()) + 1))
            for event in self._stream(version, timeout, stop):
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        self.stats.gone += 1
                    raise WatchExpiredError(
                        f"the watch ended with {code} {obj.get('reason')}: {obj.get('message')}"
                    )
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                self.stats.resource_version = version
                if kind == "BOOKMARK":
                    self.stats.bookmarks += 1
                    continue
                self.stats.events += 1
                self._on_event(str(kind), obj)
                if stop.is_set() or time.monotonic() >= relist_at:
                    break

    def _stream(self, version: str, timeout: int, stop: threading.Event | None = None) -> Iterator[PodJson]:
        from kubernetes.watch.watch import iter_resp_lines

        response = self._api.list_pod_for_all_namespaces(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _preload_content=False,
        )
        self._responses.add(response)
        try:
            if (stop or self._stop).is_set():
                return  # stopped while the stream opened: stop() found no response to close
            for line in iter_resp_lines(response):
                if line and not line.isspace():
                    yield json.loads(line)
        finally:
            self._responses.discard(response)
            response.close()
            response.release_conn()
