"""The ledger options of a ``gpupool`` connection: configuration < connection extras < arguments.

Pure: the hooks fetch the connection (sync or async), this module turns it into checked options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_gpupool import settings, validate
from airflow_gpupool.binding import check_binding_name
from airflow_gpupool.exceptions import ConfigurationError

__all__ = ["EXTRAS", "LedgerOptions", "NoConnection", "extras_of", "options_from"]

#: The connection extras read by name; any other is a mistake and fails loudly.
EXTRAS = (
    "ledger_url",
    "placement_policy",
    "binding",
    "node_pool_bindings",
    "lease_ttl_seconds",
    "reservation_timeout_seconds",
    "poll_interval_seconds",
)


@dataclass(frozen=True)
class LedgerOptions:
    """Everything resolved from arguments, connection extras and configuration."""

    ledger_url: str
    placement_policy: str
    binding: str
    node_pool_bindings: dict[str, str] = field(default_factory=dict)
    lease_ttl_seconds: float = 600.0
    reservation_timeout_seconds: float = 300.0
    poll_interval_seconds: float = 5.0


class NoConnection:
    """Stands in for the optional default connection when it does not exist."""

    extra_dejson: dict[str, Any] = {}
    host = login = password = port = schema = None


def _seconds(name: str, value: Any, source: str) -> float:
    try:
        return validate.positive_seconds(value)
    except ValueError as e:
        raise ConfigurationError(f"{source}: {name} must be positive and in seconds: {e}") from None


def _pool_bindings(value: Any, source: str) -> dict[str, str]:
    try:
        return validate.pairs(value, what="pool=strategy")
    except ValueError as e:
        raise ConfigurationError(
            f"{source}: node_pool_bindings is not pool=strategy,... (a mapping or a string): {e}"
        ) from None


def _configured_seconds() -> dict[str, float]:
    return {
        "lease_ttl_seconds": settings.lease_ttl_seconds(),
        "reservation_timeout_seconds": settings.reservation_timeout_seconds(),
        "poll_interval_seconds": settings.poll_interval_seconds(),
    }


def options_from(extras: dict[str, Any], overrides: dict[str, Any], source: str) -> LedgerOptions:
    """Merge configuration < connection extras < constructor arguments, and check them.

    :param extras: the connection's extras (:func:`extras_of`)
    :param overrides: the hook's constructor arguments, by extra name (None: not given)
    :param source: where the options came from, for errors
    :raises ConfigurationError: an unknown extra, a bad number of seconds or binding
    """
    unknown = set(extras) - set(EXTRAS)
    if unknown:
        raise ConfigurationError(f"{source}: unknown extras {sorted(unknown)}; known: {list(EXTRAS)}")
    merged = {**extras, **{k: v for k, v in overrides.items() if v is not None}}
    configured = _configured_seconds()
    seconds = {name: _seconds(name, merged.get(name, configured[name]), source) for name in configured}
    options = LedgerOptions(
        ledger_url=settings.ledger_url(merged.get("ledger_url")),
        placement_policy=str(merged.get("placement_policy") or settings.placement_policy()),
        binding=str(merged.get("binding") or settings.binding()),
        node_pool_bindings=_pool_bindings(
            merged.get("node_pool_bindings", settings.node_pool_bindings()), source
        ),
        lease_ttl_seconds=seconds["lease_ttl_seconds"],
        reservation_timeout_seconds=seconds["reservation_timeout_seconds"],
        poll_interval_seconds=seconds["poll_interval_seconds"],
    )
    check_binding_name(options.binding, source)
    for pool, name in options.node_pool_bindings.items():
        check_binding_name(name, f"{source} node pool {pool}")
    return options


def extras_of(conn: Any) -> dict[str, Any]:
    """Return a connection's extras; a host without a ``ledger_url`` extra names a PostgreSQL server.

    :param conn: an Airflow connection (or :class:`NoConnection`)
    """
    extras = dict(conn.extra_dejson or {})
    if "ledger_url" not in extras and conn.host:
        auth = conn.login or ""
        if conn.password:
            auth += f":{conn.password}"
        port = f":{conn.port}" if conn.port else ""
        extras["ledger_url"] = (
            f"postgresql://{auth}{'@' if auth else ''}{conn.host}{port}/{conn.schema or 'gpupool'}"
        )
    return extras
