"""Fail a granted pod fast when the scheduler cannot place it on its granted node, sync and deferrable.

How a read is judged is :mod:`airflow_gpupool.triggers.unschedulable`'s: at once when the node can
never hold the pod, else after :attr:`UnschedulableFailFast.unschedulable_grace_seconds`. The
synchronous start-up is watched through the reads of the parent's own pod manager (never
replaced, so a test that patches ``KubernetesPodOperator.pod_manager`` reaches it); ``deferrable=True`` pods
start inside :class:`~airflow_gpupool.triggers.pod.LeasedPodTrigger`, which watches the same way
and yields an ``unschedulable`` event that :meth:`UnschedulableFailFast.unplaceable` turns into
the same failure.

When the ledger's books were wrong (the node advertises the GPUs, something the ledger does not
count holds them), the try is classed ``ledger_drift``, not the application's fault, and the node
is reported suspect before the slice is released: no grant goes there, the retry's included,
until the controller has resynced it (:mod:`airflow_gpupool.ledger.nodes.suspects`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import PodLaunchFailedException
from kubernetes.client import V1Pod

from airflow_gpupool.exceptions import Classification, FailureClass
from airflow_gpupool.operators.failures import read_failure
from airflow_gpupool.operators.pod.lease import delete_pod
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


@contextmanager
def _watched_reads(manager: Any, watch: UnschedulableWatch) -> Iterator[None]:
    """Show every pod the manager reads to ``watch`` while the block runs.

    The manager is the parent's ``pod_manager`` as it is, not a subclass of ours: a DAG author's
    test that patches ``KubernetesPodOperator.pod_manager`` reaches this operator too. Only its
    ``read_pod`` is wrapped, on the instance, and put back after.
    """
    had_own = "read_pod" in vars(manager)
    read = manager.read_pod

    def read_pod(pod: Any) -> Any:
        remote = read(pod)
        if isinstance(remote, V1Pod):  # a patched manager's stand-in is not judged
            watch.check(remote)
        return remote

    manager.read_pod = read_pod
    try:
        yield
    finally:
        if had_own:
            manager.read_pod = read
        else:
            del manager.read_pod


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

    def await_pod_start(self, pod: Any) -> None:
        """Wait as the parent does, failing at once when the pod cannot be placed on its granted node.

        :param pod: the created ``V1Pod``
        """
        node = self.granted_node()
        if node is None:
            super().await_pod_start(pod)  # type: ignore[misc]
            return
        op: Any = self
        watch = UnschedulableWatch(
            lambda: _read_node(op.client, node), grace_seconds=self.unschedulable_grace_seconds
        )
        try:
            with _watched_reads(op.pod_manager, watch):
                super().await_pod_start(pod)  # type: ignore[misc]
        except PodLaunchFailedException:
            if watch.verdict is not None:
                self._found_unplaceable(node, watch.verdict, pod.metadata.name)
            raise


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
