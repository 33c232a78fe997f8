"""Waiting only reads: a waiter's polls open no write transaction; writers and overdue checks serve the queue.

On both backends, with the real trigger, the real in-place wait and the real hook. A detector
counts every write the ledger could make: the serialized write transaction, a call on the
concurrent path, and any SQL statement that writes or takes the write lock.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event

from airflow_gpupool.forecast.deadlines import XCOM_DEADLINE_KEY, DagDeadline
from airflow_gpupool.forecast.step import refresh_forecasts
from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.ledger import Ledger, LedgerForecasts
from airflow_gpupool.ledger.postgres.concurrent import ConcurrentPath
from airflow_gpupool.ledger.store import transactions as store_module
from airflow_gpupool.operators.pod.waiting import wait_in_place
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.triggers import ReservationTrigger
from tests.ledger_fixtures import node

_WRITES = re.compile(
    r"^\s*(INSERT|UPDATE|DELETE|BEGIN IMMEDIATE)|pg_advisory_xact_lock|pg_notify|gpupool_take|gpupool_give_back",
    re.IGNORECASE,
)


class WriteDetector:
    """Counts what would write to the ledger while it is armed."""

    def __init__(self) -> None:
        self.armed = False
        self.writes: list[str] = []

    def saw(self, what: str) -> None:
        if self.armed:
            self.writes.append(what)


@pytest.fixture
def detector(monkeypatch: pytest.MonkeyPatch) -> Iterator[WriteDetector]:
    found = WriteDetector()
    real_write = store_module.write_transaction
    real_connect = ConcurrentPath.connect

    def write_transaction(*args: Any, **kwargs: Any) -> Any:
        found.saw("write transaction")
        return real_write(*args, **kwargs)

    def connect(self: ConcurrentPath) -> Any:
        found.saw("concurrent path")
        return real_connect(self)

    def statement(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        if _WRITES.search(sql):
            found.saw(sql.strip().splitlines()[0][:80])

    monkeypatch.setattr(store_module, "write_transaction", write_transaction)
    monkeypatch.setattr(ConcurrentPath, "connect", connect)
    event.listen(Engine, "before_cursor_execute", statement)
    try:
        yield found
    finally:
        event.remove(Engine, "before_cursor_execute", statement)


@pytest.fixture
def full_pool(ledger_url: str) -> Iterator[tuple[Ledger, str, list[str]]]:
    """One GPU held, three requests waiting for it; yields the ledger, the grant and the waiters."""
    ledger = Ledger.create(ledger_url, policy="bestfit")
    ledger.upsert_nodes([node("n1", gpus=1)])
    held = ledger.reserve(GpuRequest(gpus=1), "holder", ttl=600)
    waiting = [ledger.reserve(GpuRequest(gpus=1), f"waiter-{i}", timeout=600).id for i in range(3)]
    yield ledger, held.id, waiting
    ledger.close()


def test_the_detector_sees_a_reap_and_a_release(
    full_pool: tuple[Ledger, str, list[str]], detector: WriteDetector
) -> None:
    # The test below could not fail if the detector missed the writes it is there to catch.
    ledger, held, _ = full_pool
    detector.armed = True
    ledger.reap()
    assert detector.writes, "a reap is a write transaction"
    detector.writes.clear()
    ledger.release(held)
    assert detector.writes, "a release is a write"


def test_polls_of_a_waiting_request_only_read(
    full_pool: tuple[Ledger, str, list[str]], detector: WriteDetector, ledger_url: str
) -> None:
    ledger, held, waiting = full_pool
    hook = GpuPoolHook(None, ledger_url=ledger_url)
    detector.armed = True
    for _ in range(20):
        assert hook.poll_waiting(waiting[0]).state.value == "waiting"
    assert detector.writes == []


def test_a_waiting_trigger_only_reads(
    full_pool: tuple[Ledger, str, list[str]], detector: WriteDetector, ledger_url: str
) -> None:
    ledger, held, waiting = full_pool

    async def scenario() -> list[dict[str, Any]]:
        triggers = [
            ReservationTrigger(rid, None, ledger_url=ledger_url, poll_interval=0.05) for rid in waiting
        ]
        tasks = [asyncio.create_task(_first_event(t)) for t in triggers]
        detector.armed = True
        await asyncio.sleep(1.0)  # about 20 batched reads of the wait room, and each trigger's own
        detector.armed = False
        assert not any(t.done() for t in tasks), "nothing was released: every trigger keeps waiting"
        writes = list(detector.writes)
        await asyncio.to_thread(ledger.release, held)
        first = await asyncio.wait_for(asyncio.shield(tasks[0]), 15)
        for t in tasks[1:]:
            t.cancel()
        assert writes == [], f"waiting triggers wrote: {writes}"
        return [first]

    (event,) = asyncio.run(scenario())
    assert event["status"] == "granted" and event["reservation_id"] == waiting[0]
    assert event["queue_life"]["positions"][0][1] == 1


def test_waiting_in_place_only_reads(
    full_pool: tuple[Ledger, str, list[str]], detector: WriteDetector, ledger_url: str
) -> None:
    ledger, held, waiting = full_pool
    hook = GpuPoolHook(None, ledger_url=ledger_url)
    result: dict[str, Any] = {}
    polls = threading.Event()

    class Log:
        lines: list[str] = []

        def info(self, msg: str, *args: Any) -> None:
            self.lines.append(msg % args)
            if len(self.lines) >= 5:
                polls.set()

    log = Log()
    detector.armed = True
    waiter = threading.Thread(target=lambda: result.update(grant=wait_in_place(hook, waiting[0], 0.05, log)))
    waiter.start()
    assert polls.wait(10), "the in-place wait polls"
    detector.armed = False
    assert detector.writes == [], f"waiting in place wrote: {detector.writes}"
    ledger.release(held)
    waiter.join(10)
    grant, life = result["grant"]
    assert grant.node == "n1" and life["positions"][0][1] == 1
    assert "position 1 of the queue" in log.lines[0] and "no node fits" in log.lines[0]


class Lines:
    """A logger that keeps its lines (warnings marked)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)

    def warning(self, msg: str, *args: Any) -> None:
        self.lines.append("WARNING " + msg % args)


