"""What the split of the ledger into rooms added: public transactions, one grant builder,
the bounded request cache and the seconds check, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.store import transactions as store_module
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

GRANTED = ReservationState.GRANTED
WAITING = ReservationState.WAITING


def test_write_expires_what_is_due_first_and_read_sees_one_state(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    held = ledger.reserve(GpuRequest(gpus=1), "a", ttl=10)
    clock.advance(11)

    assert ledger.write(lambda tx: tx.now) == clock.now
    assert ledger.get(held.id).state is ReservationState.EXPIRED
    count = select(func.count()).select_from(schema.reservations)
    assert ledger.read(lambda conn: conn.execute(count).scalar_one()) == 1


@pytest.mark.parametrize("concurrent", [True, False], ids=["concurrent", "serialized"])
def test_a_grant_reads_back_as_it_was_made(make_ledger: Callable[..., Ledger], concurrent: bool) -> None:
    ledger = make_ledger(concurrent=concurrent)
    ledger.upsert_nodes([node("n1", gpus=2, mig={1: ["3g.40gb", "3g.40gb"]}, pool="a100")])
    whole = ledger.reserve(GpuRequest(gpus=1), "whole")
    mig = ledger.reserve(GpuRequest(mig_profile="3g.40gb"), "mig")

    for made in (whole, mig):
        assert made.state is GRANTED and made.grant is not None
        assert ledger.get(made.id).grant == made.grant
    assert whole.grant is not None
    assert (whole.grant.gpu_uuids, whole.grant.gpu_model) == (("GPU-n1-0",), "A100")
    assert (whole.grant.node_pool, whole.grant.mig_profile) == ("a100", None)
    assert mig.grant is not None and (mig.grant.mig_profile, mig.grant.gpu_indices) == ("3g.40gb", (1,))


def test_requests_dropped_from_the_cache_are_read_again_from_their_rows(
    make_ledger: Callable[..., Ledger], monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    monkeypatch.setattr(store_module, "REQUEST_CACHE_SIZE", 2)
    ledger = make_ledger()
    ledger.upsert_nodes([node("n1", gpus=2)])
    granted = [ledger.reserve(GpuRequest(gpus=1, priority=i), f"g{i}") for i in range(2)]
    waiting = [ledger.reserve(GpuRequest(gpus=1, priority=i), f"w{i}", timeout=600) for i in range(5)]
    assert [w.state for w in waiting] == [WAITING] * 5

    for g in granted:
        ledger.release(g.id)
    # The two highest priorities were served, in the queue's order, with the requests they made.
    assert [ledger.get(w.id).state for w in waiting] == [WAITING] * 3 + [GRANTED] * 2
    assert [r.request.priority for r in ledger.snapshot().queue] == [2, 1, 0]
    history = ledger.history(limit=100)
    assert {r.request for r in history} == {GpuRequest(gpus=1, priority=i) for i in range(5)}
    assert ledger.check_invariants() == []


@pytest.mark.parametrize(
    "ttl",
    [
        pytest.param("60", id="numeric-string"),
        pytest.param(timedelta(seconds=60), id="timedelta"),
        pytest.param(True, id="bool"),
        pytest.param(0, id="zero"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(366 * 86400 + 1, id="over-366-days"),
    ],
)
def test_lease_seconds_are_a_number_in_range(ledger: Ledger, ttl: object) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    with pytest.raises(InvalidRequestError) as info:
        ledger.reserve(GpuRequest(gpus=1), "a", ttl=ttl)  # type: ignore[arg-type]
    assert (info.value.field, info.value.expected) == ("ttl", "a number of seconds in (0, 31622400]")
    assert ledger.snapshot().grants == ()


def test_the_longest_lease_is_366_days(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    held = ledger.reserve(GpuRequest(gpus=1), "a", ttl=366 * 86400)
    assert held.grant is not None and held.grant.expires_at - held.grant.granted_at == 366 * 86400
    renewed = ledger.renew(held.id, ttl=1.5)
    assert renewed.grant is not None and renewed.grant.expires_at == pytest.approx(ledger.now() + 1.5)
