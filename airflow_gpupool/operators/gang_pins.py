"""Pin a gang Job's pods, each to its member's slice, as the Job controller creates them.

The Job's pods are created gated (``gpupool.io/reservation``): none is scheduled before it is
pinned. For the pod of completion index ``i``, member ``i`` of the gang is bound to the pod in the
ledger (by name and uid, so an expired lease orphans the slice instead of freeing it under a
running pod), then the pod gets what Kubernetes allows on a gated pod, through the gatekeeper's
own :func:`~airflow_gpupool.controller.gatekeeper.admission_patch`: the member's node as
``nodeSelector``, the reservation id and GPUs as annotations (which the container reads through
the downward API), the gate removed. A pod of another index than the gang has members, or a
gang that does not hold all its members, is a :class:`~airflow_gpupool.exceptions.GpuPoolError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_gpupool.controller.gatekeeper import admission_patch
from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.labels import SCHEDULING_GATE
from airflow_gpupool.operators.rendezvous import COMPLETION_INDEX_ANNOTATION

if TYPE_CHECKING:
    from airflow_gpupool.ledger.models import Gang, Reservation

__all__ = ["JOB_NAME_LABEL", "GangPodPinner"]

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


class GangPodPinner:
    """Pin the gated pods of one gang Job.

    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param bind_pod: the hook's ``bind_pod`` (member id, ``namespace=``, ``name=``, ``uid=``)
    :param gang: the granted gang
    :param log: the task's log
    :param clock: monotonic seconds (injected in tests)
    :param sleep: waits between reads (injected in tests)
    """

    def __init__(
        self,
        core_v1_api: Any,
        bind_pod: Callable[..., Any],
        gang: Gang,
        log: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api, self._bind, self._gang, self._log = core_v1_api, bind_pod, gang, log
        self._clock, self._sleep = clock, sleep
        granted = gang.granted
        if len(granted) < gang.spec.min_members:
            raise GpuPoolError(
                f"gang {gang.leader_id} holds {len(granted)} of its {gang.spec.min_members} members"
            )
        self._members: dict[int, Reservation] = {int(m.gang_index or 0): m for m in granted}
        #: completion index -> pod uid, for the pods pinned so far
        self.pinned: dict[int, str] = {}

    def pin_all(self, namespace: str, job_name: str, *, timeout: float, poll_interval: float = 0.2) -> None:
        """Pin every member's pod, waiting up to ``timeout`` seconds for the Job controller to create them.

        :param namespace: the Job's namespace
        :param job_name: the Job's name
        :param timeout: seconds
        :param poll_interval: seconds between reads of the Job's pods
        :raises GpuPoolError: the pods did not all appear in time, or one has no member
        """
        deadline = self._clock() + timeout
        while True:
            self.pin_new(namespace, job_name)
            if len(self.pinned) >= len(self._members):
                return
            if self._clock() >= deadline:
                raise GpuPoolError(
                    f"job {namespace}/{job_name}: {len(self.pinned)} of {len(self._members)} pods "
                    f"appeared within {timeout:g}s; the gang {self._gang.leader_id} is released"
                )
            self._sleep(poll_interval)

    def pin_new(self, namespace: str, job_name: str) -> list[str]:
        """Pin the Job's gated pods not pinned yet; return their names.

        :param namespace: the Job's namespace
        :param job_name: the Job's name
        """
        from kubernetes.client import ApiClient

        listed = self._api.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={job_name}")
        done = []
        for item in listed.items:
            pod: dict[str, Any] = ApiClient().sanitize_for_serialization(item)
            if not _gated(pod) or pod["metadata"]["uid"] in self.pinned.values():
                continue
            index = _completion_index(pod)
            member = self._members.get(index) if index is not None else None
            if member is None or member.grant is None:
                raise GpuPoolError(
                    f"pod {pod['metadata']['name']} has completion index {index}; "
                    f"the gang {self._gang.leader_id} has members {sorted(self._members)}"
                )
            self._pin(pod, member)
            self.pinned[int(index)] = pod["metadata"]["uid"]  # type: ignore[arg-type]
            done.append(pod["metadata"]["name"])
        return done

    def _pin(self, pod: dict[str, Any], member: Reservation) -> None:
        meta = pod["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        self._bind(member.id, namespace=namespace, name=name, uid=uid)
        assert member.grant is not None
        self._api.patch_namespaced_pod(name, namespace, admission_patch(pod, member.id, member.grant))
        self._log.info(
            "Gang member %s (%s) pinned to node %s GPU %s: pod %s/%s",
            member.gang_index,
            member.id,
            member.grant.node,
            ",".join(map(str, member.grant.gpu_indices)),
            namespace,
            name,
        )


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _completion_index(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
