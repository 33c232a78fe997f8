"""The monitoring assets in ``docker/``: the exported metrics, alert rules and Grafana dashboard.

The files are parsed and checked for structure and exact names (metrics, labels, alerts,
panels; the image, compose stack and manifests are ``test_deploy_assets.py``'s). ``promtool``
checks and unit-tests the alert rules where it is installed (Debian: ``apt-get install
prometheus``); without it the Python checks still run, and under ``CI=true`` they are the whole
check rather than a skip.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.skips import skip_or_fail

DOCKER = Path(__file__).resolve().parents[2] / "docker"
RULES = DOCKER / "prometheus" / "rules.yaml"


def _agent_reported(url: str) -> Any:
    """A ledger whose one node's fake agent reported twice, 1,801 s apart: a leak and an idle grant."""
    from airflow_gpupool.agent.collect import NvmlCollector
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.resources import GpuRequest
    from airflow_gpupool.testing.fake_nvml import FakeNvml, node_spec
    from tests.ledger_fixtures import FakeClock, node

    clock = FakeClock()
    ledger = Ledger.create(url, clock=clock, policy="bestfit")
    ledger.upsert_nodes([node("t4-0", gpus=2, pool="infer")])
    held = ledger.reserve(GpuRequest(gpus=1, team="nlp"), "t", reservation_id="gp-idle", ttl=7200)
    assert held.grant is not None
    spec = node_spec("t4-0", 2)
    spec["gpus"][1 - held.grant.gpu_indices[0]]["processes"] = [{"pid": 77, "memory_mib": 2048}]
    fake = FakeNvml(spec)
    collector = NvmlCollector(fake, "t4-0", pod_uid_of=fake.pod_uid_of, clock=clock)
    collector.open()
    for _ in range(2):
        ledger.record_report(collector.sample(30.0), leak_grace_seconds=60)
        clock.advance(1801)
    return ledger


def _preempted(url: str) -> Any:
    """A ledger where an urgent request preempted a preemptible grant, which ended preempted."""
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.resources import GpuRequest
    from tests.ledger_fixtures import FakeClock, node

    clock = FakeClock()
    ledger = Ledger.create(url, clock=clock, min_runtime_seconds=60, preemption_grace_seconds=30)
    ledger.upsert_nodes([node("a1", gpus=2, pool="a100")])
    ledger.reserve(GpuRequest(gpus=2, team="vision", preemptible=True), "v", reservation_id="v", ttl=3600)
    clock.advance(120)
    ledger.reserve(GpuRequest(gpus=1, team="ops", priority=100), "o", reservation_id="o", timeout=600)
    ledger.release("v")
    assert ledger.get("v").state.value == "preempted"
    return ledger


