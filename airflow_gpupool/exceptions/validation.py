"""Bad values given: a GPU request, a gang, an inventory, a quota file, an option or connection.

Each is also a :class:`ValueError`, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    """A team quota file (``gpupool quota apply``) is malformed, or names a flavor the ledger lacks.

    The message names the entry by its YAML path (``teams[2].quotas[0].nominal``), what was
    expected and what was found, both in words (a YAML author never sees a Python type name).

    :param field: the YAML path of the offending entry (``quota file`` for the whole document)
    :param value: the value found
    :param expected: what would have been accepted, in words
    :param team: the team the entry belongs to, named beside the path
    """

    def __init__(self, field: str, value: Any, expected: str, *, team: str | None = None) -> None:
        super().__init__(field, value, expected)
        self.team = team
        where = field if field == "quota file" else f"quota file {field}"
        where += f" (team {team})" if team else ""
        self.args = (f"{where}: expected {expected}; found {_described(value)}",)


def _described(value: Any) -> str:
    """Say what a YAML value is, in words: ``nothing (null or empty)``, ``a list of 2 items``, ``the text 'x'``."""
    if value is None:
        return "nothing (null or empty)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a yes/no value)"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, Mapping):
        keys = ", ".join(sorted(map(str, value))) or "no keys"
        return f"a mapping ({keys})"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)} item(s)"
    return "a value of another kind"


class ConfigurationError(GpuPoolError, ValueError):
    """A configuration option, connection or argument is missing or contradictory."""
