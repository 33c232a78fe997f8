"""Every public error of airflow-gpupool, in one place.

Each carries its data in fields, so callers branch on attributes, never on message text. All
derive from :class:`GpuPoolError`, itself an Airflow ``AirflowException``, so a DAG's ``except
AirflowException`` and Airflow's own handling (retried, not failed fast) keep working; the ones that mean "a bad value was given" also derive from
:class:`ValueError` (and the unknown-id one from :class:`KeyError`), so ``except ValueError``
keeps working::

    GpuPoolError
    ├── InvalidRequestError (ValueError)   a GPU request field is bad: at DAG parse time, before any wait
    │   ├── InvalidInventoryError          a node inventory (YAML, Kubernetes node, API call) is malformed
    │   └── QuotaFileError                 a team quota file is malformed, or names what the ledger lacks
    ├── ConfigurationError (ValueError)    an option, connection or argument is missing or contradictory
    ├── TraceFormatError (ValueError)      a simulator trace (CSV) lacks a column or has a bad row
    ├── SimulationError (ValueError)       a simulator argument is out of range (``--load 0``)
    ├── TraceFetchError                    ``gpupool traces fetch``: a download failed or its SHA-256 differs
    ├── CorruptCheckpointError (ValueError) a checkpoint manifest exists but breaks the contract
    ├── NoCapacityError                    the ledger: a request fits no node, not even an empty one
    ├── ReservationTimeoutError            the operator: a queued request waited past its timeout
    ├── UnknownReservationError (KeyError) the ledger: no request or grant has this id
    ├── LeaseExpiredError                  the ledger: a grant expired or was released before renewal
    │   └── GrantPreemptedError            the grant is a preemption victim: its pod must end by a deadline
    ├── LedgerSchemaError                  the ledger database is missing or at another schema version
    ├── LedgerBusyError                    the ledger: the write lock was not free within ``lock_timeout_seconds``
    ├── LedgerUnavailableError             the ledger: the database stayed unreachable past the retry budget
    ├── StaleCacheError                    inside a ledger write only: the capacity copy was wrong; redone
    ├── CheckpointStalledError             CheckpointSensor: no new checkpoint within ``max_interval``
    ├── UnverifiedGpuUuidError             the ``device`` binding: no node agent has reported the GPUs' UUIDs yet
    ├── NoGpuError                         the node agent: no NVIDIA driver, GPU or NVML permission on this node
    └── PodFailureError                    GpuPodOperator: a try failed; one subclass per FailureClass
        ├── OutOfMemoryError               OOMKilled, or CUDA out of memory in the log tail
        ├── PreemptedError                 preempted by the scheduler for higher-priority work
        ├── EvictedError                   evicted: drained, spot capacity taken back, node pressure
        ├── NodeLostError                  the node became unreachable or disappeared
        ├── ImagePullError                 the image could not be pulled
        ├── DeadlineExceededError          ``activeDeadlineSeconds`` passed
        ├── ApplicationError               the training exited with a non-zero code
        ├── LeaseLostError                 the slice's lease was lost: the pod was deleted
        └── UnknownPodFailureError         the pod's status does not tell why

The failure classification a :class:`PodFailureError` carries (:class:`FailureClass`,
:class:`Classification`) is defined here too, so this module needs nothing above the bottom layer;
:mod:`airflow_gpupool.operators.failures` classifies pods and still exports both and the pod
errors, as the other errors' first homes (:mod:`~airflow_gpupool.checkpoints.manifest`,
:mod:`~airflow_gpupool.sensors.checkpoint`) still export theirs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

# Importing Airflow may log to stdout (its unit-test mode does): keep stdout for the caller's own
# output (the CLI's JSON, a child process's protocol).
with contextlib.redirect_stdout(sys.stderr):
    from airflow.sdk.exceptions import AirflowException

__all__ = [
    "ApplicationError",
    "CheckpointStalledError",
    "Classification",
    "ConfigurationError",
    "CorruptCheckpointError",
    "DeadlineExceededError",
    "FailureClass",
    "GpuFaultError",
    "GpuPoolError",
    "ImagePullError",
    "InvalidGangError",
    "InvalidInventoryError",
    "InvalidRequestError",
    "LeaseExpiredError",
    "LeaseLostError",
    "QuotaFileError",
    "LedgerBusyError",
    "LedgerSchemaError",
    "LedgerUnavailableError",
    "NoCapacityError",
    "NoGpuError",
    "NodeLostError",
    "OutOfMemoryError",
    "PodFailureError",
    "PreemptedError",
    "EvictedError",
    "ReservationTimeoutError",
    "SimulationError",
    "StaleCacheError",
    "TraceFetchError",
    "TraceFormatError",
    "UnknownPodFailureError",
    "UnknownReservationError",
    "UnverifiedGpuUuidError",
]


class GpuPoolError(AirflowException):
    """Base class of every error raised by airflow-gpupool: an ``AirflowException``, as task code expects."""


class InvalidRequestError(GpuPoolError, ValueError):
    """A GPU request or inventory entry has a bad field.

    :param field: the name of the offending field
    :param value: the value given
    :param expected: what would have been accepted
    """

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"invalid {field}={value!r}: expected {expected}")


class InvalidGangError(InvalidRequestError):
    """A gang reservation's spec (members, min_members, topology keys) or id is malformed."""


