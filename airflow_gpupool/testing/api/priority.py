"""The API server's Priority admission plugin, as far as the emulator goes: a new pod's ``spec.priority``.

A pod created naming ``spec.priorityClassName`` gets ``spec.priority`` (and, when it sets none,
``spec.preemptionPolicy``) from the stored scheduling.k8s.io/v1 PriorityClass, as a cluster fills
them in. Two gaps, on purpose: a pod naming a class the emulator does not store is let through
unchanged (a real API server refuses it; tests create pods naming gpupool's classes without
creating them), and no ``globalDefault`` class is given to a pod that names none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["admit_priority"]


def admit_priority(pod: dict[str, Any], priority_class: Callable[[str], Mapping[str, Any] | None]) -> None:
    """Fill a new pod's priority from the PriorityClass it names (changes ``pod`` in place).

    :param pod: the pod being created
    :param priority_class: the stored PriorityClass of a name, or None
    """
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not spec.get("priorityClassName"):
        return
    found = priority_class(str(spec["priorityClassName"]))
    if found is None or not isinstance(found.get("value"), int):
        return
    spec["priority"] = found["value"]
    spec.setdefault("preemptionPolicy", found.get("preemptionPolicy") or "PreemptLowerPriority")
