"""The ``[gpupool]`` configuration, read through small functions so tests can patch one.

Every option is declared once, in :func:`airflow_gpupool.get_provider_info.get_provider_info`;
these functions read it with the same defaults. Environment variables follow Airflow's
rule: ``AIRFLOW__GPUPOOL__LEDGER_URL`` sets ``[gpupool] ledger_url``. Airflow's own
configuration (``AIRFLOW_HOME``, the executors) is read in :mod:`~airflow_gpupool.settings.airflow_config`,
and the ``typical_shapes`` items are checked in :mod:`~airflow_gpupool.settings.shapes`; both are
re-exported here.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.settings.airflow_config import LOCAL_EXECUTORS as LOCAL_EXECUTORS
from airflow_gpupool.settings.airflow_config import airflow_home as airflow_home
from airflow_gpupool.settings.airflow_config import executors as executors
from airflow_gpupool.settings.airflow_config import read_airflow_cfg
from airflow_gpupool.settings.shapes import SHAPE_EXAMPLE, SHAPE_FORM, shape_settings
from airflow_gpupool.settings.shapes import ShapeSetting as ShapeSetting
from airflow_gpupool.validate import pairs, positive_seconds

SECTION = "gpupool"
LEDGER_URL_ENV = "GPUPOOL_LEDGER_URL"

#: The placement policy used when ``[gpupool] placement_policy`` is empty: the project's own
#: (:class:`~airflow_gpupool.placement.fgd.GpuPoolPolicy`). Written here, below placement,
#: so settings need not import it; :data:`airflow_gpupool.placement.policy.DEFAULT_POLICY` is this.
DEFAULT_POLICY = "gpupool"

DEFAULTS: dict[str, str] = {
    "ledger_url": "",
    "placement_policy": "",
    "typical_shapes": "",
    "lease_ttl_seconds": "600",
    "reservation_timeout_seconds": "3600",
    "orphan_grace_seconds": "600",
    "poll_interval_seconds": "5",
    "max_overtakes": "8",
    "synchronous_commit": "true",
    "lock_timeout_seconds": "10",
    "statement_timeout_seconds": "30",
    "idle_in_transaction_timeout_seconds": "10",
    "ledger_retry_seconds": "60",
    "binding": "whole",
    "gang_topology_keys": "topology.kubernetes.io/zone",
    "node_pool_bindings": "",
    "default_checkpoint_root": "",
    "workload_priority_classes": "training=gpupool-training,inference=gpupool-inference",
    # The waiting path (queue at scale): one ledger per process, waiters that only read.
    "max_connections_per_process": "4",
    "waiter_reap_interval_seconds": "30",
    "wait_fallback_poll_seconds": "60",
    "transaction_pooling": "false",
    # The node agent (issue 17).
    "agent_interval_seconds": "30",
    "missed_heartbeats": "3",
    "heartbeat_stable_seconds": "90",
    "leak_grace_seconds": "60",
    "leak_action": "report",
    # The GPU pool page's history (issue 15).
    "history_retention_days": "30",
    # On-demand and spot capacity (issue 16).
    "spot_node_pools": "",
    "spot_price_ratio": "",
    "urgent_priority": "100",
    "evictions_before_on_demand": "2",
    # Preemption with a checkpoint grace (issue 16).
    "preemption_grace_seconds": "120",
    "min_runtime_seconds": "60",
    # Waiting demand made visible to the autoscaler (issue 36).
    "scalable_node_pools": "",
    "autoscale_mode": "auto",
    "provisioning_class": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
    "autoscale_namespace": "",
    "placeholder_priority_class": "gpupool-placeholder",
    "discover_node_pools": "",
    # When each waiting request will start (issue 39).
    "forecast_prior_seconds": "3600",
    "forecast_interval_seconds": "30",
    # The controller's drift (issue 36).
    "drift_alert_seconds": "300",
    # Pipelines: an ending step hands its slice on to the next (issue 40).
    "handoff_seconds": "120",
    # Pipelines: a step that cannot be handed on queues ahead of its upstream's end (issue 40).
    "queue_ahead_lead_seconds": "300",
    "queue_ahead_idle_seconds": "120",
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
    parser = read_airflow_cfg()
    return dict(parser[SECTION]) if parser.has_section(SECTION) else {}


def _positive(option: str) -> float:
    raw = _get(option)
    try:
        return positive_seconds(raw, finite=True)
    except ValueError as e:
        raise ConfigurationError(f"[{SECTION}] {option}: {e}") from None


def _pairs(option: str, what: str, example: str) -> dict[str, str]:
    try:
        return pairs(_get(option), what=what)
    except ValueError as e:
        raise ConfigurationError(f"[{SECTION}] {option} {e} (example: {example!r})") from None


def ledger_url(explicit: str | None = None, connection: str | None = None) -> str:
    """Return the ledger URL, the one way every part finds it.

    The argument (a hook's ``ledger_url``, the CLI's ``--url``), else ``GPUPOOL_LEDGER_URL``,
    else the ``gpupool`` connection's URL, else ``[gpupool] ledger_url``, else
    :func:`default_ledger_url`.

    :param explicit: the URL given by the caller
    :param connection: the URL of the ``gpupool`` connection, when one was found
    """
    for candidate in (explicit, os.environ.get(LEDGER_URL_ENV), connection, _get("ledger_url")):
        if candidate:
            return candidate
    return default_ledger_url()


def default_ledger_url() -> str:
    """Return the ledger URL used when none is configured: a SQLite file under ``AIRFLOW_HOME``."""
    return f"sqlite:///{airflow_home() / 'gpupool-ledger.db'}"


def placement_policy() -> str:
    """Return the name of the placement policy the ledger uses (default: :data:`DEFAULT_POLICY`)."""
    return _get("placement_policy") or DEFAULT_POLICY


def typical_shapes() -> tuple[ShapeSetting, ...]:
    """Return the typical task shapes the fragmentation policies keep room for (empty: the built-in ones).

    ``[gpupool] typical_shapes`` lists ``cpu_milli:gpu_milli:gpus[:model|model]=weight`` items
    separated by commas: CPU milli, GPU milli on each GPU (1000 for whole GPUs, 0 with 0 GPUs),
    GPU count, optionally the allowed GPU models, and a positive relative weight. Every worker
    reads the same value, so every worker scores a cluster the same way.

    :raises ConfigurationError: an item is malformed, or a shape is listed twice
    """
    try:
        items = pairs(_get("typical_shapes"), what=SHAPE_FORM)
    except ValueError as e:
        raise ConfigurationError(f"[{SECTION}] typical_shapes: {e} (example: {SHAPE_EXAMPLE!r})") from None
    return shape_settings(items, f"[{SECTION}] typical_shapes")


def lease_ttl_seconds() -> float:
    """Return how long a grant lives without renewal."""
    return _positive("lease_ttl_seconds")


def reservation_timeout_seconds() -> float:
    """Return how long a request may wait in the queue by default."""
    return _positive("reservation_timeout_seconds")


def gang_topology_keys() -> tuple[str, ...]:
    """Return the node label keys a gang's members should share when it names none (may be empty)."""
    return tuple(k.strip() for k in _get("gang_topology_keys").split(",") if k.strip())


