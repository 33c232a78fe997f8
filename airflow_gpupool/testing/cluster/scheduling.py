"""The emulator's scheduler: which node a pod may run on, and why not, like kube-scheduler says it.

It honours ``spec.nodeName``, ``spec.nodeSelector``, required node affinity (``matchExpressions``
on labels, ``matchFields`` on ``metadata.name``), taints with ``NoSchedule``/``NoExecute`` against
tolerations, cordons, node readiness and the extended resources (``nvidia.com/gpu``,
``nvidia.com/mig-*``, ...) the pods already on the node request. CPU and memory are not counted.

What the pods on each node hold is :class:`NodeAllocations`, kept up to date with every pod change
as kube-scheduler's cache is (an informer feeds it), so placing a pod costs the same with ten
pods or ten thousand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

_NATIVE_RESOURCES = {"cpu", "memory", "ephemeral-storage", "pods"}
TERMINAL_PHASES = {"Succeeded", "Failed"}


def _quantity(value: Any) -> float:
    """Read a resource quantity as a number (extended resources are integers).

    :param value: e.g. ``"2"`` or ``1``
    """
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def extended_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """Return the extended resources a pod requests (limits count as requests, as in Kubernetes).

    :param pod: the pod
    """
    total: dict[str, float] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for key, value in merged.items():
            if key not in _NATIVE_RESOURCES and not key.startswith("hugepages-"):
                total[key] = total.get(key, 0.0) + _quantity(value)
    return total


def _expression_matches(expression: Mapping[str, Any], value: str | None) -> bool:
    """Evaluate one node selector requirement.

    :param expression: ``{"key", "operator", "values"}``
    :param value: the node's value for the key, ``None`` if absent
    """
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in {"Gt", "Lt"} and value is not None and values:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Evaluate one node selector term (all its requirements).

    :param term: ``{"matchExpressions": [...], "matchFields": [...]}``
    :param node: the node
    """
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    for expression in term.get("matchExpressions") or []:
        if not _expression_matches(expression, labels.get(expression.get("key"))):
            return False
    for expression in term.get("matchFields") or []:
        value = meta.get("name") if expression.get("key") == "metadata.name" else None
        if not _expression_matches(expression, value):
            return False
    return True


