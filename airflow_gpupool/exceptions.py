"""Domain exceptions of airflow-gpupool.

Each carries its data in fields, so callers branch on attributes, never on message text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_gpupool.placement.verdict import NoFitReason


class GpuPoolError(Exception):
    """Base class of every error raised by airflow-gpupool."""


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


class InvalidInventoryError(InvalidRequestError):
    """A node inventory (YAML file, Kubernetes node, API call) is malformed."""


class ConfigurationError(GpuPoolError, ValueError):
    """A configuration option, connection or argument is missing or contradictory."""


class NoCapacityError(GpuPoolError):
    """A request can never fit any node of the inventory, even an empty one.

    :param request: the request
    :param reasons: why each node rejected it, most promising node first
    """

    def __init__(self, request: Any, reasons: Sequence[NoFitReason]) -> None:
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


class LedgerSchemaError(GpuPoolError):
    """The ledger database is missing, or its schema is newer or older than this code."""


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
