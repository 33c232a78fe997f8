"""Classify why a GPU pod failed, from its final status, its events and its log tail (pure: no I/O).

The class decides the remedy (see :mod:`airflow_gpupool.operators.escalation`): a preempted
pod is retried as it was, an out-of-memory pod with a larger slice, an image pull error not at
all. Classification reads structured fields (reasons, exit codes); only the CUDA
out-of-memory and GPU fault cases, which Kubernetes cannot see, are read from the log tail.

It lives below the operators and the controller alike: the operator classifies the pod it ran
(with its events and log tail), reconcile an ended pod it finds (from its status alone), with
the same rules, so both record the same class for the same pod.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_gpupool.exceptions import Classification, FailureClass, ReservationTimeoutError

__all__ = [
    "CUDA_OOM",
    "DEADLINE_REASONS",
    "EVICTION_REASONS",
    "GPU_FAULT",
    "HOST_OOM_REASON",
    "IMAGE_PULL_REASONS",
    "NODE_LOST_REASONS",
    "PREEMPTION_REASONS",
    "classify",
    "describe_end",
]

log = logging.getLogger(__name__)


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


def describe_end(pod: Mapping[str, Any], *, container: str | None = "base") -> str:
    """Return how an ended pod ended, from its status alone: ``Succeeded``, or ``Failed: <class> (<facts>)``.

    What reconcile (and the gatekeeper) write when they release the grant of a pod that ended:
    a failed pod's class is the one the operator's ladder reads (``Failed: application_error
    (Error, exit code 1)``), never a lease lost.

    :param pod: the pod as the API returns it (camelCase keys)
    :param container: the main container's name
    """
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    if phase != "Failed":
        return phase
    found = classify(pod, container=container)
    code = f", exit code {found.exit_code}" if found.exit_code not in (None, 0) else ""
    return f"{phase}: {found.failure_class.value} ({found.reason}{code})"