def matches_node_selection(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Return whether a node satisfies a pod's ``nodeSelector`` and required node affinity.

    :param pod: the pod
    :param node: the node
    """
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not affinity:
        return True
    terms = affinity.get("nodeSelectorTerms") or []
    return any(_term_matches(term, node) for term in terms) if terms else True


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Return whether some toleration tolerates a taint.

    :param tolerations: the pod's tolerations
    :param taint: one node taint
    """
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def untolerated_taint(pod: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Return the first ``NoSchedule``/``NoExecute`` taint of a node the pod does not tolerate.

    :param pod: the pod
    :param node: the node
    """
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    taint: Mapping[str, Any]
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in {"NoSchedule", "NoExecute"} and not _tolerates(tolerations, taint):
            return taint
    return None


def node_is_ready(node: Mapping[str, Any]) -> bool:
    """Return whether a node's ``Ready`` condition is ``True``.

    :param node: the node
    """
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True


def used_resources(node_name: str, pods: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Return the extended resources held on a node by its non-terminated pods.

    :param node_name: the node
    :param pods: every pod of the cluster
    """
    used: dict[str, float] = {}
    for pod in pods:
        on_node = (pod.get("spec") or {}).get("nodeName") == node_name
        if on_node and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
            for key, amount in extended_requests(pod).items():
                used[key] = used.get(key, 0.0) + amount
    return used


class NodeAllocations:
    """The extended resources each node's pods hold: the scheduler's cache of :func:`used_resources`.

    A pod holds what it requests on its ``spec.nodeName`` from the moment it is bound (or created
    bound) until it is ``Succeeded``/``Failed`` or gone: a ``Terminating`` pod still holds, as in
    Kubernetes. :meth:`observe` takes every change of every pod, in the order they were stored.
    """

    def __init__(self) -> None:
        self._holders: dict[tuple[str | None, str], tuple[str, dict[str, float]]] = {}
        self._used: dict[str, dict[str, float]] = {}
        self._count: dict[str, int] = {}

    @classmethod
    def of(cls, pods: Iterable[Mapping[str, Any]]) -> NodeAllocations:
        """Return the allocations of a list of pods (a snapshot, or pods placed in a plan).

        :param pods: the pods
        """
        allocations = cls()
        for pod in pods:
            allocations.observe({"type": "ADDED", "object": pod})
        return allocations

    def observe(self, event: Mapping[str, Any]) -> None:
        """Follow one stored change of a pod.

        :param event: the watch event: ``{"type": "ADDED"|"MODIFIED"|"DELETED", "object": pod}``
        """
        pod = event.get("object") or {}
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace"), str(meta.get("name")))
        self._release(key)
        node = (pod.get("spec") or {}).get("nodeName")
        if event.get("type") == "DELETED" or not node:
            return
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            return
        requests = extended_requests(pod)
        if not requests:
            return
        self._holders[key] = (node, requests)
        used = self._used.setdefault(node, {})
        for name, amount in requests.items():
            used[name] = used.get(name, 0.0) + amount
        self._count[node] = self._count.get(node, 0) + 1

    def _release(self, key: tuple[str | None, str]) -> None:
        held = self._holders.pop(key, None)
        if held is None:
            return
        node, requests = held
        self._count[node] -= 1
        if not self._count[node]:  # the node's last holder: start again from exactly nothing
            del self._count[node], self._used[node]
            return
        used = self._used[node]
        for name, amount in requests.items():
            used[name] -= amount

    def used(self, node_name: str, *, excluding: Mapping[str, Any] | None = None) -> dict[str, float]:
        """Return what a node's pods hold, as :func:`used_resources` counts it.

        :param node_name: the node
        :param excluding: a pod whose own share is left out (the kubelet admitting it)
        """
        used = dict(self._used.get(node_name, {}))
        if excluding is not None:
            meta = excluding.get("metadata") or {}
            held = self._holders.get((meta.get("namespace"), str(meta.get("name"))))
            if held is not None and held[0] == node_name:
                for name, amount in held[1].items():
                    used[name] -= amount
        return used


def reject_reason(pod: Mapping[str, Any], node: Mapping[str, Any], held: NodeAllocations) -> str | None:
    """Return why a pod cannot go on a node, worded as kube-scheduler does, or ``None`` if it fits.

    :param pod: the pod to place
    :param node: the candidate node
    :param held: what the cluster's pods hold
    """
    if (node.get("spec") or {}).get("unschedulable"):
        return "node(s) were unschedulable"
    if not node_is_ready(node):
        return "node(s) were not ready"
    if not matches_node_selection(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    taint = untolerated_taint(pod, node)
    if taint is not None:
        return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used = held.used(node["metadata"]["name"])
    for key, amount in sorted(extended_requests(pod).items()):
        if amount > _quantity(allocatable.get(key, 0)) - used.get(key, 0.0):
            return f"Insufficient {key}"
    return None


def admission_rejection(
    pod: Mapping[str, Any], node: Mapping[str, Any], held: NodeAllocations
) -> tuple[str, str] | None:
    """Return the kubelet's ``(reason, message)`` for refusing a pod bound to its node directly, or ``None``.

    A pod whose ``spec.nodeName`` was set by its author skips kube-scheduler; the node's kubelet
    still admits it against what the node's other pods hold, and fails it (``OutOf<resource>``)
    when an extended resource is short, as a device plugin's resources are.

    :param pod: the pod
    :param node: its node
    :param held: what the cluster's pods hold (the pod's own share is left out)
    """
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used = held.used(node["metadata"]["name"], excluding=pod)
    for key, amount in sorted(extended_requests(pod).items()):
        capacity = _quantity(allocatable.get(key, 0))
        if amount > capacity - used.get(key, 0.0):
            message = (
                f"Pod was rejected: Node didn't have enough resource: {key}, requested: {amount:g}, "
                f"used: {used.get(key, 0.0):g}, capacity: {capacity:g}"
            )
            return f"OutOf{key}", message
    return None


def choose_node(
    pod: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]], held: NodeAllocations
) -> tuple[str | None, str]:
    """Pick the first node (by name) a pod fits on.

    :param pod: the pod to place
    :param nodes: every node
    :param held: what the cluster's pods hold
    :return: the node name (or ``None``) and, when none fits, the FailedScheduling message
    """
    nodes = sorted(nodes, key=lambda n: n["metadata"]["name"])
    reasons: Counter[str] = Counter()
    for node in nodes:
        reason = reject_reason(pod, node, held)
        if reason is None:
            return node["metadata"]["name"], ""
        reasons[reason] += 1
    details = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    message = f"0/{len(nodes)} nodes are available: {details}." if details else "0/0 nodes are available."
    return None, message
