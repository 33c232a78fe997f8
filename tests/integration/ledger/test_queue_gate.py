"""The queue gate, on SQLite and PostgreSQL: grants and releases that cannot matter to the queue skip it.

A state machine checks the rule that makes skipping safe: after every call, a pass over the
queue would grant nothing (the queue is always served). Scenario tests show who skips: with
whole-node requests waiting, spent, a one-GPU grant and its release skip the queue (no write
lock on PostgreSQL, no read of the queue on SQLite), while a release that frees a node a
waiting request fits, or a grant on the node the queue holds, goes through it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from sqlalchemy import select

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.store.gate import ALL_SPENT, QueueGate
from airflow_gpupool.ledger.store.transactions import Tx
from airflow_gpupool.resources import GpuRequest
from tests.integration.ledger.test_ledger_properties import ReservingMachine, run_ledger_machine
from tests.ledger_fixtures import ledger_statements, node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING
SHAPES = ({"gpus": 1}, {"gpus": 2}, {"gpus": 4}, {"gpu_milli": 250}, {"gpu_milli": 500})


class QueueGateMachine(ReservingMachine):
    """Random grants, releases, renewals and expiry on three small nodes; the queue stays served."""

    max_overtakes = 1  # every grant past a blocked request spends its budget: holds come often
    inventory = (node("a", gpus=4), node("b", gpus=4), node("c", gpus=2))

    def __init__(self) -> None:
        super().__init__()
        self.ledger.upsert_nodes(self.inventory)

    @rule(
        shape=st.sampled_from(SHAPES), priority=st.sampled_from([0, 0, 1, 2]), ttl=st.sampled_from([30, 600])
    )
    def reserve(self, shape: dict[str, int], priority: int, ttl: int) -> None:
        self._reserve(GpuRequest(**shape, priority=priority), "h", ttl, 900)

    @rule(priority=st.sampled_from([-1, 0, 3]))
    def reserve_a_whole_node(self, priority: int) -> None:
        # Blocked while the pool is busy: spent by the next grant past it, held for, (at
        # priority 3) ahead of the request held for, or (at -1) left unspent by grants at 0.
        self._reserve(GpuRequest(gpus=4, priority=priority), "big", 600, 900)

    @invariant()
    def the_queue_is_served(self) -> None:
        assert self.ledger.check_invariants() == []
        # Nothing is due between calls (time moves only in advance_and_reap, which reaps), so a
        # pass now may only grant what a write before it should have granted. The pass is rolled
        # back: the next call starts from what the last one left, so skips follow one another.
        assert pass_would_grant(self.ledger) == ()

    @invariant()
    def an_open_gate_agrees_with_the_waiting_requests(self) -> None:
        gate = QueueGate.from_meta(meta(self.ledger))
        if not gate.open:
            return
        r = schema.reservations.c
        waiting = self.ledger.read(
            lambda conn: conn.execute(
                select(r.priority, r.seq, r.overtakes).where(r.state == "waiting")
            ).all()
        )
        for priority, seq, overtakes in waiting:
            if overtakes >= gate.bound:
                # The gate names the request a pass holds a node for: no spent one comes before it.
                assert gate.behind_hold(priority, seq) or (priority, seq) == (
                    gate.hold_priority,
                    gate.hold_seq,
                )
            else:
                # Grants past the queue count overtakes only at or below the gate's unspent priority.
                assert priority <= gate.unspent_priority


class _RolledBack(Exception):
    def __init__(self, granted: tuple[str, ...]) -> None:
        super().__init__("rolled back")
        self.granted = granted


def pass_would_grant(ledger: Ledger) -> tuple[str, ...]:
    """Return what a pass over the queue would grant now, leaving the ledger as it is."""

    def serve(tx: Tx) -> None:
        ledger._cycle.serve(tx)
        raise _RolledBack(tuple(tx.granted))

    try:
        ledger.write(serve)
    except _RolledBack as e:
        return e.granted
    raise AssertionError("the pass was not rolled back")


def meta(ledger: Ledger) -> dict[str, int]:
    m = schema.ledger_meta.c
    return dict(ledger.read(lambda conn: conn.execute(select(m.key, m.value)).all()))


@pytest.mark.parametrize(
    ("backend", "examples"),
    [
        pytest.param("sqlite", 60, id="sqlite"),
        pytest.param("postgresql", 25, id="postgresql", marks=pytest.mark.postgres),
    ],
)
def test_after_every_call_a_pass_would_grant_nothing(backend: str, examples: int, tmp_path: Path) -> None:
    run_ledger_machine(QueueGateMachine, backend, tmp_path, examples=examples, steps=30)


@pytest.fixture
def pool(make_ledger: Callable[..., Ledger]) -> Ledger:
    """Four nodes of 8 GPUs, 7 of each held; three whole-node requests wait, their budget spent."""
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([node(f"n{i}", gpus=8) for i in range(4)])
    for i in range(4):
        assert ledger.reserve(GpuRequest(gpus=7), "filler", reservation_id=f"fill-{i}").state is GRANTED
    for i in range(3):
        assert ledger.reserve(GpuRequest(gpus=8), "big", reservation_id=f"big-{i}").state is WAITING
    # One grant past them spends their budget of one overtake; the next pass holds a node for the first.
    for rid in ("spend", "hold"):
        assert ledger.reserve(GpuRequest(gpus=1), "small", reservation_id=rid).state is GRANTED
        ledger.release(rid)
    return ledger


def held(ledger: Ledger) -> list[str]:
    n = schema.nodes.c
    return ledger.read(
        lambda conn: list(conn.execute(select(n.name).where(n.held_for.is_not(None))).scalars())
    )


def statements(ledger: Ledger, pattern: str) -> AbstractContextManager[list[str]]:
    """Collect the SQL statements of ``ledger``'s serialized engine that match ``pattern``."""
    found = re.compile(pattern, re.IGNORECASE)
    return ledger_statements(ledger, lambda sql: bool(found.search(sql)))


