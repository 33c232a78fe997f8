"""Suspect nodes (schema v17): a node whose books were found wrong takes no grant until resynced.

Both backends; on PostgreSQL the concurrent grant (``gpupool_take``) is checked directly too, as
a process whose capacity copy missed the mark would call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from airflow_gpupool.exceptions import InvalidInventoryError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.ledger.postgres.concurrent import ConcurrentPath
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

SCHEDULER = "0/3 nodes are available: 1 Insufficient nvidia.com/gpu"


def test_a_suspect_node_takes_no_grant_and_explain_says_why(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.mark_node_suspect("n1", SCHEDULER)

    waiting = ledger.reserve(GpuRequest(gpus=1), "retry")

    assert waiting.state is ReservationState.WAITING  # waits: the node comes back once resynced
    why = ledger.explain(waiting.id)
    assert "n1: node is suspect until the controller resyncs it" in why and "Insufficient" in why
    assert list(ledger.suspect_nodes()) == ["n1"]


def test_a_waiting_request_is_granted_once_a_sync_that_read_the_node_later_clears_it(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    read_before = ledger.now()
    clock.advance(1)
    ledger.mark_node_suspect("n1", SCHEDULER)
    waiting = ledger.reserve(GpuRequest(gpus=1), "retry")

    # A sync that read the node before the mark cannot clear it.
    assert ledger.clear_suspect_nodes(["n1"], read_at=read_before) == []
    assert ledger.get(waiting.id).state is ReservationState.WAITING

    clock.advance(1)
    assert ledger.clear_suspect_nodes(["n1"], read_at=ledger.now()) == ["n1"]

    assert ledger.get(waiting.id).state is ReservationState.GRANTED  # the queue is served at once
    assert ledger.suspect_nodes() == {}
    assert ledger.check_invariants() == []


def test_a_slice_released_on_a_suspect_node_goes_to_no_waiting_request_there(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    first = ledger.reserve(GpuRequest(gpus=1), "first-try")
    waiting = ledger.reserve(GpuRequest(gpus=1), "other")
    assert waiting.state is ReservationState.WAITING

    # The order the operator keeps: the node is marked, then the failed try's slice released.
    ledger.mark_node_suspect("n1", SCHEDULER)
    ledger.release(first.id, reason="task failed")

    assert ledger.get(waiting.id).state is ReservationState.WAITING
    assert ledger.empty_cluster().node("n1").schedulable, "it may come back: no NoCapacity for it"


def test_marking_an_unknown_node_is_a_typed_error_naming_it(ledger: Ledger) -> None:
    with pytest.raises(InvalidInventoryError, match="nope"):
        ledger.mark_node_suspect("nope", SCHEDULER)


@pytest.fixture
def take(pg_schema_url: str) -> Iterator[Callable[[str, Assignment], str]]:
    """Call ``gpupool_take`` as a process whose capacity copy has not seen the mark."""
    path = ConcurrentPath(normalize_url(pg_schema_url))

    def call(rid: str, assignment: Assignment) -> str:
        with path.connect() as conn:
            outcome, _, _ = path.take(
                conn, rid, "direct", GpuRequest(gpus=1), assignment, "A100", 1, 1_800_000_000.0, 60.0, 60.0
            )
            return str(outcome)

    yield call
    path.close()


def test_postgres_concurrent_take_refuses_a_suspect_node(
    pg_schema_url: str, take: Callable[[str, Assignment], str]
) -> None:
    ledger = Ledger.create(pg_schema_url, policy="bestfit", clock=FakeClock())
    try:
        ledger.upsert_nodes([node("n1", gpus=2)])
        one_gpu = Assignment("n1", (0,), 1000, 81920)
        ledger.mark_node_suspect("n1", SCHEDULER)

        assert take("stale-copy", one_gpu) == "stale"

        ledger.clear_suspect_nodes(["n1"], read_at=ledger.now() + 1)
        assert take("after-sync", one_gpu) == "granted"
    finally:
        ledger.close()
