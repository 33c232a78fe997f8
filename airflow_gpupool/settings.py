"""The ``[gpupool]`` configuration, read through small functions so tests can patch one.

Every option is declared once, in :func:`airflow_gpupool.get_provider_info.get_provider_info`;
these functions read it with the same defaults. Environment variables follow Airflow's
rule: ``AIRFLOW__GPUPOOL__LEDGER_URL`` sets ``[gpupool] ledger_url``.
"""

from __future__ import annotations

import configparser
import functools
import os
import sys
from pathlib import Path

from airflow_gpupool.exceptions import ConfigurationError

SECTION = "gpupool"
LEDGER_URL_ENV = "GPUPOOL_LEDGER_URL"

#: The placement policy used when ``[gpupool] placement_policy`` is empty: the project's own
#: (:class:`~airflow_gpupool.placement.fgd.GpuPoolPolicy`). Written here, below placement,
#: so settings need not import it; :data:`airflow_gpupool.placement.policy.DEFAULT_POLICY` is this.
DEFAULT_POLICY = "gpupool"

DEFAULTS: dict[str, str] = {
    "ledger_url": "",
    "placement_policy": "",
    "lease_ttl_seconds": "600",
    "reservation_timeout_seconds": "300",
    "poll_interval_seconds": "5",
    "max_overtakes": "8",
    "synchronous_commit": "true",
    "binding": "whole",
    "node_pool_bindings": "",
    "default_checkpoint_root": "",
    "workload_priority_classes": "training=gpupool-training,inference=gpupool-inference",
}


def _get(option: str) -> str:
    env = os.environ.get(f"AIRFLOW__{SECTION.upper()}__{option.upper()}")
    if env is not None:
        return env
    value = _from_airflow_config(option)
    return DEFAULTS[option] if value in (None, "") else str(value)


def _from_airflow_config(option: str) -> str | None:
    if "airflow.configuration" in sys.modules:
        from airflow.configuration import conf

        return conf.get(SECTION, option, fallback=None)
    # Outside Airflow (the CLI, benchmark clients) importing Airflow costs seconds; the
    # [gpupool] section of airflow.cfg is read directly instead.
    return _airflow_cfg_section().get(option)


@functools.cache
def _airflow_cfg_section() -> dict[str, str]:
    path = Path(os.environ.get("AIRFLOW_CONFIG", airflow_home() / "airflow.cfg")).expanduser()
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error as e:
        raise ConfigurationError(f"{path} is not a valid Airflow configuration file: {e}") from e
    return dict(parser[SECTION]) if parser.has_section(SECTION) else {}


def _positive(option: str) -> float:
    raw = _get(option)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"[{SECTION}] {option}={raw!r} is not a number") from None
    if value <= 0:
        raise ConfigurationError(f"[{SECTION}] {option}={raw!r} must be positive")
    return value


def airflow_home() -> Path:
    """Return ``AIRFLOW_HOME`` (default ``~/airflow``)."""
    return Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()


def ledger_url(explicit: str | None = None) -> str:
    """Return the ledger URL: the argument, else ``GPUPOOL_LEDGER_URL``, else ``[gpupool] ledger_url``,
    else a SQLite file under ``AIRFLOW_HOME``."""
    if explicit:
        return explicit
    env = os.environ.get(LEDGER_URL_ENV)
    if env:
        return env
    configured = _get("ledger_url")
    if configured:
        return configured
    return f"sqlite:///{airflow_home() / 'gpupool-ledger.db'}"


def placement_policy() -> str:
    """Return the name of the placement policy the ledger uses (default: :data:`DEFAULT_POLICY`)."""
    return _get("placement_policy") or DEFAULT_POLICY


def lease_ttl_seconds() -> float:
    """Return how long a grant lives without renewal."""
    return _positive("lease_ttl_seconds")


def reservation_timeout_seconds() -> float:
    """Return how long a request may wait in the queue by default."""
    return _positive("reservation_timeout_seconds")


def poll_interval_seconds() -> float:
    """Return how often a waiting trigger checks its request."""
    return _positive("poll_interval_seconds")


def max_overtakes() -> int:
    """Return how many later requests may overtake a blocked one before it blocks the queue."""
    return int(_positive("max_overtakes"))


def binding() -> str:
    """Return the default slice-binding strategy."""
    return _get("binding")


def node_pool_bindings() -> dict[str, str]:
    """Return the per-node-pool binding strategies, from ``pool=strategy,pool=strategy``."""
    raw = _get("node_pool_bindings").strip()
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        pool, sep, strategy = item.partition("=")
        if not sep or not pool.strip() or not strategy.strip():
            raise ConfigurationError(
                f"[{SECTION}] node_pool_bindings item {item!r} is not 'pool=strategy' "
                "(example: 'a100-mig=mig,t4-shared=hami')"
            )
        out[pool.strip()] = strategy.strip()
    return out


def workload_priority_classes() -> dict[str, str]:
    """Return the PriorityClass of each workload class, from ``class=priorityclass`` pairs."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in _get("workload_priority_classes").split(","))):
        workload, sep, priority_class = item.partition("=")
        if not sep or not priority_class.strip():
            raise ConfigurationError(
                f"[{SECTION}] workload_priority_classes item {item!r} is not 'class=priorityclass' "
                "(example: 'training=gpupool-training,inference=gpupool-inference')"
            )
        out[workload.strip()] = priority_class.strip()
    return out


def synchronous_commit() -> bool:
    """Return whether PostgreSQL ledger commits wait for the WAL flush (the durable default)."""
    raw = _get("synchronous_commit").strip().lower()
    if raw not in ("true", "false", "on", "off", "1", "0"):
        raise ConfigurationError(f"[{SECTION}] synchronous_commit={raw!r}: expected true or false")
    return raw in ("true", "on", "1")