class InvalidInventoryError(InvalidRequestError):
    """A node inventory (YAML file, Kubernetes node, API call) is malformed."""


class QuotaFileError(InvalidRequestError):
    """A team quota file (``gpupool quota apply``) is malformed, or names a flavor the ledger lacks."""


class ConfigurationError(GpuPoolError, ValueError):
    """A configuration option, connection or argument is missing or contradictory."""


class _NodeRejection(Protocol):
    # What a reason of NoCapacityError offers; placement's NoFitReason is one. A protocol, so this
    # bottom module need not import placement.
    @property
    def node(self) -> str: ...

    @property
    def reason(self) -> str: ...


class NoCapacityError(GpuPoolError):
    """A request can never fit any node of the inventory, even an empty one.

    :param request: the request
    :param reasons: why each node rejected it, most promising node first
        (:class:`~airflow_gpupool.placement.verdict.NoFitReason`)
    """

    def __init__(self, request: Any, reasons: Sequence[_NodeRejection]) -> None:
        self.request = request
        self.reasons = tuple(reasons)
        summary = "; ".join(str(r) for r in self.reasons[:5]) or "the inventory is empty"
        super().__init__(f"request can never be placed on this inventory: {summary}")


class ReservationTimeoutError(GpuPoolError):
    """A queued request waited longer than its reservation timeout.

    :param request_id: the queued request
    :param waited_s: seconds it waited
    :param blockers: why the closest nodes did not fit, closest first
    """

    def __init__(self, request_id: str, waited_s: float, blockers: Sequence[str]) -> None:
        self.request_id = request_id
        self.waited_s = waited_s
        self.blockers = tuple(blockers)
        blocked = "; ".join(self.blockers) or "no node matched"
        super().__init__(f"reservation {request_id} timed out after {waited_s:.0f}s: {blocked}")


class UnknownReservationError(GpuPoolError, KeyError):
    """No request or grant with this id exists in the ledger."""

    def __init__(self, reservation_id: str) -> None:
        self.reservation_id = reservation_id
        super().__init__(f"no reservation {reservation_id!r} in the ledger")

    def __str__(self) -> str:
        return str(self.args[0])


class LeaseExpiredError(GpuPoolError):
    """A grant's lease expired (or it was released) before it was renewed."""

    def __init__(self, grant_id: str, state: str) -> None:
        self.grant_id = grant_id
        self.state = state
        super().__init__(f"grant {grant_id} can no longer be renewed: it is {state}")


