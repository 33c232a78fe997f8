"""Classify why a GPU pod failed, from its final status, its events and its log tail.

The class decides the remedy (see :mod:`airflow_gpupool.operators.escalation`): a preempted
pod is retried as it was, an out-of-memory pod with a larger slice, an image pull error not at
all. Classification reads structured fields (reasons, exit codes); only the CUDA
out-of-memory case, which Kubernetes cannot see, is read from the log tail.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from airflow_gpupool.exceptions import GpuPoolError, ReservationTimeoutError


class FailureClass(str, Enum):
    """Why a GPU task try failed."""

    OUT_OF_MEMORY = "out_of_memory"
    PREEMPTED = "preempted"
    NODE_LOST = "node_lost"
    IMAGE_PULL = "image_pull"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    APPLICATION_ERROR = "application_error"
    RESERVATION_TIMEOUT = "reservation_timeout"
    UNKNOWN = "unknown"


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


@dataclass(frozen=True)
class Classification:
    """The class of a failure and the facts it rests on.

    :param failure_class: the class
    :param reason: the Kubernetes reason (or log pattern) that decided it
    :param exit_code: the main container's exit code, if it terminated
    :param pod_name: the pod, if one was created
    """

    failure_class: FailureClass
    reason: str
    exit_code: int | None = None
    pod_name: str | None = None


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
    return found(
        FailureClass.UNKNOWN, terminated.get("reason") or (pod.get("status") or {}).get("phase") or "unknown"
    )


class PodFailureError(GpuPoolError):
    """A GPU task try failed; the class, the pod, its exit code and the last checkpoint are fields.

    :param classification: why it failed
    :param last_checkpoint: the newest valid checkpoint step when it failed (None: none)
    :param log_tail: the last lines of the main container's log
    """

    failure_class = FailureClass.UNKNOWN

    def __init__(
        self, classification: Classification, *, last_checkpoint: int | None = None, log_tail: str = ""
    ) -> None:
        self.classification = classification
        self.pod_name = classification.pod_name
        self.exit_code = classification.exit_code
        self.last_checkpoint = last_checkpoint
        self.log_tail = log_tail
        where = f"pod {self.pod_name}" if self.pod_name else "the task"
        code = f", exit code {self.exit_code}" if self.exit_code is not None else ""
        step = (
            f", last checkpoint step {last_checkpoint}" if last_checkpoint is not None else ", no checkpoint"
        )
        super().__init__(
            f"{where} failed: {classification.failure_class.value} ({classification.reason}{code}{step})"
        )


class OutOfMemoryError(PodFailureError):
    """The container ran out of host or GPU memory."""

    failure_class = FailureClass.OUT_OF_MEMORY


class PreemptedError(PodFailureError):
    """The pod was evicted or preempted."""

    failure_class = FailureClass.PREEMPTED


class NodeLostError(PodFailureError):
    """The pod's node became unreachable or disappeared."""

    failure_class = FailureClass.NODE_LOST


class ImagePullError(PodFailureError):
    """The container image could not be pulled."""

    failure_class = FailureClass.IMAGE_PULL


class DeadlineExceededError(PodFailureError):
    """The pod ran past its ``activeDeadlineSeconds``."""

    failure_class = FailureClass.DEADLINE_EXCEEDED


class ApplicationError(PodFailureError):
    """The training exited with a non-zero code."""

    failure_class = FailureClass.APPLICATION_ERROR


class UnknownPodFailureError(PodFailureError):
    """The try failed for a reason the pod's status does not tell."""


_ERRORS: dict[FailureClass, type[PodFailureError]] = {
    cls.failure_class: cls
    for cls in (
        OutOfMemoryError,
        PreemptedError,
        NodeLostError,
        ImagePullError,
        DeadlineExceededError,
        ApplicationError,
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