def orphan_grace_seconds() -> float:
    """Return how long an orphaned grant's pod may run on before reconcile deletes it."""
    return _positive("orphan_grace_seconds")


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
    return _pairs("node_pool_bindings", "pool=strategy", "a100-mig=mig,t4-shared=hami")


def workload_priority_classes() -> dict[str, str]:
    """Return the PriorityClass of each workload class, from ``class=priorityclass`` pairs."""
    return _pairs(
        "workload_priority_classes",
        "class=priorityclass",
        "training=gpupool-training,inference=gpupool-inference",
    )


def synchronous_commit() -> bool:
    """Return whether PostgreSQL ledger commits wait for the WAL flush (the durable default)."""
    raw = _get("synchronous_commit").strip().lower()
    if raw not in ("true", "false", "on", "off", "1", "0"):
        raise ConfigurationError(f"[{SECTION}] synchronous_commit={raw!r}: expected true or false")
    return raw in ("true", "on", "1")


def lock_timeout_seconds() -> float:
    """Return how long a ledger writer waits for a lock before :class:`LedgerBusyError`."""
    return _positive("lock_timeout_seconds")


def statement_timeout_seconds() -> float:
    """Return how long one ledger statement may run on PostgreSQL before the server cancels it."""
    return _positive("statement_timeout_seconds")


def idle_in_transaction_timeout_seconds() -> float:
    """Return how long a PostgreSQL ledger session may sit idle inside a transaction before the server ends it."""
    return _positive("idle_in_transaction_timeout_seconds")


def ledger_retry_seconds() -> float:
    """Return how long lost connections to the ledger are retried before :class:`LedgerUnavailableError`."""
    return _positive("ledger_retry_seconds")


# -- the waiting path: one ledger per process, waiters that only read (queue at scale) ------


def max_connections_per_process() -> int:
    """Return how many database connections one process keeps to one ledger URL, at most."""
    raw = _get("max_connections_per_process").strip()
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise ConfigurationError(
            f"[{SECTION}] max_connections_per_process={raw!r}: expected a whole number from 1 to 1000"
        )
    return int(raw)


def waiter_reap_interval_seconds() -> float:
    """Return how often a process with waiting requests checks (one read) whether anything is due."""
    return _positive("waiter_reap_interval_seconds")


def wait_fallback_poll_seconds() -> float:
    """Return how often a waiter woken by NOTIFY (PostgreSQL) still reads its request, in case one was lost."""
    return _positive("wait_fallback_poll_seconds")


def transaction_pooling() -> bool:
    """Return whether the PostgreSQL ledger is reached through a transaction-pooling PgBouncer."""
    raw = _get("transaction_pooling").strip().lower()
    if raw not in ("true", "false", "on", "off", "1", "0"):
        raise ConfigurationError(f"[{SECTION}] transaction_pooling={raw!r}: expected true or false")
    return raw in ("true", "on", "1")


