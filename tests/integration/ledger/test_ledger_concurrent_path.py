"""PostgreSQL's concurrent path: grants and releases under the shared lock (schema v3).

The parametrized suite runs every ledger behaviour through this path already; these tests
pin what is particular to it: the database functions' answers, a stale capacity copy,
the transaction-id watermark, migration from v2, and a lost connection.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from sqlalchemy import Connection, create_engine, select, text

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.engine import ADVISORY_LOCK_KEY, normalize_url
from airflow_gpupool.ledger.grants import concurrent_grants as ledger_module
from airflow_gpupool.ledger.postgres.concurrent import ConcurrentPath
from airflow_gpupool.ledger.store import migrations
from airflow_gpupool.ledger.store.cache import CapacityCache
from airflow_gpupool.ledger.store.gate import QueueGate
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GangSpec, GpuDevice, GpuRequest, MigSlice, NodeInventory
from tests.ledger_fixtures import FakeClock, node

GRANTED = ReservationState.GRANTED
T = TypeVar("T")


@pytest.fixture
def open_ledger(pg_schema_url: str) -> Iterator[Callable[..., Ledger]]:
    """Open ledgers (several processes' worth) on one fresh PostgreSQL schema."""
    opened: list[Ledger] = []

    def open_(**options: object) -> Ledger:
        options.setdefault("policy", "bestfit")
        options.setdefault("max_overtakes", 4)
        options.setdefault("clock", FakeClock())  # the same start as ``take``'s ``now``
        ledger = Ledger.create(pg_schema_url, **options)  # type: ignore[arg-type]
        opened.append(ledger)
        return ledger

    yield open_
    for ledger in opened:
        ledger.close()


@pytest.fixture
def take(pg_schema_url: str) -> Iterator[Callable[..., tuple[str, Assignment | None]]]:
    """Call ``gpupool_take`` directly, as a process whose copy of the capacity is wrong would."""
    path = ConcurrentPath(normalize_url(pg_schema_url))

    def call(
        rid: str,
        request: GpuRequest,
        assignment: Assignment,
        model: str | None = "A100",
        generation: int = 1,
        now: float = 1_800_000_000.0,
    ) -> tuple[str, Assignment | None]:
        with path.connect() as conn:
            outcome, taken, _ = path.take(
                conn, rid, "direct", request, assignment, model, generation, now, 60.0, 60.0
            )
            return outcome, taken

    yield call
    path.close()


def test_take_falls_back_to_an_equivalent_slice_on_the_same_node(
    open_ledger: Callable[..., Ledger], take: Callable[..., tuple[str, Assignment | None]]
) -> None:
    ledger = open_ledger()
    ledger.upsert_nodes([node("n1", gpus=4, mig={3: ["3g.40gb", "3g.40gb"]})])
    first = ledger.reserve(GpuRequest(gpus=1), "a")
    mig = ledger.reserve(GpuRequest(mig_profile="3g.40gb"), "b")
    half = ledger.reserve(GpuRequest(gpu_milli=500), "c")
    assert first.grant is not None and mig.grant is not None and half.grant is not None
    assert (first.grant.gpu_indices, half.grant.gpu_indices) == ((0,), (1,))

    # A copy that missed those grants names the slices they took; the function takes others.
    whole = take("whole", GpuRequest(gpus=1), Assignment("n1", (0,), 1000, 81920))
    mig_slice = Assignment("n1", (3,), 429, 40960, mig.grant.mig_slice)
    other_slice = take("mig", GpuRequest(mig_profile="3g.40gb"), mig_slice)
    fraction = take("fraction", GpuRequest(gpu_milli=600), Assignment("n1", (1,), 600, 49152))

    assert whole == ("granted", Assignment("n1", (2,), 1000, 81920))
    assert other_slice[0] == "granted" and other_slice[1] is not None
    assert other_slice[1].mig_slice not in (None, mig.grant.mig_slice)
    assert fraction == ("stale", None)  # GPU 1 has 500 free; GPU 2 was just taken, GPU 3 is MIG
    assert take("mig-2", GpuRequest(mig_profile="3g.40gb"), mig_slice) == ("stale", None)
    assert ledger.check_invariants() == []


def test_take_checks_the_node_and_leaves_queue_decisions_to_the_exclusive_path(
    open_ledger: Callable[..., Ledger], take: Callable[..., tuple[str, Assignment | None]]
) -> None:
    clock = FakeClock()
    ledger = open_ledger(clock=clock)
    ledger.upsert_nodes([node("n1", gpus=1), node("n2", gpus=1, model="T4", memory_mib=15360)])
    generation = 1
    one_gpu = Assignment("n1", (0,), 1000, 81920)

    assert take("ok", GpuRequest(gpus=1), one_gpu, now=clock.now) == ("granted", one_gpu)
    assert take("ok", GpuRequest(gpus=1), one_gpu, now=clock.now) == ("serialize", None)  # id exists
    assert take("full", GpuRequest(gpus=1), one_gpu, now=clock.now) == ("stale", None)
    t4 = Assignment("n2", (0,), 1000, 15360)
    assert take("old-inventory", GpuRequest(gpus=1), t4, "T4", generation + 1, clock.now) == (
        "serialize",
        None,
    )

    waiting = ledger.reserve(GpuRequest(gpus=1, gpu_models=["A100"]), "waits")
    assert waiting.state is ReservationState.WAITING
    # A grant behind the waiting request, which no free node fits: a backfill the queue gate lets
    # pass (ledger.gate), its overtake counted as a pass would count it.
    assert take("behind-queue", GpuRequest(gpus=1), t4, "T4", now=clock.now) == ("granted", t4)
    r = schema.reservations.c
    count = ledger.read(lambda conn: conn.execute(select(r.overtakes).where(r.id == waiting.id)).scalar_one())
    assert count == 1
    ledger.release("behind-queue")
    ledger.release(waiting.id)
    # A waiting gang closes the gate: every grant goes through the queue while it waits.
    gang = ledger.reserve(GpuRequest(gpus=1, gang=GangSpec(2, 2)), "gang")
    assert gang.state is ReservationState.WAITING
    assert take("behind-gang", GpuRequest(gpus=1), t4, "T4", now=clock.now) == ("serialize", None)
    ledger.release(gang.id)
    assert take("overdue", GpuRequest(gpus=1), t4, "T4", now=clock.now + 61) == ("serialize", None)
    assert take("t4", GpuRequest(gpus=1), t4, "T4", now=clock.now) == ("granted", t4)
    assert ledger.check_invariants() == []


@pytest.fixture
def wait(pg_schema_url: str) -> Iterator[Callable[..., str]]:
    """Call ``gpupool_wait`` directly, as a process that found no node for the request would."""
    path = ConcurrentPath(normalize_url(pg_schema_url))

    def call(rid: str, request: GpuRequest, *, generation: int = 1, now: float = 1_800_000_000.0) -> str:
        with path.connect() as conn:
            queued = path.wait(conn, rid, "direct", request, generation, now, 60.0, 900.0)
            return "serialize" if queued is None else "waiting"

    yield call
    path.close()


def test_wait_queues_only_what_leaves_the_gate_as_it_is_and_fits_no_node(
    open_ledger: Callable[..., Ledger], wait: Callable[..., str]
) -> None:
    ledger = open_ledger()
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2), node("few-cpus", gpus=2, cpu=1000)])
    pair = GpuRequest(gpus=2, cpu_milli=4000)
    assert {ledger.reserve(pair, "full").state for _ in range(2)} == {GRANTED}
    assert wait("first", pair) == "serialize"  # nothing waits: queueing it sets the gate
    assert ledger.reserve(pair, "w", reservation_id="w-0").state is ReservationState.WAITING
    # Two GPUs free on a node with too few CPUs: the function counts GPUs alone, and errs towards
    # the exclusive path.
    assert wait("room", pair) == "serialize"
    assert {ledger.reserve(GpuRequest(gpus=1, cpu_milli=100), "one").state for _ in range(2)} == {GRANTED}

    assert wait("same", pair) == "waiting"
    assert wait("same", pair) == "serialize"  # the id exists
    # Either would move the gate's smallest shape (no fraction waits yet).
    assert wait("smaller", GpuRequest(gpus=1, cpu_milli=4000)) == "serialize"
    assert wait("fraction", GpuRequest(gpu_milli=500)) == "serialize"
    assert wait("old-inventory", pair, generation=2) == "serialize"
    # Leases are due: the exclusive path expires them first.
    assert wait("overdue", pair, now=1_800_000_000.0 + 86400) == "serialize"
    assert ledger.get("same").state is ReservationState.WAITING and ledger.get("same").position == 2
    assert ledger.check_invariants() == []


