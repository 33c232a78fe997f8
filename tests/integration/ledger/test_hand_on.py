"""Hand-on (issue 40): an ending grant passes the part of its slice the next step needs to that step.

SQLite and PostgreSQL (the ``ledger`` fixture: on PostgreSQL the concurrent paths run too); the
fake clock moves by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from airflow_gpupool.exceptions import InvalidRequestError, NoCapacityError, UnknownReservationError
from airflow_gpupool.ledger import HANDED_PREFIX, Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.resources import GpuRequest, NodeHealth
from tests.ledger_fixtures import FakeClock, node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING
RELEASED, EXPIRED = ReservationState.RELEASED, ReservationState.EXPIRED
EVALUATE = "pipeline/evaluate/run-1/map--1"
BAD_HOLDS: tuple[Any, ...] = (0, -1, 86401, float("nan"), "120", True)


def grant_of(ledger: Ledger, rid: str) -> tuple[str, tuple[int, ...]]:
    grant = ledger.get(rid).grant
    assert grant is not None
    return grant.node, grant.gpu_indices


def live_ids(ledger: Ledger) -> set[str]:
    snap = ledger.snapshot()
    return {r.id for r in snap.grants} | {r.id for r in snap.queue}


@pytest.fixture
def trained(ledger: Ledger) -> Ledger:
    """A 4-GPU node wholly held by ``train``, and a 3-GPU request waiting for it."""
    ledger.upsert_nodes([node("n1", gpus=4)])
    assert ledger.reserve(GpuRequest(gpus=4), "train", reservation_id="train", ttl=600).state is GRANTED
    assert ledger.reserve(GpuRequest(gpus=3), "other team", reservation_id="waiter").state is WAITING
    return ledger


def test_the_part_the_downstream_needs_is_handed_on_the_rest_serves_the_queue(
    trained: Ledger, clock: FakeClock
) -> None:
    result = trained.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=120)

    assert result.handed and result.handed_id is not None and result.handed_id.startswith(HANDED_PREFIX)
    assert (result.node, result.gpu_indices, result.hold_until) == ("n1", (0,), clock.now + 120)
    assert "handed on to pipeline/evaluate/run-1/map--1" in result.message
    assert "GPU 1,2,3 released" in result.message
    train = trained.get("train")
    assert train.state is RELEASED and train.message is not None and result.message in train.message
    handed = trained.get(result.handed_id)
    assert handed.state is GRANTED and handed.grant is not None
    assert (handed.grant.node, handed.grant.gpu_indices) == ("n1", (0,))
    assert handed.grant.expires_at == clock.now + 120 and handed.grant.granted_at == train.ended_at
    assert grant_of(trained, "waiter") == ("n1", (1, 2, 3))  # the queue was served with the rest
    assert trained.check_invariants() == []


def test_the_downstream_takes_the_handed_slice_over_with_no_gap(trained: Ledger, clock: FakeClock) -> None:
    result = trained.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=120)
    assert result.handed_id is not None
    # Every GPU is held: one more request cannot take the handed one before its step claims it.
    assert trained.reserve(GpuRequest(gpus=1), "someone", reservation_id="someone").state is WAITING
    clock.advance(5)

    evaluate = trained.reserve(
        GpuRequest(gpus=1), "evaluate try 1", reservation_id="gp-evaluate", ttl=300, task_key=EVALUATE
    )

    assert evaluate.state is GRANTED and evaluate.grant is not None
    assert (evaluate.grant.node, evaluate.grant.gpu_indices) == ("n1", (0,))
    assert evaluate.holder == "evaluate try 1" and evaluate.grant.expires_at == clock.now + 300
    # One chain: train ended, handing on, at the moment the slice became evaluate's.
    assert evaluate.grant.granted_at == trained.get("train").ended_at
    with pytest.raises(UnknownReservationError):
        trained.get(result.handed_id)  # the handed grant is evaluate's now, under its own id
    assert trained.get("someone").state is WAITING
    # Reserving again (a deferral's resume) finds the same grant; releasing it serves the queue.
    assert trained.reserve(GpuRequest(gpus=1), "evaluate try 1", reservation_id="gp-evaluate").grant == (
        evaluate.grant
    )
    trained.release("gp-evaluate")
    assert grant_of(trained, "someone") == ("n1", (0,))
    assert trained.check_invariants() == []


def test_an_unclaimed_slice_is_released_at_its_bound(trained: Ledger, clock: FakeClock) -> None:
    result = trained.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=120)
    assert result.handed_id is not None
    trained.reserve(GpuRequest(gpus=1), "someone", reservation_id="someone")

    clock.advance(120)
    trained.reap()
    assert trained.get(result.handed_id).state is GRANTED  # not before its bound
    clock.advance(1)
    trained.reap()

    assert trained.get(result.handed_id).state is EXPIRED
    assert grant_of(trained, "someone") == ("n1", (0,))
    # A late claim finds nothing handed and queues as any request.
    late = trained.reserve(GpuRequest(gpus=1), "evaluate", reservation_id="gp-evaluate", task_key=EVALUATE)
    assert late.state is WAITING
    assert trained.check_invariants() == []


def test_a_downstream_bigger_than_the_slice_gets_a_plain_release(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.reserve(GpuRequest(gpus=1), "train", reservation_id="train", ttl=600)

    result = ledger.hand_on("train", EVALUATE, GpuRequest(gpus=2), hold_seconds=120)

    assert not result.handed and result.gpu_indices == ()
    assert "does not fit within the slice" in result.message and "released" in result.message
    assert ledger.get("train").state is RELEASED
    assert live_ids(ledger) == set()
    evaluate = ledger.reserve(GpuRequest(gpus=2), "evaluate", reservation_id="gp-evaluate", task_key=EVALUATE)
    assert evaluate.state is GRANTED  # placed as any request
    assert ledger.check_invariants() == []


@pytest.mark.parametrize(
    ("downstream", "why"),
    [
        pytest.param(GpuRequest(gpus=1, team="other"), "team other", id="another-team"),
        pytest.param(GpuRequest(gpus=1, gpu_models=["H100"]), "does not fit", id="another-model"),
        pytest.param(GpuRequest(mig_profile="1g.10gb"), "MIG", id="a-mig-profile"),
    ],
)
def test_what_cannot_be_handed_on_is_released(ledger: Ledger, downstream: GpuRequest, why: str) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=2), "train", reservation_id="train", ttl=600)

    result = ledger.hand_on("train", EVALUATE, downstream, hold_seconds=120)

    assert not result.handed and why in result.message
    assert ledger.get("train").state is RELEASED and live_ids(ledger) == set()
    assert ledger.check_invariants() == []


def test_a_node_that_takes_no_grants_is_not_handed_on(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=2), "train", reservation_id="train", ttl=600)
    ledger.set_health("n1", NodeHealth.CORDONED)

    result = ledger.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=120)

    assert not result.handed and "node n1 takes no grants now (cordoned)" in result.message
    assert live_ids(ledger) == set()


def test_a_node_the_queue_holds_for_a_request_is_not_handed_on(make_ledger: Callable[..., Ledger]) -> None:
    # No-starvation: a request that spent its overtake budget has the node held for it; a hand-on
    # would overtake it once more.
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([node("n1", gpus=4), node("n2", gpus=1)])
    ledger.reserve(GpuRequest(gpus=4), "train", reservation_id="train", ttl=600)
    assert ledger.reserve(GpuRequest(gpus=4), "big", reservation_id="big").state is WAITING
    assert ledger.reserve(GpuRequest(gpus=1), "small", reservation_id="small").state is GRANTED  # overtakes
    ledger.reap()
    n = schema.nodes.c
    assert ledger.read(lambda conn: conn.execute(select(n.held_for).where(n.name == "n1")).scalar()) == "big"

    result = ledger.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=120)

    assert not result.handed and "node n1 is held for a request" in result.message
    assert ledger.get("big").state is GRANTED  # the freed node went to the request it was held for


def test_a_claim_for_another_request_releases_the_handed_slice(trained: Ledger) -> None:
    result = trained.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=120)
    assert result.handed_id is not None

    evaluate = trained.reserve(
        GpuRequest(gpus=1, priority=5), "evaluate", reservation_id="gp-evaluate", task_key=EVALUATE
    )

    # Queued first, then the slice handed on for another request released: the queue gives it the GPU.
    assert evaluate.state is WAITING
    handed = trained.get(result.handed_id)
    assert (
        handed.state is RELEASED and handed.message is not None and "claimed by gp-evaluate" in handed.message
    )
    assert grant_of(trained, "gp-evaluate") == ("n1", (0,))
    assert trained.check_invariants() == []


def test_a_refused_claim_changes_nothing(trained: Ledger) -> None:
    result = trained.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=120)
    assert result.handed_id is not None

    with pytest.raises(NoCapacityError):  # no node has 8 GPUs: refused, the handed slice untouched
        trained.reserve(GpuRequest(gpus=8), "evaluate", reservation_id="gp-evaluate", task_key=EVALUATE)

    assert trained.get(result.handed_id).state is GRANTED


def test_a_second_hand_on_to_the_same_step_is_a_plain_release(ledger: Ledger) -> None:
    # Two upstreams of one step: the first hands on, the second releases.
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=1), "a", reservation_id="a", ttl=600)
    ledger.reserve(GpuRequest(gpus=1), "b", reservation_id="b", ttl=600)
    first = ledger.hand_on("a", EVALUATE, GpuRequest(gpus=1), hold_seconds=60)

    second = ledger.hand_on("b", EVALUATE, GpuRequest(gpus=1), hold_seconds=60)

    assert first.handed and not second.handed
    assert f"a slice is handed on to it already ({first.handed_id})" in second.message
    assert live_ids(ledger) == {first.handed_id}
    assert ledger.check_invariants() == []


def test_a_reservation_that_is_not_a_plain_grant_is_released_as_usual(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "busy", reservation_id="busy", ttl=600)
    ledger.reserve(GpuRequest(gpus=1), "train", reservation_id="train")  # waits

    result = ledger.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=60)

    assert not result.handed and "not a plain grant" in result.message
    assert ledger.get("train").state is ReservationState.CANCELLED


@pytest.mark.parametrize(
    ("field", "args"),
    [
        *[
            pytest.param("hold_seconds", (EVALUATE, GpuRequest(gpus=1), h), id=f"hold-{h!r}")
            for h in BAD_HOLDS
        ],
        pytest.param("task_key", ("", GpuRequest(gpus=1), 60), id="empty-task-key"),
        pytest.param("task_key", ("x" * 513, GpuRequest(gpus=1), 60), id="long-task-key"),
        pytest.param("task_key", (None, GpuRequest(gpus=1), 60), id="no-task-key"),
        pytest.param("request", (EVALUATE, {"gpus": 1}, 60), id="request-not-a-gpu-request"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    ledger: Ledger, field: str, args: tuple[Any, ...]
) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "train", reservation_id="train", ttl=600)
    task_key, request, hold = args

    with pytest.raises(InvalidRequestError) as raised:
        ledger.hand_on("train", task_key, request, hold_seconds=hold)

    assert raised.value.field == field
    assert ledger.get("train").state is GRANTED


def test_a_step_queued_ahead_does_not_take_its_handed_slice_before_its_time(
    trained: Ledger, clock: FakeClock
) -> None:
    result = trained.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=120)
    assert result.handed_id is not None

    ahead = trained.reserve(
        GpuRequest(gpus=1),
        "evaluate",
        reservation_id="gp-evaluate",
        not_before=clock.now + 30,
        task_key=EVALUATE,
    )

    assert ahead.state is WAITING
    assert trained.get(result.handed_id).state is GRANTED  # still handed, until its bound


def test_a_claim_that_fits_no_node_changes_nothing_not_even_a_due_reap(
    trained: Ledger, clock: FakeClock
) -> None:
    """Found by the ledger's state machine: the claim's write reaped the overdue hold, then the reserve was refused."""
    result = trained.hand_on("train", EVALUATE, GpuRequest(gpus=1), hold_seconds=30)
    assert result.handed_id is not None
    clock.advance(61)  # the hold is overdue; nothing has reaped it yet
    before = (trained.snapshot().grants, trained.snapshot().queue)

    with pytest.raises(NoCapacityError):
        trained.reserve(
            GpuRequest(gpus=1, gpu_models=["T4"]),
            "evaluate try 1",
            reservation_id="gp-evaluate",
            task_key=EVALUATE,
        )

    assert (trained.snapshot().grants, trained.snapshot().queue) == before
    assert trained.get(result.handed_id).state is GRANTED  # until a write reaps it
