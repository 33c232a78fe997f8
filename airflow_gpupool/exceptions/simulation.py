"""The simulator's errors: a bad trace file, an argument out of range, a trace that cannot be fetched."""

from __future__ import annotations

from typing import Any

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = ["SimulationError", "TraceFetchError", "TraceFormatError"]


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
