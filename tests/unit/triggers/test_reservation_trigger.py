"""ReservationTrigger: serialization contract and events, on a real SQLite ledger."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from airflow_gpupool.forecast.step import refresh_forecasts
from airflow_gpupool.forecast.words import describe_forecast
from airflow_gpupool.ledger import Ledger, LedgerForecasts
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.triggers import ReservationTrigger
from tests.ledger_fixtures import node


def test_reservation_trigger_serializes_every_argument() -> None:
    trigger = ReservationTrigger(
        "gp-1", ledger_conn_id="pool_eu", ledger_url="sqlite:////x.db", poll_interval=2.5
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_gpupool.triggers.reservation.ReservationTrigger"
    assert kwargs == {
        "reservation_id": "gp-1",
        "ledger_conn_id": "pool_eu",
        "ledger_url": "sqlite:////x.db",
        "poll_interval": 2.5,
        "fail_fast_on_forecast": False,
        "deadlines": [],
    }
    assert ReservationTrigger(**kwargs).serialize() == (classpath, kwargs)
    due = [{"name": "by noon", "at": 1.5e9, "warned": True}]
    assert ReservationTrigger("gp-1", deadlines=due).serialize()[1]["deadlines"] == due


@pytest.fixture
def ledger_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger.create(url).upsert_nodes([node("n1", gpus=1)])
    monkeypatch.setenv("GPUPOOL_LEDGER_URL", url)
    return url


async def first_event(trigger: ReservationTrigger) -> dict:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger yielded nothing")


def test_trigger_yields_granted_once_the_holder_releases(ledger_url: str) -> None:
    ledger = Ledger(ledger_url)
    holder = ledger.reserve(GpuRequest(gpus=1), "holder")
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter")

    async def scenario() -> dict:
        task = asyncio.create_task(first_event(ReservationTrigger(waiting.id, None, poll_interval=0.05)))
        await asyncio.sleep(0.2)
        assert not task.done(), "the trigger must keep waiting while the GPU is held"
        await asyncio.to_thread(ledger.release, holder.id)
        return await asyncio.wait_for(task, 10)

    event = asyncio.run(scenario())
    assert event["status"] == "granted" and event["reservation_id"] == waiting.id
    assert event["grant"]["node"] == "n1" and event["grant"]["gpu_indices"] == [0]
    json.dumps(event)  # events must be plain JSON


def test_two_copies_of_the_trigger_agree(ledger_url: str) -> None:
    ledger = Ledger(ledger_url)
    granted = ledger.reserve(GpuRequest(gpus=1), "a")

    async def both() -> list[dict]:
        triggers = [ReservationTrigger(granted.id, None, poll_interval=0.05) for _ in range(2)]
        return list(await asyncio.gather(*(first_event(t) for t in triggers)))

    first, second = asyncio.run(both())
    assert first == second and first["status"] == "granted"


def test_trigger_reports_timeout_with_the_blocker(ledger_url: str) -> None:
    ledger = Ledger(ledger_url)
    ledger.reserve(GpuRequest(gpus=1), "holder")
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter", timeout=0.2)

    event = asyncio.run(
        asyncio.wait_for(first_event(ReservationTrigger(waiting.id, None, poll_interval=0.05)), 10)
    )

    assert event["status"] == "timeout"
    assert "n1: needs 1 free GPUs, 0 free of 1" in event["message"]


def test_the_wait_log_and_the_timeout_say_what_the_forecast_said(
    ledger_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(ledger_url)
    ledger.reserve(GpuRequest(gpus=1), "holder")
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter", timeout=0.5)
    refresh_forecasts(ledger)  # the controller's step; the trigger only reads what it stored
    stored = LedgerForecasts(ledger).get(waiting.id)
    assert stored is not None and stored.status == "forecast"
    words = describe_forecast(stored, time.time())

    event = asyncio.run(
        asyncio.wait_for(first_event(ReservationTrigger(waiting.id, None, poll_interval=0.05)), 10)
    )

    out, err = capfd.readouterr()  # the trigger's logger writes through Airflow's structlog
    assert f"waits at position 1 of 1; {words}" in out + err
    assert event["status"] == "timeout"
    blocker, said = event["message"].split("; the forecast said at ")
    assert "n1: needs 1 free GPUs" in blocker and said.endswith(f"s: {words}")


@pytest.mark.parametrize("fail_fast", [True, False])
def test_fail_fast_gives_up_once_p10_lies_past_the_timeout(ledger_url: str, fail_fast: bool) -> None:
    ledger = Ledger(ledger_url)
    ledger.reserve(GpuRequest(gpus=1), "holder")  # with no history it runs about an hour (the prior)
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter", timeout=60)
    refresh_forecasts(ledger)
    stored = LedgerForecasts(ledger).get(waiting.id)
    assert stored is not None and stored.p10 is not None and stored.p10 > ledger.get(waiting.id).deadline
    trigger = ReservationTrigger(waiting.id, None, poll_interval=0.05, fail_fast_on_forecast=fail_fast)

    async def first_or_none() -> dict | None:
        try:
            return await asyncio.wait_for(first_event(trigger), 1.5)
        except TimeoutError:
            return None

    event = asyncio.run(first_or_none())
    if not fail_fast:
        assert event is None  # it keeps waiting for its timeout
        return
    assert event is not None and event["status"] == "forecast"
    assert event["message"].startswith("gave up before its reservation timeout (")
    assert describe_forecast(stored, time.time()) in event["message"]


@pytest.mark.parametrize("reachable", [True, False])
def test_a_deadline_before_p10_is_said_once(
    ledger_url: str, reachable: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(ledger_url)
    ledger.reserve(GpuRequest(gpus=1), "holder")  # with no history it runs about an hour (the prior)
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter", timeout=600)
    refresh_forecasts(ledger)
    stored = LedgerForecasts(ledger).get(waiting.id)
    assert stored is not None and stored.p10 is not None
    at = stored.p10 + 1 if reachable else stored.p10 - 1
    later = {"name": "later", "at": stored.p10 + 3600, "warned": False}
    due = [{"name": "soon", "at": at, "warned": False}, later]
    trigger = ReservationTrigger(waiting.id, None, poll_interval=0.05, deadlines=due)

    async def first_or_none(trigger: ReservationTrigger) -> dict | None:
        try:
            return await asyncio.wait_for(first_event(trigger), 1.0)
        except TimeoutError:
            return None

    event = asyncio.run(first_or_none(trigger))
    out, err = capfd.readouterr()
    if reachable:
        assert event is None  # it keeps waiting
        assert "cannot start before" not in out + err
        return
    assert event is not None and event["status"] == "deadline"
    (missed,) = event["unreachable"]
    assert missed["name"] == "soon" and missed["at"] == at
    assert missed["message"].startswith("cannot start before the DAG's deadline 'soon' (")
    assert missed["message"] in out + err  # the warning in the trigger's log
    assert event["forecast"] == stored.to_dict()
    assert event["deadlines"] == [{**due[0], "warned": True}, later]
    again = ReservationTrigger(waiting.id, None, poll_interval=0.05, deadlines=event["deadlines"])
    assert asyncio.run(first_or_none(again)) is None  # said once: the next trigger keeps waiting


def test_trigger_turns_failures_into_an_error_event(ledger_url: str) -> None:
    event = asyncio.run(first_event(ReservationTrigger("no-such-reservation", None, poll_interval=0.05)))
    assert event["status"] == "error"
    assert "UnknownReservationError" in event["message"]