@functools.cache
def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """Return every sample name the exporter writes, with its family's type and its labels.

    Read from real scrapes: of the scenario ledger (tests/unit/metrics/scenario.py), of a
    ledger a fake node agent reported to (a leak past its grace, an idle grant), and of one
    where a grant was preempted (the per-team preemption counters), each also compared with an empty pod list
    (the drift gauge), so the assets
    are checked against what the exporter exports, not against a list kept beside it.
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from airflow_gpupool.metrics import GpuPoolCollector, LedgerDriftCollector
    from tests.unit.metrics.scenario import build_pool

    texts = []
    with tempfile.TemporaryDirectory() as tmp:
        pool = build_pool(f"sqlite:///{tmp}/ledger.db")
        for ledger in (
            pool.ledger,
            _agent_reported(f"sqlite:///{tmp}/agent.db"),
            _preempted(f"sqlite:///{tmp}/preempted.db"),
        ):
            registry = CollectorRegistry(auto_describe=False)
            registry.register(GpuPoolCollector(ledger))
            registry.register(LedgerDriftCollector(ledger, list))  # no pods: each node's drift is its grants
            texts.append(generate_latest(registry).decode())
            ledger.close()
    text = "".join(texts)
    found: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                found.setdefault(sample.name, (family.type, set()))[1].update(sample.labels)
    return {name: (kind, frozenset(labels)) for name, (kind, labels) in found.items()}


RESERVATION_STATES = {"expired", "timed_out", "released", "cancelled"}

_PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_GRAFANA_VARIABLE = re.compile(r"\$(?:__\w+|\{\w+\}|\w+)")


def metric_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """Return each metric a PromQL expression selects, with the label names it matches on.

    Functions and aggregations are identifiers followed by ``(``; grouping clauses, range
    durations and keywords are not metrics. Good enough for the expressions these assets use,
    which is all it has to judge.
    """
    text = _GRAFANA_VARIABLE.sub("1m", expr)
    selectors: list[tuple[str, set[str]]] = []
    # Label matchers first, with their metric, so their names and values are not read as metrics.
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}", text):
        labels = {
            part.split("=")[0].rstrip("!~").strip()
            for part in _STRING.sub('""', m.group(2)).split(",")
            if part.strip()
        }
        selectors.append((m.group(1) or "", labels))
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = _STRING.sub(" ", text)
    bare = [
        m.group(0)
        for m in _IDENT.finditer(text)
        if m.group(0) not in _PROMQL_KEYWORDS
        and not text[m.end() :].lstrip().startswith("(")
        and not text[: m.start()].rstrip().endswith(tuple("0123456789."))
    ]
    named = {name for name, _ in selectors}
    selectors.extend((name, set()) for name in bare if name not in named)
    return selectors


def assert_known_metrics(expr: str) -> set[str]:
    """Assert an expression selects only the exporter's metrics, on their labels; return them."""
    selectors = metric_selectors(expr)
    assert selectors, f"no metric in {expr!r}"
    metrics = exported()
    for name, labels in selectors:
        assert name in metrics, f"{expr!r} uses {name!r}, not a gpupool metric"
        known = metrics[name][1]
        assert labels <= known, f"{expr!r}: {name} has no label {sorted(labels - known)}"
    grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
    known_labels = set().union(*(metrics[name][1] for name, _ in selectors))
    for group in grouped:
        labels = {label.strip() for label in group.split(",") if label.strip()}
        assert labels <= known_labels, f"{expr!r} groups by {sorted(labels - known_labels)}"
    return {name for name, _ in selectors}


_RATE = re.compile(r"\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{[^}]*\})?\s*\[")


def assert_types_fit(expr: str) -> None:
    """Assert each metric is used as its exported type allows.

    Counters and histogram series only under ``rate()``/``increase()`` (their raw values count
    since the ledger was created); gauges never there (a gauge's rate means nothing);
    ``histogram_quantile()`` over the rate of a histogram's ``_bucket``, summed by ``le``.
    """
    metrics = exported()
    rated = set(_RATE.findall(expr))
    for name, _ in metric_selectors(expr):
        kind = metrics[name][0]
        if name in rated:
            assert kind in ("counter", "histogram"), f"{expr!r}: rate() of the {kind} {name}"
        elif not expr.startswith("absent("):
            assert kind == "gauge", f"{expr!r}: the {kind} {name} is used without rate()"
    if "histogram_quantile(" in expr:
        buckets = [n for n in rated if n.endswith("_bucket") and metrics[n][0] == "histogram"]
        assert buckets, f"{expr!r}: histogram_quantile() needs the rate of a histogram's _bucket"
        assert re.search(r"\bby\s*\([^)]*\ble\b", expr), f"{expr!r}: sum the buckets by (le)"


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        (
            "histogram_quantile(0.5, sum by (le) (rate(gpupool_queue_requests[5m])))",
            "rate\\(\\) of the gauge",
        ),
        ("gpupool_grants_total > 3", "the counter gpupool_grants_total is used without rate"),
        ("histogram_quantile(0.5, rate(gpupool_reservation_wait_seconds_bucket[5m]))", "sum the buckets by"),
        (
            "histogram_quantile(0.5, sum by (le) (rate(gpupool_grants_total[5m])))",
            "needs the rate of a histogram",
        ),
    ],
    ids=["rate-of-gauge", "raw-counter", "quantile-without-le", "quantile-of-counter"],
)
def test_a_query_that_misuses_a_type_is_caught(expr: str, problem: str) -> None:
    with pytest.raises(AssertionError, match=problem):
        assert_types_fit(expr)


