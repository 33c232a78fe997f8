"""Every public error of airflow-gpupool: import them from here.

Each carries its data in fields, so callers branch on attributes, never on message text. All
derive from :class:`GpuPoolError`, itself an Airflow ``AirflowException``, so a DAG's ``except
AirflowException`` and Airflow's own handling (retried, not failed fast) keep working; the ones
that mean "a bad value was given" also derive from :class:`ValueError` (and the unknown-id one
from :class:`KeyError`), so ``except ValueError`` keeps working::

    GpuPoolError
    ├── InvalidRequestError (ValueError)   a GPU request field is bad: at DAG parse time, before any wait
    │   ├── InvalidGangError               a gang's spec (members, min_members, topology keys) or id is malformed
    │   ├── InvalidInventoryError          a node inventory (YAML, Kubernetes node, API call) is malformed
    │   └── QuotaFileError                 a team quota file is malformed, or names what the ledger lacks
    ├── ConfigurationError (ValueError)    an option, connection or argument is missing or contradictory
    ├── TraceFormatError (ValueError)      a simulator trace (CSV) lacks a column or has a bad row
    ├── SimulationError (ValueError)       a simulator argument is out of range (``--load 0``)
    ├── TraceFetchError                    ``gpupool traces fetch``: a download failed or its SHA-256 differs
    ├── CorruptCheckpointError (ValueError) a checkpoint manifest exists but breaks the contract
    ├── NoCapacityError                    the ledger: a request fits no node, not even an empty one
    ├── ReservationTimeoutError            the operator: a queued request waited past its timeout
    ├── RunTooLargeError                   the ledger: a run admitted as a whole needs more GPUs at once than its quota or the pool
    ├── UnknownReservationError (KeyError) the ledger: no request or grant has this id
    ├── LeaseExpiredError                  the ledger: a grant expired or was released before renewal
    │   └── GrantPreemptedError            the grant is a preemption victim: its pod must end by a deadline
    ├── LedgerSchemaError                  the ledger database is missing or at another schema version
    ├── LedgerBusyError                    the ledger: the write lock was not free within ``lock_timeout_seconds``
    ├── LedgerUnavailableError             the ledger: the database stayed unreachable past the retry budget
    ├── LedgerConnectionRefusedError       the ledger: the server refused the connection (no such database or role)
    ├── StaleCacheError                    inside a ledger write only: the capacity copy was wrong; redone
    ├── CheckpointStalledError             CheckpointSensor: no new checkpoint within ``max_interval``
    ├── UnverifiedGpuUuidError             the ``device`` binding: no node agent has reported the GPUs' UUIDs yet
    ├── NoGpuError                         the node agent: no NVIDIA driver, GPU or NVML permission on this node
    ├── SupervisorStoppedError             ``make ui``'s supervisor: a signal came while it started services
    ├── ServiceEndedError                  ``make ui``'s supervisor: a service ended while the others needed it
    ├── WatchExpiredError                  the controller's pod watch: 410 Gone or a relist due (caught: it lists again)
    ├── ConsoleActionRefusedError          the GPU pool console: an action not allowed, or not possible (an HTTP status)
    └── PodFailureError                    GpuPodOperator: a try failed; one subclass per FailureClass
        ├── OutOfMemoryError               OOMKilled, or CUDA out of memory in the log tail
        ├── PreemptedError                 preempted by the scheduler for higher-priority work
        ├── EvictedError                   evicted: drained, spot capacity taken back, node pressure
        ├── NodeLostError                  the node became unreachable or disappeared
        ├── ImagePullError                 the image could not be pulled
        ├── DeadlineExceededError          ``activeDeadlineSeconds`` passed
        ├── ApplicationError               the training exited with a non-zero code
        ├── LeaseLostError                 the slice's lease was lost: the pod was deleted
        ├── GpuFaultError                  the GPU failed under the try: an XID, an ECC error, off the bus
        ├── LedgerDriftError               the granted node lacked the GPUs the ledger called free: the books were wrong
        └── UnknownPodFailureError         the pod's status does not tell why

Each family has a module of its own (:mod:`.validation`: bad values given; :mod:`.ledger`:
capacity, reservations, leases and the ledger's database; :mod:`.pods`: why a try failed;
:mod:`.checkpoints`, :mod:`.simulation`, :mod:`.devices`, :mod:`.processes`, :mod:`.console`), but this package is their one public
home: every class's ``__module__`` is ``airflow_gpupool.exceptions``, as when they shared one
module, so pickles, tracebacks and the docs keep naming them here.

The failure classification a :class:`PodFailureError` carries (:class:`FailureClass`,
:class:`Classification`) is defined here too (in :mod:`.pods`), so this package needs nothing
above the bottom layer; :mod:`airflow_gpupool.operators.failures` classifies pods and still exports both and the
pod errors, as the other errors' first homes (:mod:`~airflow_gpupool.checkpoints.manifest`,
:mod:`~airflow_gpupool.sensors.checkpoint`) still export theirs.
"""

from __future__ import annotations

from airflow_gpupool.exceptions.base import GpuPoolError
from airflow_gpupool.exceptions.checkpoints import CheckpointStalledError, CorruptCheckpointError
from airflow_gpupool.exceptions.console import ConsoleActionRefusedError
from airflow_gpupool.exceptions.devices import NoGpuError, UnverifiedGpuUuidError
from airflow_gpupool.exceptions.ledger import (
    GrantPreemptedError,
    LeaseExpiredError,
    LedgerBusyError,
    LedgerConnectionRefusedError,
    LedgerSchemaError,
    LedgerUnavailableError,
    NoCapacityError,
    ReservationTimeoutError,
    RunTooLargeError,
    StaleCacheError,
    UnknownReservationError,
)
from airflow_gpupool.exceptions.pods import (
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
from airflow_gpupool.exceptions.processes import ServiceEndedError, SupervisorStoppedError, WatchExpiredError
from airflow_gpupool.exceptions.simulation import SimulationError, TraceFetchError, TraceFormatError
from airflow_gpupool.exceptions.validation import (
    ConfigurationError,
    InvalidGangError,
    InvalidInventoryError,
    InvalidRequestError,
    QuotaFileError,
)

__all__ = [
    "ApplicationError",
    "CheckpointStalledError",
    "ConsoleActionRefusedError",
    "Classification",
    "ConfigurationError",
    "CorruptCheckpointError",
    "DeadlineExceededError",
    "EvictedError",
    "FailureClass",
    "GpuFaultError",
    "GpuPoolError",
    "GrantPreemptedError",
    "ImagePullError",
    "InvalidGangError",
    "InvalidInventoryError",
    "InvalidRequestError",
    "LeaseExpiredError",
    "LeaseLostError",
    "LedgerBusyError",
    "LedgerConnectionRefusedError",
    "LedgerDriftError",
    "LedgerSchemaError",
    "LedgerUnavailableError",
    "NoCapacityError",
    "NoGpuError",
    "NodeLostError",
    "OutOfMemoryError",
    "PodFailureError",
    "PreemptedError",
    "QuotaFileError",
    "ReservationTimeoutError",
    "RunTooLargeError",
    "ServiceEndedError",
    "SimulationError",
    "StaleCacheError",
    "SupervisorStoppedError",
    "TraceFetchError",
    "TraceFormatError",
    "UnknownPodFailureError",
    "UnknownReservationError",
    "WatchExpiredError",
    "UnverifiedGpuUuidError",
]

# The public home, not the family's module: what a traceback prints and a pickle stores.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
