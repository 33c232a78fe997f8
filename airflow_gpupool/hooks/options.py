"""The ledger options of a ``gpupool`` connection: configuration < connection extras < arguments.

Pure: the hooks fetch the connection (sync or async), this module turns it into checked options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_gpupool import settings, validate
from airflow_gpupool.binding import check_binding_name
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.redact import ledger_url_from_fields, redact_url

__all__ = ["EXTRAS", "LedgerOptions", "NoConnection", "check_shared_ledger", "extras_of", "options_from"]

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

    ledger_url: str = field(repr=False)
    placement_policy: str
    binding: str
    node_pool_bindings: dict[str, str] = field(default_factory=dict)
    lease_ttl_seconds: float = 600.0
    reservation_timeout_seconds: float = 3600.0
    poll_interval_seconds: float = 5.0

    @property
    def display_url(self) -> str:
        """The ledger URL as it may be shown: its password hidden."""
        return redact_url(self.ledger_url)


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
        ledger_url=settings.ledger_url(overrides.get("ledger_url"), extras.get("ledger_url")),
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


def check_shared_ledger(url: str, source: str) -> None:
    """Refuse the per-machine SQLite default where tasks run on more than one machine.

    Under Celery, Kubernetes, Edge or any executor that is not local, each worker would open its
    own SQLite file under its own ``AIRFLOW_HOME``: several ledgers, and one GPU granted twice.

    :param url: the resolved ledger URL
    :param source: where the options came from, for the error
    :raises ConfigurationError: the URL is the SQLite default and an executor is not local
    """
    remote = [name for name in settings.executors() if name not in settings.LOCAL_EXECUTORS]
    if url != settings.default_ledger_url() or not remote:
        return
    raise ConfigurationError(
        f"{source}: no GPU ledger is configured, and the SQLite default ({url}) would be a separate "
        f"ledger on each worker of {', '.join(remote)}: two workers could be granted the same GPU. "
        "Point every worker at one shared PostgreSQL ledger: the gpupool_default connection "
        "(AIRFLOW_CONN_GPUPOOL_DEFAULT with extra ledger_url, or host/login/password/schema), "
        "GPUPOOL_LEDGER_URL, or [gpupool] ledger_url (AIRFLOW__GPUPOOL__LEDGER_URL)"
    )


def extras_of(conn: Any) -> dict[str, Any]:
    """Return a connection's extras; a host without a ``ledger_url`` extra names a PostgreSQL server.

    :param conn: an Airflow connection (or :class:`NoConnection`)
    """
    extras = dict(conn.extra_dejson or {})
    if "ledger_url" not in extras and conn.host:
        extras["ledger_url"] = ledger_url_from_fields(
            login=conn.login, password=conn.password, host=conn.host, port=conn.port, schema=conn.schema
        )
    return extras
