"""The Prometheus collector against a real SQLite ledger whose every figure is known (see scenario)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from airflow_gpupool.ledger import Ledger
from airflow_gpupool.metrics import METRIC_NAMES, GpuPoolCollector
from airflow_gpupool.metrics.agent import AGENT_METRIC_NAMES
from airflow_gpupool.metrics.stats import HeldSpan, allocation_series
from tests.unit.metrics.scenario import Pool, build_pool

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
    expected[("gpupool_queue_depth", (("priority", "0"),))] = 1
    expected[("gpupool_queue_depth", (("priority", "5"),))] = 1
    # Waiters: wide for 120 s, wide2 for 20 s.
    for le, count in [("10.0", 0), ("30.0", 1), ("60.0", 1), ("120.0", 2), ("300.0", 2), ("600.0", 2),
                      ("1800.0", 2), ("3600.0", 2), ("14400.0", 2), ("+Inf", 2)]:  # fmt: skip
        expected[("gpupool_queue_wait_seconds_bucket", (("le", le),))] = count
    expected[("gpupool_queue_wait_seconds_count", ())] = 2
    expected[("gpupool_queue_wait_seconds_sum", ())] = 140
    expected[("gpupool_grants", (("team", "nlp"), ("workload_class", "batch")))] = 2
    expected[("gpupool_grants", (("team", "vision"), ("workload_class", "training")))] = 1
    for state in ("released", "expired", "timed_out", "cancelled"):
        expected[("gpupool_reservations_total", (("state", state),))] = 1
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


def test_an_empty_ledger_has_no_fragmentation_and_no_queue(tmp_path: Path) -> None:
    with Ledger.create(f"sqlite:///{tmp_path}/empty.db") as ledger:
        samples = scrape(ledger)
    assert samples[("gpupool_fragmentation_ratio", ())] == 0
    assert samples[("gpupool_queue_wait_seconds_count", ())] == 0
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
