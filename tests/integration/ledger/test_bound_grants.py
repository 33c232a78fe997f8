"""Ledger.bind and orphaned grants on SQLite and PostgreSQL (no cluster: the ledger alone)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from sqlalchemy import create_engine, text

from airflow_gpupool.exceptions import InvalidRequestError, LeaseExpiredError, UnknownReservationError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.ledger.store import migrations
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

ORPHANED = ReservationState.ORPHANED


def test_bind_records_the_pod_on_the_grant_and_is_idempotent(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    held = ledger.reserve(GpuRequest(gpus=1), "h", reservation_id="gp-1")
    assert held.grant is not None and not held.grant.bound and held.grant.pod_uid is None

    bound = ledger.bind("gp-1", namespace="ml", name="train-1", uid="uid-1")
    clock.advance(5)
    again = ledger.bind("gp-1", namespace="ml", name="train-1", uid="uid-1")

    assert bound.grant is not None and again.grant is not None
    assert (bound.grant.pod_namespace, bound.grant.pod_name, bound.grant.pod_uid) == (
        "ml",
        "train-1",
        "uid-1",
    )
    assert again.grant.bound_at == bound.grant.bound_at == clock() - 5  # unchanged by the second bind
    as_dict = ledger.get("gp-1").to_dict()["grant"]
    assert {k: as_dict[k] for k in ("pod_namespace", "pod_name", "pod_uid")} == {
        "pod_namespace": "ml",
        "pod_name": "train-1",
        "pod_uid": "uid-1",
    }
    assert ledger.snapshot().to_dict()["grants"][0]["grant"]["pod_uid"] == "uid-1"


def test_a_second_pod_replaces_the_first_and_is_logged(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "h", reservation_id="gp-1")
    ledger.bind("gp-1", namespace="ml", name="train-1", uid="uid-1")
    with caplog.at_level(logging.WARNING):
        rebound = ledger.bind("gp-1", namespace="ml", name="train-1", uid="uid-2")
    assert rebound.grant is not None and rebound.grant.pod_uid == "uid-2"
    assert "uid uid-1" in caplog.text and "uid-2" in caplog.text


def test_a_pod_bound_by_name_before_it_exists_is_orphaned_not_freed(
    ledger: Ledger, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # The operator binds by name before creating the pod: a worker dying before the uid is
    # known must not leave a running pod on a slice the ledger hands out again.
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "h", ttl=4, reservation_id="gp-1")
    named = ledger.bind("gp-1", namespace="ml", name="train-1")
    assert named.grant is not None and named.grant.bound and named.grant.pod_uid is None
    clock.advance(5)
    assert ledger.reserve(GpuRequest(gpus=1), "next", reservation_id="gp-2").state is ReservationState.WAITING
    assert ledger.get("gp-1").state is ORPHANED

    # The uid completes the binding without a warning; a name alone never drops a known uid.
    with caplog.at_level(logging.WARNING):
        with_uid = ledger.bind("gp-1", namespace="ml", name="train-1", uid="uid-1")
        again = ledger.bind("gp-1", namespace="ml", name="train-1")
    assert "now bound to" not in caplog.text
    assert with_uid.grant is not None and again.grant is not None
    assert with_uid.grant.pod_uid == again.grant.pod_uid == "uid-1"


def test_adopt_passes_an_orphan_to_the_retry_with_a_new_lease(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    first = ledger.reserve(GpuRequest(gpus=1), "dag/t/run/map--1/try-1@w1", ttl=4, reservation_id="gp-1")
    ledger.bind("gp-1", namespace="ml", name="train-1", uid="uid-1")
    clock.advance(5)
    ledger.reap()
    assert ledger.get("gp-1").state is ORPHANED

    adopted = ledger.adopt("gp-1", "dag/t/run/map--1/try-2@w2", ttl=30)

    assert adopted.state is ReservationState.GRANTED and adopted.holder.endswith("try-2@w2")
    assert adopted.grant is not None and first.grant is not None
    assert adopted.grant.gpu_indices == first.grant.gpu_indices and adopted.grant.pod_uid == "uid-1"
    assert adopted.grant.expires_at == pytest.approx(clock() + 30)
    assert ledger.check_invariants() == []
    ledger.release("gp-1", reason="pod succeeded")
    with pytest.raises(LeaseExpiredError, match="released"):
        ledger.adopt("gp-1", "dag/t/run/map--1/try-3@w3")
    with pytest.raises(InvalidRequestError, match="holder"):
        ledger.adopt("gp-1", "")


def test_bind_refuses_unknown_ended_waiting_ids_and_bad_fields(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "h", reservation_id="gp-1")
    waiting = ledger.reserve(GpuRequest(gpus=1), "h", reservation_id="gp-2")
    assert waiting.state is ReservationState.WAITING
    with pytest.raises(UnknownReservationError):
        ledger.bind("nope", namespace="ml", name="p", uid="u")
    with pytest.raises(LeaseExpiredError, match="waiting"):
        ledger.bind("gp-2", namespace="ml", name="p", uid="u")
    with pytest.raises(InvalidRequestError, match="pod uid"):
        ledger.bind("gp-1", namespace="ml", name="p", uid="")
    ledger.release("gp-1")
    with pytest.raises(LeaseExpiredError, match="released"):
        ledger.bind("gp-1", namespace="ml", name="p", uid="u")


def test_an_orphan_holds_its_slice_until_released_and_a_release_is_idempotent(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "h", ttl=4, reservation_id="gp-1")
    ledger.bind("gp-1", namespace="ml", name="p", uid="u")
    clock.advance(5)

    # The next write expires what is due: this reserve finds the orphan and queues behind it.
    queued = ledger.reserve(GpuRequest(gpus=1), "next", reservation_id="gp-2")

    assert queued.state is ReservationState.WAITING
    orphan = ledger.get("gp-1")
    assert orphan.state is ORPHANED and "slice held for pod ml/p" in orphan.message
    assert [r.id for r in ledger.history(states=[ORPHANED])] == ["gp-1"]
    assert ledger.check_invariants() == []
    assert ledger.reap().orphaned == ()  # orphaned once

    first = ledger.release("gp-1", reason="pod finished")
    assert first.released is True and first.state is ORPHANED
    assert ledger.release("gp-1").released is False
    assert ledger.get("gp-2").state is ReservationState.GRANTED
    assert ledger.check_invariants() == []


def test_a_v3_ledger_migrates_to_v4_and_keeps_its_rows(
    make_ledger: Callable[..., Ledger], ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:3])
        m.setattr(migrations, "LATEST", 3)
        old = make_ledger(concurrent=False)
        old.upsert_nodes([node("n1", gpus=2)])
        held = old.reserve(GpuRequest(gpus=1), "from-v3", reservation_id="gp-old")
        old.close()
    # v1 creates the table as the code has it now: take the v4 columns away for a true v3 table.
    engine = create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        for column in ("pod_namespace", "pod_name", "pod_uid", "bound_at", "orphaned_at"):
            conn.execute(text(f"ALTER TABLE gpupool_reservations DROP COLUMN {column}"))
    engine.dispose()

    ledger = Ledger(ledger_url)
    assert ledger.migrate() == list(range(4, migrations.LATEST + 1))
    kept = ledger.get("gp-old")
    assert kept.holder == "from-v3" and kept.state is ReservationState.GRANTED
    assert kept.grant is not None and kept.grant.node == held.grant.node and not kept.grant.bound  # type: ignore[union-attr]
    assert ledger.bind("gp-old", namespace="ml", name="p", uid="u").grant.pod_uid == "u"  # type: ignore[union-attr]
    assert ledger.check_invariants() == []
    ledger.close()


def test_bind_many_binds_in_one_transaction_and_reports_what_it_could_not(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_gpupool.ledger.store import transactions as store_module

    ledger.upsert_nodes([node("n1", gpus=2)])
    for rid in ("gp-1", "gp-2", "gp-ended"):
        ledger.reserve(GpuRequest(gpus=1), "h", reservation_id=rid)
    ledger.release("gp-ended")
    transactions = []
    real_write = store_module.write_transaction

    def write_transaction(*args: object, **kwargs: object) -> object:
        transactions.append(1)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(store_module, "write_transaction", write_transaction)

    bound = ledger.bind_many(
        {
            "gp-1": ("ml", "a", "uid-a"),
            "gp-ended": ("ml", "b", "uid-b"),
            "gp-missing": ("ml", "c", None),
            "gp-2": ("ml", "d", "uid-d"),
        }
    )

    assert len(transactions) == 1
    assert isinstance(bound["gp-ended"], LeaseExpiredError)
    assert isinstance(bound["gp-missing"], UnknownReservationError)
    assert ledger.get("gp-ended").grant is None or ledger.get("gp-ended").grant.pod_name is None
    for rid, (name, uid) in {"gp-1": ("a", "uid-a"), "gp-2": ("d", "uid-d")}.items():
        result = bound[rid]
        assert not isinstance(result, Exception) and result.grant is not None
        stored = ledger.get(rid).grant
        assert stored is not None and (stored.pod_name, stored.pod_uid) == (name, uid)
    with pytest.raises(InvalidRequestError):
        ledger.bind_many({"gp-1": ("", "a", None)})