class GrantPreemptedError(LeaseExpiredError):
    """The grant was chosen as a preemption victim: its pod must end within ``seconds_left``.

    Its holder ends the pod with a termination grace of ``seconds_left`` (SIGTERM first, so the
    training can write an emergency checkpoint) and then releases the grant.

    :param deadline: the ledger time by which the pod must have ended
    :param seconds_left: what is left of the grace when the renewal was refused
    :param preempted_by: the waiting request the slice passes to
    """

    def __init__(self, grant_id: str, deadline: float, seconds_left: float, preempted_by: str | None) -> None:
        self.deadline = deadline
        self.seconds_left = max(0.0, seconds_left)
        self.preempted_by = preempted_by
        self.grant_id, self.state = grant_id, "preempting"
        GpuPoolError.__init__(
            self,
            f"grant {grant_id} is preempted for {preempted_by or 'higher-priority work'}: its pod "
            f"must end within {self.seconds_left:.0f} s (it may write a checkpoint on SIGTERM)",
        )


class LedgerSchemaError(GpuPoolError):
    """The ledger database is missing, or its schema is newer or older than this code."""


class LedgerBusyError(GpuPoolError):
    """A ledger writer could not take the lock within ``[gpupool] lock_timeout_seconds``.

    Another client holds the ledger's write lock (or a row it needs) and does not let go: a
    stopped or hung process. Its session is ended by the server after
    ``idle_in_transaction_timeout_seconds``; trying again later can succeed.

    :param seconds: how long this writer waited
    :param holder: who holds the lock (server pid, application name), or None when unknown
    """

    def __init__(self, seconds: float, holder: str | None = None) -> None:
        self.seconds = seconds
        self.holder = holder
        super().__init__(
            f"the GPU ledger is busy: its write lock was not free within {seconds:g} s "
            f"([gpupool] lock_timeout_seconds); held by {holder or 'unknown'}"
        )


class LedgerUnavailableError(GpuPoolError):
    """The ledger's database could not be reached for ``[gpupool] ledger_retry_seconds``.

    :param seconds: how long connection errors were retried
    :param cause: the last driver error, in words
    """

    def __init__(self, seconds: float, cause: str) -> None:
        self.seconds = seconds
        self.cause = cause
        super().__init__(
            f"the GPU ledger's database is unavailable: still failing after {seconds:g} s of retries "
            f"([gpupool] ledger_retry_seconds): {cause}"
        )


class StaleCacheError(GpuPoolError):
    """A conditional update found less capacity than this process's copy said.

    Raised and caught inside one ledger write: the store reloads its copy and redoes the write,
    so it never reaches a caller.
    """


class TraceFormatError(GpuPoolError, ValueError):
    """A workload or cluster trace (CSV) lacks a column or has a bad row.

    :param path: the file
    :param row: the 1-based line number of the bad row (0 for the header)
    :param column: the missing or bad column
    :param detail: what is wrong
    """

    def __init__(self, path: str, row: int, column: str, detail: str) -> None:
        self.path = path
        self.row = row
        self.column = column
        self.detail = detail
        where = "header" if row == 0 else f"line {row}"
        super().__init__(f"{path}: {where}: column {column!r}: {detail}")


class SimulationError(GpuPoolError, ValueError):
    """An argument of the simulator (``gpupool simulate``) is out of range.

    :param option: the option (``--load``, ``--queue-nodes``, ``--plot``...)
    :param value: what was given
    :param expected: what is accepted
    """

    def __init__(self, option: str, value: Any, expected: str) -> None:
        self.option = option
        self.value = value
        self.expected = expected
        super().__init__(f"{option} {value!r}: expected {expected}")


class TraceFetchError(GpuPoolError):
    """A trace file could not be downloaded, or is not the pinned file (``gpupool traces fetch``).

    :param url: the file's URL
    :param detail: what went wrong
    """

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"{url}: {detail}")


