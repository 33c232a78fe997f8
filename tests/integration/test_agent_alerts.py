"""The alert rules fire on the series the exporter really produces from fake node agents' reports.

A real ledger gets heartbeats from the collector on the fake NVML (busy GPUs in one pool, a leak
past its grace, an idle grant); its scrape is fed to ``promtool test rules`` as constant series,
and the agent's alerts must fire with the labels the exporter gave them.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from airflow_gpupool.agent.collect import NvmlCollector
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.metrics import GpuPoolCollector
from airflow_gpupool.metrics.agent import AGENT_METRIC_NAMES
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing.fake_nvml import FakeNvml, fake_gpu_uuid, node_spec
from tests.ledger_fixtures import FakeClock, node
from tests.skips import skip_or_fail

RULES = Path(__file__).resolve().parents[2] / "docker" / "prometheus" / "rules.yaml"


def scrape(ledger: Ledger) -> list[tuple[str, dict[str, str], float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuPoolCollector(ledger))
    text = generate_latest(registry).decode()
    return [
        (s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples
    ]


def series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


@pytest.fixture
def reported(make_ledger: Callable[..., Ledger], clock: FakeClock) -> Ledger:
    ledger = make_ledger()
    ledger.upsert_nodes(
        [node("busy-0", gpus=2, pool="train"), node("t4-0", gpus=2, pool="infer", labels={"zone": "b"})]
    )
    held = ledger.reserve(
        GpuRequest(gpus=1, team="nlp", node_labels={"zone": "b"}), "t", reservation_id="gp-idle", ttl=7200
    )
    busy = node_spec("busy-0", 2)
    for gpu in busy["gpus"]:
        gpu["utilization"] = {"gpu": 97, "memory": 60}
    t4 = node_spec("t4-0", 2)
    free = 1 - held.grant.gpu_indices[0]
    t4["gpus"][free]["processes"] = [{"pid": 77, "memory_mib": 2048}]  # no grant holds it: a leak
    collectors = []
    for name, spec in (("busy-0", busy), ("t4-0", t4)):
        fake = FakeNvml(spec)
        collector = NvmlCollector(fake, name, pod_uid_of=fake.pod_uid_of, clock=clock)
        collector.open()
        collectors.append(collector)
    for collector in collectors:
        ledger.record_report(collector.sample(30.0), leak_grace_seconds=60)
    clock.advance(1801)
    for collector in collectors:
        ledger.record_report(collector.sample(30.0), leak_grace_seconds=60)
    return ledger


def test_the_agent_alerts_fire_on_the_exporters_series(reported: Ledger, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        skip_or_fail("promtool not installed (apt-get install prometheus)", what="promtool")
    samples = [s for s in scrape(reported) if s[0] in AGENT_METRIC_NAMES]
    names = {name for name, _, _ in samples}
    assert {
        "gpupool_gpu_utilization_ratio",
        "gpupool_gpu_memory_leak_mib",
        "gpupool_grant_idle_seconds",
    } <= names
    (leak_gpu,) = [labels["gpu"] for n, labels, _ in samples if n == "gpupool_gpu_memory_leak_mib"]
    assert leak_gpu in (fake_gpu_uuid("t4-0", 0), fake_gpu_uuid("t4-0", 1))
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series(n, labels), "values": f"{v}x10"} for n, labels, v in samples],
                "alert_rule_test": [
                    {"eval_time": "6m", "alertname": "GpuPoolGpuUtilizationHigh", "exp_alerts": [_alert(
                        {"severity": "warning", "action": "scale-up", "node_pool": "train"}, RULES, "GpuPoolGpuUtilizationHigh")]},
                    {"eval_time": "1m", "alertname": "GpuPoolGpuMemoryLeak", "exp_alerts": [_alert(
                        {"severity": "warning", "action": "clean-gpu", "node": "t4-0", "gpu": leak_gpu}, RULES, "GpuPoolGpuMemoryLeak")]},
                    {"eval_time": "1m", "alertname": "GpuPoolGrantIdle", "exp_alerts": [_alert(
                        {"severity": "info", "reservation": "gp-idle", "team": "nlp", "node_pool": "infer"}, RULES, "GpuPoolGrantIdle")]},
                ],
            }
        ],
    }  # fmt: skip
    path = tmp_path / "agent_rules_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _alert(labels: dict[str, str], rules: Path, name: str) -> dict[str, Any]:
    """The alert promtool must see: the labels, and the rule's annotations with them filled in."""
    doc = yaml.safe_load(rules.read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name)
    annotations = {}
    for key, text in rule["annotations"].items():
        for label, value in labels.items():
            text = text.replace("{{ $labels." + label + " }}", value)
        annotations[key] = text
    return {"exp_labels": labels, "exp_annotations": annotations}
