"""Fail a granted pod fast when the scheduler cannot place it on its granted node, sync and deferrable.

How a read is judged is :mod:`airflow_gpupool.triggers.unschedulable`'s: at once when the node can
never hold the pod, else after :attr:`UnschedulableFailFast.unschedulable_grace_seconds`. The
synchronous start-up is watched through the operator's pod manager; ``deferrable=True`` pods
start inside :class:`~airflow_gpupool.triggers.pod.LeasedPodTrigger`, which watches the same way
and yields an ``unschedulable`` event that :meth:`UnschedulableFailFast.unplaceable` turns into
the same failure.

When the ledger's books were wrong (the node advertises the GPUs, something the ledger does not
count holds them), the try is classed ``ledger_drift``, not the application's fault, and the node
is reported suspect before the slice is released: no grant goes there, the retry's included,
until the controller has resynced it (:mod:`airflow_gpupool.ledger.nodes.suspects`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import PodLaunchFailedException
from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager

from airflow_gpupool.exceptions import Classification, FailureClass
from airflow_gpupool.operators.failures import read_failure
from airflow_gpupool.operators.lease import delete_pod
from airflow_gpupool.triggers.unschedulable import (
    UNSCHEDULABLE_STATUS,
    Unplaceable,
    UnschedulableWatch,
    extended_requests,
    never_fits,
    unschedulable_message,
)

__all__ = [
    "UNSCHEDULABLE_STATUS",
    "UnschedulableFailFast",
    "UnschedulableWatch",
    "drift_classification",
    "extended_requests",
    "never_fits",
    "unschedulable_message",
]


def drift_classification(node: str, message: str, pod_name: str | None) -> Classification:
    """Return the class of a try whose granted GPUs were taken on its node: the ledger's books were wrong.

    :param node: the granted node
    :param message: the scheduler's message
    :param pod_name: the try's pod
    """
    reason = f"node {node} lacks the GPUs the ledger granted (the books were wrong): {message}"
    return Classification(FailureClass.LEDGER_DRIFT, reason, None, pod_name)


class _WatchedPodManager(PodManager):
    """KPO's pod manager whose every pod read is shown to a watch while one is set."""

    watch: UnschedulableWatch | None = None

    def read_pod(self, pod: Any) -> Any:
        """Read the pod as the parent does, then let the watch judge it."""
        remote = super().read_pod(pod)
        if self.watch is not None:
            self.watch.check(remote)
        return remote


class UnschedulableFailFast:
    """Mixin for ``KubernetesPodOperator`` subclasses whose pod is pinned to a granted node.

    The subclass says which node through :meth:`granted_node` and has a ``gpu_hook`` (the ledger),
    where :meth:`books_were_wrong` reports the node (before the slice is released); :attr:`_drift`
    then holds the class of the try.
    """

    #: How long a pod that may still fit its node is left unschedulable before the try fails.
    unschedulable_grace_seconds: float = 30.0
    _drift: Classification | None = None

    def granted_node(self) -> str | None:
        """Return the node the pod is pinned to, or ``None`` (then nothing is watched)."""
        return None

    def books_were_wrong(self, node: str, message: str) -> None:
        """Report the node suspect to the ledger before the slice is released: no grant goes there
        until the controller has resynced it.

        :param node: the granted node
        :param message: the scheduler's message
        """
        op: Any = self
        try:
            op.gpu_hook.mark_node_suspect(node, message)
        except Exception:
            # The try's failure must surface as it is; the controller's next full sync corrects the books.
            op.log.exception("Could not report node %s suspect to the ledger", node)
        else:
            op.log.warning("Node %s lacked the granted GPUs: suspect until the controller resyncs it", node)

    def _found_unplaceable(self, node: str, verdict: Unplaceable, pod_name: str | None) -> None:
        if verdict.books_wrong:
            self._drift = drift_classification(node, verdict.message, pod_name)
            self.books_were_wrong(node, verdict.message)

    def unplaceable(self, event: dict[str, Any]) -> None:
        """Fail the try the deferred pod's trigger found unplaceable, as the sync path fails it.

        The pod is read for the failure record and deleted (it never ran), the wrong books are
        reported; the caller then records the try and releases the slice.

        :param event: the trigger's ``unschedulable`` event
        :raises PodLaunchFailedException: with the scheduler's reason
        """
        op: Any = self
        namespace, name = event["namespace"], event["name"]
        op._own_pod = (namespace, name)
        verdict = Unplaceable(event["message"], event["detail"], bool(event["books_wrong"]))
        try:
            pod = op.hook.get_pod(name, namespace)
            op._failure = read_failure(op, pod, pod)
        except Exception as e:  # the verdict is the news; the record only loses the pod's details
            op.log.warning("Could not read pod %s/%s: %s", namespace, name, type(e).__name__)
        self._found_unplaceable(event["node"], verdict, name)
        delete_pod(op.client, namespace, name, why=str(verdict), log=op.log)
        raise PodLaunchFailedException(str(verdict))

    @cached_property
    def pod_manager(self) -> PodManager:
        """KPO's pod manager, able to show the start-up loop's reads to an :class:`UnschedulableWatch`."""
        op: Any = self
        return _WatchedPodManager(kube_client=op.client, callbacks=op.callbacks)

    def await_pod_start(self, pod: Any) -> None:
        """Wait as the parent does, failing at once when the pod cannot be placed on its granted node.

        :param pod: the created ``V1Pod``
        """
        node = self.granted_node()
        manager = self.pod_manager
        watch = None
        if node is not None and isinstance(manager, _WatchedPodManager):
            op: Any = self
            watch = UnschedulableWatch(
                lambda: _read_node(op.client, node), grace_seconds=self.unschedulable_grace_seconds
            )
            manager.watch = watch
        try:
            super().await_pod_start(pod)  # type: ignore[misc]
        except PodLaunchFailedException:
            if node is not None and watch is not None and watch.verdict is not None:
                self._found_unplaceable(node, watch.verdict, pod.metadata.name)
            raise
        finally:
            if isinstance(manager, _WatchedPodManager):
                manager.watch = None


def _read_node(core: Any, name: str) -> Any:
    """Return a node, or ``None`` when it does not exist.

    :param core: a ``CoreV1Api``
    :param name: the node
    """
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_node(name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
