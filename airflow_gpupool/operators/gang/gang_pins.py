"""Pin a gang Job's pods, each to its member's slice, as the Job controller creates them.

The Job's pods are created gated (``gpupool.io/reservation``): none is scheduled before it is
pinned. For the pod of completion index ``i``, member ``i`` of the gang is bound to the pod in the
ledger (by name and uid, so an expired lease orphans the slice instead of freeing it under a
running pod), then the pod gets what Kubernetes allows on a gated pod, through the gatekeeper's
own :func:`~airflow_gpupool.controller.gatekeeper.admission_patch`: the member's node as
``nodeSelector``, the reservation id and GPUs as annotations (which the container reads through
the downward API), the gate removed. A pod of another index than the gang has members, or a
gang that does not hold all its members, is a :class:`~airflow_gpupool.exceptions.GpuPoolError`.

A Job with ``backoffLimit > 0`` replaces a member's failed pod with a new gated pod of the same
index: it is pinned to the same member (the member re-bound to it in the ledger) once the old
pod ended, while the Job runs (:class:`ReplacementPinning` in the worker, LeasedJobTrigger when
deferred).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_gpupool.controller.admission import admission_patch
from airflow_gpupool.controller.gang_pods import JOB_NAME_LABEL, pods_to_pin
from airflow_gpupool.exceptions import GpuPoolError

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Gang, Reservation

__all__ = ["JOB_NAME_LABEL", "GangPodPinner", "ReplacementPinning"]


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
        pods: list[dict[str, Any]] = [ApiClient().sanitize_for_serialization(p) for p in listed.items]
        done = []
        for pod, member in pods_to_pin(pods, self._gang, self._members, self._log):
            self._pin(pod, member)
            self.pinned[int(member.gang_index or 0)] = pod["metadata"]["uid"]
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


class ReplacementPinning(threading.Thread):
    """Pin the replacement pods of a running gang Job, every ``interval`` seconds, until stopped.

    :param pinner: the Job's pinner (its first pods pinned)
    :param namespace: the Job's namespace
    :param job_name: the Job's name
    :param interval: seconds between reads of the Job's pods
    :param log: the task's log
    """

    def __init__(
        self, pinner: GangPodPinner, namespace: str, job_name: str, interval: float, log: Any
    ) -> None:
        super().__init__(name=f"gpupool-pins-{job_name}", daemon=True)
        self._pinner, self._namespace, self._job = pinner, namespace, job_name
        self._interval, self._log = interval, log
        self._stopped = threading.Event()

    def run(self) -> None:
        """Pin what appeared, until stopped; a failed round is logged and tried again."""
        while not self._stopped.wait(self._interval):
            try:
                self._pinner.pin_new(self._namespace, self._job)
            except Exception:
                self._log.exception("Pinning the replacement pods of job %s failed; will retry", self._job)

    def stop(self) -> None:
        """Stop (the Job ended, or the task leaves the worker)."""
        self._stopped.set()
