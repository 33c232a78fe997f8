"""Why a GPU task try failed: the failure classification and one :class:`PodFailureError` subclass per class."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = [
    "ApplicationError",
    "Classification",
    "DeadlineExceededError",
    "EvictedError",
    "FailureClass",
    "GpuFaultError",
    "ImagePullError",
    "LeaseLostError",
    "LedgerDriftError",
    "NodeLostError",
    "OutOfMemoryError",
    "PodFailureError",
    "PreemptedError",
    "UnknownPodFailureError",
]


class FailureClass(str, Enum):
    """Why a GPU task try failed."""

    OUT_OF_MEMORY = "out_of_memory"
    PREEMPTED = "preempted"
    EVICTED = "evicted"
    NODE_LOST = "node_lost"
    IMAGE_PULL = "image_pull"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    APPLICATION_ERROR = "application_error"
    RESERVATION_TIMEOUT = "reservation_timeout"
    LEASE_LOST = "lease_lost"
    GPU_FAULT = "gpu_fault"
    #: The ledger's books were wrong: the node lacked the GPUs the ledger granted (something it
    #: does not count holds them), so the scheduler could not place the pod; not the application.
    LEDGER_DRIFT = "ledger_drift"
    UNKNOWN = "unknown"


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
    """The pod was preempted (the scheduler made room for higher-priority work)."""

    failure_class = FailureClass.PREEMPTED


class EvictedError(PodFailureError):
    """The pod was evicted: its node drained (a spot node taken back, an upgrade) or under pressure."""

    failure_class = FailureClass.EVICTED


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


class LeaseLostError(PodFailureError):
    """The try lost its slice's lease, so the operator deleted its pod.

    Raised when the grant is gone, released, expired or preempted in the ledger, or when the
    lease could not be renewed for a whole TTL. Like a preemption, the retry resumes from the
    newest checkpoint. Build one with :meth:`of`.
    """

    failure_class = FailureClass.LEASE_LOST
    reservation_id: str | None = None
    why: str = ""
    #: Seconds the pod is given to end (SIGTERM, then SIGKILL): a preemption victim's grace when
    #: the loss was seen; else 0.
    grace_seconds: float = 0.0
    #: A preemption victim's deadline (ledger time): the grace left is counted from it when the pod
    #: is deleted, which may be long after the loss was seen (a deferred task resuming).
    deadline: float | None = None

    @classmethod
    def of(
        cls,
        reservation_id: str,
        why: str,
        pod_name: str | None = None,
        *,
        grace_seconds: float = 0.0,
        preempted: bool = False,
        deadline: float | None = None,
    ) -> LeaseLostError:
        """Return the error of a lost lease.

        :param reservation_id: the grant whose lease was lost
        :param why: what the renewal saw
        :param pod_name: the pod that was deleted, if one was running
        :param grace_seconds: how long the pod has to end (a preemption victim's grace)
        :param preempted: the grant was preempted: the try is classified ``preempted`` (its
            retry resumes from the newest checkpoint without penalty)
        :param deadline: a preemption victim's deadline, in ledger time
        """
        if preempted:
            classification = Classification(FailureClass.PREEMPTED, f"preempted: {why}", None, pod_name)
        else:
            classification = Classification(
                FailureClass.LEASE_LOST, f"lease of {reservation_id} lost: {why}", None, pod_name
            )
        error = cls(classification)
        error.reservation_id, error.why, error.grace_seconds = reservation_id, why, grace_seconds
        error.deadline = deadline
        return error

    def grace_left(self, now: float) -> float:
        """Return the seconds of grace left at ``now`` (ledger time): from the deadline when known.

        :param now: the ledger's clock
        """
        if self.deadline is None:
            return self.grace_seconds
        return max(0.0, self.deadline - now)

    @property
    def preempted(self) -> bool:
        """Whether the slice was taken by a preemption (the pod got a grace to checkpoint)."""
        return self.classification.failure_class is FailureClass.PREEMPTED


class GpuFaultError(PodFailureError):
    """The GPU itself failed under the try: an XID, an uncorrectable ECC error, a GPU lost from the bus."""

    failure_class = FailureClass.GPU_FAULT


class LedgerDriftError(PodFailureError):
    """The granted node lacked the GPUs the ledger called free: the books were wrong, not the application.

    The scheduler could not place the pod on its node for want of the GPU resource (a pod the
    ledger does not count holds it); the node is suspect until the controller resyncs it, and the
    retry goes elsewhere or waits for that.
    """

    failure_class = FailureClass.LEDGER_DRIFT


class UnknownPodFailureError(PodFailureError):
    """The try failed for a reason the pod's status does not tell."""
