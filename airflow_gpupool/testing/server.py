"""Run the Kubernetes emulator in a background thread, for tests and for the demo.

The server has its own event loop in its own thread, so blocking clients such as
``KubernetesPodOperator`` (the ``kubernetes`` package) and async ones (``kubernetes_asyncio``)
can both talk to it over HTTP. The methods of :class:`KubernetesEmulatorServer` are thread-safe:
they run on the server's loop and wait for the answer.

This module is what tests do with the running emulator (inspect pods, events, logs and requests;
steer pods and nodes); serving it from the thread is
:mod:`~airflow_gpupool.testing.background_server`'s job, the kubeconfig
:mod:`~airflow_gpupool.testing.kubeconfig`'s.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_gpupool.testing.api.apiserver import KubernetesApiEmulator, RecordedRequest
from airflow_gpupool.testing.api.kinds import (
    EVENTS,
    JOBS,
    NODES,
    PODS,
    PODTEMPLATES,
    PRIORITY_CLASSES,
    PROVISIONING_REQUESTS,
)
from airflow_gpupool.testing.api.selectors import parse_field_selector, parse_label_selector
from airflow_gpupool.testing.background_server import BackgroundEmulatorServer
from airflow_gpupool.testing.cluster.job_pods import is_finished
from airflow_gpupool.testing.cluster.nodes import gpu_node
from airflow_gpupool.testing.cluster.scheduling import TERMINAL_PHASES
from airflow_gpupool.testing.kubeconfig import CONTEXT_NAME, kubeconfig, write_kubeconfig
from airflow_gpupool.testing.pods.behaviour import PodBehaviour, PodPredicate, PodRule
from airflow_gpupool.testing.pods.pod_history import PodRecord

__all__ = ["CONTEXT_NAME", "KubernetesEmulatorServer", "kubeconfig", "write_kubeconfig"]


class KubernetesEmulatorServer(BackgroundEmulatorServer):
    """A Kubernetes API emulator with a simulated kubelet, served over HTTP from a background thread.

    Use it as a context manager::

        with KubernetesEmulatorServer(nodes=[gpu_node("gpu-a", gpus=8)]) as k8s:
            KubernetesPodOperator(..., config_file=k8s.kubeconfig_path, in_cluster=False)
            assert k8s.pod("my-pod")["status"]["phase"] == "Succeeded"

    :param nodes: Node objects (see :func:`~airflow_gpupool.testing.gpu_node`); a small default
        cluster when ``None``
    :param host: interface to listen on
    :param port: TCP port; 0 picks a free one
    :param kubeconfig_path: where to write the kubeconfig; a temporary file when ``None``
    :param namespace: the kubeconfig context's namespace
    :param default_duration_seconds: how long containers run unless told otherwise
    :param access_log: log every request through the ``aiohttp.access`` logger
    """

    # -- inspection ----------------------------------------------------------------------------

    def pods(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Return the live pods, oldest first.

        :param namespace: only this namespace
        :param label_selector: a Kubernetes label selector
        :param field_selector: a Kubernetes field selector
        """
        by_label, by_field = parse_label_selector(label_selector), parse_field_selector(field_selector)
        pods = self._run_sync(lambda api: api.list_objects(PODS, namespace))
        return [p for p in pods if by_label(p) and by_field(p)]

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """Return a live pod, or ``None``.

        :param name: pod name
        :param namespace: its namespace
        """
        return self._run_sync(lambda api: api.get_object(PODS, namespace, name))

    def pod_history(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        """Return every stored version of a pod, deleted ones included (useful after a delete).

        :param name: pod name
        :param namespace: its namespace
        """

        def history(api: KubernetesApiEmulator) -> list[dict[str, Any]]:
            key = (PODS, namespace, name)
            if key not in api.objects:
                return []
            return [copy.deepcopy(v.raw) for v in api.objects[key].history if v is not None]

        return self._run_sync(history)

    def compact(self) -> None:
        """Forget the watch history, as etcd's compaction does: a watch from an older resourceVersion gets ``410 Gone``."""
        self._run_sync(lambda api: api.compact())

    def pod_records(self) -> list[PodRecord]:
        """Return every pod's node, pinned GPUs and running time, deleted pods included (pod history).

        Check them with :func:`~airflow_gpupool.testing.pods.pod_history.gpu_overlaps`.
        """
        return self._run_sync(lambda api: api.kubelet.history.records())

    def events(
        self, namespace: str | None = None, *, involved_name: str | None = None
    ) -> list[dict[str, Any]]:
        """Return core/v1 events, oldest first.

        :param namespace: only this namespace
        :param involved_name: only about this object
        """
        events = self._run_sync(lambda api: api.list_objects(EVENTS, namespace))
        return [e for e in events if involved_name is None or e["involvedObject"]["name"] == involved_name]

    def nodes(self) -> list[dict[str, Any]]:
        """Return the nodes."""
        return self._run_sync(lambda api: api.list_objects(NODES))

    def node(self, name: str) -> dict[str, Any] | None:
        """Return a node, or ``None``.

        :param name: node name
        """
        return self._run_sync(lambda api: api.get_object(NODES, None, name))

    def logs(self, name: str, namespace: str = "default", container: str | None = None) -> list[str]:
        """Return the log lines of a pod's container (the first container by default).

        :param name: pod name
        :param namespace: its namespace
        :param container: container name
        """

        def read(api: KubernetesApiEmulator) -> list[str]:
            history = (
                [v.raw for v in api.objects[PODS, namespace, name].history if v is not None]
                if (PODS, namespace, name) in api.objects
                else []
            )
            if not history:
                return []
            pod = history[-1]
            cname = container or pod["spec"]["containers"][0]["name"]
            log = api.kubelet.logs.get(pod["metadata"]["uid"], cname)
            return [line for _, line in log.lines] if log else []

        return self._run_sync(read)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every API request served so far, oldest first."""
        return self._run_sync(lambda api: list(api.recorded))

    def created_pods(self) -> list[dict[str, Any]]:
        """Return the bodies of the pod create requests, i.e. the exact pod specs clients sent."""
        return [
            r.body
            for r in self.requests
            if r.method == "POST" and r.path.endswith("/pods") and isinstance(r.body, dict)
        ]

    def jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Return the live batch/v1 Jobs, oldest first.

        :param namespace: only this namespace
        """
        return self._run_sync(lambda api: api.list_objects(JOBS, namespace))

    def job(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """Return a live Job, or ``None``.

        :param name: Job name
        :param namespace: its namespace
        """
        return self._run_sync(lambda api: api.get_object(JOBS, namespace, name))

    def wait_for_job(self, name: str, *, namespace: str = "default", timeout: float = 10) -> dict[str, Any]:
        """Wait until a Job is ``Complete`` or ``Failed`` and return it.

        :param name: Job name
        :param namespace: its namespace
        :param timeout: seconds
        :raises TimeoutError: when it does not end in time
        """

        def ended() -> dict[str, Any] | None:
            assert self.api is not None
            job = self.api.get_object(JOBS, namespace, name)
            return job if job is not None and is_finished(job) else None

        async def wait() -> dict[str, Any]:
            assert self.api is not None
            async with asyncio.timeout(timeout):
                return await self.api.wait_until(JOBS, ended)

        return self._call(wait(), timeout=timeout + 5)

    def clear_requests(self) -> None:
        """Forget the request log."""
        self._run_sync(lambda api: api.recorded.clear())

    def wait_for_pod(
        self,
        name: str,
        phases: Iterable[str] = TERMINAL_PHASES,
        *,
        namespace: str = "default",
        timeout: float = 10,
    ) -> dict[str, Any]:
        """Wait until a pod reaches one of some phases and return it.

        :param name: pod name
        :param phases: the phases to wait for (default: Succeeded or Failed)
        :param namespace: its namespace
        :param timeout: seconds
        :raises TimeoutError: when it does not get there in time
        """
        wanted = set(phases)

        def reached() -> dict[str, Any] | None:
            assert self.api is not None
            pod = self.api.get_object(PODS, namespace, name)
            return pod if pod is not None and pod.get("status", {}).get("phase") in wanted else None

        async def wait() -> dict[str, Any]:
            assert self.api is not None
            async with asyncio.timeout(timeout):
                return await self.api.wait_until(PODS, reached)

        return self._call(wait(), timeout=timeout + 5)

    def wait_for_pod_gone(self, name: str, *, namespace: str = "default", timeout: float = 10) -> None:
        """Wait until a pod is removed (a graceful delete answers while the pod still terminates).

        :param name: pod name
        :param namespace: its namespace
        :param timeout: seconds
        :raises TimeoutError: when it is still there
        """

        async def wait() -> None:
            assert self.api is not None
            api = self.api
            async with asyncio.timeout(timeout):
                await api.wait_until(
                    PODS, lambda: True if api.get_object(PODS, namespace, name) is None else None
                )

        self._call(wait(), timeout=timeout + 5)

    def wait_for_pods(
        self,
        ready: Callable[[list[dict[str, Any]]], bool],
        *,
        namespace: str = "default",
        timeout: float = 10,
    ) -> list[dict[str, Any]]:
        """Wait until a namespace's live pods satisfy ``ready`` and return them.

        :param ready: a function of the live pods
        :param namespace: the namespace
        :param timeout: seconds
        :raises TimeoutError: when they do not in time
        """

        def reached() -> list[dict[str, Any]] | None:
            assert self.api is not None
            pods = self.api.list_objects(PODS, namespace)
            return pods if ready(pods) else None

        async def wait() -> list[dict[str, Any]]:
            assert self.api is not None
            async with asyncio.timeout(timeout):
                return await self.api.wait_until(PODS, reached)

        return self._call(wait(), timeout=timeout + 5)

    # -- control -------------------------------------------------------------------------------

    def configure_pod(
        self,
        *,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        namespace: str | None = None,
        predicate: PodPredicate | None = None,
        behaviour: PodBehaviour | None = None,
        **fields: Any,
    ) -> PodRule:
        """Tell the kubelet what to do with matching pods (wins over annotations; later rules win).

        :param name: ``fnmatch`` pattern on the pod name, e.g. ``"train-*"``
        :param labels: labels the pod must carry
        :param namespace: the pod's namespace
        :param predicate: a function of the pod dict
        :param behaviour: a whole :class:`PodBehaviour`, or give its fields as keyword arguments
            (``exit_code=1``, ``duration_seconds=2``, ``log_lines=["a", "b"]``...)
        """
        if "log_lines" in fields and fields["log_lines"] is not None:
            fields["log_lines"] = tuple(fields["log_lines"])
        rule = PodRule(
            behaviour or PodBehaviour(**fields),
            name=name,
            labels=labels,
            namespace=namespace,
            predicate=predicate,
        )
        self._run_sync(lambda api: api.kubelet.rules.append(rule))
        return rule

    def clear_pod_rules(self) -> None:
        """Forget every rule set with :meth:`configure_pod`."""
        self._run_sync(lambda api: api.kubelet.rules.clear())

    def add_node(self, node: Mapping[str, Any] | str, **kwargs: Any) -> dict[str, Any]:
        """Add (or replace) a node; pending pods are scheduled again.

        :param node: a Node object, or a name for :func:`~airflow_gpupool.testing.gpu_node`
        :param kwargs: builder arguments when ``node`` is a name
        """
        obj = gpu_node(node, **kwargs) if isinstance(node, str) else copy.deepcopy(dict(node))

        async def add() -> dict[str, Any]:
            assert self.api is not None
            stored = await self.api.put_object(NODES, obj)
            self.api.kubelet.notify()
            return stored

        return self._call(add())

    def patch_node(self, name: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
        """Change a node in place (e.g. labels, allocatable) and reschedule pending pods.

        :param name: node name
        :param change: a function mutating the node dict
        """

        async def patch() -> dict[str, Any] | None:
            assert self.api is not None
            stored = await self.api.update_object(NODES, None, name, change)
            self.api.kubelet.notify()
            return stored

        return self._call(patch())

    def cordon(self, name: str, unschedulable: bool = True) -> None:
        """Cordon (or uncordon) a node.

        :param name: node name
        :param unschedulable: ``False`` to uncordon
        """
        self.patch_node(name, lambda n: n.setdefault("spec", {}).__setitem__("unschedulable", unschedulable))

    def delete_node(self, name: str) -> None:
        """Remove a node; its running pods fail with reason ``NodeLost``.

        :param name: node name
        """
        self._call(self._lose_node(name, delete=True))

    def lose_node(self, name: str) -> None:
        """Make a node unresponsive (``NotReady``); its running pods fail with reason ``NodeLost``.

        :param name: node name
        """
        self._call(self._lose_node(name, delete=False))

    async def _lose_node(self, name: str, *, delete: bool) -> None:
        """Lose a node on the server's loop.

        :param name: node name
        :param delete: remove it
        """
        assert self.api is not None
        await self.api.kubelet.lose_node(name, delete=delete)

    def interrupt_pod(
        self,
        name: str,
        namespace: str = "default",
        reason: str = "Evicted",
        message: str = "The node was low on resource: memory.",
    ) -> None:
        """Evict a running pod now.

        :param name: pod name
        :param namespace: its namespace
        :param reason: the pod's ``status.reason``
        :param message: the pod's ``status.message``
        """
        from airflow_gpupool.testing.pods.failures import Interruption

        def interrupt(api: KubernetesApiEmulator) -> None:
            pod = api.get_object(PODS, namespace, name)
            if pod is not None:
                api.kubelet.interrupt(pod["metadata"]["uid"], Interruption(reason, message))

        self._run_sync(interrupt)

    def finish_pod(self, name: str, namespace: str = "default") -> None:
        """End a running pod's work now, as if its duration were up (it succeeds, unless told to fail).

        :param name: pod name
        :param namespace: its namespace
        """
        from airflow_gpupool.testing.pods.failures import FINISH_NOW

        self.interrupt_pod(name, namespace, reason=FINISH_NOW, message="")

    def reset(self, nodes: Iterable[Mapping[str, Any]] | None = None) -> None:
        """Delete every Job, pod, event and PriorityClass, restore the initial nodes, and clear rules and the request log.

        :param nodes: Node objects that become the initial nodes (this reset's and the next ones')
        """
        if nodes is not None:
            self.initial_nodes = [copy.deepcopy(dict(n)) for n in nodes]

        async def reset() -> None:
            assert self.api is not None
            api = self.api
            await api.jobs.shutdown()
            await api.terminations.shutdown()
            await api.kubelet.shutdown()
            await api.provisioner.shutdown()
            for res in (JOBS, PODS, EVENTS, NODES, PRIORITY_CLASSES, PROVISIONING_REQUESTS, PODTEMPLATES):
                for obj in api.list_objects(res):
                    await api.delete_object(res, obj["metadata"].get("namespace"), obj["metadata"]["name"])
            for node in self.initial_nodes:
                await api.put_object(NODES, copy.deepcopy(node))
            api.kubelet.rules.clear()
            api.kubelet.logs.clear()
            api.kubelet.history.clear()
            api.recorded.clear()
            api.kubelet.notify()
            api.provisioner.start()

        self._call(reset())
