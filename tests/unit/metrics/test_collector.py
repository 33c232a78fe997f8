"""The Prometheus collector against a real SQLite ledger whose every figure is known (see scenario)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from airflow_gpupool.ledger import HeldSpan, Ledger, allocation_series
from airflow_gpupool.metrics import METRIC_NAMES, GpuPoolCollector
from airflow_gpupool.metrics.agent import AGENT_METRIC_NAMES
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node
from tests.unit.metrics.scenario import T0, Pool, build_pool

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(source: Ledger | object) -> Samples:
    """Expose through a registry, then parse the text as Prometheus would."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuPoolCollector(source))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    built = build_pool(f"sqlite:///{tmp_path_factory.mktemp('metrics')}/ledger.db")
    yield built
    built.ledger.close()


def test_every_sample_matches_the_ledger(pool: Pool) -> None:
    # The node agents' metrics have their own test (tests/unit/metrics/test_agent_metrics.py).
    samples = {k: v for k, v in scrape(pool.ledger).items() if k[0] not in AGENT_METRIC_NAMES}
    pools = [("infer", "T4"), ("mig", "A100"), ("train", "A100")]
    capacity = {"infer": 1000, "mig": 1000, "train": 2000}
    # train: one whole A100 (1000) + 0.25 (250); mig: one 3g.40gb slice = round(3000 / 7) = 429.
    allocated = {"infer": 0, "mig": 429, "train": 1250}
    expected: Samples = {}
    for node_pool, model in pools:
        labels = (("model", model), ("node_pool", node_pool))
        c, a = capacity[node_pool], allocated[node_pool]
        expected[("gpupool_gpu_capacity_milli", labels)] = c
        expected[("gpupool_gpu_allocated_milli", labels)] = a
        expected[("gpupool_gpu_free_milli", labels)] = c - a
        expected[("gpupool_gpu_allocation_ratio", labels)] = a / c
    # Typical shapes: 2 GPU (weight 2), 1 A100, 0.25, 0.429 (1 each), total 5. Fragments:
    # t4-1 (1000 free): A100-only and 2-GPU shapes cannot use it -> (1000 + 2*1000)/5 = 600;
    # a100-1 (750 free on GPU 1): whole-GPU and 2-GPU shapes cannot -> (750 + 2*750)/5 = 450;
    # a100-mig: a partitioned GPU has no free milli -> 0. (600 + 450) / 4000.
    expected[("gpupool_fragmentation_ratio", ())] = 1050 / 4000
    expected[("gpupool_queue_requests", ())] = 2
    expected[("gpupool_queue_requests_by_priority", (("priority", "0"),))] = 1
    expected[("gpupool_queue_requests_by_priority", (("priority", "5"),))] = 1
    expected[("gpupool_queue_requested_gpu_milli", ())] = 4000  # two requests of 2 GPUs
    expected[("gpupool_queue_oldest_wait_seconds", ())] = 120  # wide
    # Cumulative waits. Granted at once (0 s): released, expired (the T4 was free again), train,
    # embed, mig; cancelled waited behind timed_out and was never granted. Timed out: timed_out,
    # reaped 20 s after its request.
    bounds = (
        "1.0",
        "5.0",
        "10.0",
        "30.0",
        "60.0",
        "120.0",
        "300.0",
        "600.0",
        "1800.0",
        "3600.0",
        "14400.0",
        "+Inf",
    )
    for le in bounds:
        expected[("gpupool_reservation_wait_seconds_bucket", (("le", le), ("outcome", "granted")))] = 5
        timed_out = 0 if le in ("1.0", "5.0", "10.0") else 1
        expected[("gpupool_reservation_wait_seconds_bucket", (("le", le), ("outcome", "timed_out")))] = (
            timed_out
        )
    expected[("gpupool_reservation_wait_seconds_count", (("outcome", "granted"),))] = 5
    expected[("gpupool_reservation_wait_seconds_sum", (("outcome", "granted"),))] = 0
    expected[("gpupool_reservation_wait_seconds_count", (("outcome", "timed_out"),))] = 1
    expected[("gpupool_reservation_wait_seconds_sum", (("outcome", "timed_out"),))] = 20
    expected[("gpupool_grants_total", ())] = 5
    expected[("gpupool_reservation_timeouts_total", ())] = 1
    expected[("gpupool_lease_expiries_total", ())] = 1
    expected[("gpupool_preemptions_total", ())] = 0
    expected[("gpupool_active_grants", (("team", "nlp"), ("workload_class", "batch")))] = 2
    expected[("gpupool_active_grants", (("team", "vision"), ("workload_class", "training")))] = 1
    for state in ("released", "expired", "timed_out", "cancelled"):
        expected[("gpupool_reservations_total", (("state", state),))] = 1
    expected[("gpupool_reservations_total", (("state", "preempted"),))] = 0
    expected[("gpupool_node_heartbeat_age_seconds", (("node", "a100-1"),))] = 30
    expected[("gpupool_node_health", (("health", "healthy"), ("node", "a100-1")))] = 1
    expected[("gpupool_node_health", (("health", "healthy"), ("node", "a100-mig")))] = 1
    expected[("gpupool_node_health", (("health", "quarantined"), ("node", "t4-1")))] = 1
    expected[("gpupool_ledger_up", ())] = 1
    expected[("gpupool_orphaned_grants", ())] = 0
    assert samples == pytest.approx(expected)