class CorruptCheckpointError(GpuPoolError, ValueError):
    """A manifest exists but does not follow the contract.

    :param location: the step directory
    :param detail: what is wrong
    """

    def __init__(self, location: str, detail: str) -> None:
        self.location = location
        self.detail = detail
        super().__init__(f"corrupt checkpoint {location}: {detail}")


class CheckpointStalledError(GpuPoolError):
    """No new valid checkpoint appeared within ``max_interval``.

    :param checkpoint_dir: the watched location
    :param last_step: the newest valid step (None: none yet)
    :param message: what the watch saw
    """

    def __init__(self, checkpoint_dir: str, last_step: int | None, message: str) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.last_step = last_step
        super().__init__(f"checkpoints at {checkpoint_dir} stalled: {message}")


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
    #: Seconds the pod is given to end (SIGTERM, then SIGKILL): a preemption victim's grace; else 0.
    grace_seconds: float = 0.0

    @classmethod
    def of(
        cls,
        reservation_id: str,
        why: str,
        pod_name: str | None = None,
        *,
        grace_seconds: float = 0.0,
        preempted: bool = False,
    ) -> LeaseLostError:
        """Return the error of a lost lease.

        :param reservation_id: the grant whose lease was lost
        :param why: what the renewal saw
        :param pod_name: the pod that was deleted, if one was running
        :param grace_seconds: how long the pod has to end (a preemption victim's grace)
        :param preempted: the grant was preempted: the try is classified ``preempted`` (its
            retry resumes from the newest checkpoint without penalty)
        """
        if preempted:
            classification = Classification(FailureClass.PREEMPTED, f"preempted: {why}", None, pod_name)
        else:
            classification = Classification(
                FailureClass.LEASE_LOST, f"lease of {reservation_id} lost: {why}", None, pod_name
            )
        error = cls(classification)
        error.reservation_id, error.why, error.grace_seconds = reservation_id, why, grace_seconds
        return error

    @property
    def preempted(self) -> bool:
        """Whether the slice was taken by a preemption (the pod got a grace to checkpoint)."""
        return self.classification.failure_class is FailureClass.PREEMPTED


class GpuFaultError(PodFailureError):
    """The GPU itself failed under the try: an XID, an uncorrectable ECC error, a GPU lost from the bus."""

    failure_class = FailureClass.GPU_FAULT


class UnknownPodFailureError(PodFailureError):
    """The try failed for a reason the pod's status does not tell."""


class UnverifiedGpuUuidError(GpuPoolError):
    """The ``device`` or ``dra`` binding was given GPU UUIDs that no node agent has reported.

    Until ``gpupool agent run`` on the node has reported its GPUs, the ledger only has the
    inventory's UUIDs, which no NVIDIA runtime can select.

    :param uuids: the unverified UUIDs
    :param selector: what would have selected them
    """

    def __init__(self, uuids: Sequence[str], selector: str = "NVIDIA_VISIBLE_DEVICES") -> None:
        self.uuids = tuple(uuids)
        super().__init__(
            f"GPU UUIDs {list(self.uuids)} are not verified: no node agent has reported them, so "
            f"{selector} cannot select them; run `gpupool agent run` on the node (the "
            "nvml-agent DaemonSet) or use another binding (whole, hami, kai) for this node pool"
        )


class NoGpuError(GpuPoolError):
    """The node agent found no GPU to watch: no driver, no NVML library, no GPU or no permission.

    :param node: the node the agent runs for
    :param reason: what NVML said, in words
    """

    def __init__(self, node: str, reason: str) -> None:
        self.node = node
        self.reason = reason
        super().__init__(
            f"no GPU to watch on node {node}: {reason}; run the agent on GPU nodes only, with the "
            "NVIDIA container runtime (or --backend fake --fake-spec FILE to try it without a GPU)"
        )
