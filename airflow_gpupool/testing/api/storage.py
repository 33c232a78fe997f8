"""The emulator's object store: kmock's objects with the metadata the API server owns, and watch buses.

:class:`StoredObjects` is the layer below the HTTP handling of
:class:`~airflow_gpupool.testing.api.apiserver.KubernetesApiEmulator`: the kubelet, the scheduler and
the tests read and change objects through it (on the server's event loop), and every change
gets a new ``resourceVersion`` (one global counter) and an event on its resource's watch bus.
"""

from __future__ import annotations

import collections
import copy
import datetime
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import attrs
from kmock import KubernetesEmulator, Object, ObjectsArray, resource
from kmock._internal.aiobus import Bus  # kmock's watch bus, which it re-exports without __all__

from airflow_gpupool.testing.api.discovery import SERVED

__all__ = ["StoredObjects", "now_iso"]

T = TypeVar("T")

#: How many deletions per resource a watch started from an older ``resourceVersion`` can replay.
_TOMBSTONES = 10_000


def now_iso() -> str:
    """Return the current UTC time as Kubernetes writes timestamps."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: What a store change tells its observers: the watch event (``{"type", "object"}``) it streams.
ChangeObserver = Callable[[Mapping[str, Any]], None]


@attrs.frozen(eq=False, order=False)
class _IndexedObjects(ObjectsArray):
    """kmock's objects array, with each resource's objects kept apart.

    kmock keeps every object of every kind in one dict, and walking it to list one kind cost
    the emulator time in proportion to everything ever stored (pods and their many events):
    placing n pods cost O(n^2). Keys are only added (kmock soft-deletes), so the index follows
    ``__setitem__`` and the rare hard ``del``.
    """

    _by_resource: dict[resource, dict[tuple[str | None, str], Object]] = attrs.field(factory=dict, init=False)

    def __setitem__(self, key: Any, value: Any, /) -> None:
        super().__setitem__(key, value)
        if len(key) == 3:
            res, namespace, name = _parse_key(key)
            self._by_resource.setdefault(res, {})[namespace, name] = super().__getitem__(key)

    def __delitem__(self, key: Any, /) -> None:
        super().__delitem__(key)
        if len(key) == 3:
            res, namespace, name = _parse_key(key)
            self._by_resource.get(res, {}).pop((namespace, name), None)

    def clear(self) -> None:
        super().clear()
        self._by_resource.clear()

    def of_resource(self, res: resource) -> Mapping[tuple[str | None, str], Object]:
        """Return the objects ever stored of one resource, live or soft-deleted, by namespace and name.

        :param res: the resource
        """
        return self._by_resource.get(res, {})


def _parse_key(key: tuple[Any, str | None, str]) -> tuple[resource, str | None, str]:
    res = key[0] if isinstance(key[0], resource) else resource(key[0])
    return res, key[1], key[2]


@attrs.mutable(weakref_slot=True)
class _ObservedBus(Bus[Any]):
    """A watch bus that tells the store's observers of each event before any watcher sees it.

    Every change of a stored object, kmock's own included, is put on its resource's bus right
    after it is stored (under the store's lock): the one place a cache can follow every change
    synchronously, as the scheduler's cache follows its informer.
    """

    observers: list[ChangeObserver] = attrs.field(factory=list, kw_only=True)

    async def put(self, *items: Any) -> None:
        for item in items:
            for observer in self.observers:
                observer(item)
        await super().put(*items)


class _ObservedBuses(dict[resource, _ObservedBus]):
    """kmock's buses by resource, created on first use, each one observed."""

    def __missing__(self, res: resource) -> _ObservedBus:
        bus = self[res] = _ObservedBus()
        return bus


class StoredObjects(KubernetesEmulator):
    """kmock's in-memory objects, stamped and versioned as the API server does."""

    def __init__(self) -> None:
        super().__init__()
        self._indexed = _IndexedObjects()
        self._objects = self._indexed
        self._observed = _ObservedBuses()
        self._buses = cast("Any", self._observed)
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
        if request.resource is not None:  # kmock's own check, over one resource's objects
            return [
                obj
                for (namespace, name), obj in self._indexed.of_resource(request.resource).items()
                if (namespace == request.namespace if strict else request.namespace in (None, namespace))
                and request.name in (None, name)
            ]
        found_all: list[Any] = super()._KubernetesEmulator__get_objs(request, strict)  # type: ignore[misc]
        return found_all

    def observe(self, res: resource, observer: ChangeObserver) -> None:
        """Call ``observer`` with each change of ``res`` as it is stored, before any watcher sees it.

        :param res: the resource
        :param observer: called with the watch event (``{"type", "object"}``); it must only read
            the object, and not await
        """
        self._observed[res].observers.append(observer)

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
            for (key_ns, _), obj in self._indexed.of_resource(res).items()
            if (namespace is None or key_ns == namespace) and not obj.deleted
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
        dependents = self.list_objects(res)
        if not dependents:  # nothing to collect: spare reading every owner (each pod removal asks)
            return []
        live = {o["metadata"].get("uid") for o in self.live_objects(owner)}
        kind = self.resources_kind(owner)
        deleted = []
        for obj in dependents:
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