def test_the_exported_types_are_the_documented_ones() -> None:
    metrics = exported()
    assert metrics["gpupool_reservation_wait_seconds_bucket"] == ("histogram", frozenset({"le", "outcome"}))
    for counter in (
        "gpupool_grants_total",
        "gpupool_reservation_timeouts_total",
        "gpupool_lease_expiries_total",
    ):
        assert metrics[counter] == ("counter", frozenset())
    assert metrics["gpupool_reservations_total"] == ("counter", frozenset({"state"}))
    for counter in ("gpupool_preempted_grants_total", "gpupool_preemption_lost_gpu_seconds_total"):
        assert metrics[counter] == ("counter", frozenset({"team"}))
    assert metrics["gpupool_queue_requests"] == ("gauge", frozenset())


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("gpupool_gpu_allocation_ratio > 0.9", [("gpupool_gpu_allocation_ratio", set())]),
        ('gpupool_node_health{health="quarantined"} == 1', [("gpupool_node_health", {"health"})]),
        (
            "histogram_quantile(0.95, sum by (le) (rate(gpupool_reservation_wait_seconds_bucket[$__rate_interval])))",
            [("gpupool_reservation_wait_seconds_bucket", set())],
        ),
        ("sum(up) > 10", [("up", set())]),
        ("absent(gpupool_ledger_up) or vector(0)", [("gpupool_ledger_up", set())]),
    ],
    ids=["comparison", "matcher", "histogram", "foreign-metric", "functions"],
)
def test_metric_selectors(expr: str, expected: list[tuple[str, set[str]]]) -> None:
    assert metric_selectors(expr) == expected


def test_an_unknown_metric_or_label_is_caught() -> None:
    with pytest.raises(AssertionError, match="'up', not a gpupool metric"):
        assert_known_metrics("sum(up) > 10")
    with pytest.raises(AssertionError, match=r"has no label \['pool'\]"):
        assert_known_metrics('gpupool_gpu_free_milli{pool="a100"}')


# --- Prometheus alert rules ---------------------------------------------------------------

_DURATION = re.compile(r"^(?:\d+(?:ms|[smhdwy]))+$")


def _rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"}
    rules: dict[str, dict[str, Any]] = {}
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"]
        for rule in group["rules"]:
            assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
            assert rule["alert"] not in rules, f"duplicate alert {rule['alert']}"
            rules[rule["alert"]] = rule
    return rules


@pytest.mark.parametrize(
    ("alert", "expr", "for_", "severity"),
    [
        ("GpuPoolAllocationHigh", "gpupool_gpu_allocation_ratio > 0.9", "5m", "warning"),
        ("GpuPoolQueueBacklog", "gpupool_queue_requests > 10", "3m", "warning"),
        # Heartbeats every 30 s: 3 missed is an age past 90 s.
        ("GpuPoolNodeHeartbeatMissing", "gpupool_node_heartbeat_age_seconds > 90", "0s", "warning"),
        ("GpuPoolNodeQuarantined", 'gpupool_node_health{health="quarantined"} == 1', "10m", "warning"),
        ("GpuPoolLedgerDown", "gpupool_ledger_up == 0", "2m", "critical"),
        ("GpuPoolMetricsAbsent", "absent(gpupool_ledger_up)", "5m", "critical"),
        (
            "GpuPoolGpuUtilizationHigh",
            "avg by (node_pool) (gpupool_gpu_utilization_ratio) > 0.9",
            "5m",
            "warning",
        ),
        ("GpuPoolGpuMemoryLeak", "gpupool_gpu_memory_leak_mib > 0", "0s", "warning"),
        ("GpuPoolGpuQuarantined", 'gpupool_gpu_health{health="quarantined"} == 1', "1m", "warning"),
        ("GpuPoolGrantIdle", "gpupool_grant_idle_seconds > 1800", "0s", "info"),
        ("GpuPoolLedgerDrift", "gpupool_ledger_drift_gpus > 0", "5m", "warning"),
    ],
)
def test_alert_rule(alert: str, expr: str, for_: str, severity: str) -> None:
    rule = _rules()[alert]
    assert (rule["expr"], rule["for"], rule["labels"]["severity"]) == (expr, for_, severity)
    assert _DURATION.match(rule["for"]), rule["for"]
    assert_known_metrics(rule["expr"])
    assert_types_fit(rule["expr"])
    assert set(rule["annotations"]) == {"summary", "description"}
    assert all(text.strip() for text in rule["annotations"].values())


def test_alert_rules_are_exactly_these() -> None:
    assert sorted(_rules()) == [
        "GpuPoolAllocationHigh",
        "GpuPoolGpuMemoryLeak",
        "GpuPoolGpuQuarantined",
        "GpuPoolGpuUtilizationHigh",
        "GpuPoolGrantIdle",
        "GpuPoolLedgerDown",
        "GpuPoolLedgerDrift",
        "GpuPoolMetricsAbsent",
        "GpuPoolNodeHeartbeatMissing",
        "GpuPoolNodeQuarantined",
        "GpuPoolQueueBacklog",
    ]


def test_allocation_alert_names_pool_and_model() -> None:
    annotations = _rules()["GpuPoolAllocationHigh"]["annotations"]
    for text in annotations.values():
        assert "{{ $labels.node_pool }}" in text and "{{ $labels.model }}" in text
    assert "Scale the node pool up" in annotations["description"]