def test_a_small_grant_and_its_release_pass_spent_waiting_requests_by(pool: Ledger) -> None:
    (hold,) = held(pool)
    # The serialized path's lock (PostgreSQL) or its pass over the queue (both) would show here.
    with statements(
        pool, r"pg_advisory_xact_lock\(|ORDER BY gpupool_reservations.priority DESC"
    ) as queue_work:
        for i in range(5):
            granted = pool.reserve(GpuRequest(gpus=1), "small", reservation_id=f"small-{i}")
            assert granted.state is GRANTED and granted.grant is not None
            assert granted.grant.node != hold  # the held node drains for the first waiting request
            pool.release(granted.id)
    assert queue_work == []
    assert [pool.get(f"big-{i}").state for i in range(3)] == [WAITING] * 3
    assert pool.check_invariants() == []


def test_a_release_that_frees_a_node_a_waiting_request_fits_serves_the_queue(pool: Ledger) -> None:
    (hold,) = held(pool)
    other = next(f"fill-{i}" for i in range(4) if pool.get(f"fill-{i}").grant.node != hold)  # type: ignore[union-attr]
    pool.release(other)  # 8 GPUs free on that node: the first waiting request fits
    assert pool.get("big-0").state is GRANTED
    assert [pool.get(f"big-{i}").state for i in (1, 2)] == [WAITING] * 2
    assert pool.reap().granted == ()


def test_a_grant_never_lands_on_the_held_node(pool: Ledger) -> None:
    (hold,) = held(pool)
    free = [f"fill-{i}" for i in range(4) if pool.get(f"fill-{i}").grant.node != hold]  # type: ignore[union-attr]
    granted = [pool.reserve(GpuRequest(gpus=1), "small", reservation_id=f"s-{i}") for i in range(4)]
    # One GPU free on each of the three other nodes; the fourth waits although the held node has one.
    assert [r.state for r in granted] == [GRANTED] * 3 + [WAITING]
    assert {r.grant.node for r in granted[:3]} == {pool.get(f).grant.node for f in free}  # type: ignore[union-attr]


def test_a_preemptible_grant_goes_through_the_queue_and_keeps_it_served_while_requests_wait(
    pool: Ledger,
) -> None:
    # A pass offers a preemptible grant to the waiting requests as a victim; while one could be,
    # every write serves the queue.
    with statements(pool, r"ORDER BY gpupool_reservations.priority DESC") as passes:
        assert pool.reserve(GpuRequest(gpus=1, preemptible=True), "p", reservation_id="pre").state is GRANTED
    assert passes
    with statements(pool, r"ORDER BY gpupool_reservations.priority DESC") as passes:
        assert pool.reserve(GpuRequest(gpus=1), "s", reservation_id="plain").state is GRANTED
    assert passes
    pool.release("pre")
    pool.release("plain")
    with statements(pool, r"ORDER BY gpupool_reservations.priority DESC") as passes:
        pool.release(pool.reserve(GpuRequest(gpus=1), "s", reservation_id="again").id)
    assert passes == []  # no preemptible grant left: the gate lets small grants by again


