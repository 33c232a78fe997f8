"""The emulator's object store: kmock's objects with the metadata the API server owns, and watch buses.

:class:`StoredObjects` is the layer below the HTTP handling of
:class:`~airflow_gpupool.testing.apiserver.KubernetesApiEmulator`: the kubelet, the scheduler and
the tests read and change objects through it (on the server's event loop), and every change
gets a new ``resourceVersion`` (one global counter) and an event on its resource's watch bus.
"""

from __future__ import annotations

import collections
import copy
import datetime
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from kmock import KubernetesEmulator, resource

from airflow_gpupool.testing.discovery import SERVED

__all__ = ["StoredObjects", "now_iso"]

T = TypeVar("T")

#: How many deletions per resource a watch started from an older ``resourceVersion`` can replay.
_TOMBSTONES = 10_000


def now_iso() -> str:
    """Return the current UTC time as Kubernetes writes timestamps."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StoredObjects(KubernetesEmulator):
    """kmock's in-memory objects, stamped and versioned as the API server does."""

    def __init__(self) -> None:
        super().__init__()
        self._resource_version = 0
        # The last deletions, so a watch from a resourceVersion sees a DELETED it would have missed.
        self._tombstones: dict[resource, collections.deque[dict[str, Any]]] = collections.defaultdict(
            lambda: collections.deque(maxlen=_TOMBSTONES)
        )
        # etcd's compaction: a watch from a resourceVersion older than this cannot be replayed.
        self.compacted_version = 0

    def _KubernetesEmulator__get_objs(self, request: Any, strict: bool) -> list[Any]:
        """Find the objects a request addresses: by key when it names one (kmock's own walks them all).

        kmock looks every create, patch, read and delete up by comparing the request with each
        stored object in turn: with thousands of pods and their events each answer took
        milliseconds more. A resource compares and hashes by group, version and plural alike, so
        the key finds exactly what the walk would. Overrides kmock 0.8's private look-up.

        :param request: kmock's parsed request
        :param strict: kmock's flag: a cluster-wide request (no namespace) matches only cluster objects
        """
        if request.name is not None and request.resource is not None and (strict or request.namespace):
            key = (request.resource, request.namespace, request.name)
            return [self.objects[key]] if key in self.objects else []
        found_all: list[Any] = super()._KubernetesEmulator__get_objs(request, strict)  # type: ignore[misc]
        return found_all

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion given out."""
        return self._resource_version

    def compact(self) -> None:
        """Forget the history before now, as etcd's compaction does: older watches get ``410 Gone``."""
        self.compacted_version = self._resource_version
        self._tombstones.clear()

    def replayable(self, res: resource, since: int) -> bool:
        """Whether a watch of ``res`` from resourceVersion ``since`` can be replayed (else ``410 Gone``)."""
        if since < self.compacted_version:
            return False
        kept = self._tombstones.get(res)
        # A full history dropped deletions older than its first: those cannot be replayed.
        return not (kept and len(kept) == kept.maxlen and since < int(kept[0]["metadata"]["resourceVersion"]))

    def next_resource_version(self) -> str:
        """Return a new, larger resourceVersion."""
        self._resource_version += 1
        return str(self._resource_version)

    def _stamp(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Fill the metadata the API server owns on a new object.

        :param obj: the object, changed in place
        :param namespace: the namespace from the URL
        """
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if namespace is not None:
            meta.setdefault("namespace", namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        meta["resourceVersion"] = self.next_resource_version()
        meta.setdefault("generation", 1)
        return obj

    def get_object(self, res: resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Return a deep copy of a live object, or ``None``.

        :param res: the resource
        :param namespace: its namespace (``None`` for cluster objects)
        :param name: its name
        """
        key = (res, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def list_objects(self, res: resource, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return deep copies of the live objects of a resource, oldest first.

        :param res: the resource
        :param namespace: only this namespace; ``None`` for all
        """
        return [copy.deepcopy(obj) for obj in self.live_objects(res, namespace)]

    def live_objects(self, res: resource, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return the stored live objects of a resource themselves, oldest first: read them, never change them.

        For readers that finish before the loop runs anything else (the simulated scheduler, a
        list answer serialized at once): copying every pod for each of them made the emulator's
        cost grow with the square of the pods.

        :param res: the resource
        :param namespace: only this namespace; ``None`` for all
        """
        found = [
            obj.raw
            for (key_res, key_ns, _), obj in list(self.objects.items())
            # the plural first: a plain string compare rules out the other kinds (events) cheaply
            if key_res.plural == res.plural
            and key_res == res
            and (namespace is None or key_ns == namespace)
            and not obj.deleted
        ]
        return sorted(found, key=lambda o: int(o["metadata"].get("resourceVersion", "0")))

    async def put_object(self, res: resource, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object and tell the watchers.

        :param res: the resource
        :param obj: the whole object; its metadata is stamped
        """
        meta = obj.setdefault("metadata", {})
        key = (res, meta.get("namespace"), meta["name"])
        existed = key in self.objects and not self.objects[key].deleted
        if existed:
            meta["resourceVersion"] = self.next_resource_version()
        else:
            self._stamp(obj)
        async with self._lock:
            if key in self.objects:
                self.objects[key].create(obj)
            else:
                self.objects[key] = obj
            await self._buses[res].put(
                {"type": "MODIFIED" if existed else "ADDED", "object": copy.deepcopy(obj)}
            )
        return obj

    async def update_object(
        self, res: resource, namespace: str | None, name: str, change: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any] | None:
        """Apply ``change`` to a copy of a live object, store it and tell the watchers.

        :param res: the resource
        :param namespace: its namespace
        :param name: its name
        :param change: a function mutating the object in place
        :return: the new object, or ``None`` if it no longer exists
        """
        obj = self.get_object(res, namespace, name)
        if obj is None:
            return None
        change(obj)
        return await self.put_object(res, obj)

    async def delete_object(self, res: resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Delete an object and tell the watchers.

        :param res: the resource
        :param namespace: its namespace
        :param name: its name
        :return: the last state, or ``None`` if it did not exist
        """
        obj = self.get_object(res, namespace, name)
        if obj is None:
            return None
        async with self._lock:
            self.objects[res, namespace, name].delete()
            obj["metadata"]["resourceVersion"] = self.next_resource_version()
            self._tombstones[res].append(copy.deepcopy(obj))
            await self._buses[res].put({"type": "DELETED", "object": obj})
        return obj

    def deleted_since(self, res: resource, namespace: str | None, since: int) -> list[dict[str, Any]]:
        """Return the last state of the objects deleted after ``resourceVersion`` ``since``, oldest first.

        :param res: the resource
        :param namespace: only this namespace; ``None`` for all
        :param since: a resourceVersion
        """
        return [
            copy.deepcopy(obj)
            for obj in self._tombstones.get(res, ())
            if int(obj["metadata"]["resourceVersion"]) > since
            and (namespace is None or obj["metadata"].get("namespace") == namespace)
        ]

    async def wait_until(self, res: resource, check: Callable[[], T | None]) -> T:
        """Wait until ``check`` returns something other than ``None``, re-checking on every change of a resource.

        :param res: the resource whose changes wake the check
        :param check: returns the result, or ``None`` to keep waiting
        """
        bus = self._buses[res]
        marker = await bus.mark()
        try:
            while (result := check()) is None:
                await bus.get(since=marker)
            return result
        finally:
            await bus.unmark(marker)

    async def collect_garbage(self, res: resource, owner: resource) -> list[str]:
        """Delete the objects of ``res`` whose every owner of resource ``owner`` is gone, as Kubernetes' garbage collector does.

        An object owned (``metadata.ownerReferences``) only by objects that no longer exist, by uid,
        is deleted; one with no owner reference, or with a live owner, stays.

        :param res: the dependents, e.g. ResourceClaims
        :param owner: the owners' resource, e.g. Pods
        :return: the names deleted
        """
        live = {o["metadata"].get("uid") for o in self.list_objects(owner)}
        kind = self.resources_kind(owner)
        deleted = []
        for obj in self.list_objects(res):
            meta = obj["metadata"]
            owners = [r for r in meta.get("ownerReferences") or [] if r.get("kind") == kind]
            if owners and not any(r.get("uid") in live for r in owners):
                await self.delete_object(res, meta.get("namespace"), meta["name"])
                deleted.append(meta["name"])
        return deleted

    @staticmethod
    def resources_kind(res: resource) -> str:
        """Return the kind of a served resource (``Pod`` for pods)."""
        return next(s.kind for s in SERVED if s.plural == res.plural and s.group == (res.group or ""))