def test_a_process_with_a_stale_copy_places_again_elsewhere(
    open_ledger: Callable[..., Ledger], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ledger_module, "_CACHE_FRESH_FOR_S", 3600.0)  # B never refreshes by age
    a, b = open_ledger(), open_ledger()
    a.upsert_nodes([node("n1", gpus=1), node("n2", gpus=1)])
    b.release(b.reserve(GpuRequest(gpus=1), "warm-up").id)  # B's copy: both nodes free again

    on_a = a.reserve(GpuRequest(gpus=1), "a")
    with caplog.at_level(logging.DEBUG, logger="airflow_gpupool.ledger.ledger"):
        on_b = b.reserve(GpuRequest(gpus=1), "b")  # B's copy still has n1 free

    assert f"Node {on_a.grant.node if on_a.grant else ''} no longer fits" in caplog.text

    assert on_a.grant is not None and on_b.grant is not None
    assert {on_a.grant.node, on_b.grant.node} == {"n1", "n2"}
    assert b.check_invariants() == []
    assert b.reserve(GpuRequest(gpus=1), "c").state is ReservationState.WAITING


def test_release_under_the_shared_lock_unless_the_queue_or_a_drain_needs_the_exclusive_one(
    open_ledger: Callable[..., Ledger],
) -> None:
    ledger = open_ledger()
    ledger.upsert_nodes([node("n1", gpus=1), node("n2", gpus=1)])
    path = ConcurrentPath(normalize_url(ledger.url))
    held = ledger.reserve(GpuRequest(gpus=1), "a")
    other = ledger.reserve(GpuRequest(gpus=1), "b")
    with path.connect() as conn:
        assert path.give_back(conn, "no-such-id", ledger.now(), "x") is None
        given = path.give_back(conn, held.id, ledger.now(), "done")
        assert held.grant is not None and given is not None
        assert (given.assignment, given.request) == (
            Assignment(held.grant.node, held.grant.gpu_indices, 1000, 81920),
            GpuRequest(gpus=1),
        )
        # Ended already: the serialized path says so.
        assert path.give_back(conn, held.id, ledger.now(), "again") is None
    assert ledger.release(held.id).released is False

    ledger.reserve(GpuRequest(gpus=1), "c")
    queued = ledger.reserve(GpuRequest(gpus=1), "d")
    assert queued.state is ReservationState.WAITING
    with path.connect() as conn:
        assert path.give_back(conn, other.id, ledger.now(), "x") is None  # freed GPUs go to the queue
    ledger.release(other.id)
    assert ledger.get(queued.id).state is GRANTED

    assert ledger.remove_node(ledger.get(queued.id).grant.node) == "draining"  # type: ignore[union-attr]
    with path.connect() as conn:
        assert path.give_back(conn, queued.id, ledger.now(), "x") is None  # the drained node must go
    path.close()
    assert ledger.check_invariants() == []


