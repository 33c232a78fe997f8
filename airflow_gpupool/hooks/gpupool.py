"""GpuPoolHook: resolves a ``gpupool`` connection to a ledger, and an async twin for triggers.

The connection (conn type ``gpupool``) carries the ledger URL and options as extras,
read by name::

    AIRFLOW_CONN_GPUPOOL_DEFAULT='{"conn_type": "gpupool",
        "extra": {"ledger_url": "postgresql://gpupool@db:5432/gpupool",
                  "binding": "hami", "node_pool_bindings": "a100-mig=mig",
                  "lease_ttl_seconds": 900}}'

Without ``ledger_url`` extra, a connection with a host is read as a PostgreSQL server
(host, port, login, password, schema = database). Constructor arguments beat extras,
extras beat the ``[gpupool]`` configuration. With no connection id at all the hook uses
the configuration alone (``GPUPOOL_LEDGER_URL``, ``[gpupool] ledger_url``, or a SQLite
file under ``AIRFLOW_HOME``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_gpupool import settings
from airflow_gpupool.exceptions import ConfigurationError

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger, ReapResult, ReleaseResult, Reservation
    from airflow_gpupool.resources import GpuRequest

_EXTRAS = (
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


def _number(name: str, value: Any, source: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{source}: {name}={value!r} is not a number of seconds") from None
    if number <= 0:
        raise ConfigurationError(f"{source}: {name}={value!r} must be positive")
    return number


def _pool_bindings(value: Any, source: str) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str):
        pairs = [p.strip() for p in value.split(",") if p.strip()]
        out = {}
        for pair in pairs:
            pool, sep, strategy = pair.partition("=")
            if not sep:
                raise ConfigurationError(f"{source}: node_pool_bindings item {pair!r} is not pool=strategy")
            out[pool.strip()] = strategy.strip()
        return out
    raise ConfigurationError(f"{source}: node_pool_bindings must be a mapping or 'pool=strategy,...'")


def options_from(extras: dict[str, Any], overrides: dict[str, Any], source: str) -> LedgerOptions:
    """Merge configuration < connection extras < constructor arguments, and check them."""
    unknown = set(extras) - set(_EXTRAS)
    if unknown:
        raise ConfigurationError(f"{source}: unknown extras {sorted(unknown)}; known: {list(_EXTRAS)}")
    merged = {**extras, **{k: v for k, v in overrides.items() if v is not None}}
    options = LedgerOptions(
        ledger_url=settings.ledger_url(merged.get("ledger_url")),
        placement_policy=str(merged.get("placement_policy") or settings.placement_policy()),
        binding=str(merged.get("binding") or settings.binding()),
        node_pool_bindings=_pool_bindings(
            merged.get("node_pool_bindings", settings.node_pool_bindings()), source
        ),
        lease_ttl_seconds=_number(
            "lease_ttl_seconds", merged.get("lease_ttl_seconds", settings.lease_ttl_seconds()), source
        ),
        reservation_timeout_seconds=_number(
            "reservation_timeout_seconds",
            merged.get("reservation_timeout_seconds", settings.reservation_timeout_seconds()),
            source,
        ),
        poll_interval_seconds=_number(
            "poll_interval_seconds",
            merged.get("poll_interval_seconds", settings.poll_interval_seconds()),
            source,
        ),
    )
    from airflow_gpupool.operators.binding import check_binding_name

    check_binding_name(options.binding, source)
    for pool, name in options.node_pool_bindings.items():
        check_binding_name(name, f"{source} node pool {pool}")
    return options


def _extras_of(conn: Any) -> dict[str, Any]:
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


class GpuPoolHook(BaseHook):
    """Access the GPU ledger named by a ``gpupool`` connection.

    :param ledger_conn_id: the connection; None to use the ``[gpupool]`` configuration only
    :param ledger_url: overrides the connection's URL
    :param options: other overrides by extra name (``binding``, ``lease_ttl_seconds``...)
    """

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "gpupool_default"
    conn_type = "gpupool"
    hook_name = "GPU pool"

    def __init__(
        self, ledger_conn_id: str | None = default_conn_name, ledger_url: str | None = None, **options: Any
    ) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id
        self._overrides = {"ledger_url": ledger_url, **options}

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Tell the connection form which fields mean what."""
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database", "host": "PostgreSQL host (or set ledger_url in Extra)"},
            "placeholders": {
                "extra": '{"ledger_url": "postgresql://gpupool@db:5432/gpupool", "binding": "whole"}'
            },
        }

    @cached_property
    def options(self) -> LedgerOptions:
        """The resolved ledger URL and options."""
        extras: dict[str, Any] = {}
        source = "[gpupool] configuration"
        if self.ledger_conn_id:
            extras = _extras_of(self._connection())
            source = f"connection {self.ledger_conn_id!r}"
        return options_from(extras, self._overrides, source)

    def _connection(self) -> Any:
        try:
            return self.get_connection(str(self.ledger_conn_id))
        except Exception as e:
            if self.ledger_conn_id == self.default_conn_name and not isinstance(e, ConfigurationError):
                # The default connection is optional: the [gpupool] configuration applies.
                return _NoConnection()
            raise ConfigurationError(
                f"GPU pool connection {self.ledger_conn_id!r} not found: create it "
                f"(AIRFLOW_CONN_{str(self.ledger_conn_id).upper()}) or set ledger_conn_id=None to use [gpupool] ledger_url"
            ) from e

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger client, created on first use."""
        from airflow_gpupool.ledger import Ledger

        return Ledger(self.options.ledger_url, policy=self.options.placement_policy)

    def reserve(
        self,
        request: GpuRequest,
        holder: str,
        *,
        reservation_id: str,
        ttl: float | None = None,
        timeout: float | None = None,
    ) -> Reservation:
        """Reserve ``request`` (idempotent by ``reservation_id``)."""
        return self.ledger.reserve(
            request,
            holder,
            ttl=ttl or self.options.lease_ttl_seconds,
            timeout=timeout or self.options.reservation_timeout_seconds,
            reservation_id=reservation_id,
        )

    def get(self, reservation_id: str) -> Reservation:
        """Return the reservation's current state."""
        return self.ledger.get(reservation_id)

    def renew(self, reservation_id: str, ttl: float | None = None) -> Reservation:
        """Extend the grant's lease."""
        return self.ledger.renew(reservation_id, ttl)

    def release(self, reservation_id: str, reason: str) -> ReleaseResult | None:
        """Release (idempotent); None when the reservation was never recorded."""
        from airflow_gpupool.exceptions import UnknownReservationError

        try:
            return self.ledger.release(reservation_id, reason=reason)
        except UnknownReservationError:
            return None

    def reap(self) -> ReapResult:
        """Expire what is due and serve the queue."""
        return self.ledger.reap()

    def close(self) -> None:
        """Close the ledger's connections, if any were opened."""
        if "ledger" in self.__dict__:
            self.ledger.close()
            del self.__dict__["ledger"]


