"""The node agent's reports in the ledger, on SQLite and PostgreSQL: UUIDs, health, heartbeats, leaks.

Reports are read by the real collector from the fake NVML backend; the clock is the tests' own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from airflow_gpupool.agent.collect import NvmlCollector
from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.ledger.store import migrations
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing.fake_nvml import FakeNvml, fake_gpu_uuid, node_spec
from tests.ledger_fixtures import FakeClock, node


class FakeNode:
    """A node's fake GPUs and the agent's collector reading them."""

    def __init__(self, name: str, gpus: int, clock: FakeClock) -> None:
        self.nvml = FakeNvml(node_spec(name, gpus))
        self.collector = NvmlCollector(self.nvml, name, pod_uid_of=self.nvml.pod_uid_of, clock=clock)
        self.collector.open()

    def gpu(self, index: int) -> dict[str, Any]:
        return self.nvml.spec["gpus"][index]

    def beat(self, ledger: Ledger, **options: Any) -> Any:
        options.setdefault("missed_heartbeats", 3)
        options.setdefault("leak_grace_seconds", 60.0)
        return ledger.record_report(self.collector.sample(30.0), **options)


@pytest.fixture
def pool(make_ledger: Callable[..., Ledger], clock: FakeClock) -> tuple[Ledger, FakeNode, FakeNode]:
    ledger = make_ledger()
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])
    return ledger, FakeNode("n1", 2, clock), FakeNode("n2", 2, clock)


def gpus_of(ledger: Ledger, name: str) -> list[dict[str, Any]]:
    (record,) = [n for n in ledger.snapshot().nodes if n.name == name]
    return list(record.gpus)


def node_json(ledger: Ledger, name: str) -> dict[str, Any]:
    (out,) = [n for n in ledger.snapshot().to_dict()["nodes"] if n["name"] == name]
    return out


def test_a_report_verifies_the_uuids_that_grants_then_carry(pool: Any) -> None:
    ledger, n1, _ = pool
    before = ledger.reserve(GpuRequest(gpus=1, gpu_models=["A100"]), "t", reservation_id="early")
    assert before.grant.gpu_uuids == ("GPU-n1-0",) and not before.grant.gpu_uuids_verified

    result = n1.beat(ledger)

    assert result.verified == (0, 1) and result.mismatches == ()
    assert [(g["uuid"], g["uuid_verified"]) for g in gpus_of(ledger, "n1")] == [
        (fake_gpu_uuid("n1", 0), True),
        (fake_gpu_uuid("n1", 1), True),
    ]
    grant = ledger.reserve(GpuRequest(gpus=1), "t", reservation_id="late").grant
    assert grant.node == "n1" and grant.gpu_uuids_verified
    assert grant.gpu_uuids == (fake_gpu_uuid("n1", 1),)
    assert ledger.get("early").grant.gpu_uuids == (fake_gpu_uuid("n1", 0),)  # read back: verified now
    # n2 has no agent yet: its UUIDs stay the inventory's, unverified.
    assert {g["uuid_verified"] for g in gpus_of(ledger, "n2")} == {False}
    assert n1.beat(ledger).verified == ()  # nothing new the second time


def test_inventory_sync_keeps_verified_uuids_and_a_mismatch_is_logged(
    pool: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ledger, n1, _ = pool
    n1.beat(ledger)
    change = ledger.upsert_nodes([node("n1", gpus=2)])
    assert change.unchanged == ("n1",)
    assert gpus_of(ledger, "n1")[0]["uuid"] == fake_gpu_uuid("n1", 0)

    n1.gpu(1)["bus_id"] = "00000000:0A:00.0"
    n1.nvml.spec["gpus"].append({"uuid": "GPU-extra", "bus_id": "00000000:0B:00.0"})
    with caplog.at_level(logging.WARNING):
        result = n1.beat(ledger)
    assert "GPU 1 moved from bus 00000000:08:00.0 to 00000000:0A:00.0" in result.mismatches
    assert any("GPU 2 (GPU-extra" in m for m in result.mismatches)
    assert "GPU 1 moved" in caplog.text


def test_three_missed_heartbeats_quarantine_then_steady_ones_release(pool: Any, clock: FakeClock) -> None:
    ledger, n1, n2 = pool
    n1.beat(ledger)
    n2.beat(ledger)
    running = ledger.reserve(GpuRequest(gpus=2), "live", reservation_id="live")
    assert running.grant.node in ("n1", "n2")
    silent = running.grant.node
    beating = n2 if silent == "n1" else n1

    for _ in range(3):  # 3 intervals of 30 s: not yet more than 3 missed
        clock.advance(30)
        beating.beat(ledger)
        assert ledger.check_heartbeats(missed_heartbeats=3, stable_seconds=60).quarantined == ()
    clock.advance(1)
    beating.beat(ledger)
    check = ledger.check_heartbeats(missed_heartbeats=3, stable_seconds=60)
    assert [name for name, _ in check.quarantined] == [silent]
    assert "3 intervals of 30s missed" in check.quarantined[0][1]
    record = node_json(ledger, silent)
    assert (record["health"], record["health_source"]) == ("quarantined", "controller")
    assert record["heartbeat_age_s"] == pytest.approx(91)

    # No new grant there; the live one keeps running and renews.
    other = ledger.reserve(GpuRequest(gpus=2), "new", reservation_id="new")
    assert other.grant.node != silent
    assert ledger.renew("live").state is ReservationState.GRANTED

    # Heartbeats come back: still quarantined until they have been steady for 60 s.
    silent_node = n1 if silent == "n1" else n2
    silent_node.beat(ledger)
    assert ledger.check_heartbeats(missed_heartbeats=3, stable_seconds=60).released == ()
    for _ in range(2):
        clock.advance(30)
        silent_node.beat(ledger)
    assert ledger.check_heartbeats(missed_heartbeats=3, stable_seconds=60).released == (silent,)
    assert node_json(ledger, silent)["health"] == "healthy"
    ledger.release("live")
    assert ledger.reserve(GpuRequest(gpus=2), "after", reservation_id="after").grant.node == silent


def test_inventory_sync_after_a_quarantine_leaves_it_quarantined(pool: Any, clock: FakeClock) -> None:
    ledger, n1, _ = pool
    n1.beat(ledger)
    clock.advance(200)
    ledger.check_heartbeats(missed_heartbeats=3, stable_seconds=60)
    assert node_json(ledger, "n1")["health"] == "quarantined"

    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])  # Kubernetes says: healthy

    assert (node_json(ledger, "n1")["health"], node_json(ledger, "n1")["health_source"]) == (
        "quarantined",
        "controller",
    )
    assert ledger.set_health("n2", "quarantined", source="admin", reason="bad fan")
    assert not ledger.set_health("n2", "healthy", source="controller")  # an admin's outranks it
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])
    assert node_json(ledger, "n2")["health_reason"] == "bad fan"
    assert ledger.set_health("n2", "healthy", source="admin")
    assert node_json(ledger, "n2")["health_source"] == "inventory"


def test_an_xid_on_one_gpu_quarantines_that_gpu_only(pool: Any) -> None:
    ledger, n1, n2 = pool
    n1.beat(ledger)
    n2.beat(ledger)
    n1.nvml.spec["xid_events"] = [{"id": 1, "gpu": 0, "xid": 79}]

    result = n1.beat(ledger)

    assert result.quarantined == ((fake_gpu_uuid("n1", 0), "XID 79: GPU has fallen off the bus"),)
    gpus = gpus_of(ledger, "n1")
    assert [(g["health"], g["health_source"]) for g in gpus] == [
        ("quarantined", "agent"),
        ("healthy", "inventory"),
    ]
    assert node_json(ledger, "n1")["health"] == "healthy"
    # GPU 1 of n1 still takes work; GPU 0 does not: 3 single GPUs land on n1/1 and n2.
    grants = [ledger.reserve(GpuRequest(gpus=1), "t", reservation_id=f"g{i}").grant for i in range(3)]
    assert sorted((g.node, g.gpu_indices) for g in grants) == [("n1", (1,)), ("n2", (0,)), ("n2", (1,))]
    assert ledger.reserve(GpuRequest(gpus=1), "t", reservation_id="g3").state is ReservationState.WAITING
    # A harmless XID (13: an application fault) quarantines nothing.
    n2.nvml.spec["xid_events"] = [{"id": 2, "gpu": 0, "xid": 13}]
    assert n2.beat(ledger).quarantined == ()
    # Inventory sync keeps the GPU's quarantine; only an admin releases it.
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])
    assert gpus_of(ledger, "n1")[0]["health"] == "quarantined"
    assert not ledger.set_gpu_health("n1", fake_gpu_uuid("n1", 0), "healthy", source="inventory")
    assert ledger.set_gpu_health("n1", fake_gpu_uuid("n1", 0), "healthy", source="admin")
    assert ledger.get("g3").state is ReservationState.GRANTED  # the queue was served on it
    assert ledger.check_invariants() == []


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param({"lost": True}, "GPU lost (fallen off the bus)", id="lost"),
        pytest.param({"ecc": {"corrected": 0, "uncorrected": 2}}, "2 uncorrectable ECC error(s)", id="ecc"),
        pytest.param({"remapped_rows": {"failure": True}}, "row remapping failed", id="remap-failure"),
    ],
)
def test_other_critical_signs_quarantine_the_gpu(pool: Any, change: dict[str, Any], reason: str) -> None:
    ledger, n1, _ = pool
    n1.beat(ledger)
    n1.gpu(1).update(change)
    ((uuid, why),) = n1.beat(ledger).quarantined
    assert uuid == fake_gpu_uuid("n1", 1) and why == reason


def test_a_leak_is_found_within_the_grace_and_cleared_when_freed(pool: Any, clock: FakeClock) -> None:
    ledger, n1, _ = pool
    n1.beat(ledger)
    grant = ledger.reserve(GpuRequest(gpus=1), "t", reservation_id="r1").grant
    ledger.bind("r1", namespace="ml", name="p", uid="pod-1")
    gpu = n1.gpu(grant.gpu_indices[0])
    gpu["processes"] = [{"pid": 11, "memory_mib": 4096, "pod_uid": "pod-1"}]
    assert n1.beat(ledger).leaks == ()  # its grant holds it
    ledger.release("r1")

    assert n1.beat(ledger).leaks == ()  # memory still used, within the grace
    clock.advance(59)
    assert n1.beat(ledger).leaks == ()
    clock.advance(2)
    (leak,) = n1.beat(ledger).leaks
    assert leak["pids"] == [11] and leak["memory_mib"] == 4096 and leak["gpu"] == gpu["uuid"]
    assert leak["since"] == pytest.approx(clock.now - 61)
    status = ledger.snapshot().to_dict()
    assert status["leaks"] == [
        {"node": "n1", "gpu": gpu["uuid"], "pids": [11], "memory_mib": 4096, "since": leak["since"]}
    ]
    shown = gpus_of(ledger, "n1")[grant.gpu_indices[0]]
    assert shown["leak"]["pids"] == [11] and shown["memory_used_mib"] == 4096

    gpu["processes"] = []
    assert n1.beat(ledger).leaks == ()
    assert ledger.snapshot().to_dict()["leaks"] == []


def test_a_leak_quarantines_the_gpu_until_clean_when_configured(pool: Any, clock: FakeClock) -> None:
    ledger, n1, _ = pool
    n1.beat(ledger)
    n1.gpu(0)["processes"] = [{"pid": 5, "memory_mib": 100}]
    n1.beat(ledger, leak_action="quarantine")
    clock.advance(61)
    result = n1.beat(ledger, leak_action="quarantine")
    assert result.quarantined[0][1].startswith("gpu_memory_leak: 100 MiB held by pids [5]")
    assert gpus_of(ledger, "n1")[0]["health"] == "quarantined"
    n1.gpu(0)["processes"] = []
    assert n1.beat(ledger, leak_action="quarantine").released == (fake_gpu_uuid("n1", 0),)
    assert gpus_of(ledger, "n1")[0]["health"] == "healthy"


def test_used_versus_reserved_and_idle_grants(pool: Any) -> None:
    ledger, n1, _ = pool
    n1.beat(ledger)
    ledger.reserve(GpuRequest(gpus=1, team="vision"), "t", reservation_id="busy")
    ledger.bind("busy", namespace="ml", name="a", uid="pod-a")
    ledger.reserve(GpuRequest(gpus=1, team="nlp"), "t", reservation_id="idle")
    ledger.bind("idle", namespace="ml", name="b", uid="pod-b")
    busy, idle = ledger.get("busy").grant, ledger.get("idle").grant
    n1.gpu(busy.gpu_indices[0])["processes"] = [{"pid": 3, "memory_mib": 30000, "pod_uid": "pod-a"}]
    n1.beat(ledger)
    gpus = gpus_of(ledger, "n1")
    used = gpus[busy.gpu_indices[0]]["usage"]["busy"]
    assert used["memory_used_mib"] == 30000 and used["utilization"] == 90 and used["team"] == "vision"
    assert gpus[idle.gpu_indices[0]]["usage"]["idle"]["memory_used_mib"] == 0
    assert "idle" in gpus[idle.gpu_indices[0]]["idle"] and gpus[busy.gpu_indices[0]]["idle"] == {}


def test_warning_signs_ask_the_grants_for_a_checkpoint(pool: Any) -> None:
    ledger, n1, _ = pool
    n1.gpu(0).update(ecc={"corrected": 1, "uncorrected": 0})
    n1.beat(ledger)
    ledger.reserve(GpuRequest(gpus=2), "t", reservation_id="r")
    n1.gpu(0).update(ecc={"corrected": 5, "uncorrected": 0}, temperature=87)
    n1.nvml.spec["xid_events"] = [{"id": 1, "gpu": 1, "xid": 94}]
    warnings = n1.beat(ledger).warnings["r"]
    assert warnings == [
        "correctable ECC errors rising (1 -> 5)",
        "temperature 87 °C near the slowdown threshold 90 °C",
        "XID 94: contained ECC error",
    ]
    assert gpus_of(ledger, "n1")[1]["health"] == "healthy"  # a warning quarantines nothing


def test_reports_and_health_errors(pool: Any) -> None:
    ledger, n1, _ = pool
    ghost = FakeNode("ghost", 1, FakeClock())
    with pytest.raises(InvalidInventoryError, match="run inventory sync first"):
        ghost.beat(ledger)
    with pytest.raises(InvalidInventoryError, match="leak action"):
        n1.beat(ledger, leak_action="delete")
    with pytest.raises(InvalidInventoryError, match="health source"):
        ledger.set_health("n1", "quarantined", source="someone")
    with pytest.raises(InvalidInventoryError, match="gpu"):
        ledger.set_gpu_health("n1", "GPU-nope", "quarantined")
    assert node_json(ledger, "n1")["health"] == "healthy"


def test_a_v6_ledger_migrates_to_v7_and_keeps_its_rows(
    make_ledger: Callable[..., Ledger], ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:6])
        m.setattr(migrations, "LATEST", 6)
        old = make_ledger(concurrent=False)
        old.upsert_nodes([node("n1", gpus=2)])
        old.set_health("n1", "cordoned")
        old.reserve(GpuRequest(), "cpu-only", reservation_id="cpu")
        old.close()
    engine = create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:  # v1 made the tables as the code has them now: a true v6 lacks these
        for table, columns in migrations._V7_COLUMNS.items():
            for column, _ in columns:
                conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
    engine.dispose()

    ledger = Ledger(ledger_url)
    assert ledger.migrate() == list(range(7, migrations.LATEST + 1))
    assert ledger.migrate() == []
    (record,) = ledger.snapshot().to_dict()["nodes"]
    assert (record["health"], record["health_source"]) == ("cordoned", "inventory")
    assert [(g["uuid_verified"], g["health"]) for g in record["gpus"]] == [(False, "healthy")] * 2
    assert ledger.get("cpu").state is ReservationState.WAITING  # the node is cordoned: it waits, kept
    ledger.close()


def test_the_ui_page_shows_what_the_agent_saw(pool: Any, clock: FakeClock) -> None:
    from airflow_gpupool.plugins.page import node_html

    ledger, n1, _ = pool
    n1.gpu(0)["processes"] = [{"pid": 9, "memory_mib": 1000}]
    n1.nvml.spec["xid_events"] = [{"id": 1, "gpu": 1, "xid": 79}]
    n1.beat(ledger)
    clock.advance(61)
    n1.beat(ledger)
    snap = ledger.snapshot()
    n1_html = node_html(next(n for n in snap.nodes if n.name == "n1"), snap, "/")
    assert "90% busy, 1000 MiB used" in n1_html and "leak 1000 MiB" in n1_html
    assert ">quarantined</span>" in n1_html and 'title="set by inventory"' in n1_html
    n2_html = node_html(next(n for n in snap.nodes if n.name == "n2"), snap, "/")
    assert "UUID unverified" in n2_html and "busy" not in n2_html