class RecordingTi:
    """The task instance's one call here: ``xcom_push`` (Airflow's side, not the ledger's)."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, Any]] = []
        self.said = threading.Event()

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed.append((key, value))
        self.said.set()


def test_waiting_in_place_says_an_unreachable_deadline_once_and_only_reads(
    full_pool: tuple[Ledger, str, list[str]], detector: WriteDetector, ledger_url: str
) -> None:
    # The holder has no history: the prior's hour. A deadline in a minute lies before the forecast's p10.
    ledger, held, waiting = full_pool
    refresh_forecasts(ledger)
    forecast = LedgerForecasts(ledger).get(waiting[0])
    assert forecast is not None and forecast.p10 is not None
    soon = DagDeadline("within a minute", time.time() + 60)
    later = DagDeadline("within a year", time.time() + 365 * 86400)
    assert soon.at < forecast.p10 < later.at  # the case is what it claims
    hook, ti = GpuPoolHook(None, ledger_url=ledger_url), RecordingTi()
    log = Lines()
    lines = log.lines
    result: dict[str, Any] = {}
    detector.armed = True
    waiter = threading.Thread(
        target=lambda: result.update(
            grant=wait_in_place(hook, waiting[0], 0.05, log, deadlines=[later, soon], ti=ti)
        )
    )
    waiter.start()
    assert ti.said.wait(10), "the forecast makes the minute unreachable: said while waiting"
    polls = len(lines)
    until = time.monotonic() + 10
    while len(lines) < polls + 5 and time.monotonic() < until:  # five more polls: said once, not again
        time.sleep(0.05)
    detector.armed = False
    assert detector.writes == [], f"waiting in place wrote: {detector.writes}"
    ledger.release(held)
    waiter.join(10)
    assert result["grant"][0].node == "n1"
    ((key, value),) = ti.pushed
    assert key == XCOM_DEADLINE_KEY and value["reservation_id"] == waiting[0]
    (missed,) = value["unreachable"]
    assert missed["name"] == "within a minute" and missed["at"] == soon.at
    assert "(10 %), is later; expected start" in missed["message"]
    assert value["forecast"] == forecast.to_dict()
    assert [line for line in lines if line.startswith("WARNING ")] == [
        f"WARNING Reservation {waiting[0]} {missed['message']}"
    ]


def test_with_no_controller_a_waiting_process_ends_a_dead_lease(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedded default (make demo): nobody reaps, the holder died, only waiters remain.
    monkeypatch.setenv("AIRFLOW__GPUPOOL__WAITER_REAP_INTERVAL_SECONDS", "0.1")
    ledger = Ledger.create(ledger_url, policy="bestfit")
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "died", ttl=0.5)
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter", timeout=60)
    event = asyncio.run(
        asyncio.wait_for(
            _first_event(ReservationTrigger(waiting.id, None, ledger_url=ledger_url, poll_interval=0.1)), 20
        )
    )
    assert event["status"] == "granted"
    ledger.close()


def test_a_waiter_times_out_on_time_when_nobody_else_writes(ledger_url: str) -> None:
    ledger = Ledger.create(ledger_url, policy="bestfit")
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "holder", ttl=600)
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter", timeout=0.5)
    started = time.monotonic()
    event = asyncio.run(
        asyncio.wait_for(
            _first_event(ReservationTrigger(waiting.id, None, ledger_url=ledger_url, poll_interval=5)), 20
        )
    )
    assert event["status"] == "timeout" and "no node fits" in event["message"]
    assert time.monotonic() - started < 4, "the waiter's own deadline, not the 5 s poll, ends the wait"
    ledger.close()


async def _first_event(trigger: ReservationTrigger) -> dict[str, Any]:
    async for fired in trigger.run():
        return dict(fired.payload)
    raise AssertionError("the trigger yielded nothing")


def test_the_granting_writer_wakes_exactly_the_granted_waiter(pg_schema_url: str) -> None:
    # PostgreSQL: a NOTIFY at the grant's commit, one listening connection, no poll needed
    # (the batched poll is set to a minute, so only the notification can wake it in time).
    from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook
    from airflow_gpupool.triggers.wait_room import wait_room

    ledger = Ledger.create(pg_schema_url, policy="bestfit")
    ledger.upsert_nodes([node("n1", gpus=1)])
    held = ledger.reserve(GpuRequest(gpus=1), "holder", ttl=600)
    first, second = (ledger.reserve(GpuRequest(gpus=1), f"w{i}", timeout=600).id for i in range(2))

    async def scenario() -> tuple[dict[str, Any], bool, dict[str, int], float]:
        hook = AsyncGpuPoolHook(None, ledger_url=pg_schema_url)  # the triggers' own shared ledger
        await hook.aoptions()
        room = wait_room(hook.ledger, 60.0)
        runs = {
            rid: asyncio.create_task(
                _first_event(ReservationTrigger(rid, None, ledger_url=pg_schema_url, poll_interval=60))
            )
            for rid in (first, second)
        }
        for _ in range(100):  # the listener is up
            if room.listening:
                break
            await asyncio.sleep(0.05)
        assert room.listening
        released = time.monotonic()
        await asyncio.to_thread(ledger.release, held.id)
        event = await asyncio.wait_for(runs[first], 10)
        woke_after = time.monotonic() - released
        await asyncio.sleep(0.3)
        still_waiting = not runs[second].done()
        runs[second].cancel()
        return event, still_waiting, dict(room.woken), woke_after

    event, still_waiting, woken, woke_after = asyncio.run(scenario())
    assert event["status"] == "granted" and event["reservation_id"] == first
    assert still_waiting, "the other waiter's request was not granted: it is not woken"
    assert woken == {"notify": 1, "poll": 0, "forecast": 0}
    assert woke_after < 5
    ledger.close()


def test_a_grant_between_a_waiters_read_and_its_wait_still_wakes_it(
    pg_schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race behind a lost wake-up: the trigger read its request (waiting), the grant's NOTIFY
    # came before it entered the room, and the room's next batched read was a minute away.
    from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook
    from airflow_gpupool.triggers.wait_room import wait_room

    ledger = Ledger.create(pg_schema_url, policy="bestfit")
    ledger.upsert_nodes([node("n1", gpus=1)])
    held = ledger.reserve(GpuRequest(gpus=1), "holder", ttl=600)
    late, other = (ledger.reserve(GpuRequest(gpus=1), f"w{i}", timeout=600).id for i in range(2))

    async def scenario() -> tuple[dict[str, Any], float]:
        hook = AsyncGpuPoolHook(None, ledger_url=pg_schema_url)  # the triggers' own shared ledger
        await hook.aoptions()
        room = wait_room(hook.ledger, 60.0)
        others = asyncio.create_task(
            _first_event(ReservationTrigger(other, None, ledger_url=pg_schema_url, poll_interval=60))
        )
        for _ in range(100):  # the room runs and listens, for the other waiter
            if room.listening:
                break
            await asyncio.sleep(0.05)
        assert room.listening
        between = asyncio.Event()
        go_on = asyncio.Event()
        real_log_wait = ReservationTrigger._log_wait

        async def log_wait_held_back(self: ReservationTrigger, *args: Any) -> Any:
            # Between the trigger's read and its wait: hold it here while the grant commits.
            between.set()
            await go_on.wait()
            return await real_log_wait(self, *args)

        monkeypatch.setattr(ReservationTrigger, "_log_wait", log_wait_held_back)
        run = asyncio.create_task(
            _first_event(ReservationTrigger(late, None, ledger_url=pg_schema_url, poll_interval=60))
        )
        await asyncio.wait_for(between.wait(), 10)
        await asyncio.to_thread(ledger.release, held.id)
        await asyncio.sleep(1.0)  # the NOTIFY reaches the room while the trigger is not in it
        released = time.monotonic()
        go_on.set()
        event = await asyncio.wait_for(run, 10)
        others.cancel()
        return event, time.monotonic() - released

    event, woke_after = asyncio.run(scenario())
    assert event["status"] == "granted" and event["reservation_id"] == late
    assert woke_after < 5, "woken by the notification it missed, not by the minute's batched read"
    ledger.close()