def test_every_contract_name_is_exposed(pool: Pool) -> None:
    names = {name for name, _ in scrape(pool.ledger)}
    for metric in METRIC_NAMES:
        assert metric in names or f"{metric}_count" in names, metric


def test_a_ledger_that_cannot_be_read_reports_only_down(tmp_path: Path) -> None:
    def broken() -> Ledger:
        # A database file that was never created: the snapshot fails on its schema check.
        return Ledger(f"sqlite:///{tmp_path}/missing.db")

    assert scrape(broken) == {("gpupool_ledger_up", ()): 0}


def test_an_empty_ledger_reports_zeros_not_absent_series(tmp_path: Path) -> None:
    with Ledger.create(f"sqlite:///{tmp_path}/empty.db") as ledger:
        samples = scrape(ledger)
    assert samples[("gpupool_fragmentation_ratio", ())] == 0
    # Nothing waiting, nothing counted yet: the series are there, at 0 ("No data" is not 0).
    for name in (
        "gpupool_queue_requests",
        "gpupool_queue_requested_gpu_milli",
        "gpupool_queue_oldest_wait_seconds",
    ):
        assert samples[(name, ())] == 0
    for name in (
        "gpupool_grants_total",
        "gpupool_reservation_timeouts_total",
        "gpupool_lease_expiries_total",
    ):
        assert samples[(name, ())] == 0
    assert samples[("gpupool_preemptions_total", ())] == 0
    assert samples[("gpupool_reservation_wait_seconds_count", (("outcome", "granted"),))] == 0
    assert samples[("gpupool_reservations_total", (("state", "expired"),))] == 0
    assert samples[("gpupool_ledger_up", ())] == 1


@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        pytest.param([], [(0, 0.0), (100, 0.0)], id="nothing-held"),
        pytest.param(
            [HeldSpan(-50, 40, 1000), HeldSpan(20, None, 500)],
            [(0, 0.5), (20, 0.5), (20, 0.75), (40, 0.75), (40, 0.25), (100, 0.25)],
            id="held-before-and-ended-inside",
        ),
        pytest.param([HeldSpan(-50, -10, 1000)], [(0, 0.0), (100, 0.0)], id="ended-before-the-window"),
    ],
)
def test_allocation_series_steps_at_grants_and_ends(
    spans: list[HeldSpan], expected: list[tuple[float, float]]
) -> None:
    assert allocation_series(spans, 2000, 0, 100) == expected


def test_the_wait_histogram_is_cumulative_and_observed_at_grant(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    with Ledger.create(f"sqlite:///{tmp_path}/wait.db", clock=clock) as ledger:
        ledger.upsert_nodes([node("n1", gpus=1, model="A100")])
        first = ledger.reserve(GpuRequest(gpus=1), "first@w", ttl=3600)
        ledger.reserve(GpuRequest(gpus=1), "second@w", ttl=3600, timeout=3600)
        clock.advance(45)
        ledger.release(first.id)  # serves the queue: the second request is granted after 45 s
        clock.advance(600)
        granted = {
            labels: value
            for (name, labels), value in scrape(ledger).items()
            if name.startswith("gpupool_reservation_wait_seconds") and ("outcome", "granted") in labels
        }
        assert granted[(("le", "30.0"), ("outcome", "granted"))] == 1  # the first, at once
        assert granted[(("le", "60.0"), ("outcome", "granted"))] == 2  # the second, 45 s
        # Waiting longer changes nothing: waits are observed once, at the grant.
        clock.advance(3600)
        assert scrape(ledger)[("gpupool_reservation_wait_seconds_sum", (("outcome", "granted"),))] == 45
        assert scrape(ledger)[("gpupool_grants_total", ())] == 2


def test_quota_gauges_show_each_teams_nominal_held_borrowed_and_lent(tmp_path: Path) -> None:
    import yaml

    from airflow_gpupool.governance.quotas import parse_quota_file
    from airflow_gpupool.ledger import LedgerQuotas
    from airflow_gpupool.metrics import QUOTA_METRIC_NAMES

    quotas = """
teams:
  - {name: vision, cohort: lab, quotas: [{flavor: {pool: a100}, nominal: 2}]}
  - {name: nlp, cohort: lab, quotas: [{flavor: {pool: a100}, nominal: 4, lending_limit: 3}]}
"""
    with Ledger.create(f"sqlite:///{tmp_path}/quotas.db") as ledger:
        ledger.upsert_nodes([node("a1", gpus=8, pool="a100")])
        assert not {name for name, _ in scrape(ledger)} & set(QUOTA_METRIC_NAMES)  # no quota: no series
        LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load(quotas)))
        ledger.reserve(GpuRequest(gpus=3, team="vision"), "v", reservation_id="v1")  # 1 borrowed
        ledger.reserve(GpuRequest(gpu_milli=500, team="nlp"), "n", reservation_id="n1")
        samples = scrape(ledger)
    quota = {k: v for k, v in samples.items() if k[0] in QUOTA_METRIC_NAMES}
    vision, nlp = (("flavor", "pool:a100"), ("team", "vision")), (("flavor", "pool:a100"), ("team", "nlp"))
    assert quota == {
        ("gpupool_quota_nominal_gpus", vision): 2,
        ("gpupool_quota_held_gpus", vision): 3,
        ("gpupool_quota_borrowed_gpus", vision): 1,
        ("gpupool_quota_lent_gpus", vision): 0,
        ("gpupool_quota_nominal_gpus", nlp): 4,
        ("gpupool_quota_held_gpus", nlp): 0.5,
        ("gpupool_quota_borrowed_gpus", nlp): 0,
        ("gpupool_quota_lent_gpus", nlp): 1,  # the cohort borrows 1, all of it nlp's
    }


