"""Classify why a GPU pod failed, from its final status, its events and its log tail.

The class decides the remedy (see :mod:`airflow_gpupool.operators.escalation`): a preempted
pod is retried as it was, an out-of-memory pod with a larger slice, an image pull error not at
all. Classification reads structured fields (reasons, exit codes); only the CUDA
out-of-memory and GPU fault cases, which Kubernetes cannot see, are read from the log tail.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
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
    ReservationTimeoutError,
    UnknownPodFailureError,
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


#: Pod (``status.reason``), condition and event reasons of a pod the scheduler took away for other work.
PREEMPTION_REASONS = frozenset({"Preempted", "Preempting", "PreemptionByScheduler"})
#: ... and of a pod evicted from its node: drained through the Eviction API (Karpenter and the
#: cloud's spot interruption handlers drain a node about to go), or by its kubelet (node
#: pressure, graceful node shutdown).
EVICTION_REASONS = frozenset({"Evicted", "EvictionByEvictionAPI", "TerminationByKubelet"})
NODE_LOST_REASONS = frozenset({"NodeLost", "NodeNotReady", "NodeShutdown", "DeletionByPodGC"})
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
DEADLINE_REASONS = frozenset({"DeadlineExceeded"})
#: The reason of a container the kernel killed for host memory (not GPU memory).
HOST_OOM_REASON = "OOMKilled"
#: What CUDA, PyTorch, TensorFlow and JAX print when the GPU runs out of memory.
CUDA_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED"
    r"|RESOURCE_EXHAUSTED: Out of memory|cudaErrorMemoryAllocation"
)
#: What the driver, NVML and CUDA print when the GPU itself fails (an XID, an uncorrectable ECC
#: error, a GPU off the bus): the slice is not at fault, the hardware is.
GPU_FAULT = re.compile(
    r"NVRM: Xid|\bXid \d+|uncorrectable ECC error|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable"
    r"|fallen off the bus|NVML_ERROR_GPU_IS_LOST|GPU is lost"
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
    pod: Any,
    events: Iterable[Mapping[str, Any]] = (),
    log_tail: str = "",
    *,
    container: str | None = "base",
    error: BaseException | None = None,
) -> Classification:
    """Return the class of a failed try; never raise: anything unexpected is ``unknown``, logged.

    Runs inside the operator's ``cleanup``, on whatever the API returned: a response of another
    shape (a string, a list, fields of the wrong type) must not make the cleanup fail.

    :param pod: the pod's final state as the API returns it (camelCase keys); None if never created
    :param events: the pod's events (``reason``, ``message``)
    :param log_tail: the last lines of the main container's log
    :param container: the main container's name
    :param error: the exception the try failed with
    """
    try:
        if pod is not None and not isinstance(pod, Mapping):
            raise TypeError(f"the pod is a {type(pod).__name__}, not a mapping")
        return _classify(pod, events, log_tail if isinstance(log_tail, str) else "", container, error)
    except Exception as e:
        log.warning("Could not classify the failed pod (%s: %s); its class is unknown", type(e).__name__, e)
        return Classification(FailureClass.UNKNOWN, f"unclassifiable: {type(e).__name__}")


def _classify(
    pod: Mapping[str, Any] | None,
    events: Iterable[Mapping[str, Any]],
    log_tail: str,
    container: str | None,
    error: BaseException | None,
) -> Classification:
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

    if terminated.get("reason") == HOST_OOM_REASON:
        return found(FailureClass.OUT_OF_MEMORY, HOST_OOM_REASON)
    for cls, known in (
        (FailureClass.PREEMPTED, PREEMPTION_REASONS),
        (FailureClass.EVICTED, EVICTION_REASONS),
        (FailureClass.NODE_LOST, NODE_LOST_REASONS),
        (FailureClass.DEADLINE_EXCEEDED, DEADLINE_REASONS),
    ):
        hit = sorted(reasons & known)
        if hit:
            return found(cls, hit[0])
    pulled = sorted(({str(waiting.get("reason") or "")} | reasons) & IMAGE_PULL_REASONS)
    if pulled:
        return found(FailureClass.IMAGE_PULL, pulled[0])
    printed = _printed_failure(log_tail)
    if printed is not None:
        return found(*printed)
    if exit_code not in (None, 0):
        return found(FailureClass.APPLICATION_ERROR, terminated.get("reason") or f"exit code {exit_code}")
    return found(FailureClass.UNKNOWN, _fallback_reason(pod, terminated))


def _printed_failure(log_tail: str) -> tuple[FailureClass, str] | None:
    """Return the class and the words of a failure only the log tail tells (GPU fault, GPU out of memory)."""
    # A faulty GPU often makes CUDA report out of memory too: the fault is the cause.
    for cls, pattern in ((FailureClass.GPU_FAULT, GPU_FAULT), (FailureClass.OUT_OF_MEMORY, CUDA_OOM)):
        printed = pattern.search(log_tail)
        if printed:
            return cls, printed.group(0)
    return None


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
