"""Argument types of the ``gpupool`` command: each checks its range, so argparse says what is allowed.

A bad value ends the command with argparse's usage error (exit 2) naming the option, before
anything is read or written; never a traceback from deep inside.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from collections.abc import Callable

__all__ = [
    "bind_address",
    "integer",
    "key_value",
    "non_empty",
    "non_negative",
    "number",
    "port",
    "port_or_zero",
]


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """Return an argparse type: an integer within ``[minimum, maximum]``.

    :param minimum: the smallest value allowed (None: no bound)
    :param maximum: the largest value allowed (None: no bound)
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{value} is not {_range(minimum, maximum)}")
        return value

    parse.__name__ = "integer"
    return parse


def number(
    minimum: float | None = None, *, above: bool = False, maximum: float | None = None
) -> Callable[[str], float]:
    """Return an argparse type: a finite number, at least (or, with ``above``, more than) ``minimum``.

    :param minimum: the lower bound (None: no bound)
    :param above: the bound is exclusive (``> 0`` for durations that must pass)
    :param maximum: the upper bound, inclusive (None: no bound)
    """

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        low = minimum is not None and (value <= minimum if above else value < minimum)
        if low or (maximum is not None and value > maximum):
            bound = f"more than {minimum:g}" if above and minimum is not None else _range(minimum, maximum)
            raise argparse.ArgumentTypeError(f"{value:g} is not {bound}")
        return value

    parse.__name__ = "number"
    return parse


def _range(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"between {minimum:g} and {maximum:g}"
    if minimum is not None:
        return f"at least {minimum:g}"
    return f"at most {maximum:g}"


#: A TCP port to listen on or connect to.
port = integer(1, 65535)
#: A TCP port to listen on, 0 for any free one.
port_or_zero = integer(0, 65535)
#: A number of seconds that may be zero.
non_negative = number(0)


def non_empty(text: str) -> str:
    """An argparse type: a string that is not empty or blank."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def key_value(text: str) -> tuple[str, str]:
    """An argparse type: ``key=value`` with a non-empty key."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key.strip(), value.strip()


_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def bind_address(text: str) -> str:
    """An argparse type: an IP address or a host name (RFC 1123) to listen on.

    Checked here, not looked up: ``999.1.1.1`` or ``not an ip`` would otherwise reach the socket
    and end in a lookup error's traceback.
    """
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    labels = text.removesuffix(".").split(".")
    if len(text) > 253 or not all(_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an IP address or a host name")
    return text