def test_the_capacity_copy_sees_a_transaction_that_commits_after_it_refreshed(pg_schema_url: str) -> None:
    ledger = Ledger.create(pg_schema_url)
    ledger.upsert_nodes([node("n1", gpus=1), node("n2", gpus=1)])
    engine = create_engine(normalize_url(pg_schema_url))
    reader = create_engine(normalize_url(pg_schema_url), isolation_level="AUTOCOMMIT")
    stamp_cpu = text(
        "UPDATE gpupool_nodes SET cpu_free = :cpu, version = pg_current_xact_id()::text::bigint WHERE name = :name"
    )
    cache = CapacityCache()
    with reader.connect() as read, engine.connect() as slow, engine.connect() as fast:
        cache.refresh(read)
        slow_tx = slow.begin()
        slow.execute(stamp_cpu, {"cpu": 111, "name": "n1"})  # started first, commits last
        with fast.begin():
            fast.execute(stamp_cpu, {"cpu": 222, "name": "n2"})
        cache.refresh(read)
        assert (cache.nodes["n1"].cpu_free, cache.nodes["n2"].cpu_free) == (64000, 222)
        slow_tx.commit()
        cache.refresh(read)
        assert (cache.nodes["n1"].cpu_free, cache.nodes["n2"].cpu_free) == (111, 222)
    engine.dispose()
    reader.dispose()
    ledger.close()


