"""Preemption on the GPU pool page, its reservation page and its JSON API, from a real ledger (SQLite and PostgreSQL).

The story (times from the fake clock's start, ``T``; one node of 8 A100, grace 120 s):
    T+0      vision's train/fit try 1 holds all 8 GPUs, preemptible
    T+400    its holder reports a checkpoint to the ledger
    T+600    ops asks for 4 GPUs at priority 100: vision's grant turns preempting, deadline T+720
    T+630    the page is read: 90 s of grace left
    T+660    vision's holder releases: preempted, 8 GPUs × 260 s = 2,080 GPU-s lost
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_gpupool.ledger import Ledger, PreemptionLoss, ReservationState, preemption_losses, usage_report
from airflow_gpupool.plugins.app import create_app
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry
from tests.ledger_fixtures import FakeClock, node

TRAIN = TaskTry("train", "fit", "manual__1", -1, 1, "w1")
GRACE = 120.0


@pytest.fixture
def ledger(make_ledger: Callable[..., Ledger], clock: FakeClock) -> Ledger:
    ledger = make_ledger(min_runtime_seconds=300, preemption_grace_seconds=GRACE)
    ledger.upsert_nodes([node("a1", gpus=8, model="A100", pool="a100")])
    ask = GpuRequest(gpus=8, team="vision", preemptible=True)
    ledger.reserve(ask, TRAIN.holder, reservation_id="r-train", ttl=7200)
    clock.advance(400)
    assert ledger.note_checkpoint("r-train", clock.now)
    clock.advance(200)
    urgent = GpuRequest(gpus=4, team="ops", priority=100)
    assert (
        ledger.reserve(urgent, "urgent@w", reservation_id="r-urgent", timeout=3600).state.value == "waiting"
    )
    assert ledger.get("r-train").state is ReservationState.PREEMPTING
    clock.advance(30)
    return ledger


@pytest.fixture
def client(ledger: Ledger) -> TestClient:
    app = create_app(lambda: ledger, snapshot_ttl=0)
    app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="viewer", role="viewer")
    return TestClient(app)


def test_the_page_shows_a_preempting_grant_its_preemptor_and_the_grace_left(
    client: TestClient, clock: FakeClock
) -> None:
    html = client.get("/").text
    (row,) = [r for r in re.findall(r"<tr>.*?</tr>", html) if "r-train" in r and "preempting" in r]
    assert (
        '<span class="state s-preempting">preempting</span> for <a class="rid" href="reservations/r-urgent"'
        in row
    )
    # Right without the script: 90 s left as rendered, the script counts down from data-left.
    deadline = clock.now + 90
    assert (
        f'<span class="countdown" data-deadline="{deadline:.3f}" data-left="90.000">1m 30s</span> left' in row
    )
    assert 'class="seg held preempting"' in html and "preempting for r-urgent" in html
    clock.advance(45)
    assert 'data-left="45.000">45s</span>' in client.get("/", params={"partial": 1}).text


def test_the_reservation_page_says_who_preempts_it_and_counts_the_grace_down(
    client: TestClient, clock: FakeClock
) -> None:
    html = client.get("/reservations/r-train").text
    assert "<dt>State</dt><dd>preempting</dd>" in html
    assert "<dt>Preempted for</dt><dd>r-urgent</dd>" in html
    assert "<dt>Last checkpoint</dt><dd>" in html and "<dt>Grace until</dt><dd>" in html
    assert 'for <a class="rid" href="r-urgent" title="r-urgent">' in html  # its page is a sibling
    assert 'data-left="90.000">1m 30s</span> left: its pod must end by then.' in html


def test_the_snapshot_api_gives_the_seconds_left(client: TestClient) -> None:
    grants = {g["id"]: g for g in client.get("/api/v1/snapshot").json()["grants"]}
    train = grants["r-train"]
    assert (train["state"], train["preempted_by"], train["preempt_seconds_left"]) == (
        "preempting",
        "r-urgent",
        90.0,
    )


def test_once_released_the_page_and_the_usage_api_count_the_preemption_and_the_work_lost(
    ledger: Ledger, client: TestClient, clock: FakeClock
) -> None:
    clock.advance(30)
    assert ledger.release("r-train").released
    assert ledger.get("r-train").state is ReservationState.PREEMPTED
    assert ledger.get("r-urgent").state is ReservationState.GRANTED
    expected = PreemptionLoss("vision", 1, 8 * 260.0)
    assert ledger.read(preemption_losses) == {"vision": expected}
    html = client.get("/").text
    by_team = html.split('<table class="by-team">')[1].split("</table>")[0]
    (row,) = [r for r in re.findall(r"<tr>.*?</tr>", by_team) if "vision</a></td>" in r]
    assert row.endswith('<td>1</td><td><b class="lost">2,080</b></td></tr>')
    assert "<dt>Lost GPU-s</dt>" in html
    (vision,) = [t for t in client.get("/api/v1/usage").json()["teams"] if t["team"] == "vision"]
    assert (vision["preemptions"], vision["lost_gpu_seconds"]) == (1, 2080.0)
    # The range counts those that ended in it: an hour later, the last hour has none.
    clock.advance(3600)
    assert usage_report(ledger, ledger.snapshot(), 1).preempted == {}
    assert usage_report(ledger, ledger.snapshot(), 24).preempted == {"vision": expected}