def test_preemptions_count_preempted_and_evicted_tries(tmp_path: Path) -> None:
    from airflow_gpupool.exceptions import FailureClass
    from airflow_gpupool.ledger import TaskAttempt, TaskAttempts

    with Ledger.create(f"sqlite:///{tmp_path}/tries.db") as ledger:
        attempts = TaskAttempts(ledger)
        for n, failure in enumerate(
            [FailureClass.PREEMPTED, FailureClass.EVICTED, FailureClass.OUT_OF_MEMORY], 1
        ):
            attempts.record(
                TaskAttempt(
                    "d/t/r/map--1", n, f"gp-{n}", failure.value, "retry", GpuRequest(gpus=1), "failed"
                )
            )
        assert scrape(ledger)[("gpupool_preemptions_total", ())] == 2


def test_preemptions_and_the_work_they_lost_per_team(tmp_path: Path) -> None:
    """Two grants preempted through the ledger: one released in its grace, one ended at its deadline.

    vision's 4 A100 (granted at T0, checkpoint reported at T0+400) is released at T0+750:
    4 × 350 s = 1,400 GPU-s lost. nlp's 3g.40gb MIG slice (3/7 of an A100: 429 milli, no
    checkpoint) ends when the ledger is reaped past its deadline, T0+821: 0.429 × 821 s = 352.209 GPU-s.
    """
    from airflow_gpupool.ledger import LedgerHistory, ReservationState
    from airflow_gpupool.metrics import PREEMPTION_METRIC_NAMES

    clock = FakeClock(T0)
    url = f"sqlite:///{tmp_path}/preempted.db"
    with Ledger.create(url, clock=clock, min_runtime_seconds=300, preemption_grace_seconds=120) as ledger:
        ledger.upsert_nodes(
            [
                node("a1", gpus=4, model="A100", pool="a100"),
                node("m1", gpus=1, model="A100", pool="mig", mig={0: ["3g.40gb", "3g.40gb"]}),
            ]
        )
        ledger.reserve(
            GpuRequest(gpus=4, team="vision", preemptible=True), "v", reservation_id="v-train", ttl=3600
        )
        ledger.reserve(
            GpuRequest(mig_profile="3g.40gb", team="nlp", preemptible=True),
            "n",
            reservation_id="n-mig",
            ttl=3600,
        )
        ledger.reserve(GpuRequest(mig_profile="3g.40gb", team="nlp"), "n2", reservation_id="n-keep", ttl=3600)
        assert not {name for name, _ in scrape(ledger)} & set(PREEMPTION_METRIC_NAMES)
        clock.advance(400)
        assert ledger.note_checkpoint("v-train", clock.now)
        clock.advance(300)
        ledger.reserve(
            GpuRequest(gpus=2, team="ops", priority=100), "o", reservation_id="urgent", timeout=3600
        )
        ledger.reserve(
            GpuRequest(mig_profile="3g.40gb", team="ops", priority=100),
            "o2",
            reservation_id="urgent-mig",
            timeout=3600,
        )
        assert {ledger.get(r).state for r in ("v-train", "n-mig")} == {ReservationState.PREEMPTING}
        clock.advance(50)
        ledger.release("v-train")
        clock.advance(71)
        ledger.reap()
        assert {ledger.get(r).state for r in ("v-train", "n-mig")} == {ReservationState.PREEMPTED}
        samples = {k: v for k, v in scrape(ledger).items() if k[0] in PREEMPTION_METRIC_NAMES}
        # Counters never go down: pruning the history carries what its rows counted over.
        clock.advance(86400)
        assert LedgerHistory(ledger).prune(1) == 2  # the two victims' rows are gone
        assert {k: v for k, v in scrape(ledger).items() if k[0] in PREEMPTION_METRIC_NAMES} == samples
    assert samples == pytest.approx(
        {
            ("gpupool_preempted_grants_total", (("team", "nlp"),)): 1,
            ("gpupool_preempted_grants_total", (("team", "vision"),)): 1,
            ("gpupool_preemption_lost_gpu_seconds_total", (("team", "nlp"),)): 0.429 * 821,
            ("gpupool_preemption_lost_gpu_seconds_total", (("team", "vision"),)): 4 * 350,
        }
    )
