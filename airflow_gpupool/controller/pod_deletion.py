"""Delete a pod and wait until it is gone: what every release that follows a delete waits for.

Kubernetes deletes gracefully: ``DELETE`` answers at once with the pod ``Terminating``, and its
containers keep running on their GPUs (SIGTERM, an emergency checkpoint) until they exit or the
grace ends. A slice released when the ``DELETE`` answers can be granted to a pod that then shares
the GPU with one still writing its checkpoint. So the pod is watched until it is gone; if it
outlives its grace by :data:`GONE_MARGIN_S` (its node lost, its kubelet stuck) it is deleted with
``gracePeriodSeconds=0``, which removes it from the API at once, and only then is the slice free.

Several pods are deleted together by sending every ``DELETE`` first (:func:`begin_deletion`), then
waiting for each (:func:`finish_deletion`), its grace counted from its own ``DELETE``: they
terminate at once, so the wait is the longest grace, not the sum.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GONE_MARGIN_S",
    "PodDeletion",
    "PodGone",
    "begin_deletion",
    "delete_pod_until_gone",
    "finish_deletion",
    "settle_deleted_pod",
    "wait_until_gone",
]

log = logging.getLogger(__name__)

#: How long past its grace a terminating pod may take to go before it is deleted at once.
GONE_MARGIN_S = 15.0


class PodGone(str, enum.Enum):
    """How a deleted pod went."""

    ALREADY = "already gone"
    ENDED = "gone"
    FORCED = "force-deleted after its grace"


def _delete(api: Any, namespace: str, name: str, grace: int | None) -> Any | None:
    """Send the ``DELETE``; return the API's answer, or ``None`` when the pod was gone already."""
    from kubernetes.client.exceptions import ApiException

    options = {} if grace is None else {"grace_period_seconds": grace}
    try:
        return api.delete_namespaced_pod(name, namespace, **options)
    except ApiException as e:
        if e.status != 404:
            raise
        return None


def wait_until_gone(api: Any, namespace: str, name: str, timeout: float) -> bool:
    """Watch a pod until it is removed; return False if it is still there after ``timeout`` seconds.

    The pod is read first and watched from the version read, so a removal in between is not missed;
    a watch that ends early (the server's timeout, ``410 Gone``) is followed by a new read.

    :param api: a ``kubernetes.client.CoreV1Api``
    :param namespace: the pod's namespace
    :param name: the pod's name
    :param timeout: seconds
    """
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout
    while True:
        try:
            pod = api.read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        stream = watch.Watch()
        try:
            for event in stream.stream(
                api.list_namespaced_pod,
                namespace,
                field_selector=f"metadata.name={name}",
                resource_version=pod.metadata.resource_version,
                timeout_seconds=max(1, math.ceil(left)),
            ):
                if event["type"] == "DELETED":
                    return True
        except ApiException as e:
            if e.status != 410:  # an expired version: read again
                raise
        finally:
            stream.stop()


@dataclass(frozen=True)
class PodDeletion:
    """A pod whose ``DELETE`` was answered: what :func:`finish_deletion` waits for.

    :param namespace: the pod's namespace
    :param name: the pod's name
    :param grace: the termination grace the API server gave it, in seconds
    :param started: when the ``DELETE`` was answered (``time.monotonic()``)
    """

    namespace: str
    name: str
    grace: int
    started: float


def begin_deletion(api: Any, namespace: str, name: str, *, grace_seconds: float | None) -> PodDeletion | None:
    """Send a pod's ``DELETE`` (answered at once; the pod terminates meanwhile) without waiting.

    :param api: a ``kubernetes.client.CoreV1Api``
    :param namespace: the pod's namespace
    :param name: the pod's name
    :param grace_seconds: the termination grace (rounded up to whole seconds; 0: remove at once;
        ``None``: the pod's own ``terminationGracePeriodSeconds``)
    :return: what to wait for, or None when the pod was gone already
    :raises ApiException: the API refused (a pod already gone is not an error)
    """
    grace = None if grace_seconds is None else max(0, math.ceil(grace_seconds))
    answer = _delete(api, namespace, name, grace)
    if answer is None:
        return None
    granted = getattr(getattr(answer, "metadata", None), "deletion_grace_period_seconds", None)
    return PodDeletion(namespace, name, granted if granted is not None else grace or 0, time.monotonic())


