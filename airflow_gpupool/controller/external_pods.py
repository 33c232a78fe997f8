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

The ResourceClaims that pods name (DRA) are read by :class:`ResourceClaimCache`, not watched: a
pod is bound only once its claims are allocated, and an allocation does not change while the pod
holds it, so reading a claim when its pod's event or relist needs it is enough; a second watch
would keep a stream open for objects most clusters have none of. Allocated claims are kept; a
claim not found or not allocated yet is read again at the pod's next event, or the next relist.
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

__all__ = ["ExternalPodCounter", "GpuPodCache", "ResourceClaimCache"]

log = logging.getLogger(__name__)

#: resource.k8s.io/v1 (Kubernetes 1.34): the ResourceClaims of Dynamic Resource Allocation.
_DRA_GROUP, _DRA_VERSION, _DRA_PLURAL = "resource.k8s.io", "v1", "resourceclaims"


def _key(pod: PodJson) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _same_pod(found: ExternalPod | None, known: ExternalPod | None) -> bool:
    """Whether ``found`` is the pod last written: the same uid on the same node (what it holds cannot change)."""
    return found is not None and known is not None and (found.uid, found.node) == (known.uid, known.node)


def _names_claims(pod: PodJson) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims")) and bool(
        (pod.get("spec") or {}).get("nodeName")
    )


def _reserved_for(claim: PodJson, uid: str) -> bool:
    return any(r.get("uid") == uid for r in (claim.get("status") or {}).get("reservedFor") or [])


class ResourceClaimCache:
    """The allocated ResourceClaims the pod watch's pods name, by ``(namespace, name)``.

    A kept claim answers for a pod it is reserved for (``status.reservedFor``); for any other pod it
    is read again (a claim of that name may have been made anew). Each relist that finds pods naming
    claims lists them all once and starts the cache over.

    :param api_client: a ``kubernetes.client.ApiClient``
    """

    def __init__(self, api_client: Any) -> None:
        self._api_client = api_client
        self._lock = threading.Lock()
        self._claims: dict[tuple[str, str], PodJson] = {}
        #: API reads made (a list counts one): for tests.
        self.reads = 0

    @property
    def _api(self) -> Any:
        from kubernetes.client import CustomObjectsApi

        return CustomObjectsApi(self._api_client)

    def relisted(self, pods: list[PodJson]) -> None:
        """Start over from one list of every claim, if any pod of a complete pod list names one."""
        with self._lock:
            self._claims = {}
        if not any(_names_claims(p) for p in pods):
            return
        try:
            self.reads += 1
            listed = self._api.list_cluster_custom_object(_DRA_GROUP, _DRA_VERSION, _DRA_PLURAL)
        except Exception as e:  # DRA not served, or not permitted: each pod reads its claims
            log.warning("Could not list ResourceClaims (%s: %s)", type(e).__name__, e)
            return
        with self._lock:
            for claim in listed.get("items") or []:
                self._keep(claim)

    def lookup(self, namespace: str, name: str, pod_uid: str) -> PodJson | None:
        """Return the claim ``namespace/name`` for the pod ``pod_uid``; None when there is none."""
        with self._lock:
            kept = self._claims.get((namespace, name))
        if kept is not None and _reserved_for(kept, pod_uid):
            return kept
        from kubernetes.client.exceptions import ApiException

        try:
            self.reads += 1
            claim = self._api.get_namespaced_custom_object(
                _DRA_GROUP, _DRA_VERSION, namespace, _DRA_PLURAL, name
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("Could not read ResourceClaim %s/%s (%s)", namespace, name, e.reason)
            return None
        with self._lock:
            self._keep(claim)
        return dict(claim)

    def _keep(self, claim: PodJson) -> None:
        meta = claim.get("metadata") or {}
        if (claim.get("status") or {}).get("allocation"):
            self._claims[(str(meta.get("namespace") or "default"), str(meta.get("name")))] = claim


class GpuPodCache:
    """The live pods that hold GPUs, by ``namespace/name``, kept from the watch's lists and events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodJson] = {}
        #: Whether a list was read since the watch started (before, the cache knows nothing).
        self.listed = False

    def relisted(self, pods: list[PodJson], found: set[str]) -> None:
        """Replace the cache with the GPU pods of a complete list (``found``: their keys)."""
        with self._lock:
            self._pods = {_key(p): p for p in pods if _key(p) in found}
            self.listed = True

    def changed(self, key: str, pod: PodJson | None) -> None:
        """Keep ``pod`` (it holds GPUs), or forget the key (None: gone, or no GPU now)."""
        with self._lock:
            if pod is None:
                self._pods.pop(key, None)
            else:
                self._pods[key] = pod

    def pods(self) -> list[PodJson]:
        """Return a copy of the cached pods."""
        with self._lock:
            return list(self._pods.values())


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
        #: The ResourceClaims the pods name (DRA), read as they are needed.
        self.claims = ResourceClaimCache(core_v1_api.api_client)
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
        #: Every live pod that holds GPUs, ours too, as the watch last saw it: the drift step reads it.
        self.gpu_pods = GpuPodCache()

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
        self.claims.relisted(pods)
        found = [p for p in (self._read(pod) for pod in pods) if p is not None]
        self.gpu_pods.relisted(pods, {p.key for p in found})
        with self._lock:
            self._pending.clear()
        result = self.ledger.sync_external(found, complete=True)
        self._written(found, result)
        released_at = time.monotonic()
        for key in result.released:
            self.written_at[key] = released_at
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
        found = None if kind == "DELETED" else self._read(pod)
        self.gpu_pods.changed(key, pod if found is not None else None)
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

    def _read(self, pod: PodJson) -> ExternalPod | None:
        return external_pod(pod, self.claims.lookup)

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
