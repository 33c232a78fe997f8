"""Queued ahead (issue 40): a request with ``not_before`` keeps its place but is not granted before it.

SQLite and PostgreSQL (the ``ledger`` fixture: on PostgreSQL the concurrent paths run too); the
fake clock moves by hand.
"""

from __future__ import annotations

import math

import pytest

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING


def test_a_request_queued_ahead_waits_on_a_free_pool_until_its_time(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ahead = ledger.reserve(
        GpuRequest(gpus=1), "evaluate", reservation_id="evaluate", not_before=clock.now + 60
    )

    assert (ahead.state, ahead.not_before, ahead.position) == (WAITING, clock.now + 60, 1)
    assert "queued ahead: not granted for another 60s" in ledger.explain("evaluate")
    assert ledger.explain("evaluate").endswith("it fits n1 now")  # no earlier request holds it
    clock.advance(59)
    ledger.reap()
    assert ledger.get("evaluate").state is WAITING
    clock.advance(1)
    assert ledger.reap_if_due() is not None  # a waiting process's look finds it due and serves it
    got = ledger.get("evaluate")
    assert got.state is GRANTED and got.grant is not None
    assert got.grant.granted_at == clock.now and got.not_before is None


def test_a_release_does_not_hand_its_node_to_a_request_not_yet_due(ledger: Ledger, clock: FakeClock) -> None:
    # On PostgreSQL a release that empties a node hands it to the queue's first request in its own
    # transaction (ledger.queue.hand_over): never to one queued ahead before its time.
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "train", reservation_id="train", ttl=3600)
    ledger.reserve(GpuRequest(gpus=1), "evaluate", reservation_id="evaluate", not_before=clock.now + 30)

    ledger.release("train")

    assert ledger.get("evaluate").state is WAITING
    clock.advance(30)
    ledger.reap()
    assert ledger.get("evaluate").state is GRANTED


def test_it_keeps_its_place_and_requests_behind_it_count_as_overtaking(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=2), "train", reservation_id="train", ttl=3600)
    ledger.reserve(GpuRequest(gpus=2), "evaluate", reservation_id="evaluate", not_before=clock.now + 30)
    ledger.reserve(GpuRequest(gpus=1), "late", reservation_id="late", timeout=3600)
    assert ledger.queue_positions() == {"evaluate": 1, "late": 2}

    ledger.release("train")  # before evaluate is due: the GPU goes to the request behind it
    assert ledger.get("late").state is GRANTED
    assert ledger.get("evaluate").state is WAITING
    clock.advance(30)
    ledger.reserve(GpuRequest(gpus=2), "later", reservation_id="later", timeout=3600)
    ledger.release("late")
    # Once due it is served in its place: ahead of a request that came after it.
    assert ledger.get("evaluate").state is GRANTED
    assert ledger.get("later").state is WAITING


def test_a_not_before_already_past_is_granted_at_once(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    got = ledger.reserve(GpuRequest(gpus=1), "late", reservation_id="late", not_before=clock.now - 5)
    assert got.state is GRANTED and got.not_before is None


@pytest.mark.parametrize("bad", ["soon", math.nan, math.inf, True])
def test_a_bad_not_before_is_refused_and_nothing_is_written(ledger: Ledger, bad: object) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    with pytest.raises(InvalidRequestError, match="not_before.*a finite ledger time"):
        ledger.reserve(GpuRequest(gpus=1), "x", reservation_id="x", not_before=bad)  # type: ignore[arg-type]
    assert ledger.get_or_none("x") is None
