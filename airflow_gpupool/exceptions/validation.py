"""Bad values given: a GPU request, a gang, an inventory, a quota file, an option or connection.

Each is also a :class:`ValueError`, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

from typing import Any

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = [
    "ConfigurationError",
    "InvalidGangError",
    "InvalidInventoryError",
    "InvalidRequestError",
    "QuotaFileError",
]


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
