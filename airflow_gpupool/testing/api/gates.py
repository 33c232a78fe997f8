"""Kubernetes' rules for scheduling gates and pod updates, as the emulator enforces them.

A pod with ``spec.schedulingGates`` is not scheduled: it stays ``Pending`` with the condition
``PodScheduled=False``, reason ``SchedulingGated``, until its last gate is removed. Updates of a
pod are refused with ``422 Invalid`` as the real API server refuses them (Pod Scheduling
Readiness, KEP-3521; mutable scheduling directives, KEP-3838):

* any pod: metadata (labels, annotations) may change; in the spec only container images,
  ``activeDeadlineSeconds``, ``terminationGracePeriodSeconds`` and *added* tolerations;
  scheduling gates may only be removed, never added;
* a gated pod besides: ``nodeSelector`` may gain keys (not change or lose them), required node
  affinity may be set when it has no terms, or gain requirements in each existing term;
  preferred node affinity may change freely;
* a pod may not be created with both gates and ``spec.nodeName``.

So a test catches a patch a real cluster would refuse. The kubelet and the API server call this
module at two marked lines each; the object model is the JSON the API stores.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

from kmock import KubernetesError

from airflow_gpupool.testing.pods.pod_status import condition

__all__ = [
    "GATED_REASON",
    "KubernetesInvalid",
    "changed",
    "check_pod_create",
    "check_pod_update",
    "is_gated",
    "mark_gated",
    "marked_gated",
    "watch",
]

GATED_REASON = "SchedulingGated"
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
_FORBIDDEN_SPEC = (
    "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
    "to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


class KubernetesInvalid(KubernetesError):
    """A 422 answer: the object (or the change) is invalid.

    :param kind: the object's kind
    :param name: the object's name
    :param message: the field error, e.g. ``spec.schedulingGates: Forbidden: ...``
    """

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(
            status=422,
            reason="Invalid",
            message=f'{kind} "{name}" is invalid: {message}',
            details={"name": name, "kind": kind.lower()},
        )


# Gated pods wait on an event of their own, set when that pod is updated: with a thousand gated
# pods, waking them all on every update would cost a million reads.
_WAITERS_ATTRIBUTE = "_gpupool_gate_waiters"


def _waiters(owner: object) -> dict[tuple[str | None, str], asyncio.Event]:
    """Return the registry of the emulator ``owner`` (kept on it: it lives and dies with it)."""
    waiters: dict[tuple[str | None, str], asyncio.Event] | None = getattr(owner, _WAITERS_ATTRIBUTE, None)
    if waiters is None:
        waiters = {}
        setattr(owner, _WAITERS_ATTRIBUTE, waiters)
    return waiters


def watch(owner: object, namespace: str | None, name: str) -> asyncio.Event:
    """Return an event set at the next update of a pod (call before reading it, on the server's loop).

    :param owner: the API server (one registry per emulator)
    :param namespace: the pod's namespace
    :param name: the pod's name
    """
    return _waiters(owner).setdefault((namespace, name), asyncio.Event())


def changed(owner: object, namespace: str | None, name: str) -> None:
    """Wake the kubelet's wait on a pod that was just updated.

    :param owner: the API server
    :param namespace: the pod's namespace
    :param name: the pod's name
    """
    event = _waiters(owner).pop((namespace, name), None)
    if event is not None:
        event.set()


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Return whether a pod still has scheduling gates.

    :param pod: the pod
    """
    return bool((pod.get("spec") or {}).get("schedulingGates"))


def mark_gated(pod: dict[str, Any]) -> None:
    """Record that a pod waits for its gates (``PodScheduled=False``, ``SchedulingGated``).

    :param pod: the pod, changed in place
    """
    pod.setdefault("status", {})["conditions"] = [
        condition("PodScheduled", False, GATED_REASON, GATED_MESSAGE)
    ]


def marked_gated(pod: Mapping[str, Any]) -> bool:
    """Return whether a pod's status already says it waits for its gates.

    :param pod: the pod
    """
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == GATED_REASON
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def check_pod_create(pod: Mapping[str, Any]) -> None:
    """Refuse a new pod the API server refuses: gated and already bound to a node.

    :param pod: the pod being created
    :raises KubernetesInvalid: it is
    """
    spec = pod.get("spec") or {}
    if spec.get("schedulingGates") and spec.get("nodeName"):
        name = str((pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get("generateName"))
        raise KubernetesInvalid(
            "Pod", name, "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been removed"
        )


def _gate_names(spec: Mapping[str, Any]) -> list[str]:
    return [str(g.get("name")) for g in spec.get("schedulingGates") or []]


def _check_gates(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    before = set(_gate_names(old))
    added = [g for g in _gate_names(new) if g not in before]
    if added:
        return f"spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate '{added[0]}'"
    new["schedulingGates"] = old.get("schedulingGates")
    return None


def _check_tolerations(old: dict[str, Any], new: dict[str, Any]) -> None:
    before = list(old.get("tolerations") or [])
    after = list(new.get("tolerations") or [])
    if all(t in after for t in before):  # only additions: existing ones kept
        new["tolerations"] = old.get("tolerations")


def _check_node_selector(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    before, after = dict(old.get("nodeSelector") or {}), dict(new.get("nodeSelector") or {})
    if any(after.get(k) != v for k, v in before.items()):
        return (
            "spec.nodeSelector: Invalid value: only additions of key/value pairs are allowed on a gated pod"
        )
    new["nodeSelector"] = old.get("nodeSelector")
    return None


def _required_terms(spec: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return None if required is None else list(required.get("nodeSelectorTerms") or [])


def _term_extends(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    for key in ("matchExpressions", "matchFields"):
        old_reqs, new_reqs = list(before.get(key) or []), list(after.get(key) or [])
        if new_reqs[: len(old_reqs)] != old_reqs:
            return False
    return True


def _check_node_affinity(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    before, after = _required_terms(old), _required_terms(new)
    if before and (after is None or len(after) != len(before) or not all(map(_term_extends, before, after))):
        return (
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: Invalid value: "
            "only additions of requirements to existing terms are allowed on a gated pod"
        )
    # Accepted: the new affinity (required part checked, preferred part free) replaces the old.
    old_affinity = dict(old.get("affinity") or {})
    new_affinity = dict(new.get("affinity") or {})
    old_affinity.pop("nodeAffinity", None)
    new_affinity.pop("nodeAffinity", None)
    new["affinity"], old["affinity"] = new_affinity or None, old_affinity or None
    return None


def _normalize_allowed(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Copy onto ``new`` the fields any pod may change, so only forbidden changes remain."""
    for key in ("activeDeadlineSeconds", "terminationGracePeriodSeconds"):
        if key in old or key in new:
            new[key] = old.get(key)
    for key in ("containers", "initContainers"):
        olds, news = old.get(key) or [], new.get(key) or []
        if len(olds) == len(news):
            for before, after in zip(olds, news, strict=True):
                after["image"] = before.get("image")


def check_pod_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Refuse an update of a pod the API server refuses.

    :param old: the stored pod
    :param new: the pod as the update would leave it (status is not part of the check)
    :raises KubernetesInvalid: the update changes what may not change
    """
    old_spec = copy.deepcopy(dict(old.get("spec") or {}))
    new_spec = copy.deepcopy(dict(new.get("spec") or {}))
    name = str((old.get("metadata") or {}).get("name"))
    gated = is_gated(old)
    problem = _check_gates(old_spec, new_spec)
    if problem is None and gated:
        problem = _check_node_selector(old_spec, new_spec) or _check_node_affinity(old_spec, new_spec)
    if problem is not None:
        raise KubernetesInvalid("Pod", name, problem)
    _check_tolerations(old_spec, new_spec)
    _normalize_allowed(old_spec, new_spec)
    if _pruned(old_spec) != _pruned(new_spec):
        raise KubernetesInvalid("Pod", name, _FORBIDDEN_SPEC)


def _pruned(value: Any) -> Any:
    """Drop ``None`` and empty values, which the API server does not store."""
    if isinstance(value, Mapping):
        pruned = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value
