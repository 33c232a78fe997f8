"""The controller's drift step: since when each node drifts, the warning past the alert time, the stored rows."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.controller.drift import DriftKeeper, drift_records
from airflow_gpupool.ledger import Ledger, LedgerDriftRecords, NodeDrift
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

ALERT = 300.0


def row(name: str, drift: float, running: float = 0.0) -> NodeDrift:
    mismatched = (f"grant x: {drift:g} → 0",) if drift else ()
    return NodeDrift(name, 4.0, drift, 0.0, running, drift, mismatched)


@pytest.mark.parametrize(
    ("rows", "before", "since"),
    [
        pytest.param([row("a", 1)], {}, {"a": 100.0}, id="starts drifting now"),
        pytest.param([row("a", 1)], {"a": 40.0}, {"a": 40.0}, id="still drifting: since kept"),
        pytest.param([row("a", 0)], {"a": 40.0}, {}, id="agrees again: forgotten"),
        pytest.param([row("a", 0), row("b", 2)], {"gone": 1.0}, {"b": 100.0}, id="a node gone is forgotten"),
    ],
)
def test_since_when_each_node_drifts(
    rows: list[NodeDrift], before: dict[str, float], since: dict[str, float]
) -> None:
    records, after = drift_records(rows, 100.0, before)
    assert after == since
    assert {r.node: r.since for r in records} == {r.node: since.get(r.node) for r in rows}
    assert all(r.computed_at == 100.0 for r in records)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(tmp_path: Path, clock: FakeClock) -> Iterator[Ledger]:
    with Ledger.create(f"sqlite:///{tmp_path}/ledger.db", clock=clock) as ledger:
        ledger.upsert_nodes([node("gpu-a", gpus=4), node("gpu-b", gpus=4)])
        ledger.reserve(GpuRequest(gpus=1), "train", reservation_id="gp-1")  # best fit: one node
        yield ledger


def pod_of(grant_node: str, rid: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "name": rid,
            "namespace": "default",
            "uid": f"u-{rid}",
            "labels": {"gpupool.io/reservation-id": rid},
        },
        "spec": {
            "nodeName": grant_node,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def test_a_node_drifting_past_the_alert_time_is_logged_once_and_stored(
    ledger: Ledger, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    granted = ledger.get("gp-1").grant
    assert granted is not None
    pods: list[dict[str, Any]] = []  # the grant's pod has not started: 1 GPU of drift
    keeper = DriftKeeper(ledger, lambda: pods, ALERT)
    caplog.set_level(logging.INFO, logger="airflow_gpupool.controller.drift")

    first = keeper()
    assert first is not None and (first.drifting, first.alerted, first.written) == ([granted.node], [], True)
    clock.advance(ALERT - 1)
    assert keeper().alerted == []  # type: ignore[union-attr]
    clock.advance(1)
    assert keeper().alerted == [granted.node]  # type: ignore[union-attr]
    clock.advance(10)
    assert keeper().alerted == []  # type: ignore[union-attr]  # logged once
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and granted.node in warnings[0].getMessage()
    assert "grant gp-1: 1 → 0" in warnings[0].getMessage()

    stored = LedgerDriftRecords(ledger).get()
    assert stored[granted.node].drift == 1.0 and stored[granted.node].since == clock.now - ALERT - 10
    assert stored[granted.node].mismatched == ("grant gp-1: 1 → 0",)
    other = "gpu-b" if granted.node == "gpu-a" else "gpu-a"
    assert (stored[other].drift, stored[other].since) == (0.0, None)

    # A restarted controller keeps since when the node drifts, from the stored rows.
    restarted = DriftKeeper(ledger, lambda: pods, ALERT)
    assert restarted().alerted == [granted.node]  # type: ignore[union-attr]
    assert LedgerDriftRecords(ledger).get()[granted.node].since == clock.now - ALERT - 10

    pods.append(pod_of(granted.node, "gp-1"))  # the pod runs: the books agree
    clock.advance(1)
    agreed = keeper()
    assert agreed is not None and agreed.drifting == []
    assert LedgerDriftRecords(ledger).get()[granted.node].since is None
    assert any("agree with its pods again" in r.getMessage() for r in caplog.records)


def test_unchanged_numbers_are_not_written_again_until_the_refresh(ledger: Ledger, clock: FakeClock) -> None:
    keeper = DriftKeeper(ledger, lambda: [], ALERT)
    assert keeper().written  # type: ignore[union-attr]
    clock.advance(1)
    assert not keeper().written  # type: ignore[union-attr]
    clock.advance(keeper.refresh_seconds)
    assert keeper().written  # type: ignore[union-attr]


def test_nothing_is_computed_before_the_watch_has_listed(ledger: Ledger) -> None:
    assert DriftKeeper(ledger, lambda: None, ALERT)() is None
    assert LedgerDriftRecords(ledger).get() == {}
