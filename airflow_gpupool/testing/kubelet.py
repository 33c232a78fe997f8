"""The simulated kubelet (and scheduler) of the emulator: moves pods through their phases.

Pending (unscheduled) → Pending (scheduled, ``ContainerCreating``) → Running → Succeeded or
Failed, with ``status.conditions``, ``containerStatuses`` (waiting, running, terminated with
``exitCode`` and ``reason``), ``hostIP``/``podIP``, ``spec.nodeName`` and core/v1 events on the
way. What happens to each pod is a :class:`~airflow_gpupool.testing.behaviour.PodBehaviour` read
from its annotations and the test rules. Everything is driven by asyncio events and short timers
on the API server's loop: no polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from airflow_gpupool.testing import checkpoints
from airflow_gpupool.testing.behaviour import PodBehaviour, PodRule, resolve_behaviour
from airflow_gpupool.testing.kinds import EVENTS, NODES, PODS
from airflow_gpupool.testing.logs import LogBook
from airflow_gpupool.testing.scheduling import choose_node

if TYPE_CHECKING:
    from airflow_gpupool.testing.apiserver import KubernetesApiEmulator

log = logging.getLogger(__name__)

DEFAULT_STEP_DELAY_SECONDS = 0.05


def _now() -> str:
    """Return the current UTC time as Kubernetes writes timestamps."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Interruption:
    """Something that stops a running pod from outside: an eviction or a lost node.

    :param reason: ``Evicted`` or ``NodeLost``
    :param message: the pod's ``status.message``
    """

    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a pod ends.

    :param phase: ``Succeeded`` or ``Failed``
    :param exit_code: the containers' exit code
    :param container_reason: ``Completed``, ``Error``, ``OOMKilled``...
    :param pod_reason: ``status.reason`` (``Evicted``, ``NodeLost``) or ``None``
    :param pod_message: ``status.message`` or ``None``
    :param events: ``(type, reason, message, component)`` events to record
    """

    phase: str
    exit_code: int
    container_reason: str
    pod_reason: str | None = None
    pod_message: str | None = None
    events: tuple[tuple[str, str, str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class CheckpointPlan:
    """Which checkpoint steps a run writes.

    :param root: the checkpoint directory
    :param first: first step to write
    :param last: final step of the training
    :param crash_after: step after which the run crashes, if any
    """

    root: Any
    first: int
    last: int
    crash_after: int | None


def _container_env(pod: dict[str, Any], name: str) -> str | None:
    """Return the value of an environment variable of the pod's first container.

    :param pod: the pod
    :param name: the variable
    """
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    for var in containers[0].get("env") or []:
        if var.get("name") == name:
            value: str | None = var.get("value")
            return value
    return None


def checkpoint_plan(pod: dict[str, Any], behaviour: PodBehaviour) -> CheckpointPlan | None:
    """Return the checkpoints a pod writes, or ``None``.

    :param pod: the pod (its env may carry ``GPUPOOL_RESUME_FROM`` and ``GPUPOOL_CHECKPOINT_DIR``)
    :param behaviour: its behaviour
    """
    location = behaviour.checkpoint_dir or _container_env(pod, checkpoints.CHECKPOINT_DIR_ENV)
    if not location or not behaviour.checkpoint_steps:
        return None
    resumed = checkpoints.resume_step(_container_env(pod, checkpoints.RESUME_ENV))
    crash = behaviour.fail_after_step
    if crash is not None and crash <= resumed:
        crash = None  # the crash happened in an earlier run; the resumed one goes past it
    return CheckpointPlan(checkpoints.local_path(location), resumed + 1, behaviour.checkpoint_steps, crash)


def _container_status(
    container: dict[str, Any], state: dict[str, Any], *, ready: bool = False
) -> dict[str, Any]:
    """Return a containerStatuses entry.

    :param container: the container spec
    :param state: its ``state`` (``{"waiting": ...}``, ``{"running": ...}``, ``{"terminated": ...}``)
    :param ready: readiness
    """
    image = container.get("image", "")
    return {
        "name": container.get("name"),
        "image": image,
        "imageID": f"{image}@sha256:{uuid.uuid5(uuid.NAMESPACE_URL, image).hex * 2}"
        if "running" in state or "terminated" in state
        else "",
        "containerID": f"containerd://{uuid.uuid4().hex}" if "waiting" not in state else None,
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
        "lastState": {},
    }


def _condition(
    kind: str, status: bool, reason: str | None = None, message: str | None = None
) -> dict[str, Any]:
    """Return a pod condition.

    :param kind: ``PodScheduled``, ``Initialized``, ``ContainersReady`` or ``Ready``
    :param status: its truth
    :param reason: machine reason
    :param message: human message
    """
    condition: dict[str, Any] = {
        "type": kind,
        "status": "True" if status else "False",
        "lastProbeTime": None,
        "lastTransitionTime": _now(),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _set_statuses(
    pod: dict[str, Any], state: Callable[[dict[str, Any]], dict[str, Any]], ready: bool = False
) -> None:
    """Set every container's status from a state builder.

    :param pod: the pod, changed in place
    :param state: builds the state of one container spec
    :param ready: readiness
    """
    containers = (pod.get("spec") or {}).get("containers") or []
    pod["status"]["containerStatuses"] = [_container_status(c, state(c), ready=ready) for c in containers]


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
        self._wakeups: dict[str, asyncio.Event] = {}
        self._interruptions: dict[str, Interruption] = {}
        self._running: dict[str, str] = {}
        self._changed: asyncio.Event | None = None
        self._next_ip = 0
        self._background: set[asyncio.Task[None]] = set()

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
        self._uids[namespace, name] = uid
        self._wakeups[uid] = asyncio.Event()
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

    async def stopped(self, namespace: str | None, name: str) -> None:
        """Stop a deleted pod: cancel its lifecycle, end its logs, free its resources.

        :param namespace: its namespace
        :param name: its name
        """
        uid = self._uids.pop((namespace, name), None)
        if uid is None:
            return
        task = self._tasks.pop(uid, None)
        if task is not None:
            task.cancel()
        self.logs.finish_pod(uid)
        node = self._running.pop(uid, None)
        if node is not None:
            involved = {"metadata": {"name": name, "namespace": namespace, "uid": uid}}
            await self.event(involved, "Normal", "Killing", "Stopping container", "kubelet", node)
        self.notify()

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
        self._wakeups.clear()
        self._interruptions.clear()
        self._running.clear()

    def interrupt(self, uid: str, interruption: Interruption) -> None:
        """Stop a running pod from outside.

        :param uid: the pod uid
        :param interruption: why
        """
        if uid in self._wakeups and uid not in self._interruptions:
            self._interruptions[uid] = interruption
            self._wakeups[uid].set()

    async def lose_node(self, node_name: str, *, delete: bool = False) -> None:
        """Make a node unresponsive (``NotReady``, tainted unreachable) or remove it; its pods fail ``NodeLost``.

        :param node_name: the node
        :param delete: remove the node object instead of marking it ``NotReady``
        """
        if delete:
            await self.api.delete_object(NODES, None, node_name)
        else:
            await self.api.update_object(NODES, None, node_name, _mark_unreachable)
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
        meta = pod["metadata"]
        now = _now()
        source = {"component": component, **({"host": host} if host else {})}
        await self.api.put_object(
            EVENTS,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                    "namespace": meta.get("namespace"),
                },
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "namespace": meta.get("namespace"),
                    "uid": meta.get("uid"),
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "source": source,
                "reportingComponent": component,
                "reportingInstance": host or component,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )

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
            await self._fail_image_pull(namespace, name, node)
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
            nodes = self.api.list_objects(NODES)
            node_name: str | None = (pod.get("spec") or {}).get("nodeName")
            message = ""
            if not node_name and behaviour.never_schedule:
                message = f"0/{len(nodes)} nodes are available: {len(nodes)} node(s) were excluded by the gpupool.emulator/never-schedule annotation."
            elif not node_name:
                node_name, message = choose_node(pod, nodes, self.api.list_objects(PODS))
            if node_name:
                address = _node_address(nodes, node_name)
                await self.api.update_object(
                    PODS, namespace, name, functools.partial(_bind, node=node_name, host_ip=address)
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
                    PODS, namespace, name, functools.partial(_unschedulable, message=message)
                )
                await self.event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            await self._cluster_changed()

    async def _fail_image_pull(self, namespace: str | None, name: str, node: str) -> None:
        """Leave the pod ``Pending`` with ``ErrImagePull`` and then ``ImagePullBackOff``.

        :param namespace: pod namespace
        :param name: pod name
        :param node: its node
        """
        pod = self.api.get_object(PODS, namespace, name)
        if pod is None:
            return
        image = ((pod["spec"].get("containers") or [{}])[0]).get("image", "")
        pull_error = f'failed to pull and unpack image "{image}": pull access denied, repository does not exist or may require authorization'
        await self.event(pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet", node)
        await self.event(
            pod, "Warning", "Failed", f'Failed to pull image "{image}": {pull_error}', "kubelet", node
        )
        await self.event(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet", node)
        await self.api.update_object(PODS, namespace, name, lambda p: _waiting(p, "ErrImagePull", pull_error))
        await asyncio.sleep(DEFAULT_STEP_DELAY_SECONDS)
        await self.event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"', "kubelet", node)
        await self.event(pod, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet", node)
        back_off = f'Back-off pulling image "{image}": ErrImagePull: {pull_error}'
        await self.api.update_object(
            PODS, namespace, name, lambda p: _waiting(p, "ImagePullBackOff", back_off)
        )

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
        return await self.api.update_object(PODS, namespace, name, lambda p: _run(p, pod_ip))

    def _log(self, pod: dict[str, Any], uid: str, line: str) -> None:
        """Write a line to every container's log.

        :param pod: the pod
        :param uid: its uid
        :param line: the text
        """
        for container in pod["spec"].get("containers") or []:
            self.logs.open(uid, container["name"]).append(line)

    async def _pause(self, uid: str, seconds: float) -> Interruption | None:
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

    def _plan_interruption(
        self, pod: dict[str, Any], uid: str, node: str, behaviour: PodBehaviour, duration: float
    ) -> asyncio.TimerHandle | None:
        """Schedule the eviction or node loss a behaviour asks for, halfway through the run.

        :param pod: the pod
        :param uid: its uid
        :param node: its node
        :param behaviour: its behaviour
        :param duration: the planned run time
        """
        loop = asyncio.get_running_loop()
        if behaviour.evict:
            evicted = Interruption(
                "Evicted", "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi."
            )
            return loop.call_later(duration / 2, self.interrupt, uid, evicted)
        if behaviour.node_lost:
            delete = behaviour.node_lost == "delete"
            return loop.call_later(duration / 2, lambda: self._spawn(self.lose_node(node, delete=delete)))
        return None

    async def _work(self, pod: dict[str, Any], uid: str, node: str, behaviour: PodBehaviour) -> Outcome:
        """Run the workload: write logs and checkpoints over the duration, then pick the outcome.

        :param pod: the running pod
        :param uid: its uid
        :param node: its node
        :param behaviour: its behaviour
        """
        duration = (
            behaviour.duration_seconds
            if behaviour.duration_seconds is not None
            else self.default_duration_seconds
        )
        plan = checkpoint_plan(pod, behaviour)
        lines = (
            behaviour.log_lines
            if behaviour.log_lines is not None
            else (f"gpupool emulator: running {pod['metadata']['name']} on {node}",)
        )
        for line in lines:
            self._log(pod, uid, line)
        steps = range(plan.first, plan.last + 1) if plan else range(0)
        interval = duration / (len(steps) + 1)
        timer = self._plan_interruption(pod, uid, node, behaviour, duration)
        try:
            for step in steps:
                if (interruption := await self._pause(uid, interval)) is not None:
                    return _interrupted(interruption, node)
                assert plan is not None
                checkpoints.write_step(plan.root, step)
                self._log(
                    pod,
                    uid,
                    f"step {step}/{plan.last}: loss={checkpoints.loss_at(step)} checkpoint {checkpoints.STEP_DIR_FORMAT.format(step)} saved",
                )
                if plan.crash_after is not None and step >= plan.crash_after:
                    self._log(
                        pod,
                        uid,
                        f"Traceback (most recent call last): RuntimeError: simulated crash after step {step}",
                    )
                    return Outcome("Failed", 1, "Error")
            if (interruption := await self._pause(uid, interval)) is not None:
                return _interrupted(interruption, node)
        finally:
            if timer is not None:
                timer.cancel()
        return self._completion(pod, uid, behaviour, plan)

    def _completion(
        self, pod: dict[str, Any], uid: str, behaviour: PodBehaviour, plan: CheckpointPlan | None
    ) -> Outcome:
        """Return the outcome of a run that was not interrupted.

        :param pod: the pod
        :param uid: its uid
        :param behaviour: its behaviour
        :param plan: its checkpoints
        """
        if behaviour.oom_killed:
            self._log(pod, uid, "CUDA out of memory / container killed by the OOM killer")
            return Outcome("Failed", 137, "OOMKilled")
        exit_code = behaviour.exit_code or 0
        if exit_code != 0:
            self._log(pod, uid, f"gpupool emulator: exiting with code {exit_code}")
            return Outcome("Failed", exit_code, "Error")
        if plan is not None:
            checkpoints.write_complete(plan.root, plan.last)
        return Outcome("Succeeded", 0, "Completed")

    async def _finish(self, namespace: str | None, name: str, uid: str, node: str, outcome: Outcome) -> None:
        """Terminate the containers and record the pod's final phase.

        :param namespace: pod namespace
        :param name: pod name
        :param uid: pod uid
        :param node: its node
        :param outcome: how it ends
        """
        self._running.pop(uid, None)
        pod = await self.api.update_object(PODS, namespace, name, lambda p: _terminate(p, outcome))
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


def _node_address(nodes: list[dict[str, Any]], node_name: str) -> str:
    """Return a node's InternalIP.

    :param nodes: every node
    :param node_name: the node
    """
    for node in nodes:
        if node["metadata"]["name"] == node_name:
            for address in (node.get("status") or {}).get("addresses") or []:
                if address.get("type") == "InternalIP":
                    return str(address["address"])
    return "10.0.0.1"


def _bind(pod: dict[str, Any], node: str, host_ip: str) -> None:
    """Bind a pod to a node: ``spec.nodeName``, ``PodScheduled``, ``ContainerCreating``.

    :param pod: the pod, changed in place
    :param node: the node
    :param host_ip: the node's address
    """
    pod["spec"]["nodeName"] = node
    status = pod["status"]
    status.update({"hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "startTime": _now()})
    status["conditions"] = [
        _condition("PodScheduled", True),
        _condition("Initialized", True),
        _condition("ContainersReady", False, "ContainersNotReady", "containers with unready status"),
        _condition("Ready", False, "ContainersNotReady", "containers with unready status"),
    ]
    _set_statuses(pod, lambda c: {"waiting": {"reason": "ContainerCreating"}})


def _unschedulable(pod: dict[str, Any], message: str) -> None:
    """Mark a pod unschedulable.

    :param pod: the pod, changed in place
    :param message: the scheduler's message
    """
    pod["status"]["conditions"] = [_condition("PodScheduled", False, "Unschedulable", message)]


def _waiting(pod: dict[str, Any], reason: str, message: str) -> None:
    """Leave the containers waiting.

    :param pod: the pod, changed in place
    :param reason: e.g. ``ImagePullBackOff``
    :param message: details
    """
    _set_statuses(pod, lambda c: {"waiting": {"reason": reason, "message": message}})


def _run(pod: dict[str, Any], pod_ip: str) -> None:
    """Mark a pod ``Running`` and ready.

    :param pod: the pod, changed in place
    :param pod_ip: its address
    """
    started = _now()
    status = pod["status"]
    status.update({"phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}]})
    status["conditions"] = [
        _condition("PodScheduled", True),
        _condition("Initialized", True),
        _condition("ContainersReady", True),
        _condition("Ready", True),
    ]
    _set_statuses(pod, lambda c: {"running": {"startedAt": started}}, ready=True)


def _terminate(pod: dict[str, Any], outcome: Outcome) -> None:
    """Record a pod's end.

    :param pod: the pod, changed in place
    :param outcome: how it ended
    """
    finished = _now()
    status = pod["status"]
    started = {
        s["name"]: (s.get("state") or {}).get("running", {}).get("startedAt", finished)
        for s in status.get("containerStatuses") or []
    }
    status["phase"] = outcome.phase
    if outcome.pod_reason:
        status["reason"] = outcome.pod_reason
        status["message"] = outcome.pod_message
    reason = "PodCompleted" if outcome.phase == "Succeeded" else "PodFailed"
    status["conditions"] = [
        _condition("PodScheduled", True),
        _condition("Initialized", True),
        _condition("ContainersReady", False, reason),
        _condition("Ready", False, reason),
    ]

    def terminated(container: dict[str, Any]) -> dict[str, Any]:
        return {
            "terminated": {
                "exitCode": outcome.exit_code,
                "reason": outcome.container_reason,
                "startedAt": started.get(container.get("name"), finished),
                "finishedAt": finished,
                "containerID": f"containerd://{uuid.uuid4().hex}",
            }
        }

    _set_statuses(pod, terminated)


def _interrupted(interruption: Interruption, node: str) -> Outcome:
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


def _mark_unreachable(node: dict[str, Any]) -> None:
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
    taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": _now()})
    taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": _now()})
    node["spec"]["taints"] = taints
