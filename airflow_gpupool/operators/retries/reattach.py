"""A retry and the grants of the tries before it: adopt the one whose pod it re-attaches to, end the rest.

A worker that dies while its pod runs leaves the pod running and its grant bound to it
(``orphaned`` once the lease expires, still holding the slice). Before it reserves, a retry
settles every earlier try's grant that still holds a slice:

- with ``durable=True`` (``KubernetesPodOperator``'s default on Airflow 3.3) the parent re-attaches
  to the still-running pod, so the retry **adopts** the grant bound to it: same slice, lease
  renewed under the new try's holder, one grant in the history, released once at the end;
- with ``durable=False``, or when the pod finished or is gone, the old pod is deleted and its
  grant freed before the new try reserves: one task never holds two slices.

Below Airflow 3.3 there is no task state store: ``KubernetesPodOperator`` ignores ``durable``
(it warns) and re-attaches through ``reattach_on_restart``'s label search instead, which finds the
same pod; the retry logs :data:`DURABLE_FALLBACK` once and settles the grants the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_gpupool.labels import RESERVATION_LABEL
from airflow_gpupool.operators.pod.lease import delete_pod

if TYPE_CHECKING:
    from airflow.sdk.types import Logger

    from airflow_gpupool.hooks.gpupool import GpuPoolHook
    from airflow_gpupool.ledger import Grant
    from airflow_gpupool.task_try import TaskTry

__all__ = ["DURABLE_FALLBACK", "Adopted", "EarlierTries", "durable_reattach_supported"]

DURABLE_FALLBACK = (
    "Durable re-attach through the task state store needs Airflow 3.3 (this is Airflow %s): "
    "this retry re-attaches through KubernetesPodOperator's label search instead"
)


def durable_reattach_supported() -> bool:
    """Return whether this Airflow keeps a pod's identity across tries (the task state store, 3.3+)."""
    from airflow import __version__ as airflow_version
    from packaging.version import Version

    return Version(Version(airflow_version).base_version) >= Version("3.3")


# KubernetesPodOperator does not re-attach to a pod in these phases (it deletes and recreates it).
_ENDED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Adopted:
    """The grant of an earlier try that this try took over, and the pod it runs.

    :param reservation_id: the earlier try's reservation, now this try's
    :param grant: the slice, with its lease renewed
    :param namespace: the pod's namespace
    :param name: the pod's name
    """

    reservation_id: str
    grant: Grant
    namespace: str
    name: str


class EarlierTries:
    """Settle the grants of a task's earlier tries (see the module docstring).

    :param hook: the ledger hook
    :param client: a ``kubernetes.client.CoreV1Api``
    :param namespace: where the task's pods run (used when a grant has no pod bound)
    :param log: the task's log
    """

    def __init__(self, hook: GpuPoolHook, client: Any, namespace: str, log: Logger) -> None:
        self._hook, self._client, self._namespace, self._log = hook, client, namespace, log

    def settle(self, task: TaskTry, *, durable: bool, ttl: float) -> Adopted | None:
        """Adopt the newest earlier grant whose pod still runs (``durable``); end every other one.

        :param task: this try
        :param durable: whether the parent re-attaches to a running pod of an earlier try
        :param ttl: the lease seconds of an adopted grant
        """
        if durable and not durable_reattach_supported():
            from airflow import __version__ as airflow_version

            self._log.info(DURABLE_FALLBACK, airflow_version)
        adopted: Adopted | None = None
        for number in range(task.try_number - 1, 0, -1):
            rid = replace(task, try_number=number).reservation_id
            reservation = self._hook.get_or_none(rid)
            if reservation is None or reservation.grant is None or not reservation.state.holds:
                continue
            pod = self._running_pod(rid, reservation.grant)
            if durable and adopted is None and pod is not None:
                adopted = self._adopt(task, rid, pod, ttl)
            else:
                self._end(task, number, rid, pod)
        return adopted

    def _running_pod(self, rid: str, grant: Grant) -> Any | None:
        """Return the earlier try's pod if it has not ended, else None."""
        namespace = grant.pod_namespace or self._namespace
        pods = self._client.list_namespaced_pod(namespace, label_selector=f"{RESERVATION_LABEL}={rid}").items
        running = [
            p
            for p in pods
            if (p.status is None or p.status.phase not in _ENDED_PHASES)
            and p.metadata.deletion_timestamp is None
        ]
        bound = [p for p in running if grant.pod_uid is not None and p.metadata.uid == grant.pod_uid]
        return (bound or running or [None])[0]

    def _adopt(self, task: TaskTry, rid: str, pod: Any, ttl: float) -> Adopted:
        meta = pod.metadata
        reservation = self._hook.adopt(rid, task.holder, ttl)
        reservation = self._hook.bind_pod(rid, namespace=meta.namespace, name=meta.name, uid=meta.uid)
        assert reservation.grant is not None
        self._log.info(
            "Try %d re-attaches to pod %s/%s of an earlier try and adopts its GPU slice %s "
            "(node %s, same GPUs); nothing new is reserved",
            task.try_number,
            meta.namespace,
            meta.name,
            rid,
            reservation.grant.node,
        )
        return Adopted(rid, reservation.grant, meta.namespace, meta.name)

    def _end(self, task: TaskTry, number: int, rid: str, pod: Any | None) -> None:
        if pod is not None:
            why = f"try {task.try_number} does not re-attach (durable=False): its pod of try {number} must not keep a slice"
            delete_pod(self._client, pod.metadata.namespace, pod.metadata.name, why=why, log=self._log)
            reason = f"try {task.try_number} starts afresh: pod {pod.metadata.name} of try {number} deleted"
        else:
            reason = f"try {task.try_number} starts afresh: the pod of try {number} has ended or is gone"
        result = self._hook.release(rid, reason)
        if result is not None and result.released:
            self._log.info("GPU slice %s of try %d freed: %s", rid, number, reason)
