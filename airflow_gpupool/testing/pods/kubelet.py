"""The simulated kubelet (and scheduler) of the emulator: moves pods through their phases.

Pending (unscheduled) → Pending (scheduled, ``ContainerCreating``) → Running → Succeeded or
Failed, with ``status.conditions``, ``containerStatuses`` (waiting, running, terminated with
``exitCode`` and ``reason``), ``hostIP``/``podIP``, ``spec.nodeName`` and core/v1 events on the
way. What happens to each pod is a :class:`~airflow_gpupool.testing.pods.behaviour.PodBehaviour` read
from its annotations and the test rules. Everything is driven by asyncio events and short timers
on the API server's loop: no polling.

This module is the state machine; what each step writes into the pod is in
:mod:`~airflow_gpupool.testing.pods.pod_status`, the events in :mod:`~airflow_gpupool.testing.pods.pod_events`,
the running workload (logs, checkpoints, exit) in :mod:`~airflow_gpupool.testing.pods.workload` and the
injected failures (evictions, lost nodes, image pulls) in :mod:`~airflow_gpupool.testing.pods.failures`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from airflow_gpupool.testing.api import gates
from airflow_gpupool.testing.api.kinds import EVENTS, NODES, PODS
from airflow_gpupool.testing.cluster.scheduling import (
    NodeAllocations,
    admission_rejection,
    choose_node,
    extended_requests,
)
from airflow_gpupool.testing.pods.behaviour import PodBehaviour, PodRule, resolve_behaviour
from airflow_gpupool.testing.pods.failures import (
    Interruption,
    PodInterruptions,
    fail_image_pull,
    mark_unreachable,
    plan_interruption,
)
from airflow_gpupool.testing.pods.gpu_processes import EmulatedGpuProcesses
from airflow_gpupool.testing.pods.logs import LogBook
from airflow_gpupool.testing.pods.pod_events import pod_event
from airflow_gpupool.testing.pods.pod_history import PodHistory
from airflow_gpupool.testing.pods.pod_status import (
    Outcome,
    bind,
    mark_running,
    mark_unschedulable,
    reject_at_admission,
    terminate,
)
from airflow_gpupool.testing.pods.workload import CheckpointPlan, PodWorkload, checkpoint_plan

if TYPE_CHECKING:
    from airflow_gpupool.testing.api.apiserver import KubernetesApiEmulator

__all__ = [
    "DEFAULT_STEP_DELAY_SECONDS",
    "CheckpointPlan",
    "Interruption",
    "Outcome",
    "SimulatedKubelet",
    "checkpoint_plan",
]

log = logging.getLogger(__name__)

DEFAULT_STEP_DELAY_SECONDS = 0.05


class SimulatedKubelet:
    """Schedules and runs the emulator's pods.

    :param api: the API server whose objects it changes
    :param default_duration_seconds: how long containers run unless a behaviour says otherwise
    """

    def __init__(self, api: KubernetesApiEmulator, *, default_duration_seconds: float = 0.5) -> None:
        self.api = api
        self.default_duration_seconds = default_duration_seconds
        self.rules: list[PodRule] = []
        self.logs = LogBook()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._uids: dict[tuple[str | None, str], str] = {}
        self._interruptions = PodInterruptions()
        self._running: dict[str, str] = {}
        self._changed: asyncio.Event | None = None
        self._next_ip = 0
        self._background: set[asyncio.Task[None]] = set()
        # pod history (tests/integration/multiworker): who ran on which GPU, when
        self.history = PodHistory()
        #: The fake NVML a running pod's GPUs show processes in (issue 17; off without a directory).
        self.gpus = EmulatedGpuProcesses()
        #: The scheduler's cache: what each node's pods hold, following every stored pod change.
        self.allocations = NodeAllocations()
        api.observe(PODS, self.allocations.observe)

    # -- wiring ------------------------------------------------------------------------------

    def prepare_new_pod(self, pod: dict[str, Any]) -> None:
        """Fill what the API server sets on a new pod: defaults and a ``Pending`` status.

        :param pod: the pod being created, changed in place
        """
        spec = pod.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        has_resources = any((c.get("resources") or {}) for c in spec.get("containers") or [])
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable" if has_resources else "BestEffort"}

    def start(self, namespace: str | None, name: str) -> None:
        """Start the lifecycle of a created pod.

        :param namespace: its namespace
        :param name: its name
        """
        pod = self.api.get_object(PODS, namespace, name)
        if pod is None:
            return
        uid = pod["metadata"]["uid"]
        self.history.created(pod)  # pod history
        self._uids[namespace, name] = uid
        self._interruptions.watch(uid)
        task = asyncio.get_running_loop().create_task(
            self._lifecycle(namespace, name, uid), name=f"kubelet:{name}"
        )
        self._tasks[uid] = task
        task.add_done_callback(lambda t: self._forget(uid, t))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a coroutine in the background, keeping a reference until it ends.

        :param coro: the coroutine
        """
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _forget(self, uid: str, task: asyncio.Task[None]) -> None:
        """Drop a finished lifecycle, logging its crash if any.

        :param uid: the pod uid
        :param task: the finished task
        """
        self._tasks.pop(uid, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("kubelet lifecycle of pod %s crashed", uid, exc_info=task.exception())

    async def stopped(self, namespace: str | None, name: str, how: str = "Deleted") -> None:
        """Stop a deleted pod: cancel its lifecycle, end its logs, free its resources.

        :param namespace: its namespace
        :param name: its name
        :param how: how its pod history ends if it still ran (``Deleted``, or ``Killed`` past its grace)
        """
        uid = self._uids.pop((namespace, name), None)
        if uid is None:
            return
        task = self._tasks.pop(uid, None)
        if task is not None:
            task.cancel()
        self.logs.finish_pod(uid)
        self.history.ended(uid, how)  # pod history
        node = self._running.pop(uid, None)
        self.gpus.ended(self.api.get_object(PODS, namespace, name), uid, node)
        if node is not None:
            involved = {"metadata": {"name": name, "namespace": namespace, "uid": uid}}
            await self.event(involved, "Normal", "Killing", "Stopping container", "kubelet", node)
        self.notify()

    def lifecycle(self, namespace: str | None, name: str) -> asyncio.Task[None] | None:
        """Return the task running a pod whose containers run now, or ``None``.

        :param namespace: its namespace
        :param name: its name
        """
        uid = self._uids.get((namespace, name))
        return self._tasks.get(uid) if uid is not None and uid in self._running else None

    def notify(self) -> None:
        """Tell unschedulable pods that the cluster changed (a node or free capacity)."""
        if self._changed is not None:
            self._changed.set()
        self._changed = asyncio.Event()

    async def _cluster_changed(self) -> None:
        """Wait until :meth:`notify` is called."""
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    async def shutdown(self) -> None:
        """Cancel every lifecycle."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._uids.clear()
        self._interruptions.clear()
        self._running.clear()

    def interrupt(self, uid: str, interruption: Interruption) -> None:
        """Stop a running pod from outside.

        :param uid: the pod uid
        :param interruption: why
        """
        self._interruptions.interrupt(uid, interruption)

    async def lose_node(self, node_name: str, *, delete: bool = False) -> None:
        """Make a node unresponsive (``NotReady``, tainted unreachable) or remove it; its pods fail ``NodeLost``.

        :param node_name: the node
        :param delete: remove the node object instead of marking it ``NotReady``
        """
        if delete:
            await self.api.delete_object(NODES, None, node_name)
        else:
            await self.api.update_object(NODES, None, node_name, mark_unreachable)
        for uid, node in list(self._running.items()):
            if node == node_name:
                pod_name = next((n for (_, n), u in self._uids.items() if u == uid), "?")
                message = f"Node {node_name} which was running pod {pod_name} is unresponsive"
                self.interrupt(uid, Interruption("NodeLost", message))
        self.notify()

    def behaviour_for(self, pod: dict[str, Any]) -> PodBehaviour:
        """Return what to do with a pod.

        :param pod: the pod
        """
        return resolve_behaviour(pod, self.rules)

    def waiting_reason(self, pod: dict[str, Any], container: str) -> str:
        """Return why a container has not started, for the log endpoint's error.

        :param pod: the pod
        :param container: the container name
        """
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == container and "waiting" in (status.get("state") or {}):
                return str(status["state"]["waiting"].get("reason", "ContainerCreating"))
        return "ContainerCreating"

    async def event(
        self,
        pod: dict[str, Any],
        kind: str,
        reason: str,
        message: str,
        component: str,
        host: str | None = None,
    ) -> None:
        """Record a core/v1 event about a pod.

        :param pod: the pod (its metadata is enough)
        :param kind: ``Normal`` or ``Warning``
        :param reason: e.g. ``Scheduled``
        :param message: human text
        :param component: ``kubelet``, ``default-scheduler``...
        :param host: the node, for kubelet events
        """
        await self.api.put_object(EVENTS, pod_event(pod, kind, reason, message, component, host))

    # -- lifecycle -----------------------------------------------------------------------------

    async def _lifecycle(self, namespace: str | None, name: str, uid: str) -> None:
        """Run a pod from creation to its end.

        :param namespace: its namespace
        :param name: its name
        :param uid: its uid
        """
        pod = self.api.get_object(PODS, namespace, name)
        if pod is None:
            return
        try:
            behaviour = self.behaviour_for(pod)
        except ValueError as e:
            await self.event(pod, "Warning", "InvalidEmulatorAnnotation", str(e), "gpupool-emulator")
            behaviour = PodBehaviour()
        await asyncio.sleep(_delay(behaviour.schedule_delay_seconds))
        node = await self._schedule(namespace, name, behaviour)
        if node is None:
            return
        await asyncio.sleep(_delay(behaviour.start_delay_seconds))
        if behaviour.image_pull_error:
            await fail_image_pull(
                self.api, self.event, namespace, name, node, back_off_after=DEFAULT_STEP_DELAY_SECONDS
            )
            return
        pod = await self._start_containers(namespace, name, uid, node)
        if pod is None:
            return
        outcome = await self._work(pod, uid, node, behaviour)
        await self._finish(namespace, name, uid, node, outcome)

    async def _schedule(self, namespace: str | None, name: str, behaviour: PodBehaviour) -> str | None:
        """Bind the pod to a node, waiting (``FailedScheduling``) while none fits.

        :param namespace: pod namespace
        :param name: pod name
        :param behaviour: its behaviour
        :return: the node, or ``None`` if the pod went away
        """
        last_message = None
        while True:
            pod = self.api.get_object(PODS, namespace, name)
            if pod is None:
                return None
            if gates.is_gated(pod):  # scheduling gates (testing/api/gates.py): wait until all are removed
                updated = gates.watch(self.api, namespace, name)
                if not gates.marked_gated(pod):
                    await self.api.update_object(PODS, namespace, name, gates.mark_gated)
                await updated.wait()
                continue
            node_name: str | None = (pod.get("spec") or {}).get("nodeName")
            message = ""
            if not node_name and behaviour.never_schedule:
                count = len(self.api.live_objects(NODES))
                message = f"0/{count} nodes are available: {count} node(s) were excluded by the gpupool.emulator/never-schedule annotation."
            elif not node_name:
                node_name, message = choose_node(pod, self.api.live_objects(NODES), self.allocations)
            elif extended_requests(pod) and (rejected := self._admission(pod, node_name)) is not None:
                await self.api.update_object(
                    PODS, namespace, name, lambda p: reject_at_admission(p, *rejected)
                )
                await self.event(pod, "Warning", rejected[0], rejected[1], "kubelet")
                self.history.ended(pod["metadata"]["uid"], "Failed")
                self.notify()
                return None
            if node_name:
                address = _node_address(self.api.get_object(NODES, None, node_name))
                await self.api.update_object(
                    PODS, namespace, name, functools.partial(bind, node=node_name, host_ip=address)
                )
                await self.event(
                    pod,
                    "Normal",
                    "Scheduled",
                    f"Successfully assigned {namespace}/{name} to {node_name}",
                    "default-scheduler",
                )
                return node_name
            if message != last_message:
                last_message = message
                await self.api.update_object(
                    PODS, namespace, name, functools.partial(mark_unschedulable, message=message)
                )
                await self.event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            await self._cluster_changed()

    def _admission(self, pod: dict[str, Any], node_name: str) -> tuple[str, str] | None:
        """The kubelet's refusal of a pod bound to ``node_name`` by its author, if it refuses it.

        :param pod: the pod
        :param node_name: the node its author named (none such: no kubelet to refuse it)
        """
        node = self.api.get_object(NODES, None, node_name)
        return None if node is None else admission_rejection(pod, node, self.allocations)

    async def _start_containers(
        self, namespace: str | None, name: str, uid: str, node: str
    ) -> dict[str, Any] | None:
        """Pull, create and start the containers: the pod goes ``Running``.

        :param namespace: pod namespace
        :param name: pod name
        :param uid: pod uid
        :param node: its node
        """
        pod = self.api.get_object(PODS, namespace, name)
        if pod is None:
            return None
        for container in pod["spec"].get("containers") or []:
            cname, image = container.get("name"), container.get("image", "")
            await self.event(
                pod,
                "Normal",
                "Pulled",
                f'Container image "{image}" already present on machine',
                "kubelet",
                node,
            )
            await self.event(pod, "Normal", "Created", f"Created container {cname}", "kubelet", node)
            await self.event(pod, "Normal", "Started", f"Started container {cname}", "kubelet", node)
            self.logs.open(uid, cname)
        self._next_ip += 1
        pod_ip = f"10.244.{self._next_ip // 250}.{self._next_ip % 250 + 2}"
        self._running[uid] = node
        self.history.started(uid, node)  # pod history
        self.gpus.started(pod, node)
        return await self.api.update_object(PODS, namespace, name, lambda p: mark_running(p, pod_ip))

    async def _work(self, pod: dict[str, Any], uid: str, node: str, behaviour: PodBehaviour) -> Outcome:
        """Run the workload with the failure its behaviour injects, and return how it ends.

        :param pod: the running pod
        :param uid: its uid
        :param node: its node
        :param behaviour: its behaviour
        """
        workload = PodWorkload(
            pod,
            uid,
            node,
            behaviour,
            logs=self.logs,
            pause=functools.partial(self._interruptions.pause, uid),
            default_duration_seconds=self.default_duration_seconds,
        )
        return await workload.run(
            lambda duration: plan_interruption(
                behaviour,
                duration,
                interrupt=functools.partial(self.interrupt, uid),
                lose_node=lambda delete: self._spawn(self.lose_node(node, delete=delete)),
            )
        )

    async def _finish(self, namespace: str | None, name: str, uid: str, node: str, outcome: Outcome) -> None:
        """Terminate the containers and record the pod's final phase.

        :param namespace: pod namespace
        :param name: pod name
        :param uid: pod uid
        :param node: its node
        :param outcome: how it ends
        """
        self._running.pop(uid, None)
        pod = await self.api.update_object(PODS, namespace, name, lambda p: terminate(p, outcome))
        self.history.ended(uid, str(((pod or {}).get("status") or {}).get("phase", "Failed")))  # pod history
        self.gpus.ended(pod, uid, node)
        self.logs.finish_pod(uid)
        if pod is not None:
            for kind, reason, message, component in outcome.events:
                await self.event(pod, kind, reason, message, component, node)
        self.notify()


def _delay(value: float | None) -> float:
    """Return a configured delay or the default one.

    :param value: the configured delay
    """
    return DEFAULT_STEP_DELAY_SECONDS if value is None else value


def _node_address(node: dict[str, Any] | None) -> str:
    """Return a node's InternalIP.

    :param node: the node, or ``None`` when there is no such node
    """
    for address in ((node or {}).get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address["address"])
    return "10.0.0.1"
