"""The failures the emulator injects into pods: evictions, lost nodes and image pulls that fail.

An :class:`Interruption` stops a running pod from outside (``Evicted``, ``NodeLost``);
:class:`PodInterruptions` holds the pending ones and wakes the pods they stop, and
:func:`interrupted` says how such a pod ends. :func:`plan_interruption` schedules the one a
behaviour asks for, :func:`mark_unreachable` is what a lost node looks like, and
:func:`fail_image_pull` leaves a pod in ``ImagePullBackOff``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_gpupool.testing.api.kinds import PODS
from airflow_gpupool.testing.pods.pod_status import Outcome, mark_waiting, now_timestamp

if TYPE_CHECKING:
    from airflow_gpupool.testing.api.apiserver import KubernetesApiEmulator
    from airflow_gpupool.testing.pods.behaviour import PodBehaviour
    from airflow_gpupool.testing.pods.pod_events import RecordPodEvent

EVICTION_MESSAGE = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi."


@dataclasses.dataclass(frozen=True)
class Interruption:
    """Something that stops a running pod from outside: an eviction or a lost node.

    :param reason: ``Evicted`` or ``NodeLost``
    :param message: the pod's ``status.message``
    """

    reason: str
    message: str


class PodInterruptions:
    """The interruptions of running pods, each waking its pod early from :meth:`pause`."""

    def __init__(self) -> None:
        self._wakeups: dict[str, asyncio.Event] = {}
        self._interruptions: dict[str, Interruption] = {}

    def watch(self, uid: str) -> None:
        """Let a new pod be interrupted.

        :param uid: the pod uid
        """
        self._wakeups[uid] = asyncio.Event()

    def interrupt(self, uid: str, interruption: Interruption) -> None:
        """Stop a watched pod; only the first interruption counts.

        :param uid: the pod uid
        :param interruption: why
        """
        if uid in self._wakeups and uid not in self._interruptions:
            self._interruptions[uid] = interruption
            self._wakeups[uid].set()

    async def pause(self, uid: str, seconds: float) -> Interruption | None:
        """Sleep, waking early if the pod is interrupted.

        :param uid: the pod uid
        :param seconds: how long
        :return: the interruption, if one came
        """
        wakeup = self._wakeups[uid]
        if not wakeup.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), max(seconds, 0.0))
        return self._interruptions.get(uid)

    def clear(self) -> None:
        """Forget every pod."""
        self._wakeups.clear()
        self._interruptions.clear()


def plan_interruption(
    behaviour: PodBehaviour,
    duration: float,
    *,
    interrupt: Callable[[Interruption], None],
    lose_node: Callable[[bool], None],
) -> asyncio.TimerHandle | None:
    """Schedule the eviction or node loss a behaviour asks for, halfway through the run.

    :param behaviour: the pod's behaviour
    :param duration: the planned run time
    :param interrupt: interrupts the pod
    :param lose_node: loses the pod's node; its argument says whether to delete the node
    :return: the timer, to cancel when the run ends first
    """
    loop = asyncio.get_running_loop()
    if behaviour.evict:
        evicted = Interruption("Evicted", EVICTION_MESSAGE)
        return loop.call_later(duration / 2, interrupt, evicted)
    if behaviour.node_lost:
        delete = behaviour.node_lost == "delete"
        return loop.call_later(duration / 2, lose_node, delete)
    return None


#: The reason of an "interruption" that only ends a running pod's work early, successfully.
FINISH_NOW = "FinishNow"


def interrupted(interruption: Interruption, node: str) -> Outcome:
    """Return the outcome of an evicted pod or one whose node was lost.

    :param interruption: what happened
    :param node: the pod's node
    """
    events: tuple[tuple[str, str, str, str], ...]
    if interruption.reason == "Evicted":
        events = (
            ("Warning", "Evicted", interruption.message, "kubelet"),
            ("Normal", "Killing", "Stopping container", "kubelet"),
        )
        return Outcome("Failed", 137, "Error", "Evicted", interruption.message, events)
    events = (("Warning", "NodeNotReady", "Node is not ready", "node-controller"),)
    return Outcome("Failed", 137, "ContainerStatusUnknown", interruption.reason, interruption.message, events)


def mark_unreachable(node: dict[str, Any]) -> None:
    """Mark a node as a lost one: ``Ready`` unknown and the unreachable taints.

    :param node: the node, changed in place
    """
    status = node.setdefault("status", {})
    status["conditions"] = [
        {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
        }
    ]
    taints = [
        t
        for t in node.setdefault("spec", {}).get("taints") or []
        if t.get("key") != "node.kubernetes.io/unreachable"
    ]
    taints.append(
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": now_timestamp()}
    )
    taints.append(
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": now_timestamp()}
    )
    node["spec"]["taints"] = taints


async def fail_image_pull(
    api: KubernetesApiEmulator,
    record_event: RecordPodEvent,
    namespace: str | None,
    name: str,
    node: str,
    *,
    back_off_after: float,
) -> None:
    """Leave the pod ``Pending`` with ``ErrImagePull`` and then ``ImagePullBackOff``.

    :param api: the API server holding the pod
    :param record_event: records the kubelet's events
    :param namespace: pod namespace
    :param name: pod name
    :param node: its node
    :param back_off_after: seconds between the failed pull and the back-off
    """
    pod = api.get_object(PODS, namespace, name)
    if pod is None:
        return
    image = ((pod["spec"].get("containers") or [{}])[0]).get("image", "")
    pull_error = f'failed to pull and unpack image "{image}": pull access denied, repository does not exist or may require authorization'
    await record_event(pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet", node)
    await record_event(
        pod, "Warning", "Failed", f'Failed to pull image "{image}": {pull_error}', "kubelet", node
    )
    await record_event(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet", node)
    await api.update_object(PODS, namespace, name, lambda p: mark_waiting(p, "ErrImagePull", pull_error))
    await asyncio.sleep(back_off_after)
    await record_event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"', "kubelet", node)
    await record_event(pod, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet", node)
    back_off = f'Back-off pulling image "{image}": ErrImagePull: {pull_error}'
    await api.update_object(PODS, namespace, name, lambda p: mark_waiting(p, "ImagePullBackOff", back_off))