def held_for(ledger: Ledger) -> dict[str, str]:
    n = schema.nodes.c
    query = select(n.name, n.held_for).where(n.held_for.is_not(None))
    return dict(ledger.read(lambda conn: conn.execute(query).all()))


PASS_OR_LOCK = r"pg_advisory_xact_lock\(|ORDER BY gpupool_reservations.priority DESC"


def test_a_request_that_fits_nowhere_waits_and_spends_its_budget_behind_the_hold_without_a_pass(
    pool: Ledger,
) -> None:
    hold = held_for(pool)
    # PostgreSQL: no larger than the requests waiting, it joins them under the shared lock.
    on_postgres = pool._store.engine.dialect.name == "postgresql"
    with statements(
        pool, PASS_OR_LOCK if on_postgres else r"ORDER BY gpupool_reservations.priority DESC"
    ) as work:
        late = pool.reserve(GpuRequest(gpus=8), "big", reservation_id="late")
    assert late.state is WAITING and late.position == 4
    assert work == []  # it fits no node: a pass would only leave it waiting
    with statements(pool, PASS_OR_LOCK) as queue_work:
        for i in range(3):  # the first grant spends its budget of one: behind the held request
            pool.release(pool.reserve(GpuRequest(gpus=1), "small", reservation_id=f"small-{i}").id)
    assert queue_work == []
    assert pool.get("late").state is WAITING and held_for(pool) == hold
    assert pass_would_grant(pool) == ()


def test_a_grant_that_spends_the_last_unspent_budget_tells_later_grants_to_stop_counting(
    pool: Ledger,
) -> None:
    assert QueueGate.from_meta(meta(pool)).unspent_priority == ALL_SPENT  # the fixture's grants spent all
    assert pool.reserve(GpuRequest(gpus=8), "big", reservation_id="late").state is WAITING
    assert QueueGate.from_meta(meta(pool)).unspent_priority == 0  # queued unspent: grants count it
    pool.release(pool.reserve(GpuRequest(gpus=1), "small", reservation_id="spends").id)
    assert (
        overtakes(pool, "late") == 1
    )  # its budget of one, spent behind the held request: the gate stays open
    gate = QueueGate.from_meta(meta(pool))
    assert gate.open and gate.unspent_priority == ALL_SPENT
    assert pass_would_grant(pool) == ()


def test_a_grant_that_spends_a_budget_keeps_counting_the_unspent_ones_below_it(pool: Ledger) -> None:
    # Two requests queue unspent, at priorities 0 and -1; a grant at priority 0 passes only the first.
    for rid, priority in (("late", 0), ("lower", -1)):
        assert pool.reserve(GpuRequest(gpus=8, priority=priority), "big", reservation_id=rid).state is WAITING
    pool.release(pool.reserve(GpuRequest(gpus=1), "small", reservation_id="spends").id)
    assert (overtakes(pool, "late"), overtakes(pool, "lower")) == (1, 0)
    assert QueueGate.from_meta(meta(pool)).unspent_priority == -1
    # A grant at priority -1 passes the lower one too: counted, as a pass would.
    pool.release(pool.reserve(GpuRequest(gpus=1, priority=-1), "small", reservation_id="passes").id)
    assert overtakes(pool, "lower") == 1
    assert QueueGate.from_meta(meta(pool)).unspent_priority == ALL_SPENT
    assert pass_would_grant(pool) == ()


def overtakes(ledger: Ledger, reservation_id: str) -> int:
    r = schema.reservations.c
    query = select(r.overtakes).where(r.id == reservation_id)
    return int(ledger.read(lambda conn: conn.execute(query).scalar_one()))


def test_a_request_that_spends_its_budget_ahead_of_the_held_one_takes_the_hold(pool: Ledger) -> None:
    ((node_held, first),) = held_for(pool).items()
    assert first == "big-0"
    assert pool.reserve(GpuRequest(gpus=8, priority=5), "urgent", reservation_id="urgent").state is WAITING
    # A grant past it spends its budget; served before big-0, it gets the hold at the next write.
    assert pool.reserve(GpuRequest(gpus=1), "small", reservation_id="spends").state is GRANTED
    assert list(held_for(pool).values()) == ["big-0"]
    with statements(pool, r"ORDER BY gpupool_reservations.priority DESC") as passes:
        pool.release("spends")
    assert passes
    assert list(held_for(pool).values()) == ["urgent"]
    assert pass_would_grant(pool) == ()


