"""``Ledger.set_priority``: a waiting request's new priority orders the queue, in every process, a gang as one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_gpupool.exceptions import InvalidRequestError, UnknownReservationError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GangSpec, GpuRequest
from tests.ledger_fixtures import node

GRANTED = ReservationState.GRANTED
WAITING = ReservationState.WAITING


def test_the_new_priority_serves_first_even_where_another_ledger_cached_the_old_one(
    make_ledger: Callable[..., Ledger],
) -> None:
    # Two Ledger objects stand for two processes: the worker that queued the requests (its
    # parsed requests cached) and the console that re-prioritizes one.
    worker, console = make_ledger(), make_ledger()
    worker.upsert_nodes([node("n1", gpus=1)])
    worker.reserve(GpuRequest(gpus=1), "holder", reservation_id="g", ttl=3600)
    worker.reserve(GpuRequest(gpus=1), "first", reservation_id="w1", timeout=3600)
    worker.reserve(GpuRequest(gpus=1), "second", reservation_id="w2", timeout=3600)
    assert worker.queue_positions() == {"w1": 1, "w2": 2}

    moved = console.set_priority("w2", 9)

    assert (moved.state, moved.request.priority) == (WAITING, 9)
    assert worker.queue_positions() == {"w2": 1, "w1": 2}
    worker.release("g")  # the worker's pass serves the queue by the new priority
    assert (worker.get("w2").state, worker.get("w1").state) == (GRANTED, WAITING)


def test_a_waiting_gang_moves_as_one_and_its_members_keep_the_new_priority(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=2), "holder", reservation_id="g", ttl=3600)
    ledger.reserve(GpuRequest(gpus=1), "single", reservation_id="s", timeout=3600)
    ledger.reserve(GpuRequest(gpus=1, gang=GangSpec(2, 2, ())), "gang", reservation_id="gg", timeout=3600)

    ledger.set_priority("gg", 4)  # a waiting gang is its leader's row; members are made when admitted

    ledger.release("g")
    members = ledger.gang("gg").members
    assert [(m.state, m.request.priority) for m in members] == [(GRANTED, 4), (GRANTED, 4)]
    assert ledger.get("s").state is WAITING


@pytest.mark.parametrize("priority", [True, 1.5, "3", 10**7])
def test_a_bad_priority_is_refused_and_nothing_changes(ledger: Ledger, priority: object) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "holder", reservation_id="g", ttl=3600)
    ledger.reserve(GpuRequest(gpus=1), "w", reservation_id="w", timeout=3600)
    with pytest.raises(InvalidRequestError, match="priority"):
        ledger.set_priority("w", priority)  # type: ignore[arg-type]
    assert ledger.get("w").request.priority == 0


def test_only_a_waiting_request_is_re_prioritized(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "holder", reservation_id="g", ttl=3600)
    with pytest.raises(InvalidRequestError, match="a waiting request \\(it is granted\\)"):
        ledger.set_priority("g", 3)
    with pytest.raises(UnknownReservationError):
        ledger.set_priority("nope", 3)
    assert ledger.get("g").request.priority == 0