# -- the node agent (issue 17) ------------------------------------------------------------------


def agent_interval_seconds() -> float:
    """``[gpupool] agent_interval_seconds``: how often a node agent reports (default 30)."""
    return _positive("agent_interval_seconds")


def missed_heartbeats() -> int:
    """``[gpupool] missed_heartbeats``: intervals a node's agent may miss before quarantine (default 3)."""
    value = _get("missed_heartbeats")
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigurationError(f"[gpupool] missed_heartbeats: {value!r} is not a whole number of 1 or more")
    return count


def heartbeat_stable_seconds() -> float:
    """``[gpupool] heartbeat_stable_seconds``: steady heartbeats before a quarantined node comes back."""
    return _positive("heartbeat_stable_seconds")


def leak_grace_seconds() -> float:
    """``[gpupool] leak_grace_seconds``: how long GPU memory may stay used with no grant (default 60)."""
    return _positive("leak_grace_seconds")


def leak_action() -> str:
    """``[gpupool] leak_action``: ``report`` a GPU memory leak, or also ``quarantine`` the GPU."""
    value = _get("leak_action").strip()
    if value not in ("report", "quarantine"):
        raise ConfigurationError(f"[gpupool] leak_action: {value!r}; choose report or quarantine")
    return value


# -- the history (issue 15) ----------------------------------------------------------------------


def history_retention_seconds() -> float:
    """``[gpupool] history_retention_days`` in seconds: how long ended reservations are kept (default 30 days)."""
    return _positive("history_retention_days") * 86400


def forecast_prior_seconds() -> float:
    """``[gpupool] forecast_prior_seconds``: the mean run time assumed of a task with no history (default 1 h)."""
    return _positive("forecast_prior_seconds")


def forecast_interval_seconds() -> float:
    """``[gpupool] forecast_interval_seconds``: the controller recomputes forecasts at most this often (default 30)."""
    return _positive("forecast_interval_seconds")


def handoff_seconds() -> float:
    """``[gpupool] handoff_seconds``: how long a slice handed on waits for its downstream step's claim (default 120)."""
    return _positive("handoff_seconds")


def queue_ahead_lead_seconds() -> float:
    """``[gpupool] queue_ahead_lead_seconds``: how long before its upstream's forecast end a step enters the queue (default 300)."""
    return _positive("queue_ahead_lead_seconds")


def queue_ahead_idle_seconds() -> float:
    """``[gpupool] queue_ahead_idle_seconds``: how long a request queued ahead, granted, waits for its claim (default 120)."""
    return _positive("queue_ahead_idle_seconds")


def drift_alert_seconds() -> float:
    """``[gpupool] drift_alert_seconds``: the controller logs a node whose books drift this long (default 5 min)."""
    return _positive("drift_alert_seconds")


def spot_node_pools() -> frozenset[str]:
    """Return the node pools whose nodes are spot capacity, besides those the cloud's labels say."""
    return frozenset(p.strip() for p in _get("spot_node_pools").split(",") if p.strip())


def spot_price_ratio() -> float | None:
    """Return spot's price over on-demand's (0 to 1), or None when unknown (no preference for spot)."""
    raw = _get("spot_price_ratio").strip()
    if not raw:
        return None
    try:
        ratio = float(raw)
    except ValueError:
        ratio = math.nan
    if not 0 < ratio <= 1:
        raise ConfigurationError(
            f"[{SECTION}] spot_price_ratio: {raw!r} is not a number above 0 and at most 1"
        )
    return ratio


def urgent_priority() -> int:
    """Return the priority at and above which work is urgent (never on spot unless it asks)."""
    raw = _get("urgent_priority")
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"[{SECTION}] urgent_priority: {raw!r} is not an integer") from None


def preemption_grace_seconds() -> float:
    """Return how long a preemption victim's pod has to checkpoint and end (a request may ask for another)."""
    return _positive("preemption_grace_seconds")


def min_runtime_seconds() -> float:
    """Return how long a grant runs before it may be preempted (0: at once)."""
    with contextlib.suppress(ValueError):
        if float(_get("min_runtime_seconds")) == 0:
            return 0.0
    return _positive("min_runtime_seconds")


def evictions_before_on_demand() -> int:
    """Return after how many evictions a task run's next try runs on on-demand capacity only (0: never)."""
    raw = _get("evictions_before_on_demand")
    try:
        count = int(raw)
    except ValueError:
        count = -1
    if count < 0:
        raise ConfigurationError(
            f"[{SECTION}] evictions_before_on_demand: {raw!r} is not a whole number of at least 0"
        )
    return count


def autoscale_option(option: str) -> str:
    """Return one of the autoscale step's options as text, stripped; the controller checks them.

    :param option: ``scalable_node_pools``, ``autoscale_mode``, ``provisioning_class``,
        ``autoscale_namespace``, ``placeholder_priority_class`` or ``discover_node_pools``
    """
    return _get(option).strip()
