"""A request waits an hour by default, and its timeout names what blocked it, on SQLite and PostgreSQL.

Issue 38 item 7: at 300 s ordinary queueing became failed tries. The default is now 3600 s
(``[gpupool] reservation_timeout_seconds``, what ``Ledger.reserve`` and the operators take when
given no timeout); the message a timed-out request keeps (the operator's
``ReservationTimeoutError`` carries it) is the reason it waited, for placement and governance
blockers alike. The situations are the reason table's (:mod:`.test_reason_texts`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml

from airflow_gpupool import settings
from airflow_gpupool.governance.quotas import parse_quota_file
from airflow_gpupool.hooks.options import LedgerOptions
from airflow_gpupool.ledger import Ledger, LedgerQuotas, ReservationState
from airflow_gpupool.resources import GpuRequest
from tests.integration.ledger.test_reason_texts import ROWS
from tests.ledger_fixtures import FakeClock, node

HOUR = 3600.0


def test_the_default_wait_is_an_hour() -> None:
    assert settings.reservation_timeout_seconds() == HOUR
    assert LedgerOptions.__dataclass_fields__["reservation_timeout_seconds"].default == HOUR


def test_a_request_given_no_timeout_waits_an_hour(
    make_ledger: Callable[..., Ledger], clock: FakeClock
) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "holder", reservation_id="held", ttl=10 * HOUR)
    waiting = ledger.reserve(GpuRequest(gpus=1), "asker", reservation_id="asker")

    clock.advance(HOUR - 1)
    ledger.reap()
    assert ledger.get(waiting.id).state is ReservationState.WAITING, "300 s is no longer the default"

    clock.advance(2)
    assert ledger.reap().timed_out == ("asker",)
    assert ledger.get(waiting.id).state is ReservationState.TIMED_OUT


@pytest.mark.parametrize(
    "dimension", ["MIG-partitioned GPU", "quota", "headroom", "spot", "quarantine", "quarantined GPU"]
)
def test_the_timeout_message_names_the_blocker(
    make_ledger: Callable[..., Ledger], clock: FakeClock, dimension: str
) -> None:
    row = ROWS[dimension]
    ledger = make_ledger()
    ledger.upsert_nodes(row.nodes)
    if row.quotas is not None:
        LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load(row.quotas)))
    for i, request in enumerate(row.taken):
        ledger.reserve(request, f"h{i}", reservation_id=f"r{i}", ttl=10 * HOUR)
    if row.health is not None:
        ledger.set_health(*row.health)
    if row.gpu_health is not None:
        ledger.set_gpu_health(*row.gpu_health)
    ledger.reserve(row.waiting, "asker", reservation_id="asker")

    clock.advance(HOUR + 1)
    ledger.reap()

    timed_out = ledger.get("asker")
    assert timed_out.state is ReservationState.TIMED_OUT
    assert row.reason in (timed_out.message or ""), timed_out.message
