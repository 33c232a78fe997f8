"""Classify why a GPU pod failed, from its final status, its events and its log tail.

The class decides the remedy (see :mod:`airflow_gpupool.operators.escalation`): a preempted
pod is retried as it was, an out-of-memory pod with a larger slice, an image pull error not at
all. Classification reads structured fields (reasons, exit codes); only the CUDA
out-of-memory case, which Kubernetes cannot see, is read from the log tail.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# The classification and the errors live in the bottom layer (exceptions.py); re-exported here.
from airflow_gpupool.exceptions import (
    ApplicationError,
    Classification,
    DeadlineExceededError,
    FailureClass,
    ImagePullError,
    LeaseLostError,
    NodeLostError,
    OutOfMemoryError,
    PodFailureError,
    PreemptedError,
    ReservationTimeoutError,
    UnknownPodFailureError,
)

__all__ = [
    "CUDA_OOM",
    "DEADLINE_REASONS",
    "IMAGE_PULL_REASONS",
    "NODE_LOST_REASONS",
    "PREEMPTION_REASONS",
    "ApplicationError",
    "Classification",
    "DeadlineExceededError",
    "FailureClass",
    "ImagePullError",
    "LeaseLostError",
    "NodeLostError",
    "OutOfMemoryError",
    "PodFailureError",
    "PreemptedError",
    "UnknownPodFailureError",
    "classify",
    "error_for",
]


#: Pod (``status.reason``), condition and event reasons of a pod that was taken away.
PREEMPTION_REASONS = frozenset(
    {
        "Evicted",
        "Preempted",
        "Preempting",
        "PreemptionByScheduler",
        "EvictionByEvictionAPI",
        "TerminationByKubelet",
    }
)
NODE_LOST_REASONS = frozenset({"NodeLost", "NodeNotReady", "NodeShutdown", "DeletionByPodGC"})
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
DEADLINE_REASONS = frozenset({"DeadlineExceeded"})
#: What CUDA, PyTorch, TensorFlow and JAX print when the GPU runs out of memory.
CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED"
    r"|RESOURCE_EXHAUSTED: Out of memory|cudaErrorMemoryAllocation"
)


def _container_state(pod: Mapping[str, Any], container: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    chosen = next((s for s in statuses if s.get("name") == container), statuses[0] if statuses else {})
    state = chosen.get("state") or {}
    return state.get("terminated") or {}, state.get("waiting") or {}


def _pod_reasons(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> set[str]:
    status = pod.get("status") or {}
    reasons = {status.get("reason") or ""}
    reasons |= {
        c.get("reason") or "" for c in status.get("conditions") or [] if c.get("type") == "DisruptionTarget"
    }
    reasons |= {e.get("reason") or "" for e in events}
    return reasons - {""}


def classify(
    pod: Mapping[str, Any] | None,
    events: Iterable[Mapping[str, Any]] = (),
    log_tail: str = "",
    *,
    container: str | None = "base",
    error: BaseException | None = None,
) -> Classification:
    """Return the class of a failed try.

    :param pod: the pod's final state as the API returns it (camelCase keys); None if never created
    :param events: the pod's events (``reason``, ``message``)
    :param log_tail: the last lines of the main container's log
    :param container: the main container's name
    :param error: the exception the try failed with
    """
    if isinstance(error, ReservationTimeoutError):
        return Classification(FailureClass.RESERVATION_TIMEOUT, "reservation timed out")
    if pod is None:
        return Classification(FailureClass.UNKNOWN, f"no pod: {type(error).__name__ if error else 'unknown'}")
    name = (pod.get("metadata") or {}).get("name")
    events = list(events)
    terminated, waiting = _container_state(pod, container)
    exit_code = terminated.get("exitCode")
    reasons = _pod_reasons(pod, events)

    def found(cls: FailureClass, reason: str) -> Classification:
        return Classification(cls, reason, exit_code, name)

    if terminated.get("reason") == "OOMKilled":
        return found(FailureClass.OUT_OF_MEMORY, "OOMKilled")
    for cls, known in (
        (FailureClass.PREEMPTED, PREEMPTION_REASONS),
        (FailureClass.NODE_LOST, NODE_LOST_REASONS),
        (FailureClass.DEADLINE_EXCEEDED, DEADLINE_REASONS),
    ):
        hit = sorted(reasons & known)
        if hit:
            return found(cls, hit[0])
    pulled = sorted(({str(waiting.get("reason") or "")} | reasons) & IMAGE_PULL_REASONS)
    if pulled:
        return found(FailureClass.IMAGE_PULL, pulled[0])
    oom = CUDA_OOM.search(log_tail)
    if oom:
        return found(FailureClass.OUT_OF_MEMORY, oom.group(0))
    if exit_code not in (None, 0):
        return found(FailureClass.APPLICATION_ERROR, terminated.get("reason") or f"exit code {exit_code}")
    return found(FailureClass.UNKNOWN, _fallback_reason(pod, terminated))


def _fallback_reason(pod: Mapping[str, Any], terminated: Mapping[str, Any]) -> str:
    """Return the reason of an unclassified failure; a pod never placed says the scheduler's why (kit, issue 15).

    :param pod: the pod as the API returns it
    :param terminated: its main container's terminated state
    """
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return f"unschedulable: {condition.get('message') or 'Unschedulable'}"
    return str(terminated.get("reason") or (pod.get("status") or {}).get("phase") or "unknown")


_ERRORS: dict[FailureClass, type[PodFailureError]] = {
    cls.failure_class: cls
    for cls in (
        OutOfMemoryError,
        PreemptedError,
        NodeLostError,
        ImagePullError,
        DeadlineExceededError,
        ApplicationError,
        LeaseLostError,
    )
}


def error_for(
    classification: Classification, *, last_checkpoint: int | None = None, log_tail: str = ""
) -> PodFailureError:
    """Return the typed exception of a classification.

    :param classification: why it failed
    :param last_checkpoint: the newest valid checkpoint step
    :param log_tail: the last lines of the log
    """
    cls = _ERRORS.get(classification.failure_class, UnknownPodFailureError)
    return cls(classification, last_checkpoint=last_checkpoint, log_tail=log_tail)
