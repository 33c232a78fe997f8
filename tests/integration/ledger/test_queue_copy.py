"""The per-process copy of the spent waiting requests: no read of them while nobody changed them.

On both backends, with real ledgers: the spent requests' version in ``gpupool_meta`` moves
with each write that makes a budget spent or grants or ends a spent request, and a ledger
whose copy carries the current version reads no spent row on a pass. A copy is read only once
its version holds still: where budgets are spent between any two passes, a pass reads the few
rows it needs instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Connection, event, select

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.queue.queue_copy import QueueCopy, SpentRows
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

WHOLE_NODE = GpuRequest(gpus=8, cpu_milli=1000, memory_mib=1024)
ONE_GPU = GpuRequest(gpus=1, cpu_milli=1000, memory_mib=1024)


def spent_version(ledger: Ledger) -> int | None:
    def run(conn: Connection) -> int | None:
        meta = schema.ledger_meta.c
        return conn.execute(select(meta.value).where(meta.key == sql.SPENT_VERSION_KEY)).scalar()

    return ledger.read(run)


@pytest.fixture
def spent_reads(ledger: Ledger) -> Iterator[list[str]]:
    """Every statement of ``ledger`` that reads spent waiting rows."""
    seen: list[str] = []

    def saw(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if "gpupool_reservations.overtakes >=" in statement:
            seen.append(statement)

    engine = ledger._store.engine
    event.listen(engine, "before_cursor_execute", saw)
    yield seen
    event.remove(engine, "before_cursor_execute", saw)


def _full_pool_with_waiters(ledger: Ledger, waiters: int) -> list[str]:
    ledger.upsert_nodes([node(name, gpus=8, labels={"node": name}) for name in ("n1", "n2")])
    for name in ("n1", "n2"):
        held = GpuRequest(gpus=7, cpu_milli=1000, memory_mib=1024, node_labels=(("node", name),))
        assert ledger.reserve(held, "filler").state is ReservationState.GRANTED
    return [ledger.reserve(WHOLE_NODE, f"waiter-{i}").id for i in range(waiters)]


def _backfill(ledger: Ledger, cycles: int) -> None:
    for _ in range(cycles):
        granted = ledger.reserve(ONE_GPU, "client")
        assert granted.state is ReservationState.GRANTED
        ledger.release(granted.id)


def test_cycles_that_spend_no_budget_read_no_spent_rows(ledger: Ledger, spent_reads: list[str]) -> None:
    waiting = _full_pool_with_waiters(ledger, 5)
    _backfill(ledger, 12)  # backfills overtake the waiters until their budgets are spent
    stamped = spent_version(ledger)
    spent_reads.clear()
    _backfill(ledger, 10)
    assert spent_reads == []
    assert spent_version(ledger) == stamped
    assert [ledger.get(rid).state for rid in waiting] == [ReservationState.WAITING] * 5


def test_a_request_spent_by_another_process_is_read(make_ledger: Callable[..., Ledger]) -> None:
    first, second = make_ledger(), make_ledger()
    first.upsert_nodes([node("n1", gpus=8)])
    half = first.reserve(GpuRequest(gpus=4, cpu_milli=1000, memory_mib=1024), "first")
    first.reap()  # a pass: the first's copy holds no spent request
    whole = second.reserve(WHOLE_NODE, "second")
    assert whole.state is ReservationState.WAITING
    before = spent_version(first)
    _backfill(second, 8)  # the whole-node request's budget is spent
    assert spent_version(first) != before
    # The first's release serves spent requests it has not read: it must see this one.
    first.release(half.id)
    assert first.get(whole.id).state is ReservationState.GRANTED


def test_the_version_moves_when_a_budget_is_spent_not_when_a_request_queues(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=8)])
    ledger.reserve(ONE_GPU, "client")
    stamped = spent_version(ledger)
    waiter = ledger.reserve(WHOLE_NODE, "waiter")
    _backfill(ledger, 7)
    assert spent_version(ledger) == stamped
    _backfill(ledger, 1)
    assert ledger.get(waiter.id).state is ReservationState.WAITING
    assert spent_version(ledger) not in (None, stamped)


def test_a_copy_is_read_once_its_version_holds_still(make_ledger: Callable[..., Ledger]) -> None:
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([node("a", gpus=2)])
    ledger.reserve(GpuRequest(gpus=1), "one", reservation_id="one")
    for i in range(3):
        assert (
            ledger.reserve(GpuRequest(gpus=2), "big", reservation_id=f"big-{i}").state
            is ReservationState.WAITING
        )
    ledger.release(ledger.reserve(GpuRequest(gpus=1), "spends", reservation_id="spends").id)  # budgets spent
    copy = QueueCopy()

    def rows(version: int) -> SpentRows | None:
        return ledger.read(lambda conn: copy.rows(conn, version, 1))

    assert rows(5) is None and copy.reads == 0  # first seen: the pass reads what it needs
    held = rows(5)
    assert held is not None and copy.reads == 1
    assert [row.id for rows_of in held.spent_by_shape.values() for row in rows_of] == [
        "big-0",
        "big-1",
        "big-2",
    ]
    assert rows(5) is held and copy.reads == 1
    assert rows(6) is None and rows(7) is None and copy.reads == 1  # changing at every pass
    assert rows(7) is not None and copy.reads == 2
