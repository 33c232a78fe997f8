"""Read why a GPU pod failed off the pod before it is deleted, and carry the class on the try's exception.

The rules that classify a pod live in :mod:`airflow_gpupool.pod_failures` (reconcile uses them
too) and are re-exported here; this module reads what they need (status, events, log tail) and
adds the class and the ladder's decision to what the try raises.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

# The classification and the errors live in the bottom layer (airflow_gpupool.exceptions); re-exported here.
from airflow_gpupool.exceptions import (
    ApplicationError,
    Classification,
    DeadlineExceededError,
    EvictedError,
    FailureClass,
    GpuFaultError,
    ImagePullError,
    LeaseLostError,
    LedgerDriftError,
    NodeLostError,
    OutOfMemoryError,
    PodFailureError,
    PreemptedError,
    UnknownPodFailureError,
)
from airflow_gpupool.pod_failures import (
    CUDA_OOM,
    DEADLINE_REASONS,
    EVICTION_REASONS,
    GPU_FAULT,
    HOST_OOM_REASON,
    IMAGE_PULL_REASONS,
    NODE_LOST_REASONS,
    PREEMPTION_REASONS,
    classify,
)

__all__ = [
    "CUDA_OOM",
    "DEADLINE_REASONS",
    "EVICTION_REASONS",
    "IMAGE_PULL_REASONS",
    "NODE_LOST_REASONS",
    "PREEMPTION_REASONS",
    "ApplicationError",
    "Classification",
    "DeadlineExceededError",
    "EvictedError",
    "FailureClass",
    "GPU_FAULT",
    "HOST_OOM_REASON",
    "GpuFaultError",
    "ImagePullError",
    "LeaseLostError",
    "LedgerDriftError",
    "NodeLostError",
    "OutOfMemoryError",
    "PodFailureError",
    "PreemptedError",
    "FAILURE_ATTRIBUTE",
    "FailureReport",
    "UnknownPodFailureError",
    "annotate",
    "classify",
    "error_for",
    "read_failure",
    "report_of",
]

log = logging.getLogger(__name__)

#: The attribute of a failed try's exception that holds its :class:`FailureReport`.
FAILURE_ATTRIBUTE = "gpupool_failure"


_ERRORS: dict[FailureClass, type[PodFailureError]] = {
    cls.failure_class: cls
    for cls in (
        OutOfMemoryError,
        PreemptedError,
        EvictedError,
        NodeLostError,
        ImagePullError,
        DeadlineExceededError,
        ApplicationError,
        LeaseLostError,
        GpuFaultError,
        LedgerDriftError,
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


@dataclass(frozen=True)
class FailureReport:
    """What the project adds to a failed try's exception: its class and the ladder's decision.

    The exception itself stays what ``KubernetesPodOperator`` raised (same type, same message);
    this rides on it as the ``gpupool_failure`` attribute and an exception note, and goes to the
    task log, the ``gpupool_failure`` XCom and the ledger's attempt record.

    :param classification: why the try failed
    :param remedy: the remedy the ladder chose (``retry``, ``retry_larger``, ``fail``, ``escalate``)
    :param decision: the ladder's decision, in words
    :param retry: whether Airflow may retry the task
    :param last_checkpoint: the newest valid checkpoint step when it failed (None: none)
    :param log_tail: the last lines of the main container's log
    """

    classification: Classification
    remedy: str
    decision: str
    retry: bool
    last_checkpoint: int | None = None
    log_tail: str = field(default="", repr=False)

    @property
    def failure_class(self) -> FailureClass:
        """The class of the failure."""
        return self.classification.failure_class

    def error(self) -> PodFailureError:
        """Return the project's typed view of the failure (:class:`PodFailureError` subclass)."""
        return error_for(self.classification, last_checkpoint=self.last_checkpoint, log_tail=self.log_tail)

    def note(self) -> str:
        """Return the exception note: ``gpupool: <class> (<facts>); <decision>``."""
        return f"gpupool: {str(self.error()).rstrip('.')}; {self.decision}"

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-ready primitives (the XCom)."""
        c = self.classification
        return {
            "failure_class": c.failure_class.value,
            "reason": c.reason,
            "exit_code": c.exit_code,
            "pod_name": c.pod_name,
            "remedy": self.remedy,
            "decision": self.decision,
            "retry": self.retry,
            "last_checkpoint": self.last_checkpoint,
        }


def annotate(error: BaseException, report: FailureReport) -> BaseException:
    """Add a report to an exception (attribute and note), once; return the exception.

    :param error: what the try raised
    :param report: the class and the decision
    """
    if getattr(error, FAILURE_ATTRIBUTE, None) is None:
        setattr(error, FAILURE_ATTRIBUTE, report)
        error.add_note(report.note())
    return error


def report_of(error: BaseException) -> FailureReport | None:
    """Return the report a failed try's exception carries (or its cause carries), if any.

    :param error: an exception raised by ``GpuPodOperator``
    """
    report = getattr(error, FAILURE_ATTRIBUTE, None)
    if report is None and error.__cause__ is not None:
        report = getattr(error.__cause__, FAILURE_ATTRIBUTE, None)
    return report if isinstance(report, FailureReport) else None


def read_failure(operator: Any, pod: Any, remote_pod: Any) -> tuple[Classification, str]:
    """Read why a pod failed (status, events, log tail) before it is deleted, and classify it.

    Runs inside ``cleanup``: it never raises. Every read that fails is logged and skipped; a
    response of an unexpected shape gives the ``unknown`` class and a log line.

    :param operator: the ``GpuPodOperator`` (its pod manager, client, container name, log tail)
    :param pod: the pod as created
    :param remote_pod: its last known state
    :return: the classification and the log tail
    """
    name = getattr(getattr(pod, "metadata", None), "name", None)
    try:
        remote_pod = operator.pod_manager.read_pod(pod)
    except Exception:
        operator.log.warning("Could not re-read pod %s; classifying its last known state", name)
    events = _events(operator, pod, name)
    tail = _log_tail(operator, pod, name)
    try:
        from kubernetes.client import ApiClient

        data = ApiClient().sanitize_for_serialization(remote_pod)
    except Exception as e:
        operator.log.warning(
            "Pod %s's state cannot be read (%s); its class is unknown", name, type(e).__name__
        )
        return Classification(
            FailureClass.UNKNOWN, f"unreadable pod state: {type(e).__name__}", None, name
        ), tail
    return classify(data, events, tail, container=operator.base_container_name), tail


def _events(operator: Any, pod: Any, name: str | None) -> list[dict[str, Any]]:
    try:
        return [
            {"reason": e.reason, "message": e.message}
            for e in operator.pod_manager.read_pod_events(pod).items
        ]
    except Exception:
        operator.log.warning("Could not read the events of pod %s", name)
        return []


def _log_tail(operator: Any, pod: Any, name: str | None) -> str:
    try:
        raw = operator.client.read_namespaced_pod_log(
            name=name,
            namespace=pod.metadata.namespace,
            container=operator.base_container_name,
            tail_lines=operator.log_tail_lines,
            _preload_content=False,
        )
        return str(raw.data.decode("utf-8", errors="replace"))
    except Exception:
        operator.log.info("No log tail for pod %s", name)
        return ""
