"""Kubernetes resource quantities (``500m``, ``0.5``, ``80Gi``, ``1e3``): the one parser for CPU and memory.

Exact decimal arithmetic, as the API server does it: ``0.1`` cores is 100 milli-cores, never
99.999. Callers turn the :class:`ValueError` into their own typed error, which names where the
value came from.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["cpu_milli", "memory_mib", "parse_quantity"]

_SUFFIX_FACTOR = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "Ei": Decimal(1024**6),
}
_QUANTITY = re.compile(
    r"^(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:(?P<exponent>[eE][+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE]))?$"
)
_MIB = Decimal(1024**2)
_MILLI = Decimal(1000)


def parse_quantity(value: object) -> Decimal:
    """Return a non-negative quantity as an exact decimal of its base unit (cores, bytes).

    :param value: a Kubernetes quantity string, or an int or float
    :raises ValueError: the value is not a non-negative Kubernetes quantity
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{value!r} is not a non-negative Kubernetes quantity (such as 500m, 2, 80Gi)")
    try:
        number = Decimal(match["number"] + (match["exponent"] or ""))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None
    return number * _SUFFIX_FACTOR[match["suffix"] or ""]


def cpu_milli(value: object) -> int:
    """Return a CPU quantity (``64``, ``0.5``, ``63500m``) in milli-cores, rounded down.

    :raises ValueError: the value is not a non-negative CPU quantity
    """
    return int(parse_quantity(value) * _MILLI)


def memory_mib(value: object) -> int:
    """Return a memory quantity (``80Gi``, ``512Mi``, ``1G``, or bytes as an int) in MiB, rounded down.

    :raises ValueError: the value is not a non-negative memory quantity
    """
    return int(parse_quantity(value) / _MIB)