def test_a_request_served_before_the_held_one_may_take_the_held_node(pool: Ledger) -> None:
    ((node_held, _),) = held_for(pool).items()
    for i in range(3):  # the one free GPU of every other node
        assert pool.reserve(GpuRequest(gpus=1), "small", reservation_id=f"s-{i}").state is GRANTED
    # Only the held node has a GPU free; a request of higher priority than big-0 is served first.
    urgent = pool.reserve(GpuRequest(gpus=1, priority=5), "urgent", reservation_id="urgent")
    assert urgent.state is GRANTED and urgent.grant is not None and urgent.grant.node == node_held


def test_a_pass_grants_every_copy_of_a_long_queue_of_one_shape_that_fits(
    make_ledger: Callable[..., Ledger],
) -> None:
    # A pass reads of a spent shape only what the free capacity could take (ledger.waiting): a
    # release that frees room for four must still grant four, the next in line left waiting.
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([node("a", gpus=8), node("side", gpus=1)])
    whole = ledger.reserve(GpuRequest(gpus=8), "whole", reservation_id="whole")
    waiting = [ledger.reserve(GpuRequest(gpus=2), "pair", reservation_id=f"pair-{i:02d}") for i in range(12)]
    assert {r.state for r in waiting} == {WAITING}
    ledger.release(ledger.reserve(GpuRequest(gpus=1), "side", reservation_id="spends").id)  # budgets spent
    ledger.release(whole.id)
    states = [ledger.get(r.id).state for r in waiting]
    assert states == [GRANTED] * 4 + [WAITING] * 8
    assert pass_would_grant(ledger) == ()


def test_a_request_smaller_than_those_waiting_is_served_by_the_release_that_makes_it_fit(
    make_ledger: Callable[..., Ledger],
) -> None:
    # Queued, it lowers the gate's smallest shape (on PostgreSQL through the exclusive path), so a
    # release that frees room for it, but not for the larger one, still serves the queue.
    ledger = make_ledger()
    ledger.upsert_nodes([node("a", gpus=4), node("b", gpus=4)])
    ones = [ledger.reserve(GpuRequest(gpus=1), "one", reservation_id=f"one-{i}") for i in range(8)]
    assert ledger.reserve(GpuRequest(gpus=4), "big", reservation_id="big").state is WAITING
    assert ledger.reserve(GpuRequest(gpus=2), "pair", reservation_id="pair").state is WAITING
    on_a = [r.id for r in ones if r.grant is not None and r.grant.node == "a"]
    ledger.release(on_a[0])
    assert ledger.get("pair").state is WAITING  # one GPU free: it fits neither
    ledger.release(on_a[1])
    assert ledger.get("pair").state is GRANTED and ledger.get("big").state is WAITING
    assert pass_would_grant(ledger) == ()


def test_a_pass_that_grants_the_first_spent_request_holds_a_node_for_the_next(
    make_ledger: Callable[..., Ledger],
) -> None:
    # The state machine's find: a pass read only the first spent request of the shapes that fit
    # nowhere, found it was the first spent one of all, granted it, and left the second without a
    # hold behind an open gate: every later grant passed the second by, its budget long spent.
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes([node("a", gpus=2), node("b", gpus=2)])
    for rid, shape in (("a-full", {"gpus": 2}), ("b-one", {"gpus": 1}), ("frac", {"gpu_milli": 500})):
        assert ledger.reserve(GpuRequest(**shape), "filler", reservation_id=rid).state is GRANTED
    for rid, gpus in (("one", 1), ("two", 2)):
        assert ledger.reserve(GpuRequest(gpus=gpus), "waits", reservation_id=rid).state is WAITING
    assert ledger.reserve(GpuRequest(gpu_milli=250), "small", reservation_id="spends").state is GRANTED
    assert (overtakes(ledger, "one"), overtakes(ledger, "two")) == (1, 1)
    ledger.release("b-one")  # one whole GPU free: "one" fits, "two" fits nowhere
    assert ledger.get("one").state is GRANTED and ledger.get("two").state is WAITING
    assert list(held_for(ledger).values()) == ["two"]
    gate = QueueGate.from_meta(meta(ledger))
    r = schema.reservations.c
    seq = ledger.read(lambda conn: conn.execute(select(r.seq).where(r.id == "two")).scalar_one())
    assert not gate.open or (gate.hold_priority, gate.hold_seq) == (0, seq)
    # Nothing may land on the held node now, so "two" gets it once "a-full" ends.
    ledger.release("a-full")
    assert ledger.get("two").state is GRANTED