@pytest.mark.parametrize(
    "args",
    [
        ["check", "rules", "rules.yaml"],
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "rules_test.yaml"],
    ],
    ids=["check-rules", "check-config", "test-rules"],
)
def test_promtool(args: list[str]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        reason = "promtool not installed (apt-get install prometheus); the rules were checked in Python only"
        skip_or_fail(reason, what="promtool")  # .ci/run installs it
    result = subprocess.run(
        [promtool, *args], cwd=DOCKER / "prometheus", capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_prometheus_config_scrapes_the_exporter_with_the_rules() -> None:
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rules.yaml"]
    (job,) = config["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["gpupool-metrics:9464"]}]


# --- Grafana dashboard --------------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    return json.loads((DOCKER / "grafana" / "dashboard.json").read_text())


def _targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(panel["title"], target) for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_identity_and_datasource_variable() -> None:
    dashboard = _dashboard()
    assert (dashboard["uid"], dashboard["title"], dashboard["schemaVersion"]) == (
        "gpupool-overview",
        "GPU pool",
        39,
    )
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    assert variables["node_pool"]["definition"] == "label_values(gpupool_gpu_capacity_milli, node_pool)"
    for title, target in _targets(dashboard):
        assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title


@pytest.mark.parametrize(
    ("title", "metrics"),
    [
        ("GPU allocation by node pool and model", {"gpupool_gpu_allocation_ratio"}),
        ("Free GPU capacity (GPUs)", {"gpupool_gpu_free_milli", "gpupool_gpu_capacity_milli"}),
        ("Fragmentation ratio", {"gpupool_fragmentation_ratio"}),
        ("Waiting requests by priority", {"gpupool_queue_requests_by_priority", "gpupool_queue_requests"}),
        ("Wait until granted (p50, p95)", {"gpupool_reservation_wait_seconds_bucket"}),
        ("Grants by team", {"gpupool_active_grants"}),
        (
            "Lease expiries, timeouts and preemptions",
            {
                "gpupool_lease_expiries_total",
                "gpupool_reservation_timeouts_total",
                "gpupool_preemptions_total",
            },
        ),
        ("Node heartbeat age", {"gpupool_node_heartbeat_age_seconds"}),
        ("GPU-seconds lost to preemption by team", {"gpupool_preemption_lost_gpu_seconds_total"}),
        ("Ledger up", {"gpupool_ledger_up"}),
        ("GPUs queued", {"gpupool_queue_requested_gpu_milli"}),
        ("Fragmentation", {"gpupool_fragmentation_ratio"}),
        ("Quarantined nodes", {"gpupool_node_health"}),
    ],
)
def test_dashboard_panel(title: str, metrics: set[str]) -> None:
    (panel,) = [p for p in _dashboard()["panels"] if p["title"] == title]
    assert panel["targets"], title
    used: set[str] = set()
    for target in panel["targets"]:
        used |= assert_known_metrics(target["expr"])
        assert_types_fit(target["expr"])
    assert used == metrics


def test_every_dashboard_query_uses_only_exporter_metrics() -> None:
    dashboard = _dashboard()
    assert len(dashboard["panels"]) == 13
    for _, target in _targets(dashboard):
        assert_known_metrics(target["expr"])
        assert_types_fit(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert_known_metrics(variable["definition"].removeprefix("label_values(").split(",")[0])


def test_wait_time_quantiles_are_over_granted_waits() -> None:
    panels = {p["title"]: p for p in _dashboard()["panels"]}
    wait = [t["expr"] for t in panels["Wait until granted (p50, p95)"]["targets"]]
    assert [e.split(",")[0] for e in wait] == ["histogram_quantile(0.5", "histogram_quantile(0.95"]
    bucket = 'sum by (le) (rate(gpupool_reservation_wait_seconds_bucket{outcome="granted"}['
    assert all(bucket in e for e in wait)


def test_dashboard_layout() -> None:
    panels = _dashboard()["panels"]
    assert sorted(p["id"] for p in panels) == list(range(1, len(panels) + 1))
    boxes = [(p["gridPos"]["x"], p["gridPos"]["y"], p["gridPos"]["w"], p["gridPos"]["h"]) for p in panels]
    for x, _, w, _ in boxes:
        assert 0 <= x and x + w <= 24
    for i, (x1, y1, w1, h1) in enumerate(boxes):
        for x2, y2, w2, h2 in boxes[i + 1 :]:
            assert x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1, "panels overlap"
    for panel in panels:
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
