"""Checks of the small values that come from configuration, connections and DAG files.

Each raises :class:`ValueError` with what was wrong and what is accepted; the caller re-raises
it as its own typed error (:class:`~airflow_gpupool.exceptions.ConfigurationError`,
:class:`~airflow_gpupool.exceptions.InvalidRequestError`), which names where the value came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

__all__ = ["pairs", "positive_seconds"]


def positive_seconds(value: object, *, maximum: float | None = None, finite: bool = True) -> float:
    """Return a duration in seconds that must be above zero, finite (and at most ``maximum``).

    :param value: a number, a numeric string (from a config file or connection extra) or a timedelta
    :param finite: refuse infinity (a lease that never expires); True everywhere but where
        "forever" is meant
    :raises ValueError: not a number of seconds, not positive, infinite, or above ``maximum``
    """
    if isinstance(value, timedelta):
        seconds: object = value.total_seconds()
    elif isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a number of seconds") from None
    else:
        seconds = value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{value!r} is not a number of seconds (or a timedelta)")
    if not seconds > 0:  # also refuses NaN
        raise ValueError(f"{value!r} must be a positive number of seconds")
    if finite and seconds == float("inf"):
        raise ValueError(f"{value!r} must be a finite number of seconds")
    if maximum is not None and seconds > maximum:
        raise ValueError(f"{value!r} is more than {maximum:g} seconds")
    return float(seconds)


def pairs(value: str | Mapping[str, object], *, what: str = "key=value") -> dict[str, str]:
    """Return ``{"a100-mig": "mig", "t4-shared": "hami"}`` from ``"a100-mig=mig,t4-shared=hami"``.

    A mapping (a connection extra given as JSON) is taken as it is. Blank items are ignored.

    :param what: how an item looks, for the error (``pool=binding``)
    :raises ValueError: an item is not ``key=value`` with both sides non-empty
    """
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is neither a mapping nor a '{what},{what}' string")
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, sep, val = item.partition("=")
        if not sep or not key.strip() or not val.strip():
            raise ValueError(f"item {item!r} is not '{what}'")
        out[key.strip()] = val.strip()
    return out