def test_a_v2_ledger_with_live_grants_migrates_to_v3(
    pg_schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:2])
        m.setattr(migrations, "LATEST", 2)
        old = Ledger.create(pg_schema_url, concurrent=False)
        old.upsert_nodes([node("n1", gpus=2)])
        held = old.reserve(GpuRequest(gpus=1), "from-v2")
        old.close()

    ledger = Ledger(pg_schema_url)
    assert ledger.migrate() == list(range(3, migrations.LATEST + 1))
    assert ledger.release(held.id).released is True
    again = ledger.reserve(GpuRequest(gpus=2), "on-v3")
    assert again.state is GRANTED
    assert ledger.check_invariants() == []
    ledger.close()


def test_a_lost_connection_is_replaced_and_the_call_retried(
    pg_schema_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{pg_schema_url}&application_name=gpupool-victim"
    ledger = Ledger.create(url, policy="bestfit")
    ledger.upsert_nodes([node("n1", gpus=2)])
    first = ledger.reserve(GpuRequest(gpus=1), "before")  # the concurrent path's connection is pooled now
    admin = create_engine(normalize_url(pg_schema_url))
    with admin.begin() as conn:
        killed = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'gpupool-victim'"
            )
        ).scalar_one()
    admin.dispose()
    assert killed >= 1

    with caplog.at_level(logging.WARNING, logger="airflow_gpupool.ledger.db.engine"):
        second = ledger.reserve(GpuRequest(gpus=1), "after")
        released = ledger.release(first.id)

    assert second.state is GRANTED and released.released is True
    assert "Transient database error in Ledger._reserve_concurrently" in caplog.text
    assert ledger.check_invariants() == []
    ledger.close()