def finish_deletion(
    api: Any, deletion: PodDeletion, *, why: str, margin_seconds: float = GONE_MARGIN_S
) -> PodGone:
    """Wait until a pod :func:`begin_deletion` deleted is gone, force-deleting it past its grace.

    The grace is counted from the pod's ``DELETE``, not from this call: pods deleted together are
    waited for one after another, in about the time of the longest grace.

    :param api: a ``kubernetes.client.CoreV1Api``
    :param deletion: the deleted pod
    :param why: for the log
    :param margin_seconds: how long past its grace the pod may take to go
    """
    d = deletion
    return _settle(api, d.namespace, d.name, d.grace, why, margin_seconds, started=d.started)


def delete_pod_until_gone(
    api: Any,
    namespace: str,
    name: str,
    *,
    grace_seconds: float | None,
    why: str,
    margin_seconds: float = GONE_MARGIN_S,
) -> PodGone:
    """Delete a pod with a grace and return once it is gone, force-deleting it past its grace.

    :param api: a ``kubernetes.client.CoreV1Api``
    :param namespace: the pod's namespace
    :param name: the pod's name
    :param grace_seconds: the termination grace (rounded up to whole seconds; 0: remove at once;
        ``None``: the pod's own ``terminationGracePeriodSeconds``)
    :param why: for the log
    :param margin_seconds: how long past its grace the pod may take to go
    :raises ApiException: the API refused (a pod already gone is not an error)
    """
    deletion = begin_deletion(api, namespace, name, grace_seconds=grace_seconds)
    if deletion is None:
        log.info("Pod %s/%s was gone already: %s", namespace, name, why)
        return PodGone.ALREADY
    return finish_deletion(api, deletion, why=why, margin_seconds=margin_seconds)


def settle_deleted_pod(
    api: Any, namespace: str, name: str, *, why: str, margin_seconds: float = GONE_MARGIN_S
) -> PodGone:
    """Wait until a pod someone deleted (KubernetesPodOperator's clean-up, ``on_kill``) is gone.

    A pod that is not being deleted (kept by ``on_finish_action``, or finished) is left alone.

    :param api: a ``kubernetes.client.CoreV1Api``
    :param namespace: the pod's namespace
    :param name: the pod's name
    :param why: for the log
    :param margin_seconds: how long past its grace the pod may take to go
    """
    from kubernetes.client.exceptions import ApiException

    try:
        pod = api.read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise
        return PodGone.ALREADY
    if pod.metadata.deletion_timestamp is None:
        return PodGone.ALREADY  # not being deleted: nothing to wait for
    grace = pod.metadata.deletion_grace_period_seconds or 0
    return _settle(api, namespace, name, grace, why, margin_seconds)


def _settle(
    api: Any,
    namespace: str,
    name: str,
    grace: int,
    why: str,
    margin_seconds: float,
    *,
    started: float | None = None,
) -> PodGone:
    """Wait for a terminating pod to go; past its grace and the margin (from ``started``), delete it at once."""
    if grace > 0:
        log.info(
            "Waiting up to %d s (+%g s) for pod %s/%s to end before its GPU slice is released: %s",
            grace,
            margin_seconds,
            namespace,
            name,
            why,
        )
    waited = 0.0 if started is None else time.monotonic() - started
    if wait_until_gone(api, namespace, name, max(0.0, grace + margin_seconds - waited)):
        log.info("Pod %s/%s is gone: %s", namespace, name, why)
        return PodGone.ENDED
    log.warning(
        "Pod %s/%s outlived its %d s grace by %g s: deleting it with gracePeriodSeconds=0 so its slice "
        "can be released",
        namespace,
        name,
        grace,
        margin_seconds,
    )
    _delete(api, namespace, name, 0)
    wait_until_gone(api, namespace, name, margin_seconds)
    return PodGone.FORCED
