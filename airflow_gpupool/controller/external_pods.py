"""Count the GPUs of pods this project did not make, from the controller's one pod watch.

:class:`ExternalPodCounter` turns the :class:`~airflow_gpupool.controller.pod_watch.PodWatch`'s
lists and events into the ledger's external holds (:meth:`Ledger.sync_external
<airflow_gpupool.ledger.Ledger.sync_external>`): each list is a complete relist (every hold
whose pod it does not find ends); each event of a pod that holds GPUs, or held them, is written
within :attr:`ExternalPodCounter.batch_seconds`, events that arrive together in one transaction.
Pods that hold no GPU cost nothing beyond reading their event. A pod on a node the ledger does
not keep yet (the inventory sync has not seen it) is tried again every
:attr:`ExternalPodCounter.retry_seconds`.

A pod the ledger says is bound to a grant is remembered as such, and sent again whenever it
changes, so that once its grant ends while the pod still runs it is counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_gpupool.controller.pod_watch import PodJson, PodWatch
from airflow_gpupool.pod_gpus import ExternalPod, external_pod

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger

__all__ = ["ExternalPodCounter"]

log = logging.getLogger(__name__)


def _key(pod: PodJson) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _same_pod(found: ExternalPod | None, known: ExternalPod | None) -> bool:
    """Whether ``found`` is the pod last written: the same uid on the same node (what it holds cannot change)."""
    return found is not None and known is not None and (found.uid, found.node) == (known.uid, known.node)


class ExternalPodCounter:
    """Feed one pod watch into the ledger's external holds, on threads of its own.

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param relist_seconds: list every pod again at least this often (the safety net)
    :param watch_factory: builds the watch (tests pass one with short timeouts)
    """

    batch_seconds = 0.05
    retry_seconds = 5.0

    def __init__(
        self,
        ledger: Ledger,
        core_v1_api: Any,
        *,
        relist_seconds: float = 300.0,
        watch_factory: Callable[..., PodWatch] = PodWatch,
    ) -> None:
        self.ledger = ledger
        self.api = core_v1_api
        self._watch = watch_factory(core_v1_api, self.on_list, self.on_event, relist_seconds=relist_seconds)
        self._lock = threading.Lock()
        self._pending: dict[str, ExternalPod | None] = {}  # by key; None: gone
        self._writing: set[str] = set()  # the keys of the write in progress
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._known: dict[str, ExternalPod] = {}  # the GPU pods last written, by key
        self._unknown_node: dict[str, ExternalPod] = {}
        self._flusher: threading.Thread | None = None
        #: When each pod was last counted or released (monotonic): for tests and the benchmark.
        self.written_at: dict[str, float] = {}

    @property
    def watch(self) -> PodWatch:
        """The pod watch this counter reads."""
        return self._watch

    @property
    def running(self) -> bool:
        """Whether the watch and the writer run."""
        return self._flusher is not None and self._flusher.is_alive()

    def start(self) -> None:
        """Start the watch (its first list is a complete relist) and the writer."""
        if self.running:
            return
        self._stop.clear()
        self._flusher = threading.Thread(target=self._write_loop, name="gpupool-external-pods", daemon=True)
        self._flusher.start()
        self._watch.start()
        log.info("Counting pods this project did not make: watching every pod")

    def stop(self) -> None:
        """Stop the watch, write what is pending, and stop the writer."""
        self._watch.stop()
        self._stop.set()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join(10.0)
        self._flusher = None

    def count_once(self) -> None:
        """List every pod and write the result now, without a watch (``gpupool controller run --once``)."""
        self._watch.list_now()
        self._flush()

    def retry_unknown_nodes(self) -> None:
        """Write the pods on nodes the ledger did not keep again now (the inventory sync just ran)."""
        with self._lock:
            for key, pod in self._unknown_node.items():
                self._pending.setdefault(key, pod)
        if self._unknown_node:
            self._wake.set()

    # -- the watch's callbacks (its thread) -----------------------------------------------------

    def on_list(self, pods: list[PodJson]) -> None:
        """Write a complete relist: the GPU pods found, every other hold ended."""
        found = [p for p in (external_pod(pod) for pod in pods) if p is not None]
        with self._lock:
            self._pending.clear()
        result = self.ledger.sync_external(found, complete=True)
        self._written(found, result)
        self._known = {p.key: p for p in found if p.key not in set(result.ours) | set(result.unknown_node)}
        log.info(
            "Pod relist: %d pods, %d hold GPUs: %d counted, %d released, %d already held, %d bound to grants",
            len(pods),
            len(found),
            len(result.counted),
            len(result.released),
            result.kept,
            len(result.ours),
        )

    def on_event(self, kind: str, pod: PodJson) -> None:
        """Queue a change of a pod that holds, or held, GPUs for the writer."""
        key = _key(pod)
        found = None if kind == "DELETED" else external_pod(pod)
        known = self._known.get(key)
        with self._lock:
            # A change not written yet, or being written: this one replaces it (or follows it).
            queued = key in self._pending or key in self._writing
            if found is None and known is None and key not in self._unknown_node and not queued:
                return  # no GPU now, none before: nothing to write
            if not queued and _same_pod(found, known):
                return  # as written
            self._pending[key] = found
        self._wake.set()

    # -- the writer ----------------------------------------------------------------------------

    def _write_loop(self) -> None:
        retry_at = time.monotonic() + self.retry_seconds
        while not self._stop.is_set():
            self._wake.wait(max(0.0, retry_at - time.monotonic()))
            if self._stop.is_set():
                break
            time.sleep(self.batch_seconds)  # events that come together are written together
            self._wake.clear()
            if time.monotonic() >= retry_at:
                retry_at = time.monotonic() + self.retry_seconds
                with self._lock:
                    for key, pod in self._unknown_node.items():
                        self._pending.setdefault(key, pod)
            try:
                self._flush()
            except Exception as e:  # the ledger unreachable: kept pending, tried again
                log.warning(
                    "Could not write pod changes to the ledger (%s: %s); trying again", type(e).__name__, e
                )
                self._stop.wait(1.0)
                self._wake.set()
        self._flush_quietly()

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            self._writing = set(pending)
        if not pending:
            return
        live = [pod for pod in pending.values() if pod is not None]
        gone = [key for key, pod in pending.items() if pod is None]
        try:
            result = self.ledger.sync_external(live, gone)
        except Exception:
            with self._lock:
                for key, pod in pending.items():
                    self._pending.setdefault(key, pod)
            raise
        finally:
            with self._lock:
                self._writing = set()
        for key in gone:
            self._known.pop(key, None)
            self._unknown_node.pop(key, None)
        self._written(live, result)
        now = time.monotonic()
        for key in gone:
            self.written_at[key] = now

    def _written(self, live: list[ExternalPod], result: Any) -> None:
        unknown, ours = set(result.unknown_node), set(result.ours)
        now = time.monotonic()
        for pod in live:
            if pod.key in ours:  # sent again at its next change: its grant may have ended
                self._known.pop(pod.key, None)
                self._unknown_node.pop(pod.key, None)
            elif pod.key in unknown:
                self._unknown_node[pod.key] = pod
                self._known.pop(pod.key, None)
            else:
                self._unknown_node.pop(pod.key, None)
                self._known[pod.key] = pod
                self.written_at[pod.key] = now

    def _flush_quietly(self) -> None:
        try:
            self._flush()
        except Exception as e:
            log.warning(
                "Pod changes not written at stop (%s: %s): the next relist counts them", type(e).__name__, e
            )
