"""The deployment assets in ``docker/``: alert rules, dashboard, image, compose stack, manifests.

Docker and a cluster are not available to the tests: the files are parsed and checked for
structure and for exact names (metrics, services, RBAC verbs, priority classes). ``promtool``
checks and unit-tests the alert rules where it is installed (Debian: ``apt-get install
prometheus``); without it the Python checks still run, and under ``CI=true`` they are the
whole check rather than a skip.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_gpupool import settings
from airflow_gpupool.cli import build_parser
from airflow_gpupool.operators.pod_spec import GPU_TOLERATION
from tests.s3_fixtures import MotoS3
from tests.skips import skip_or_fail

DOCKER = Path(__file__).resolve().parents[2] / "docker"
RULES = DOCKER / "prometheus" / "rules.yaml"
KUBERNETES = DOCKER / "kubernetes"


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


@functools.cache
def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """Return every sample name the exporter writes, with its family's type and its labels.

    Read from real scrapes: of the scenario ledger (tests/unit/metrics/scenario.py), and of a
    ledger a fake node agent reported to (a leak past its grace, an idle grant), so the assets
    are checked against what the exporter exports, not against a list kept beside it.
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from airflow_gpupool.metrics import GpuPoolCollector
    from tests.unit.metrics.scenario import build_pool

    texts = []
    with tempfile.TemporaryDirectory() as tmp:
        pool = build_pool(f"sqlite:///{tmp}/ledger.db")
        for ledger in (pool.ledger, _agent_reported(f"sqlite:///{tmp}/agent.db")):
            registry = CollectorRegistry(auto_describe=False)
            registry.register(GpuPoolCollector(ledger))
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
    assert len(dashboard["panels"]) == 12
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


# --- Image and compose stack --------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", "", (DOCKER / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0], line.split(None, 1)[1]) for line in lines]


def test_dockerfile() -> None:
    instructions = _dockerfile_instructions()
    assert instructions[0] == ("FROM", "apache/airflow:3.3.2-python3.11")
    assert [arg for op, arg in instructions if op == "COPY"] == [
        "--chown=airflow:root constraints.txt ./constraints.txt",
        "--chown=airflow:root pyproject.toml README.md ./",
        "--chown=airflow:root airflow_gpupool ./airflow_gpupool",
    ]
    (run,) = [arg for op, arg in instructions if op == "RUN"]
    # With the s3 extra: ObjectStoragePath reads the compose stack's s3:// checkpoints.
    assert run.startswith('pip install --no-cache-dir -c constraints.txt ".[s3]" ')
    assert run.endswith('python -c "import s3fs, airflow.providers.amazon.aws.fs.s3"')
    assert ("USER", "airflow") in instructions


def test_image_matches_the_pinned_airflow() -> None:
    pins = dict(
        line.split("==", 1)
        for line in (DOCKER.parent / "constraints.txt").read_text().splitlines()
        if "==" in line
    )
    base = _dockerfile_instructions()[0][1]
    assert base == f"apache/airflow:{pins['apache-airflow']}-python3.11"


def test_dockerignore_sends_only_the_package() -> None:
    lines = [
        line
        for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
        if line and line[0] != "#"
    ]
    assert lines[:5] == ["*", "!constraints.txt", "!pyproject.toml", "!README.md", "!airflow_gpupool/"]


LEDGER_URL = "postgresql://gpupool:gpupool@postgres:5432/gpupool"
AIRFLOW_SERVICES = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_services() -> None:
    services = _compose()["services"]
    assert set(services) == {
        "postgres",
        "airflow-init",
        *AIRFLOW_SERVICES,
        "gpupool-controller",
        "object-store",
        "object-store-init",
        "gpupool-metrics",
        "prometheus",
    }
    # PostgreSQL is not published on the host's 5432 (a local server may hold it), and only on loopback.
    assert services["postgres"]["ports"] == ["127.0.0.1:${GPUPOOL_POSTGRES_PORT:-15432}:5432"]
    assert services["object-store"]["image"].startswith("minio/minio:")
    (script,) = services["object-store-init"]["entrypoint"][2:]
    assert "mc mb --ignore-existing local/gpupool-checkpoints" in script
    assert services["postgres"]["image"] == "postgres:16"
    assert services["postgres"]["healthcheck"]["test"] == ["CMD", "pg_isready", "-U", "airflow"]
    assert services["prometheus"]["image"].startswith("prom/prometheus:v3.")
    assert services["prometheus"]["profiles"] == services["gpupool-metrics"]["profiles"] == ["monitoring"]


