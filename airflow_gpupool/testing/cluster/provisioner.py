"""The emulator's node provisioner: Cluster Autoscaler's part, for node pools declared scalable.

A :class:`ScalableNodePool` is a node shape (:func:`~airflow_gpupool.testing.cluster.nodes.gpu_node`'s
arguments) the provisioner may add nodes of. Each tick of :class:`NodeProvisioner`:

* a new ``ProvisioningRequest`` is ``Accepted`` when the pool for its pods is found (the first
  pool whose empty node takes one pod of the template, as the scheduler judges), else ``Failed``;
  a ``best-effort-atomic-scale-up`` request gets all its nodes at once ``delay_seconds`` later,
  then ``Provisioned``; a ``check-capacity`` request adds nothing and is ``Provisioned`` once the
  cluster's free capacity holds all its pods;
* a pod the scheduler left ``Unschedulable`` that some pool's node takes gets a node of that
  pool ``delay_seconds`` later (pods that one new node can hold share it), as for pending pods;
* a node it added is removed once it has run no pod above Cluster Autoscaler's expendable
  cutoff (priority -10: placeholder pods do not keep a node) for ``idle_seconds``; the
  expendable pods on it go with it.

Its own state (what is due, when each node was last busy) lives only here; everything it does
is seen through the API as Kubernetes shows it (conditions, nodes added and removed).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import math
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpupool.labels import POOL_LABEL
from airflow_gpupool.testing.api.kinds import NODES, PODS, PODTEMPLATES, PROVISIONING_REQUESTS
from airflow_gpupool.testing.cluster import provisioning as pr
from airflow_gpupool.testing.cluster.nodes import gpu_node
from airflow_gpupool.testing.cluster.scheduling import TERMINAL_PHASES, NodeAllocations, reject_reason

if TYPE_CHECKING:
    from airflow_gpupool.testing.api.apiserver import KubernetesApiEmulator

__all__ = ["EXPENDABLE_PRIORITY_CUTOFF", "NodeProvisioner", "ScalableNodePool"]

#: Cluster Autoscaler's ``--expendable-pods-priority-cutoff`` default: pods below it keep no node.
EXPENDABLE_PRIORITY_CUTOFF = -10


@dataclasses.dataclass(frozen=True)
class ScalableNodePool:
    """A node pool the provisioner grows and shrinks.

    :param name: the pool, its nodes' ``gpupool.io/pool`` label and their name prefix
    :param node: :func:`~airflow_gpupool.testing.cluster.nodes.gpu_node`'s keyword arguments for its nodes
    :param delay_seconds: how long after the demand a node appears
    :param idle_seconds: how long a node it added stays without a pod above the cutoff
    :param max_nodes: the most nodes it adds at once
    """

    name: str
    node: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    delay_seconds: float = 1.0
    idle_seconds: float = 10.0
    max_nodes: int = 10

    def build(self, index: int) -> dict[str, Any]:
        """Return the Node object of this pool's ``index``-th node.

        :param index: a number unique in the pool
        """
        return gpu_node(f"{self.name}-{index}", pool=self.name, **dict(self.node))


def _on(pod: Mapping[str, Any], node: str, name: str) -> dict[str, Any]:
    """A pod as planned on ``node``, under a name of its own (what it holds is counted by name)."""
    placed = copy.deepcopy(dict(pod))
    placed.setdefault("spec", {})["nodeName"] = node
    placed["metadata"] = {**(placed.get("metadata") or {}), "name": name, "namespace": None}
    placed["status"] = {"phase": "Running"}
    return placed


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    if (pod.get("spec") or {}).get("nodeName") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


def _expendable(pod: Mapping[str, Any]) -> bool:
    return int((pod.get("spec") or {}).get("priority") or 0) < EXPENDABLE_PRIORITY_CUTOFF


@dataclasses.dataclass
class _Due:
    """Nodes of a pool to add at a time."""

    at: float
    pool: ScalableNodePool
    nodes: int = 1


class NodeProvisioner:
    """Add nodes of declared pools for ProvisioningRequests and unschedulable pods; remove idle ones.

    :param api: the emulator
    :param pools: the scalable pools
    :param tick: seconds between two looks
    """

    def __init__(
        self, api: KubernetesApiEmulator, pools: Iterable[ScalableNodePool] = (), tick: float = 0.05
    ) -> None:
        self.api = api
        self.pools = tuple(pools)
        self.tick = tick
        self._requests: dict[str, _Due] = {}  # ProvisioningRequest uid -> its nodes
        self._pods: dict[str, _Due] = {}  # unschedulable pod uid -> its node
        self._added: dict[str, float] = {}  # node added -> when it was last busy
        self._counter = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start looking, on the running loop (nothing to do without pools)."""
        if self.pools and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="node-provisioner")

    async def shutdown(self) -> None:
        """Stop looking and forget what was due."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._requests.clear()
        self._pods.clear()
        self._added.clear()

    async def _run(self) -> None:
        while True:
            await self.step(time.monotonic())
            await asyncio.sleep(self.tick)

    async def step(self, now: float) -> None:
        """Look once: answer requests, add the nodes due, remove idle nodes.

        :param now: a monotonic time, in seconds
        """
        for request in self.api.list_objects(PROVISIONING_REQUESTS):
            await self._provision(request, now)
        await self._pending_pods(now)
        await self._remove_idle(now)

    # -- ProvisioningRequests -------------------------------------------------------------------

    def _pool_for(self, pod: Mapping[str, Any]) -> ScalableNodePool | None:
        empty = NodeAllocations()
        return next((p for p in self.pools if reject_reason(pod, p.build(0), empty) is None), None)

    def _per_node(self, pool: ScalableNodePool, pod: Mapping[str, Any]) -> int:
        node, placed, held = pool.build(0), 0, NodeAllocations()
        while reject_reason(pod, node, held) is None and placed < 1000:
            held.observe({"type": "ADDED", "object": _on(pod, node["metadata"]["name"], f"planned-{placed}")})
            placed += 1
        return max(1, placed)

    async def _provision(self, request: dict[str, Any], now: float) -> None:
        meta = request["metadata"]
        uid, namespace, name = meta["uid"], meta.get("namespace"), meta["name"]
        if pr.has_condition(request, pr.FAILED) or pr.has_condition(request, pr.PROVISIONED):
            self._requests.pop(uid, None)
            return
        spec = request["spec"]
        if spec["provisioningClassName"] == pr.CHECK_CAPACITY:
            await self._check_capacity(request)
            return
        due = self._requests.get(uid)
        if due is None:
            await self._accept(request, now)
        elif now >= due.at:
            del self._requests[uid]
            for _ in range(due.nodes):
                await self._add_node(due.pool, now)
            message = f"{due.nodes} node(s) of pool {due.pool.name} added"
            await self._set(namespace, name, pr.PROVISIONED, True, "CapacityIsProvisioned", message)

    def _pods_of(self, request: Mapping[str, Any]) -> list[dict[str, Any]] | str:
        """Return one pod per requested pod (from the templates), or why there are none."""
        namespace = request["metadata"].get("namespace")
        pods = []
        for pod_set in request["spec"]["podSets"]:
            template = self.api.get_object(PODTEMPLATES, namespace, pod_set["podTemplateRef"]["name"])
            if template is None:
                return f"PodTemplate {namespace}/{pod_set['podTemplateRef']['name']} not found"
            pods += [dict(template.get("template") or {})] * int(pod_set["count"])
        return pods

    async def _accept(self, request: dict[str, Any], now: float) -> None:
        meta = request["metadata"]
        namespace, name = meta.get("namespace"), meta["name"]
        pods = self._pods_of(request)
        if isinstance(pods, str):
            await self._set(namespace, name, pr.FAILED, True, "PodTemplateNotFound", pods)
            return
        pool = self._pool_for(pods[0])
        if pool is None:
            await self._set(
                namespace, name, pr.FAILED, True, "NoNodePoolFits", "no scalable pool fits its pods"
            )
            return
        nodes = math.ceil(len(pods) / self._per_node(pool, pods[0]))
        if nodes > pool.max_nodes:
            message = f"needs {nodes} nodes of pool {pool.name}, which adds at most {pool.max_nodes}"
            await self._set(namespace, name, pr.FAILED, True, "MaxNodesReached", message)
            return
        self._requests[meta["uid"]] = _Due(now + pool.delay_seconds, pool, nodes)
        await self._set(namespace, name, pr.ACCEPTED, True, "Accepted", f"pool {pool.name}")

    async def _check_capacity(self, request: dict[str, Any]) -> None:
        meta = request["metadata"]
        pods = self._pods_of(request)
        if isinstance(pods, str):
            await self._set(meta.get("namespace"), meta["name"], pr.FAILED, True, "PodTemplateNotFound", pods)
            return
        held = NodeAllocations.of(self.api.live_objects(PODS))
        nodes = self.api.list_objects(NODES)
        for planned, pod in enumerate(pods):
            node = next((n for n in nodes if reject_reason(pod, n, held) is None), None)
            if node is None:
                if not pr.has_condition(request, pr.ACCEPTED):
                    await self._set(meta.get("namespace"), meta["name"], pr.ACCEPTED, True, "Accepted", "")
                return
            held.observe(
                {"type": "ADDED", "object": _on(pod, node["metadata"]["name"], f"planned-{planned}")}
            )
        await self._set(meta.get("namespace"), meta["name"], pr.PROVISIONED, True, "CapacityIsFound", "")

    async def _set(
        self, namespace: str | None, name: str, kind: str, status: bool, reason: str, message: str
    ) -> None:
        await self.api.update_object(
            PROVISIONING_REQUESTS,
            namespace,
            name,
            lambda obj: pr.set_condition(obj, kind, status, reason, message),
        )

    # -- pods the scheduler cannot place --------------------------------------------------------

    async def _pending_pods(self, now: float) -> None:
        # Cluster Autoscaler adds no node for an expendable pod (below the priority cutoff).
        pending = [p for p in self.api.list_objects(PODS) if _unschedulable(p) and not _expendable(p)]
        pending_uids = {p["metadata"]["uid"] for p in pending}
        for uid in [u for u in self._pods if u not in pending_uids]:
            del self._pods[uid]
        new_nodes: list[dict[str, Any]] = []
        placed = NodeAllocations()
        for pod in pending:
            uid = pod["metadata"]["uid"]
            if uid not in self._pods:
                pool = self._pool_for(pod)
                if pool is not None:
                    self._pods[uid] = _Due(now + pool.delay_seconds, pool)
                continue
            due = self._pods[uid]
            if now < due.at:
                continue
            del self._pods[uid]
            node = next((n for n in new_nodes if reject_reason(pod, n, placed) is None), None)
            if node is None:
                node = await self._add_node(due.pool, now)
                new_nodes.append(node)
            placed.observe({"type": "ADDED", "object": _on(pod, node["metadata"]["name"], uid)})

    # -- nodes ----------------------------------------------------------------------------------

    async def _add_node(self, pool: ScalableNodePool, now: float) -> dict[str, Any]:
        self._counter += 1
        node = pool.build(self._counter)
        stored = await self.api.put_object(NODES, node)
        self._added[node["metadata"]["name"]] = now
        self.api.kubelet.notify()
        return stored

    async def _remove_idle(self, now: float) -> None:
        pools = {p.name: p for p in self.pools}
        pods = [
            p
            for p in self.api.list_objects(PODS)
            if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES
        ]
        for name, last_busy in list(self._added.items()):
            node = self.api.get_object(NODES, None, name)
            if node is None:
                del self._added[name]
                continue
            on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == name]
            if any(not _expendable(p) for p in on_node):
                self._added[name] = now
                continue
            pool = pools[node["metadata"]["labels"][POOL_LABEL]]
            if now - last_busy < pool.idle_seconds:
                continue
            del self._added[name]
            for pod in on_node:
                await self.api.remove_pod(pod["metadata"].get("namespace"), pod["metadata"]["name"])
            await self.api.kubelet.lose_node(name, delete=True)