class _NoConnection:
    extra_dejson: dict[str, Any] = {}
    host = login = password = port = schema = None


class AsyncGpuPoolHook(GpuPoolHook):
    """The hook for triggers: async connection look-up, ledger calls off the event loop."""

    async def aoptions(self) -> LedgerOptions:
        """Resolve the options with an async connection look-up."""
        if "options" not in self.__dict__:
            extras: dict[str, Any] = {}
            source = "[gpupool] configuration"
            if self.ledger_conn_id:
                conn: Any
                try:
                    conn = await self.aget_connection(str(self.ledger_conn_id))
                except Exception as e:
                    if self.ledger_conn_id != self.default_conn_name:
                        raise ConfigurationError(
                            f"GPU pool connection {self.ledger_conn_id!r} not found"
                        ) from e
                    conn = _NoConnection()
                extras = _extras_of(conn)
                source = f"connection {self.ledger_conn_id!r}"
            self.__dict__["options"] = options_from(extras, self._overrides, source)
        return self.options

    async def aget(self, reservation_id: str) -> Reservation:
        """Return the reservation's state without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.ledger.get, reservation_id)

    async def areap(self) -> ReapResult:
        """Reap without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.ledger.reap)

    async def arenew(self, reservation_id: str, ttl: float | None = None) -> Reservation:
        """Renew a lease without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.ledger.renew, reservation_id, ttl)