@pytest.mark.parametrize(
    "service", ["airflow-init", *AIRFLOW_SERVICES, "gpupool-controller", "gpupool-metrics"]
)
def test_compose_airflow_service(service: str) -> None:
    spec = _compose()["services"][service]
    assert spec["image"] == "airflow-gpupool:0.1.0"
    assert spec["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    env = spec["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert (
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        == "postgresql+psycopg2://airflow:airflow@postgres:5432/airflow"
    )
    assert json.loads(env["AIRFLOW_CONN_GPUPOOL_DEFAULT"]) == {
        "conn_type": "gpupool",
        "extra": {"ledger_url": LEDGER_URL},
    }
    assert env["GPUPOOL_LEDGER_URL"] == LEDGER_URL
    # The mounted kubeconfig is the one used: nothing falls back to in-cluster configuration.
    assert env["KUBECONFIG"] == "/home/airflow/.kube/config"
    # Checkpoints on the shared object store: ObjectStoragePath through the aws connection the
    # example DAGs name; plain fsspec clients through botocore's variables, to the same store.
    assert env["GPUPOOL_CHECKPOINT_ROOT"] == "s3://gpupool-checkpoints"
    assert env["GPUPOOL_CHECKPOINT_CONN_ID"] == "gpupool_s3"
    minio = _compose()["services"]["object-store"]["environment"]
    assert json.loads(env["AIRFLOW_CONN_GPUPOOL_S3"]) == {
        "conn_type": "aws",
        "login": minio["MINIO_ROOT_USER"],
        "password": minio["MINIO_ROOT_PASSWORD"],
        "extra": {"endpoint_url": "http://object-store:9000", "region_name": "us-east-1"},
    }
    assert env["AWS_ENDPOINT_URL"] == "http://object-store:9000"
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
        minio["MINIO_ROOT_USER"],
        minio["MINIO_ROOT_PASSWORD"],
    )
    assert spec["volumes"] == [
        "../dags:/opt/airflow/dags:ro",
        "../examples:/opt/airflow/gpupool-examples:ro",
        "${KUBECONFIG_DIR:-~/.kube}:/home/airflow/.kube:ro",
    ]
    if service == "airflow-init":
        assert spec["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    else:
        assert spec["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "airflow-init": {"condition": "service_completed_successfully"},
            "object-store-init": {"condition": "service_completed_successfully"},
        }
    if service in AIRFLOW_SERVICES:
        assert spec["command"] == AIRFLOW_SERVICES[service]


def test_compose_checkpoint_settings_work_against_an_s3_api(
    moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack's checkpoint root and connection, pointed at moto instead of MinIO, read and write."""
    from airflow_gpupool.checkpoints import CheckpointStore, manifest_bytes

    env = _compose()["services"]["airflow-scheduler"]["environment"]
    conn_id = env["GPUPOOL_CHECKPOINT_CONN_ID"]
    connection = json.loads(env[f"AIRFLOW_CONN_{conn_id.upper()}"])
    connection["extra"]["endpoint_url"] = moto_s3.endpoint_url  # the only change: where MinIO would be
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name)  # the connection alone must reach the store
    (init,) = _compose()["services"]["object-store-init"]["entrypoint"][2:]
    assert env["GPUPOOL_CHECKPOINT_ROOT"] == f"s3://{moto_s3.bucket}"
    assert f"local/{moto_s3.bucket}" in init

    root = f"{env['GPUPOOL_CHECKPOINT_ROOT']}/compose-check/{uuid.uuid4().hex}"
    store = CheckpointStore(root, conn_id=conn_id)
    store.fs.pipe_file(f"{store.root}/step-000001/manifest.json", manifest_bytes(1, {"loss": 0.4}))

    newest = store.newest()
    assert newest is not None and (newest.step, newest.location) == (1, f"{root}/step-000001")


def test_compose_init_migrates_both_databases() -> None:
    services = _compose()["services"]
    bash, flag, script = services["airflow-init"]["command"]
    assert (bash, flag) == ("bash", "-c")
    assert script == 'airflow db migrate && gpupool ledger init --url "$$GPUPOOL_LEDGER_URL"'
    assert services["airflow-init"]["restart"] == "no"
    assert (
        services["gpupool-metrics"]["command"][-1] == "exec gpupool metrics serve --bind 0.0.0.0 --port 9464"
    )
    controller = services["gpupool-controller"]["command"][-1]
    assert controller == "exec gpupool controller run --sync-interval 60 --reconcile-interval 30"


def test_compose_ledger_database_and_volumes() -> None:
    compose = _compose()
    postgres = compose["services"]["postgres"]
    assert postgres["volumes"] == [
        "postgres-data:/var/lib/postgresql/data",
        "./postgres/init-ledger.sql:/docker-entrypoint-initdb.d/10-init-ledger.sql:ro",
    ]
    assert set(compose["volumes"]) == {"postgres-data", "object-store-data"}
    sql = (DOCKER / "postgres" / "init-ledger.sql").read_text()
    assert "CREATE ROLE gpupool LOGIN PASSWORD 'gpupool';" in sql
    assert "CREATE DATABASE gpupool OWNER gpupool;" in sql
    assert compose["services"]["prometheus"]["volumes"] == [
        "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
        "./prometheus/rules.yaml:/etc/prometheus/rules.yaml:ro",
    ]
    for path in (
        "../dags",
        "../examples/inventory.yaml",
        "./postgres/init-ledger.sql",
        "./prometheus/prometheus.yml",
        "./prometheus/rules.yaml",
    ):
        assert (DOCKER / path).exists(), path


# --- Kubernetes manifests -----------------------------------------------------------------


class _Response:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.data = json.dumps(obj)


MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("scheduling.k8s.io/v1", "PriorityClass"): "V1PriorityClass",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("apps/v1", "Deployment"): "V1Deployment",
}


