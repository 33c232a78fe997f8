"""The GPU pool console: an action refused before it reached the ledger."""

from __future__ import annotations

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = ["ConsoleActionRefusedError"]


class ConsoleActionRefusedError(GpuPoolError):
    """A console action refused (not allowed, unknown target, wrong state, bad value, unconfirmed).

    :param status: the HTTP status the console answers (400, 403, 404, 409 or 422)
    :param message: why, in words the page shows
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
