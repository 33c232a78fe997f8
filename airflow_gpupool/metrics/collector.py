"""A Prometheus collector that reads one ledger snapshot per scrape.

Metric names are a contract with the alert rules and dashboard in ``docker/``:

==========================================================  =====================================
``gpupool_gpu_capacity_milli{node_pool,model}``             GPU compute installed (1000 per GPU)
``gpupool_gpu_allocated_milli{node_pool,model}``            granted (a MIG slice counts its share)
``gpupool_gpu_free_milli{node_pool,model}``                 capacity minus allocated
``gpupool_gpu_allocation_ratio{node_pool,model}``           allocated / capacity (0–1)
``gpupool_fragmentation_ratio``                             FGD fragmentation / capacity (0–1)
``gpupool_queue_depth{priority}``                           waiting requests; ``sum()`` for total
``gpupool_queue_wait_seconds``                              histogram of current waiters' wait
``gpupool_grants{team,workload_class}``                     live grants (orphans included)
``gpupool_orphaned_grants``                                 grants whose lease expired while their pod ran on
``gpupool_reservations_total{state}``                       ended reservations by final state
``gpupool_node_heartbeat_age_seconds{node}``                nodes that have sent a heartbeat
``gpupool_node_health{node,health}``                        1 for the node's current health
``gpupool_ledger_up``                                       1 when the ledger answered the scrape
==========================================================  =====================================

``gpupool_reservations_total{state="expired"}`` counts leases that expired without renewal:
it is the reap (lease expiry) counter, and its ``rate()`` is what a "slices are being
reaped" alert watches. ``state="timed_out"`` counts requests that waited past their
deadline. The counters are counted from the ledger's reservations table, so every
exporter of one ledger reports the same values, and they survive exporter restarts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from airflow_gpupool.metrics.agent import agent_metrics
from airflow_gpupool.resources import MILLI_PER_GPU

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from airflow_gpupool.ledger import Ledger, LedgerSnapshot

log = logging.getLogger(__name__)

WAIT_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 4 * 3600.0)

METRIC_NAMES = (
    "gpupool_gpu_capacity_milli",
    "gpupool_gpu_allocated_milli",
    "gpupool_gpu_allocation_ratio",
    "gpupool_gpu_free_milli",
    "gpupool_fragmentation_ratio",
    "gpupool_queue_depth",
    "gpupool_queue_wait_seconds",
    "gpupool_grants",
    "gpupool_orphaned_grants",
    "gpupool_reservations_total",
    "gpupool_node_heartbeat_age_seconds",
    "gpupool_node_health",
    "gpupool_ledger_up",
)

# Shapes that score fragmentation when nothing is granted or waiting: a whole GPU, a half, a quarter.
_DEFAULT_SHAPES = ((0, MILLI_PER_GPU, 1), (0, MILLI_PER_GPU // 2, 1), (0, MILLI_PER_GPU // 4, 1))


def fragmentation_ratio(snapshot: LedgerSnapshot) -> float:
    """Return the cluster's fragmentation as a share of its GPU capacity (0–1).

    The typical shapes are those of the live grants and the queue (FGD's workload
    estimate), or a whole, half and quarter GPU when both are empty.

    :param snapshot: a ledger snapshot
    """
    from airflow_gpupool.placement.frag import Fragmentation, TypicalShape, shape_key, typical_shapes
    from airflow_gpupool.placement.table import NodeTable

    cluster = snapshot.cluster
    capacity = cluster.gpu_capacity_milli
    if capacity <= 0:
        return 0.0
    keys = [shape_key(r.request) for r in (*snapshot.grants, *snapshot.queue)]
    shapes = typical_shapes(keys) if keys else tuple(TypicalShape(c, m, n) for c, m, n in _DEFAULT_SHAPES)
    frag = Fragmentation(shapes)
    table = NodeTable()
    table.sync(cluster)
    frag.refresh(table, None)
    if not frag.weight_total:
        return 0.0
    return float(frag.value.sum()) / frag.weight_total / capacity


def pool_usage(snapshot: LedgerSnapshot) -> dict[tuple[str, str], tuple[int, int]]:
    """Return ``(capacity, allocated)`` milli-GPU for each ``(node_pool, model)``.

    :param snapshot: a ledger snapshot
    """
    capacity: Counter[tuple[str, str]] = Counter()
    allocated: Counter[tuple[str, str]] = Counter()
    node_model: dict[str, str] = {}
    for node in snapshot.nodes:
        for gpu in node.gpus:
            capacity[(node.node_pool, str(gpu["model"]))] += MILLI_PER_GPU
            node_model.setdefault(node.name, str(gpu["model"]))
    for r in snapshot.grants:
        if r.grant is None:
            continue
        model = r.grant.gpu_model or node_model.get(r.grant.node, "unknown")
        allocated[(r.grant.node_pool, model)] += r.request.total_gpu_milli
    keys = sorted(set(capacity) | set(allocated))
    return {k: (capacity[k], allocated[k]) for k in keys}


def _histogram(values: Iterable[float], buckets: tuple[float, ...]) -> tuple[list[tuple[str, float]], float]:
    ordered = sorted(values)
    out = [(str(float(b)), float(sum(1 for v in ordered if v <= b))) for b in buckets]
    out.append(("+Inf", float(len(ordered))))
    return out, float(sum(ordered))


def ledger_metrics(snapshot: LedgerSnapshot, counts: dict[str, int]) -> list[Metric]:
    """Return every metric family except ``gpupool_ledger_up``, from one snapshot.

    :param snapshot: a ledger snapshot; its ``taken_at`` is "now" for ages and waits
    :param counts: ended reservations by state, from :func:`airflow_gpupool.metrics.stats.reservation_counts`
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    now = snapshot.taken_at
    pool_labels = ["node_pool", "model"]
    cap = GaugeMetricFamily(
        "gpupool_gpu_capacity_milli", "GPU compute installed, milli-GPU", labels=pool_labels
    )
    alloc = GaugeMetricFamily(
        "gpupool_gpu_allocated_milli", "GPU compute granted, milli-GPU", labels=pool_labels
    )
    ratio = GaugeMetricFamily(
        "gpupool_gpu_allocation_ratio", "Granted share of GPU compute", labels=pool_labels
    )
    free = GaugeMetricFamily(
        "gpupool_gpu_free_milli", "GPU compute not granted, milli-GPU", labels=pool_labels
    )
    for (pool, model), (c, a) in pool_usage(snapshot).items():
        cap.add_metric([pool, model], c)
        alloc.add_metric([pool, model], a)
        ratio.add_metric([pool, model], a / c if c else 0.0)
        free.add_metric([pool, model], c - a)
    frag = GaugeMetricFamily(
        "gpupool_fragmentation_ratio", "GPU compute unusable by the typical request shapes, share of capacity"
    )
    frag.add_metric([], fragmentation_ratio(snapshot))

    depth = GaugeMetricFamily("gpupool_queue_depth", "Waiting reservations by priority", labels=["priority"])
    for priority, n in sorted(Counter(r.request.priority for r in snapshot.queue).items()):
        depth.add_metric([str(priority)], n)
    buckets, total = _histogram((max(0.0, now - r.created_at) for r in snapshot.queue), WAIT_BUCKETS)
    wait = HistogramMetricFamily("gpupool_queue_wait_seconds", "How long current waiters have waited so far")
    wait.add_metric([], buckets, total)

    grants = GaugeMetricFamily("gpupool_grants", "Live grants", labels=["team", "workload_class"])
    per_team = Counter((r.request.team, _value(r.request.workload_class)) for r in snapshot.grants)
    for (team, wclass), n in sorted(per_team.items()):
        grants.add_metric([team, wclass], n)
    orphaned = GaugeMetricFamily(
        "gpupool_orphaned_grants",
        "Grants whose lease expired while their pod ran on: held until the pod is finished, gone or deleted",
    )
    orphaned.add_metric([], sum(r.state.value == "orphaned" for r in snapshot.grants))
    ended = CounterMetricFamily(
        "gpupool_reservations",
        "Ended reservations by final state (expired: lease expiries, i.e. reaps; timed_out: waited past deadline)",
        labels=["state"],
    )
    for state, n in sorted(counts.items()):
        ended.add_metric([state], n)

    age = GaugeMetricFamily(
        "gpupool_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat", labels=["node"]
    )
    health = GaugeMetricFamily(
        "gpupool_node_health", "1 for the node's current health", labels=["node", "health"]
    )
    for node in snapshot.nodes:
        if node.heartbeat_at is not None:
            age.add_metric([node.name], max(0.0, now - node.heartbeat_at))
        health.add_metric([node.name, node.health], 1)
    return [cap, alloc, ratio, free, frag, depth, wait, grants, orphaned, ended, age, health]