def _manifest(name: str) -> dict[tuple[str, str], Any]:
    """Load one manifest file into Kubernetes client models, keyed by (kind, name)."""
    from kubernetes.client import ApiClient

    client = ApiClient()
    objects: dict[tuple[str, str], Any] = {}
    for doc in yaml.safe_load_all((KUBERNETES / name).read_text()):
        model = MODELS[(doc["apiVersion"], doc["kind"])]
        obj = client.deserialize(_Response(doc), model)
        # A misspelled field would be dropped silently: the model must give back the document.
        assert client.sanitize_for_serialization(obj) == doc
        objects[(doc["kind"], doc["metadata"]["name"])] = obj
    return objects


def test_manifest_files() -> None:
    assert sorted(p.name for p in KUBERNETES.iterdir()) == [
        "namespace.yaml",
        "nvml-agent-daemonset.yaml",
        "pool-controller.yaml",
        "pool-metrics.yaml",
        "priority-classes.yaml",
        "prometheus-operator",
        "rbac.yaml",
    ]
    # `kubectl apply -f docker/kubernetes/` goes in file-name order: the namespace first.
    assert sorted(p.name for p in KUBERNETES.iterdir())[0] == "namespace.yaml"
    assert list(_manifest("namespace.yaml")) == [("Namespace", "airflow")]