def test_threads_sharing_one_ledger_take_turns_with_its_copy(open_ledger: Callable[..., Ledger]) -> None:
    ledger = open_ledger(clock=time.time)
    ledger.upsert_nodes([node(f"n{i}", gpus=2, mig={1: ["3g.40gb", "3g.40gb"]}) for i in range(4)])
    shapes = [GpuRequest(gpus=1), GpuRequest(gpu_milli=250), GpuRequest(mig_profile="3g.40gb")]
    errors: list[BaseException] = []

    def cycles(offset: int) -> None:
        try:
            for k in range(80):
                held = ledger.reserve(shapes[(offset + k) % 3], f"thread-{offset}")
                ledger.release(held.id)
        except BaseException as e:  # every failure reaches the assertion below
            errors.append(e)

    threads = [threading.Thread(target=cycles, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ledger.snapshot().grants == () and ledger.check_invariants() == []


def test_an_equivalent_mig_slice_is_on_a_gpu_of_the_same_model(
    open_ledger: Callable[..., Ledger], take: Callable[..., tuple[str, Assignment | None]]
) -> None:
    ledger = open_ledger()
    mixed = NodeInventory(
        "mixed",
        64000,
        262144,
        (
            GpuDevice(0, "GPU-a", "A100", 81920, (MigSlice("a-m0", "1g.10gb"),)),
            GpuDevice(1, "GPU-h", "H100", 81920, (MigSlice("h-m0", "1g.10gb"),)),
        ),
    )
    ledger.upsert_nodes([mixed])
    h100_only = GpuRequest(mig_profile="1g.10gb", gpu_models=["H100"])
    held = ledger.reserve(h100_only, "a")
    assert held.grant is not None and held.grant.mig_slice == "h-m0"

    chosen = Assignment("mixed", (1,), 143, 10240, "h-m0")
    assert take("b", h100_only, chosen, model="H100") == ("stale", None)  # not the A100's slice
    assert ledger.check_invariants() == []


def insert_waiting(conn: Connection, rid: str, request: GpuRequest, now: float) -> None:
    """Write a waiting reservation row as the serialized path queues one (not committed yet).

    Its pass leaves the queue gate closed, as for a request the gate cannot summarize (a gang,
    a MIG slice): every grant then goes through the queue (ledger.gate).
    """
    conn.execute(
        text(
            "INSERT INTO gpupool_reservations (id, holder, request, priority, seq, state, team,"
            " workload_class, created_at, deadline, ttl, overtakes) VALUES (:rid, 'other', :request,"
            " 0, 1, 'waiting', 'default', 'batch', :now, :deadline, 60, 0)"
        ),
        {"rid": rid, "request": json.dumps(request.to_dict()), "now": now, "deadline": now + 60},
    )
    for key, value in QueueGate().to_meta().items():
        updated = conn.execute(
            text("UPDATE gpupool_meta SET value = :value WHERE key = :key"), {"key": key, "value": value}
        )
        if updated.rowcount == 0:
            conn.execute(
                text("INSERT INTO gpupool_meta (key, value) VALUES (:key, :value)"),
                {"key": key, "value": value},
            )


def take_behind(
    url: str, hold: Callable[[Connection], None], call: Callable[[], T], waiting_on: str
) -> list[T]:
    """Run ``call`` while another transaction holds what ``hold`` took; return what it gave.

    :param waiting_on: a count over ``pg_locks`` that is non-zero once ``call`` waits; the
        holder commits only then, so the call was blocked and not merely slow
    """
    engine = create_engine(normalize_url(url))
    outcome: list[T] = []
    with engine.connect() as holder:
        held = holder.begin()
        hold(holder)
        caller = threading.Thread(target=lambda: outcome.append(call()))
        caller.start()
        with engine.connect() as watcher:
            while not watcher.execute(text(waiting_on)).scalar_one():
                assert caller.is_alive() and not outcome
        held.commit()
    caller.join()
    engine.dispose()
    return outcome


def test_a_grant_waits_for_a_serialized_writer_and_then_sees_what_it_queued(
    open_ledger: Callable[..., Ledger], take: Callable[..., tuple[str, Assignment | None]], pg_schema_url: str
) -> None:
    ledger = open_ledger()
    ledger.upsert_nodes([node("n1", gpus=2)])

    def queue_under_the_lock(conn: Connection) -> None:
        conn.execute(text(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY}, hashtext(current_schema()))"))
        insert_waiting(conn, "queued", GpuRequest(gpus=4), ledger.now())

    outcome = take_behind(
        pg_schema_url,
        queue_under_the_lock,
        lambda: take("late", GpuRequest(gpus=1), Assignment("n1", (0,), 1000, 81920)),
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND mode = 'ShareLock'",
    )
    assert outcome == [("serialize", None)]  # it saw the queued request: the freed GPUs are the queue's


def test_one_id_reserved_twice_at_once_leaves_the_second_to_the_serialized_path(
    open_ledger: Callable[..., Ledger], take: Callable[..., tuple[str, Assignment | None]], pg_schema_url: str
) -> None:
    ledger = open_ledger()
    ledger.upsert_nodes([node("n1", gpus=2)])

    outcome = take_behind(
        pg_schema_url,
        # The same task's other run, between its insert and its commit.
        lambda conn: insert_waiting(conn, "gp-same", GpuRequest(gpus=1), ledger.now()),
        lambda: take("gp-same", GpuRequest(gpus=1), Assignment("n1", (0,), 1000, 81920)),
        "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted",
    )
    assert outcome == [("serialize", None)]
    assert [g.id for g in ledger.snapshot().grants] == [] and ledger.check_invariants() == []
