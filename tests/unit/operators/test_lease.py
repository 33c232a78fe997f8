"""LeaseRenewer: when a failed renewal means the lease is lost, with an injected clock and no sleeps.

The ledger is a real SQLite one; only the database outage is faked, at the hook's boundary."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_gpupool.exceptions import LeaseExpiredError, LeaseLostError, LedgerUnavailableError
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.operators.pod.lease import LeaseRenewer
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

LOG: Any = logging.getLogger("test-lease")
TTL = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FlakyLedger:
    """A real ledger whose database can be made unreachable (what the hook raises then)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.down = False
        self.renewals = 0

    def renew(self, reservation_id: str, ttl: float | None = None) -> Any:
        self.renewals += 1
        if self.down:
            raise LedgerUnavailableError(60, "connection refused")
        return self.ledger.renew(reservation_id, ttl)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger.create(f"sqlite:///{tmp_path}/ledger.db")
    ledger.upsert_nodes([node("n1", gpus=2)])
    yield ledger
    ledger.close()


def renewer_of(ledger: Ledger, clock: Clock) -> tuple[LeaseRenewer, FlakyLedger, list[LeaseLostError]]:
    rid = ledger.reserve(GpuRequest(gpus=1), "worker-1", reservation_id="gp-lease", ttl=TTL).id
    flaky, deleted = FlakyLedger(ledger), []
    renewer = LeaseRenewer(flaky, rid, TTL, LOG, lambda: None, on_lost=deleted.append, clock=clock)
    return renewer, flaky, deleted


def test_transient_errors_are_retried_until_the_lease_would_expire(ledger: Ledger) -> None:
    clock = Clock()
    renewer, flaky, deleted = renewer_of(ledger, clock)
    clock.now += 10
    assert renewer.renew_once() and flaky.renewals == 1  # renewed at t=10: the lease runs to t=40

    flaky.down = True
    for now in (20, 30, 39.9):
        clock.now = 1000 + now
        assert renewer.renew_once(), now
    assert renewer.lost is None and deleted == []

    clock.now = 1040
    assert not renewer.renew_once()
    assert renewer.lost is not None and deleted == [renewer.lost]
    assert renewer.lost.failure_class.value == "lease_lost"
    assert "not renewed for its whole TTL of 30 s" in renewer.lost.classification.reason
    assert isinstance(renewer.lost.__cause__, LedgerUnavailableError)


def test_a_renewal_after_an_outage_starts_a_new_ttl(ledger: Ledger) -> None:
    clock = Clock()
    renewer, flaky, deleted = renewer_of(ledger, clock)
    flaky.down = True
    clock.now = 1029
    assert renewer.renew_once()
    flaky.down = False
    assert renewer.renew_once()  # back at t=29: the lease runs to t=59
    flaky.down = True
    clock.now = 1058
    assert renewer.renew_once() and renewer.lost is None and deleted == []


class PreemptedLedger:
    def renew(self, reservation_id: str, ttl: float | None = None) -> Any:
        raise LeaseExpiredError(reservation_id, "preempted")


@pytest.mark.parametrize("ended_by", ["release", "preempted", "unknown"])
def test_the_ledger_saying_the_grant_ended_loses_the_lease_at_once(ledger: Ledger, ended_by: str) -> None:
    clock = Clock()
    renewer, _, deleted = renewer_of(ledger, clock)
    if ended_by == "release":
        ledger.release("gp-lease", reason="taken back")
    elif ended_by == "preempted":
        renewer = LeaseRenewer(PreemptedLedger(), "gp-lease", TTL, LOG, lambda: None, on_lost=deleted.append)
    else:
        renewer = LeaseRenewer(FlakyLedger(ledger), "gp-none", TTL, LOG, lambda: None, on_lost=deleted.append)

    assert not renewer.renew_once()  # no time has passed: the ledger's word is enough

    assert renewer.lost is not None and deleted == [renewer.lost]
    assert renewer.lost.reservation_id == renewer.name.removeprefix("gpupool-lease-")


def test_a_grant_released_by_reconcile_stops_renewing_without_a_loss(ledger: Ledger) -> None:
    rid = ledger.reserve(GpuRequest(gpus=1), "worker-1", reservation_id="gp-done", ttl=TTL).id
    deleted: list[LeaseLostError] = []
    renewer = LeaseRenewer(ledger, rid, TTL, LOG, lambda: "pod succeeded", on_lost=deleted.append)
    assert not renewer.renew_once()
    assert renewer.lost is None and deleted == []


def test_guard_raises_the_loss_whatever_the_pod_wait_ended_with(ledger: Ledger) -> None:
    clock = Clock()
    renewer, _, _ = renewer_of(ledger, clock)
    assert renewer.guard(lambda: "done") == "done"
    ledger.release("gp-lease", reason="taken back")
    renewer.renew_once()

    def pod_vanished() -> None:
        raise RuntimeError("404: pod not found")

    with pytest.raises(LeaseLostError) as raised:
        renewer.guard(pod_vanished)
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(LeaseLostError):
        renewer.guard(lambda: "finished anyway")


def test_a_failing_pod_deletion_still_records_the_loss(ledger: Ledger) -> None:
    rid = ledger.reserve(GpuRequest(gpus=1), "worker-1", reservation_id="gp-del", ttl=TTL).id
    ledger.release(rid, reason="taken back")

    def cannot_delete(lost: LeaseLostError) -> None:
        raise RuntimeError("API server down")

    renewer = LeaseRenewer(ledger, rid, TTL, LOG, lambda: None, on_lost=cannot_delete)
    assert not renewer.renew_once()
    assert renewer.lost is not None


@pytest.mark.parametrize("ended_by", ["release", "preempted"])
def test_a_grant_ended_after_its_pod_did_is_no_loss_and_deletes_nothing(
    ledger: Ledger, ended_by: str
) -> None:
    # Reconcile saw the pod end and released the grant before the task did: the pod's outcome is the try's.
    rid = ledger.reserve(GpuRequest(gpus=1), "worker-1", reservation_id="gp-ended", ttl=TTL).id
    ledger.release(rid, reason="reconcile: pod default/p finished (Succeeded)")
    hook: Any = ledger if ended_by == "release" else PreemptedLedger()
    deleted: list[LeaseLostError] = []
    renewer = LeaseRenewer(hook, rid, TTL, LOG, lambda: None, on_lost=deleted.append, pod_ended=lambda: True)

    assert not renewer.renew_once()  # renewing stops

    assert renewer.lost is None and deleted == []
    assert renewer.guard(lambda: "the pod's own result") == "the pod's own result"


def test_a_pod_still_running_or_unreadable_when_the_grant_ends_is_a_loss(ledger: Ledger) -> None:
    rid = ledger.reserve(GpuRequest(gpus=1), "worker-1", reservation_id="gp-running", ttl=TTL).id
    ledger.release(rid, reason="taken back")

    def unreadable() -> bool:
        raise RuntimeError("API server down")

    for pod_ended in (lambda: False, unreadable):
        deleted: list[LeaseLostError] = []
        renewer = LeaseRenewer(
            ledger, rid, TTL, LOG, lambda: None, on_lost=deleted.append, pod_ended=pod_ended
        )
        assert not renewer.renew_once()
        assert renewer.lost is not None and deleted == [renewer.lost]