def test_priority_classes_match_the_default_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__GPUPOOL__WORKLOAD_PRIORITY_CLASSES", raising=False)
    monkeypatch.setattr(settings, "_from_airflow_config", lambda option: None)
    classes = {name: obj for (_, name), obj in _manifest("priority-classes.yaml").items()}
    assert (
        set(classes)
        == set(settings.workload_priority_classes().values())
        == {"gpupool-training", "gpupool-inference"}
    )
    inference, training = classes["gpupool-inference"], classes["gpupool-training"]
    assert (inference.value, inference.preemption_policy) == (1_000_000, "PreemptLowerPriority")
    assert (training.value, training.preemption_policy) == (100_000, "Never")
    for pc in classes.values():
        assert pc.global_default is False
        assert pc.value < 1_000_000_000  # above that is reserved for system classes
        assert pc.description


def _verbs(rules: list[Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for rule in rules:
        assert rule.api_groups == [""]
        for resource in rule.resources:
            out[resource] = rule.verbs
    return out


def test_rbac() -> None:
    objects = _manifest("rbac.yaml")
    assert sorted(objects) == [
        ("ClusterRole", "gpupool-operator-cluster"),
        ("ClusterRoleBinding", "gpupool-operator-cluster"),
        ("Role", "gpupool-operator"),
        ("RoleBinding", "gpupool-operator"),
        ("ServiceAccount", "gpupool-operator"),
    ]
    account = objects[("ServiceAccount", "gpupool-operator")]
    role = objects[("Role", "gpupool-operator")]
    assert _verbs(role.rules) == {
        "pods": ["create", "get", "list", "watch", "delete", "patch"],
        "pods/log": ["get"],
        "events": ["list", "watch"],
    }
    assert _verbs(objects[("ClusterRole", "gpupool-operator-cluster")].rules) == {
        "nodes": ["get", "list"],
        "pods": ["list"],
    }
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        binding = next(obj for (k, _), obj in objects.items() if k == kind)
        assert (binding.role_ref.kind, binding.role_ref.name) == (
            role_kind,
            "gpupool-operator" if role_kind == "Role" else "gpupool-operator-cluster",
        )
        (subject,) = binding.subjects
        assert (subject.kind, subject.name, subject.namespace) == (
            "ServiceAccount",
            account.metadata.name,
            account.metadata.namespace,
        )
    # The Role and its binding live where the example DAG launches its pods.
    example_dag = (DOCKER.parent / "dags" / "example_gpu_pod.py").read_text()
    assert f'namespace="{role.metadata.namespace}"' in example_dag
    assert objects[("RoleBinding", "gpupool-operator")].metadata.namespace == role.metadata.namespace


def test_nvml_agent_daemonset() -> None:
    objects = _manifest("nvml-agent-daemonset.yaml")
    assert sorted(objects) == [("DaemonSet", "gpupool-nvml-agent"), ("ServiceAccount", "gpupool-nvml-agent")]
    daemonset = objects[("DaemonSet", "gpupool-nvml-agent")]
    spec = daemonset.spec.template.spec
    assert daemonset.spec.selector.match_labels.items() <= daemonset.spec.template.metadata.labels.items()
    assert spec.node_selector == {"nvidia.com/gpu.present": "true"}
    (toleration,) = spec.tolerations
    assert (toleration.key, toleration.operator, toleration.effect) == (
        GPU_TOLERATION.key,
        GPU_TOLERATION.operator,
        GPU_TOLERATION.effect,
    )
    assert spec.service_account_name == "gpupool-nvml-agent"
    (container,) = spec.containers
    assert container.command == ["gpupool", "agent", "run"]
    env = {e.name: e for e in container.env}
    ledger = env["GPUPOOL_LEDGER_URL"].value_from.secret_key_ref
    assert (ledger.name, ledger.key) == ("gpupool-ledger", "url")
    assert env["NODE_NAME"].value_from.field_ref.field_path == "spec.nodeName"
    assert container.resources.requests == {"cpu": "50m", "memory": "128Mi"}
    assert container.resources.limits == {"cpu": "200m", "memory": "256Mi"}
    # The agent watches GPUs through NVML; requesting one would take it away from the pool.
    assert not any(key.startswith("nvidia.com/") for key in container.resources.limits)
    # The real agent (issue 17): its own command line, the NVIDIA runtime, the host's pids.
    assert container.args == ["--node", "$(NODE_NAME)", "--interval", "30"]
    parsed = build_parser().parse_args(["agent", "run", "--node", "n1", "--interval", "30"])
    assert (parsed.node, parsed.interval) == ("n1", 30.0)
    assert spec.runtime_class_name == "nvidia"
    assert spec.host_pid is True  # process -> cgroup -> pod uid needs the host's /proc
    assert not container.security_context.privileged and container.security_context.capabilities.drop == [
        "ALL"
    ]
    assert "PLACEHOLDER" not in (KUBERNETES / "nvml-agent-daemonset.yaml").read_text()


def _rules_by_group(rules: list[Any]) -> dict[tuple[str, str], list[str]]:
    return {
        (group, resource): rule.verbs
        for rule in rules
        for group in rule.api_groups
        for resource in rule.resources
    }


def test_controller_deployment() -> None:
    from airflow_gpupool.cli import build_parser

    objects = _manifest("pool-controller.yaml")
    assert sorted(objects) == [
        ("ClusterRole", "gpupool-controller"),
        ("ClusterRoleBinding", "gpupool-controller"),
        ("Deployment", "gpupool-controller"),
        ("Role", "gpupool-controller-leader-election"),
        ("RoleBinding", "gpupool-controller-leader-election"),
        ("ServiceAccount", "gpupool-controller"),
    ]
    account = objects[("ServiceAccount", "gpupool-controller")]
    assert _rules_by_group(objects[("ClusterRole", "gpupool-controller")].rules) == {
        ("", "nodes"): ["list"],
        ("", "pods"): ["list", "delete"],
        ("", "events"): ["create"],
    }
    role = objects[("Role", "gpupool-controller-leader-election")]
    assert _rules_by_group(role.rules) == {("coordination.k8s.io", "leases"): ["get", "create", "update"]}
    for kind, role_kind, role_name in (
        ("ClusterRoleBinding", "ClusterRole", "gpupool-controller"),
        ("RoleBinding", "Role", "gpupool-controller-leader-election"),
    ):
        binding = next(obj for (k, _), obj in objects.items() if k == kind)
        assert (binding.role_ref.kind, binding.role_ref.name) == (role_kind, role_name)
        (subject,) = binding.subjects
        assert (subject.kind, subject.name, subject.namespace) == (
            "ServiceAccount",
            account.metadata.name,
            account.metadata.namespace,
        )
    deployment = objects[("Deployment", "gpupool-controller")]
    assert deployment.spec.replicas == 2
    assert deployment.metadata.namespace == role.metadata.namespace == account.metadata.namespace
    assert deployment.spec.selector.match_labels.items() <= deployment.spec.template.metadata.labels.items()
    spec = deployment.spec.template.spec
    assert spec.service_account_name == "gpupool-controller"
    (container,) = spec.containers
    assert container.command == ["gpupool", "controller", "run"]
    # The flags are the command's own: the parser accepts them.
    args = build_parser().parse_args([*container.command[1:], *container.args])
    assert (args.sync_interval, args.reconcile_interval, args.lease_duration) == (60, 30, 15)
    env = {e.name: e for e in container.env}
    ledger = env["GPUPOOL_LEDGER_URL"].value_from.secret_key_ref
    assert (ledger.name, ledger.key) == ("gpupool-ledger", "url")
    # The Lease's namespace: the pod's own (cli.controller.default_namespace reads POD_NAMESPACE).
    assert env["POD_NAMESPACE"].value_from.field_ref.field_path == "metadata.namespace"
    assert not any(key.startswith("nvidia.com/") for key in container.resources.limits)
