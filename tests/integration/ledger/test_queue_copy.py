"""The per-process copy of the queue: no queue read while nobody changed it, and every change seen.

On both backends, with real ledgers: the queue's version in ``gpupool_meta`` moves with each
write that changes a waiting row, and a ledger whose copy carries the current version reads
no waiting rows on a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Connection, event, select

from airflow_gpupool.ledger import Ledger, ReservationState, schema
from airflow_gpupool.ledger import statements as sql
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

WHOLE_NODE = GpuRequest(gpus=8, cpu_milli=1000, memory_mib=1024)
ONE_GPU = GpuRequest(gpus=1, cpu_milli=1000, memory_mib=1024)


def queue_version(ledger: Ledger) -> int | None:
    def run(conn: Connection) -> int | None:
        meta = schema.ledger_meta.c
        return conn.execute(select(meta.value).where(meta.key == sql.QUEUE_VERSION_KEY)).scalar()

    return ledger.read(run)


@pytest.fixture
def queue_reads(ledger: Ledger) -> Iterator[list[str]]:
    """Every statement of ``ledger`` that reads the queue (not a request it queued, by id)."""
    seen: list[str] = []

    def saw(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        queue_order = "ORDER BY gpupool_reservations.priority DESC" in statement
        if (queue_order and "gpupool_reservations.id IN" not in statement) or "DISTINCT" in statement:
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


def test_cycles_that_leave_the_queue_as_it_was_read_no_waiting_rows(
    ledger: Ledger, queue_reads: list[str]
) -> None:
    waiting = _full_pool_with_waiters(ledger, 5)
    for _ in range(12):  # backfills overtake the waiters until their budgets are spent
        ledger.release(ledger.reserve(ONE_GPU, "client").id)
    stamped = queue_version(ledger)
    queue_reads.clear()
    for _ in range(10):
        granted = ledger.reserve(ONE_GPU, "client")
        assert granted.state is ReservationState.GRANTED
        ledger.release(granted.id)
    assert queue_reads == []
    assert queue_version(ledger) == stamped  # a grant that fits at once, and its release, change no waiter
    assert [ledger.get(rid).state for rid in waiting] == [ReservationState.WAITING] * 5


def test_a_change_by_another_process_is_read(make_ledger: Callable[..., Ledger]) -> None:
    first, second = make_ledger(), make_ledger()
    first.upsert_nodes([node("n1", gpus=8)])
    big = first.reserve(WHOLE_NODE, "first")  # the first's copy: an empty queue
    assert big.state is ReservationState.GRANTED
    before = queue_version(first)
    queued = second.reserve(GpuRequest(gpus=4, cpu_milli=1000, memory_mib=1024), "second")
    assert queued.state is ReservationState.WAITING
    assert queue_version(first) != before
    # The first's release serves a queue it has not read since: it must see the new request.
    first.release(big.id)
    assert first.get(queued.id).state is ReservationState.GRANTED


def test_a_request_that_waits_moves_the_version_and_one_granted_at_once_does_not(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=8)])
    stamped = queue_version(ledger)
    ledger.reserve(ONE_GPU, "client")
    assert queue_version(ledger) == stamped
    ledger.reserve(WHOLE_NODE, "waiter")
    assert queue_version(ledger) not in (None, stamped)
