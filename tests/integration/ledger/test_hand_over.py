"""A release that empties a node hands it to the queue's first request, on SQLite and PostgreSQL.

On PostgreSQL the release does it in its own call under the shared lock (``gpupool_give_back``,
:mod:`airflow_gpupool.ledger.queue.hand_over`); on SQLite, and wherever a pass might decide otherwise,
the release serves the queue under the exclusive lock. Both must leave what a pass would: the
same grant, the hold passed to the next spent request, nothing more a pass would grant.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.store.gate import QueueGate
from airflow_gpupool.resources import GpuRequest
from tests.integration.ledger.test_ledger_properties import run_ledger_machine
from tests.integration.ledger.test_queue_gate import (
    QueueGateMachine,
    held_for,
    meta,
    pass_would_grant,
    statements,
)
from tests.ledger_fixtures import node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING
EXCLUSIVE_LOCK = r"pg_advisory_xact_lock\("
WHOLE = GpuRequest(gpus=8, cpu_milli=8000, memory_mib=65536)


def on_postgres(ledger: Ledger) -> bool:
    return ledger._store.engine.dialect.name == "postgresql"


@pytest.fixture
def busy(make_ledger: Callable[..., Ledger]) -> Ledger:
    """Four 8-GPU nodes each taken by a whole-node task, one 1-GPU node; three whole-node requests wait, spent."""
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([*(node(f"n{i}", gpus=8) for i in range(4)), node("side", gpus=1)])
    for i in range(4):
        assert ledger.reserve(WHOLE, "task", reservation_id=f"task-{i}").state is GRANTED
    for i in range(3):
        assert ledger.reserve(WHOLE, "big", reservation_id=f"big-{i}").state is WAITING
    # A grant past them spends their budget of one; the next write's pass holds a node for big-0.
    for rid in ("spend", "hold"):
        assert ledger.reserve(GpuRequest(gpus=1), "small", reservation_id=rid).state is GRANTED
        ledger.release(rid)
    assert list(held_for(ledger).values()) == ["big-0"]
    return ledger


def assert_as_a_pass_leaves_it(ledger: Ledger) -> None:
    assert ledger.check_invariants() == []
    assert pass_would_grant(ledger) == ()
    gate = QueueGate.from_meta(meta(ledger))
    holds = held_for(ledger)
    waiting = [r for r in (ledger.get(f"big-{i}") for i in range(3)) if r.state is WAITING]
    if waiting:  # the first request waiting, spent, is the one held for, and the gate names it
        assert list(holds.values()) == [waiting[0].id]
        assert gate.open and (gate.hold_priority, gate.hold_seq) != (QueueGate().hold_priority, 0)
    else:
        assert holds == {}


def test_each_release_that_empties_a_node_grants_the_first_request_there_and_passes_the_hold_on(
    busy: Ledger,
) -> None:
    ((held_node, _),) = held_for(busy).items()
    tasks = [f"task-{i}" for i in range(4) if busy.get(f"task-{i}").grant.node != held_node]  # type: ignore[union-attr]
    for k, task in enumerate(tasks):
        freed = busy.get(task).grant.node  # type: ignore[union-attr]
        with statements(busy, EXCLUSIVE_LOCK) as locked:
            busy.release(task)
        if on_postgres(busy):
            assert locked == []  # handed over in the release's own call
        big = busy.get(f"big-{k}")
        assert big.state is GRANTED and big.grant is not None and big.grant.node == freed
        assert big.grant.gpu_indices == tuple(range(8))
        assert [busy.get(f"big-{i}").state for i in range(k + 1, 3)] == [WAITING] * (2 - k)
        assert_as_a_pass_leaves_it(busy)
        if k < 2:
            assert held_for(busy) == {held_node: f"big-{k + 1}"}  # the node a pass would hold again


def test_the_woken_request_reads_its_grant_and_the_node_is_given_back_whole(busy: Ledger) -> None:
    ((held_node, _),) = held_for(busy).items()
    task = next(f"task-{i}" for i in range(4) if busy.get(f"task-{i}").grant.node != held_node)  # type: ignore[union-attr]
    busy.release(task)
    granted = busy.get("big-0")
    assert granted.state is GRANTED and granted.grant is not None
    busy.release("big-0")  # the next request is handed the same node
    assert busy.get("big-1").state is GRANTED and busy.get("big-1").grant.node == granted.grant.node  # type: ignore[union-attr]
    assert_as_a_pass_leaves_it(busy)


def test_a_release_that_leaves_room_for_more_than_the_first_request_serves_the_queue(
    make_ledger: Callable[..., Ledger],
) -> None:
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([node("a", gpus=8)])
    assert ledger.reserve(WHOLE, "task", reservation_id="task").state is GRANTED
    halves = [ledger.reserve(GpuRequest(gpus=4), "half", reservation_id=f"half-{i}") for i in range(2)]
    assert {r.state for r in halves} == {WAITING}
    ledger.reap()  # a pass: it marks the nodes the first request fits empty (a first waiter queues without one)
    assert meta(ledger).get("queue_head_generation", -1) >= 0 or not on_postgres(ledger)
    with statements(ledger, EXCLUSIVE_LOCK) as locked:
        ledger.release("task")
    # The empty node takes both: a pass grants the second too, which a hand-over alone would not.
    assert [ledger.get(r.id).state for r in halves] == [GRANTED, GRANTED]
    if on_postgres(ledger):
        assert locked  # the pass, under the exclusive lock
    assert ledger.check_invariants() == []


def test_a_release_that_does_not_empty_its_node_serves_the_queue(make_ledger: Callable[..., Ledger]) -> None:
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([node("a", gpus=8)])
    ledger.reserve(GpuRequest(gpus=2), "t", reservation_id="first")
    second = ledger.reserve(GpuRequest(gpus=6), "t", reservation_id="second")
    assert second.grant is not None and second.grant.gpu_indices == (2, 3, 4, 5, 6, 7)
    assert ledger.reserve(GpuRequest(gpus=6), "w", reservation_id="waits").state is WAITING
    ledger.reap()  # a pass marks the node: it fits the first request empty
    with statements(ledger, EXCLUSIVE_LOCK) as locked:
        ledger.release(second.id)
    # The first request is granted the GPUs the release freed, beside the grant left on the others.
    assert ledger.get("waits").state is GRANTED
    assert ledger.get("waits").grant.gpu_indices == (2, 3, 4, 5, 6, 7)  # type: ignore[union-attr]
    if on_postgres(ledger):
        assert locked
    assert ledger.check_invariants() == []


def test_releases_and_grants_at_once_leave_the_queue_as_a_pass_would(busy: Ledger) -> None:
    # Tasks end and start again while small grants pass the queue and spend budgets: whatever
    # commits in whatever order, one request per emptied node, the hold on the next spent one.
    for i in range(3, 8):
        assert busy.reserve(WHOLE, "big", reservation_id=f"big-{i}").state is WAITING
    errors: list[BaseException] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # reported below, with the thread's traceback
            errors.append(e)

    def tasks_end() -> None:
        for i in range(4):
            rid = f"task-{i}"
            if busy.get(rid).state is GRANTED:
                busy.release(rid)

    def small_grants() -> None:
        for k in range(20):
            small = busy.reserve(GpuRequest(gpus=1), "small", reservation_id=f"s-{k}")
            busy.release(small.id)  # or withdrawn, if it had to wait

    threads = [threading.Thread(target=run, args=(fn,)) for fn in (tasks_end, small_grants, small_grants)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert busy.check_invariants() == []
    assert pass_would_grant(busy) == ()
    granted = [f"big-{i}" for i in range(8) if busy.get(f"big-{i}").state is GRANTED]
    assert granted == ["big-0", "big-1", "big-2", "big-3"]  # in order: one per node the tasks emptied
    gate = QueueGate.from_meta(meta(busy))
    if gate.open:  # open, it names the first waiting request, spent, as the one held for
        assert list(held_for(busy).values()) == ["big-4"]


class HandOverMachine(QueueGateMachine):
    """The queue gate's machine on nodes a whole-node request empties and fills: hand-overs come often."""

    inventory = (node("a", gpus=4), node("b", gpus=4), node("c", gpus=4))

    @rule()
    def reserve_a_whole_node_again(self) -> None:
        # Whole-node requests of one shape: the hold passes from one to the next.
        self._reserve(GpuRequest(gpus=4), "big", 600, 900)

    @rule(pick=st.integers(min_value=0, max_value=7))
    def a_whole_node_task_ends(self, pick: int) -> None:
        # The draw does not depend on the ledger's state, so the same draws replay the same calls
        # however the state came out (a draw from the granted ones failed CI as "inconsistent data
        # generation" once, state read back differently on a replay: cause not found, see the note).
        whole = [r.id for r in map(self.ledger.get, self.ids) if r.state is GRANTED and r.request.gpus == 4]
        if whole:  # its node empties, unless smaller grants share it
            self.ledger.release(whole[pick % len(whole)])


@pytest.mark.parametrize(
    ("backend", "examples"),
    [
        pytest.param("sqlite", 30, id="sqlite"),
        pytest.param("postgresql", 40, id="postgresql", marks=pytest.mark.postgres),
    ],
)
def test_after_every_call_with_hand_overs_a_pass_would_grant_nothing(
    backend: str, examples: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="airflow_gpupool")
    run_ledger_machine(HandOverMachine, backend, tmp_path, examples=examples, steps=30)
    handed = sum("handed to" in r.getMessage() for r in caplog.records)
    if backend == "postgresql":  # the machine reached the hand-over, not only the pass (7-29 in a run)
        assert handed >= 1
    else:
        assert handed == 0
