"""The on-demand/spot rule for gated pods: the same rule as GpuPodOperator's, applied at admission.

The executor hook writes a gated pod's request from what the pod says (priority, request
annotation, ``nodeSelector`` and node affinity); the gatekeeper reserves it. Before it does,
:meth:`GatedCapacity.apply` puts the capacity the default rule chooses on the request
(:func:`~airflow_gpupool.governance.capacity.apply_capacity`, with the controller's ``[gpupool]
urgent_priority`` and ``spot_price_ratio``): urgent work on on-demand only, checkpointed
preemptible training preferring spot when the price makes it worth it, the rest anywhere. A pod
that chooses the capacity type itself (``gpupool.io/capacity-type`` or a cloud's label in its
node selection) keeps that choice. A gated pod has no expected duration: its run counts as long.
A pod group's gang request gets the same rule (checkpointed when every pod of the group is), and
a pod whose priority comes from its PriorityClass is judged at the class's priority
(:mod:`~airflow_gpupool.controller.priority_classes` resolves it first).

Applied here, not in the hook: the hook may not import the governance rules (they are
independent layers), and the controller's configuration is the one the queue runs on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpupool import settings
from airflow_gpupool.governance.capacity import apply_capacity
from airflow_gpupool.pod_options import checkpointed
from airflow_gpupool.resources import GpuRequest

__all__ = ["GatedCapacity", "checkpointed"]


@dataclass(frozen=True)
class GatedCapacity:
    """The default rule's options, read once per gatekeeper pass.

    Read before any pod is looked at: a malformed option fails the pass (retried at the next),
    never refuses a pod.

    :param urgent_priority: ``[gpupool] urgent_priority``
    :param price_ratio: ``[gpupool] spot_price_ratio`` (None: unknown)
    """

    urgent_priority: int
    price_ratio: float | None

    @classmethod
    def from_settings(cls) -> GatedCapacity:
        """Read the options.

        :raises ConfigurationError: one is malformed
        """
        return cls(settings.urgent_priority(), settings.spot_price_ratio())

    def apply(self, request: GpuRequest, *pods: Mapping[str, Any]) -> GpuRequest:
        """Return a gated pod's request, or a pod group's, with the capacity the default rule chooses.

        A group is checkpointed when each of its pods is: a preempted gang loses the work of any
        member that does not checkpoint.

        :param request: the request the executor hook wrote on the pod (a group's gang request)
        :param pods: the pod, or the group's live pods, as JSON dicts
        """
        return apply_capacity(
            request,
            None,
            checkpointed=bool(pods) and all(checkpointed(pod) for pod in pods),
            expected_seconds=None,
            urgent_priority=self.urgent_priority,
            price_ratio=self.price_ratio,
        )