def _value(item: Any) -> str:
    return str(getattr(item, "value", item))


class GpuPoolCollector:
    """Collect the ledger's metrics on each scrape (register it in a ``CollectorRegistry``).

    A ledger that cannot be read yields only ``gpupool_ledger_up 0``, so the scrape itself
    succeeds and the alert on ``gpupool_ledger_up`` fires.

    :param ledger: the ledger to read, or a function returning it (called on each scrape)
    """

    def __init__(self, ledger: Ledger | Callable[[], Ledger]) -> None:
        self._ledger = ledger

    def describe(self) -> list[Metric]:
        """Return nothing, so registering does not read the ledger."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Read one snapshot and yield every metric family."""
        from prometheus_client.core import GaugeMetricFamily

        from airflow_gpupool.metrics.stats import reservation_counts

        up = GaugeMetricFamily("gpupool_ledger_up", "1 when the ledger answered this scrape")
        try:
            ledger = self._ledger() if callable(self._ledger) else self._ledger
            snapshot = ledger.snapshot()
            families = ledger_metrics(snapshot, reservation_counts(ledger.url))
        except Exception:
            # Any failure to read means "down" for this scrape; the cause goes to the log.
            log.exception("Could not read the GPU ledger for metrics")
            up.add_metric([], 0)
            yield up
            return
        yield from families
        yield from agent_metrics(snapshot)  # issue 17: the node agents' reports
        up.add_metric([], 1)
        yield up
