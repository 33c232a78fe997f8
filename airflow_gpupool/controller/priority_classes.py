"""The priority of a gated pod that takes it from its PriorityClass, as the gatekeeper reserves it.

The executor hook marks such a pod ``gpupool.io/priority-class: <name>`` (it names
``spec.priorityClassName`` and sets no gpupool priority of its own: :mod:`airflow_gpupool.pod_options`)
but cannot read the cluster; the gatekeeper can. The Kubernetes priority is the pod's
``spec.priority`` when set (the API server's Priority admission plugin fills it in from the class
when the pod is created), else the class's ``value`` read from scheduling.k8s.io/v1 (each class
once a pass). It becomes the ledger priority as it is, as Kueue takes a pod's priority, clamped
to the ledger's range (±1,000,000: system classes are above it). A class that does not exist or
cannot be read leaves the request's own priority (the default) and says why: the pass goes on.
gpupool's own workload classes (``[gpupool] workload_priority_classes``) order pods for the
kube-scheduler, not requests in the ledger: they leave the request's priority as it is, so a plain
pod that names ``gpupool-training`` does not become urgent work by its value (100000).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpupool import settings
from airflow_gpupool.labels import PRIORITY_CLASS_ANNOTATION
from airflow_gpupool.resources import MAX_ABS_PRIORITY

__all__ = ["PodPriorities", "ResolvedPriority", "ledger_priority"]


def ledger_priority(kubernetes_priority: int) -> int:
    """Return the ledger priority of a Kubernetes priority: the same number, clamped to the ledger's range.

    :param kubernetes_priority: a PriorityClass's value, or a pod's ``spec.priority``
    """
    return max(-MAX_ABS_PRIORITY, min(MAX_ABS_PRIORITY, kubernetes_priority))


@dataclass(frozen=True)
class ResolvedPriority:
    """What a gated pod's PriorityClass says.

    :param priority: the ledger priority; None to keep the request's own (no class, or unknown)
    :param problem: why the class could not be read; None when it could, or there is none
    """

    priority: int | None
    problem: str | None = None


@dataclass
class PodPriorities:
    """Resolves gated pods' priorities for one gatekeeper pass, reading each class at most once.

    :param core_v1_api: the pass's ``kubernetes.client.CoreV1Api`` (its API client reads the classes)
    """

    core_v1_api: Any
    _values: dict[str, int | str] = field(default_factory=dict)  # a class's value, or why none

    def resolve(self, pod: Mapping[str, Any]) -> ResolvedPriority:
        """Return the priority a gated pod's PriorityClass gives it (see the module docstring).

        :param pod: the gated pod, as a JSON dict
        """
        name = ((pod.get("metadata") or {}).get("annotations") or {}).get(PRIORITY_CLASS_ANNOTATION)
        if not name or name in settings.workload_priority_classes().values():
            return ResolvedPriority(None)
        filled = (pod.get("spec") or {}).get("priority")
        if isinstance(filled, int) and not isinstance(filled, bool):
            return ResolvedPriority(ledger_priority(filled))
        return self.of_class(str(name))

    def of_class(self, name: str) -> ResolvedPriority:
        """Return the ledger priority a PriorityClass's value gives, or why it gives none.

        :param name: the class (read from the cluster once per pass)
        """
        value = self._value(name)
        if isinstance(value, str):
            return ResolvedPriority(None, value)
        return ResolvedPriority(ledger_priority(value))

    def _value(self, name: str) -> int | str:
        if name not in self._values:
            self._values[name] = self._read(name)
        return self._values[name]

    def _read(self, name: str) -> int | str:
        """Return a PriorityClass's value, or why it has none (missing, forbidden, malformed)."""
        from kubernetes.client import SchedulingV1Api
        from kubernetes.client.exceptions import ApiException

        try:
            found = SchedulingV1Api(self.core_v1_api.api_client).read_priority_class(name)
        except ApiException as e:
            if e.status == 404:
                return f"PriorityClass {name!r} does not exist"
            return f"PriorityClass {name!r} could not be read ({e.status} {e.reason})"
        value = getattr(found, "value", None)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"PriorityClass {name!r} has no integer value ({value!r})"
        return value
