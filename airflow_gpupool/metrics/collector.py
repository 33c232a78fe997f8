"""A Prometheus collector that reads one ledger snapshot per scrape.

Metric names are a contract with the alert rules and dashboard in ``docker/`` (the dashboard's
queries are checked against these names and types in ``tests/integration/test_docker_assets.py``):

==============================================================  =================================
gauges (now)
``gpupool_gpu_capacity_milli{node_pool,model}``                 GPU compute installed (1000 per GPU)
``gpupool_gpu_allocated_milli{node_pool,model}``                granted (a MIG slice counts its share)
``gpupool_gpu_free_milli{node_pool,model}``                     capacity minus allocated
``gpupool_gpu_allocation_ratio{node_pool,model}``               allocated / capacity (0–1)
``gpupool_fragmentation_ratio``                                 FGD fragmentation / capacity (0–1)
``gpupool_queue_requests``                                      waiting requests (0 when none)
``gpupool_queue_requests_by_priority{priority}``                the same per priority (only those waiting)
``gpupool_queue_requested_gpu_milli``                           GPU compute the waiting requests ask for
``gpupool_queue_oldest_wait_seconds``                           how long the oldest waiter has waited (0: none)
``gpupool_active_grants{team,workload_class}``                  live grants (orphans included)
``gpupool_orphaned_grants``                                     grants whose lease expired while their pod ran on
``gpupool_node_heartbeat_age_seconds{node}``                    nodes that have sent a heartbeat
``gpupool_node_health{node,health}``                            1 for the node's current health
``gpupool_ledger_up``                                           1 when the ledger answered the scrape
``gpupool_quota_{nominal,held,borrowed,lent}_gpus{team,flavor}`` per stored quota (absent without
                                                                quotas): nominal, held now, held above
                                                                nominal, lent to the cohort
counters and histogram (since the ledger was created)
``gpupool_reservation_wait_seconds{outcome}``                   histogram: how long a request waited, observed
                                                                at its grant (``granted``) or timeout (``timed_out``)
``gpupool_grants_total``                                        reservations granted
``gpupool_reservation_timeouts_total``                          requests that waited past their deadline
``gpupool_lease_expiries_total``                                leases that expired unrenewed and were reaped
``gpupool_preemptions_total``                                   task tries whose pod was preempted or evicted
``gpupool_reservations_total{state}``                           ended reservations by final state
``gpupool_preempted_grants_total{team}``                        grants that ended preempted (absent before
                                                                the first)
``gpupool_preemption_lost_gpu_seconds_total{team}``             their GPUs × seconds from the newest checkpoint
                                                                the holder reported (else the grant) to the end
==============================================================  =================================

The counters and the histogram are counted from the ledger's tables
(:func:`airflow_gpupool.ledger.ledger_totals`), not kept in the exporter's memory: every
exporter of one ledger reports the same values, they survive exporter restarts, and they are
cumulative, so ``rate()`` and ``histogram_quantile()`` over them mean what they say.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_gpupool.ledger import WAIT_BUCKETS
from airflow_gpupool.metrics.agent import agent_metrics
from airflow_gpupool.redact import redact_url, scrub
from airflow_gpupool.resources import MILLI_PER_GPU

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from airflow_gpupool.ledger import Ledger, LedgerSnapshot, LedgerTotals, PreemptionLoss, QuotaUse

log = logging.getLogger(__name__)

METRIC_NAMES = (
    "gpupool_gpu_capacity_milli",
    "gpupool_gpu_allocated_milli",
    "gpupool_gpu_allocation_ratio",
    "gpupool_gpu_free_milli",
    "gpupool_fragmentation_ratio",
    "gpupool_queue_requests",
    "gpupool_queue_requests_by_priority",
    "gpupool_queue_requested_gpu_milli",
    "gpupool_queue_oldest_wait_seconds",
    "gpupool_active_grants",
    "gpupool_orphaned_grants",
    "gpupool_reservation_wait_seconds",
    "gpupool_grants_total",
    "gpupool_reservation_timeouts_total",
    "gpupool_lease_expiries_total",
    "gpupool_preemptions_total",
    "gpupool_reservations_total",
    "gpupool_node_heartbeat_age_seconds",
    "gpupool_node_health",
    "gpupool_ledger_up",
)

#: Present only where quotas are stored (``gpupool quota apply``).
QUOTA_METRIC_NAMES = (
    "gpupool_quota_nominal_gpus",
    "gpupool_quota_held_gpus",
    "gpupool_quota_borrowed_gpus",
    "gpupool_quota_lent_gpus",
)

#: Present per team once one of its grants ended preempted.
PREEMPTION_METRIC_NAMES = (
    "gpupool_preempted_grants_total",
    "gpupool_preemption_lost_gpu_seconds_total",
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


def _pool_gauges(snapshot: LedgerSnapshot) -> list[Metric]:
    """Return capacity, allocation, ratio and free compute per ``(node_pool, model)``.

    :param snapshot: a ledger snapshot
    """
    from prometheus_client.core import GaugeMetricFamily

    labels = ["node_pool", "model"]
    cap = GaugeMetricFamily("gpupool_gpu_capacity_milli", "GPU compute installed, milli-GPU", labels=labels)
    alloc = GaugeMetricFamily("gpupool_gpu_allocated_milli", "GPU compute granted, milli-GPU", labels=labels)
    ratio = GaugeMetricFamily("gpupool_gpu_allocation_ratio", "Granted share of GPU compute", labels=labels)
    free = GaugeMetricFamily("gpupool_gpu_free_milli", "GPU compute not granted, milli-GPU", labels=labels)
    for (pool, model), (c, a) in pool_usage(snapshot).items():
        cap.add_metric([pool, model], c)
        alloc.add_metric([pool, model], a)
        ratio.add_metric([pool, model], a / c if c else 0.0)
        free.add_metric([pool, model], c - a)
    frag = GaugeMetricFamily(
        "gpupool_fragmentation_ratio", "GPU compute unusable by the typical request shapes, share of capacity"
    )
    frag.add_metric([], fragmentation_ratio(snapshot))
    return [cap, alloc, ratio, free, frag]


def _queue_gauges(snapshot: LedgerSnapshot) -> list[Metric]:
    """Return the queue's gauges; the unlabelled ones are 0 (not absent) when nothing waits.

    :param snapshot: a ledger snapshot; its ``taken_at`` is "now"
    """
    from prometheus_client.core import GaugeMetricFamily

    queue = snapshot.queue
    total = GaugeMetricFamily("gpupool_queue_requests", "Reservation requests waiting in the queue")
    total.add_metric([], len(queue))
    by_priority = GaugeMetricFamily(
        "gpupool_queue_requests_by_priority", "Waiting reservation requests per priority", labels=["priority"]
    )
    for priority, n in sorted(Counter(r.request.priority for r in queue).items()):
        by_priority.add_metric([str(priority)], n)
    asked = GaugeMetricFamily(
        "gpupool_queue_requested_gpu_milli", "GPU compute the waiting requests ask for, milli-GPU"
    )
    asked.add_metric([], sum(r.request.total_gpu_milli for r in queue))
    oldest = GaugeMetricFamily(
        "gpupool_queue_oldest_wait_seconds",
        "How long the longest-waiting request has waited so far (0: none)",
    )
    oldest.add_metric([], max((max(0.0, snapshot.taken_at - r.created_at) for r in queue), default=0.0))
    return [total, by_priority, asked, oldest]


def _wait_histogram(totals: LedgerTotals) -> Metric:
    """Return the cumulative wait histogram, one series per outcome.

    :param totals: the ledger's cumulative counts
    """
    from prometheus_client.core import HistogramMetricFamily

    wait = HistogramMetricFamily(
        "gpupool_reservation_wait_seconds",
        "How long reservation requests waited: observed at their grant (granted) or their timeout (timed_out)",
        labels=["outcome"],
    )
    for outcome, hist in (("granted", totals.waited_granted), ("timed_out", totals.waited_timed_out)):
        buckets = [(str(bound), float(n)) for bound, n in zip(WAIT_BUCKETS, hist.buckets, strict=True)]
        wait.add_metric([outcome], [*buckets, ("+Inf", float(hist.count))], hist.total)
    return wait


def _counters(totals: LedgerTotals) -> list[Metric]:
    """Return the cumulative counters; each is present (0 at first) from the first scrape.

    :param totals: the ledger's cumulative counts
    """
    from prometheus_client.core import CounterMetricFamily

    def counter(name: str, doc: str, value: int) -> Metric:
        family = CounterMetricFamily(name, doc)
        family.add_metric([], value)
        return family

    ended = CounterMetricFamily("gpupool_reservations", "Ended reservations by final state", labels=["state"])
    for state, n in sorted(totals.ended.items()):
        ended.add_metric([state], n)
    return [
        counter("gpupool_grants", "Reservations granted", totals.grants),
        counter(
            "gpupool_reservation_timeouts",
            "Requests that waited past their deadline",
            totals.ended["timed_out"],
        ),
        counter(
            "gpupool_lease_expiries", "Leases that expired unrenewed and were reaped", totals.ended["expired"]
        ),
        counter("gpupool_preemptions", "Task tries whose pod was preempted or evicted", totals.preemptions),
        ended,
    ]


def ledger_metrics(snapshot: LedgerSnapshot, totals: LedgerTotals) -> list[Metric]:
    """Return every metric family except ``gpupool_ledger_up``, from one snapshot and the ledger's totals.

    :param snapshot: a ledger snapshot; its ``taken_at`` is "now" for ages and waits
    :param totals: cumulative counts, from :func:`airflow_gpupool.ledger.ledger_totals`
    """
    from prometheus_client.core import GaugeMetricFamily

    now = snapshot.taken_at
    grants = GaugeMetricFamily("gpupool_active_grants", "Live grants", labels=["team", "workload_class"])
    per_team = Counter((r.request.team, _value(r.request.workload_class)) for r in snapshot.grants)
    for (team, wclass), n in sorted(per_team.items()):
        grants.add_metric([team, wclass], n)
    orphaned = GaugeMetricFamily(
        "gpupool_orphaned_grants",
        "Grants whose lease expired while their pod ran on: held until the pod is finished, gone or deleted",
    )
    orphaned.add_metric([], sum(r.state.value == "orphaned" for r in snapshot.grants))
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
    return [
        *_pool_gauges(snapshot),
        *_queue_gauges(snapshot),
        grants,
        orphaned,
        _wait_histogram(totals),
        *_counters(totals),
        age,
        health,
    ]


def quota_metrics(uses: Sequence[QuotaUse]) -> list[Metric]:
    """Return the quota gauges, one series per stored quota (no family at all without quotas).

    :param uses: each quota beside its team's use now (:func:`~airflow_gpupool.ledger.teams.usage.quota_uses`)
    """
    from prometheus_client.core import GaugeMetricFamily

    if not uses:
        return []
    labels = ["team", "flavor"]
    families = [
        (
            GaugeMetricFamily("gpupool_quota_nominal_gpus", "The team's nominal quota", labels=labels),
            "nominal",
        ),
        (GaugeMetricFamily("gpupool_quota_held_gpus", "GPUs the team holds now", labels=labels), "held"),
        (
            GaugeMetricFamily(
                "gpupool_quota_borrowed_gpus", "GPUs the team holds above its nominal quota", labels=labels
            ),
            "borrowed",
        ),
        (
            GaugeMetricFamily(
                "gpupool_quota_lent_gpus", "The team's share of what its cohort borrows", labels=labels
            ),
            "lent",
        ),
    ]
    for use in uses:
        for family, field in families:
            family.add_metric([use.team, use.flavor], getattr(use, field))
    return [family for family, _ in families]


def preemption_metrics(losses: Mapping[str, PreemptionLoss]) -> list[Metric]:
    """Return the per-team preemption counters (families without series before any preemption).

    :param losses: per team, from :func:`~airflow_gpupool.ledger.teams.usage.preemption_losses`
    """
    from prometheus_client.core import CounterMetricFamily

    grants = CounterMetricFamily(
        "gpupool_preempted_grants", "Grants that ended preempted, per team", labels=["team"]
    )
    lost = CounterMetricFamily(
        "gpupool_preemption_lost_gpu_seconds",
        "Work lost to preemption: each preempted grant's GPUs (a MIG slice its compute share) times the "
        "seconds from its newest checkpoint reported to the ledger (its grant when none) to its end",
        labels=["team"],
    )
    for team, loss in losses.items():
        grants.add_metric([team], loss.preemptions)
        lost.add_metric([team], loss.lost_gpu_seconds)
    return [grants, lost]


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

        from airflow_gpupool.ledger import LedgerForecasts, ledger_totals, preemption_losses, quota_uses
        from airflow_gpupool.metrics.forecast import forecast_metrics

        up = GaugeMetricFamily("gpupool_ledger_up", "1 when the ledger answered this scrape")
        url: str | None = None
        try:
            ledger = self._ledger() if callable(self._ledger) else self._ledger
            url = ledger.url
            snapshot = ledger.snapshot()
            families = ledger_metrics(snapshot, ledger_totals(ledger.url))
            families += quota_metrics(quota_uses(ledger, snapshot))
            families += preemption_metrics(ledger.read(preemption_losses))
            families += forecast_metrics(snapshot, LedgerForecasts(ledger).get_many())  # metrics/forecast.py
        except Exception as e:  # any failure to read means "down" for this scrape
            # The cause goes to the log, its text scrubbed of the URL's password; no traceback,
            # whose frames' messages could quote it.
            log.error(
                "Could not read the GPU ledger %s for metrics: %s: %s",
                redact_url(url) if url else "(not opened)",
                type(e).__name__,
                scrub(str(e), url),
            )
            up.add_metric([], 0)
            yield up
            return
        yield from families
        yield from agent_metrics(snapshot)  # issue 17: the node agents' reports
        up.add_metric([], 1)
        yield up
