"""The ledger against real SQLite and PostgreSQL databases (one parametrized suite)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError

from airflow_gpupool.exceptions import (
    InvalidInventoryError,
    InvalidRequestError,
    LeaseExpiredError,
    LedgerSchemaError,
    NoCapacityError,
    UnknownReservationError,
)
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

GRANTED = ReservationState.GRANTED
WAITING = ReservationState.WAITING


def free_milli(ledger: Ledger) -> dict[tuple[str, int], int]:
    return {(n.name, g.index): g.free_milli for n in ledger.snapshot().cluster.nodes for g in n.gpus}


def state_of(ledger: Ledger) -> tuple:
    """Everything a failed call must leave unchanged."""
    snap = ledger.snapshot()
    return (
        snap.cluster,
        tuple((r.id, r.state, r.grant) for r in snap.grants),
        tuple((r.id, r.state) for r in snap.queue),
    )


def test_grant_records_the_slice_and_keeps_invariants(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=1, model="T4", memory_mib=15360)])
    whole = ledger.reserve(GpuRequest(gpus=2), "task-a")
    half = ledger.reserve(GpuRequest(gpu_milli=500, gpu_models=["T4"]), "task-b")

    assert whole.state is GRANTED and whole.grant is not None
    assert (whole.grant.node, whole.grant.gpu_indices) == ("n1", (0, 1))
    assert whole.grant.gpu_uuids == ("GPU-n1-0", "GPU-n1-1")
    assert half.grant is not None and (half.grant.node, half.grant.milli_per_gpu) == ("n2", 500)
    assert ledger.get(half.id).grant == half.grant
    assert free_milli(ledger) == {("n1", 0): 0, ("n1", 1): 0, ("n2", 0): 500}
    assert ledger.check_invariants() == []


def test_multi_gpu_request_is_all_or_nothing(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2, labels={"zone": "a"}), node("n2", gpus=2, labels={"zone": "b"})])
    ledger.reserve(GpuRequest(gpus=1, node_labels={"zone": "a"}), "a")
    ledger.reserve(GpuRequest(gpus=1, node_labels={"zone": "b"}), "b")
    before = free_milli(ledger)

    three = ledger.reserve(GpuRequest(gpus=2), "c")  # 2 GPUs free, but on two nodes

    assert three.state is WAITING and three.grant is None and three.position == 1
    assert free_milli(ledger) == before


def test_failure_inside_the_transaction_leaves_ledger_unchanged(
    make_ledger: Callable[..., Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = make_ledger(concurrent=False)  # Python code inside the transaction: the serialized path
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.reserve(GpuRequest(gpus=1), "a")
    before = state_of(ledger)

    def crash(*args: object) -> None:
        raise RuntimeError("worker died mid-grant")

    # The grant's SQL has run when the in-memory copy is updated; the crash must undo it.
    monkeypatch.setattr("airflow_gpupool.ledger.store.take.allocate", crash)
    with pytest.raises(RuntimeError):
        ledger.reserve(GpuRequest(gpus=2), "b")
    monkeypatch.undo()

    assert state_of(ledger) == before
    assert ledger.check_invariants() == []
    assert ledger.reserve(GpuRequest(gpus=3), "c").state is GRANTED


def fail_grant_rows(ledger: Ledger) -> None:
    """Make the database refuse to write a granted reservation: a crash after the GPUs were taken."""
    engine = create_engine(normalize_url(ledger.url))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'disk full mid-grant'; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON gpupool_reservations "
                "FOR EACH ROW WHEN (NEW.state = 'granted') EXECUTE FUNCTION refuse()"
            )
        else:
            for event in ("INSERT", "UPDATE"):
                conn.exec_driver_sql(
                    f"CREATE TRIGGER refuse_{event} BEFORE {event} ON gpupool_reservations "
                    "WHEN NEW.state = 'granted' BEGIN SELECT RAISE(ABORT, 'disk full mid-grant'); END"
                )
    engine.dispose()


@pytest.mark.parametrize("concurrent", [True, False], ids=["concurrent", "serialized"])
def test_database_failure_mid_grant_leaves_ledger_unchanged(
    make_ledger: Callable[..., Ledger], concurrent: bool
) -> None:
    ledger = make_ledger(concurrent=concurrent)
    ledger.upsert_nodes([node("n1", gpus=4, mig={3: ["3g.40gb", "3g.40gb"]})])
    ledger.reserve(GpuRequest(gpus=1), "a")
    before = state_of(ledger)
    fail_grant_rows(ledger)

    for request in (GpuRequest(gpus=2), GpuRequest(gpu_milli=500), GpuRequest(mig_profile="3g.40gb")):
        with pytest.raises(DBAPIError, match="disk full mid-grant"):
            ledger.reserve(request, "b")

    assert state_of(ledger) == before
    assert ledger.check_invariants() == []


def test_queue_serves_priority_first_then_fifo(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    holder = ledger.reserve(GpuRequest(gpus=1), "holder")
    low = ledger.reserve(GpuRequest(gpus=1, priority=1), "low")
    first = ledger.reserve(GpuRequest(gpus=1, priority=5), "first")
    second = ledger.reserve(GpuRequest(gpus=1, priority=5), "second")
    assert [ledger.get(r.id).position for r in (first, second, low)] == [1, 2, 3]

    order = []
    current = holder
    for _ in range(3):
        ledger.release(current.id)
        granted = [r for r in (low, first, second) if ledger.get(r.id).state is GRANTED]
        (current,) = [r for r in granted if r.id not in {o.id for o in order}]
        order.append(current)

    assert [r.holder for r in order] == ["first", "second", "low"]


def test_large_request_is_not_starved_by_small_ones(make_ledger) -> None:
    ledger = make_ledger(max_overtakes=3)
    ledger.upsert_nodes([node("n1", gpus=2)])
    small = [ledger.reserve(GpuRequest(gpu_milli=500), f"small-{i}") for i in range(2)]
    big = ledger.reserve(GpuRequest(gpus=2), "big")
    assert big.state is WAITING

    # A stream of small requests: each may backfill past the big one, three times at most.
    later, states = [], []
    for i in range(5):
        later.append(ledger.reserve(GpuRequest(gpu_milli=500), f"later-{i}"))
        states.append(later[-1].state)
        if i < 3:
            ledger.release(small[i].id if i < 2 else later[0].id)
    assert states == [GRANTED] * 3 + [WAITING] * 2, "three backfills, then the queue is held for the big one"
    assert ledger.get(big.id).state is WAITING

    for r in small + later:
        ledger.release(r.id)
    assert ledger.get(big.id).state is GRANTED
    assert ledger.check_invariants() == []


def test_timeout_names_what_blocked_the_request(ledger: Ledger, clock) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=1, cpu=4000)])
    ledger.reserve(GpuRequest(gpus=1), "a")
    ledger.reserve(GpuRequest(gpus=1, cpu_milli=1000), "b")
    waiting = ledger.reserve(GpuRequest(gpus=2, cpu_milli=8000), "c", timeout=60)
    clock.advance(61)

    result = ledger.reap()

    assert result.timed_out == (waiting.id,)
    ended = ledger.get(waiting.id)
    assert ended.state is ReservationState.TIMED_OUT
    assert "waited 61s" in ended.message
    assert "n1: needs 2 free GPUs, 1 free of 2" in ended.message
    # n2 has one GPU: the GPUs are checked before the CPU (the order of placement/fit.py).
    assert "n2: needs 2 GPUs, node has 1" in ended.message


def test_release_is_idempotent_and_says_so(ledger: Ledger, clock) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    r = ledger.reserve(GpuRequest(gpus=1), "a", ttl=30)

    first = ledger.release(r.id)
    second = ledger.release(r.id)

    assert first.released and first.state is GRANTED
    assert not second.released and second.state is ReservationState.RELEASED
    assert "nothing to release" in second.message
    expiring = ledger.reserve(GpuRequest(gpus=1), "b", ttl=30)
    clock.advance(31)
    after_expiry = ledger.release(expiring.id)
    assert not after_expiry.released and after_expiry.state is ReservationState.EXPIRED
    with pytest.raises(UnknownReservationError):
        ledger.release("no-such-id")


def test_expired_lease_is_reaped_and_queue_served(ledger: Ledger, clock) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    dead = ledger.reserve(GpuRequest(gpus=1), "dead-worker", ttl=30)
    waiting = ledger.reserve(GpuRequest(gpus=1), "next", timeout=600)
    clock.advance(20)
    assert ledger.reap().expired == ()
    clock.advance(11)

    result = ledger.reap()

    assert result.expired == (dead.id,) and result.granted == (waiting.id,)
    assert ledger.get(dead.id).state is ReservationState.EXPIRED
    assert ledger.get(waiting.id).state is GRANTED
    assert ledger.check_invariants() == []


def test_renew_extends_the_lease_until_it_ends(ledger: Ledger, clock) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    r = ledger.reserve(GpuRequest(gpus=1), "a", ttl=30)
    clock.advance(25)
    renewed = ledger.renew(r.id)
    assert renewed.grant is not None and renewed.grant.expires_at == clock.now + 30
    clock.advance(25)
    assert ledger.reap().expired == ()
    clock.advance(10)
    ledger.reap()
    with pytest.raises(LeaseExpiredError) as info:
        ledger.renew(r.id)
    assert info.value.state == "expired"


def test_reserve_is_idempotent_by_id(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    first = ledger.reserve(GpuRequest(gpus=1), "a", reservation_id="dag.task.run.1")
    again = ledger.reserve(GpuRequest(gpus=1), "a", reservation_id="dag.task.run.1")
    assert again.id == first.id and again.grant == first.grant
    assert len(ledger.snapshot().grants) == 1


def test_mig_slices_and_workload_isolation(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2, mig={1: ["3g.40gb", "3g.40gb"]}), node("n2", gpus=1)])
    a = ledger.reserve(GpuRequest(mig_profile="3g.40gb", workload_class="inference"), "a")
    b = ledger.reserve(GpuRequest(mig_profile="3g.40gb", workload_class="inference"), "b")
    c = ledger.reserve(GpuRequest(mig_profile="3g.40gb", workload_class="inference"), "c")
    train = ledger.reserve(GpuRequest(gpus=1, workload_class="training"), "t")

    assert {a.grant.mig_slice, b.grant.mig_slice} == {"n1-g1-m0", "n1-g1-m1"}
    assert a.grant.gpu_uuids == ("GPU-n1-1",) and a.grant.mig_profile == "3g.40gb"
    assert c.state is WAITING
    assert train.grant is not None and train.grant.node == "n2", "training may not join inference on n1"
    ledger.release(a.id)
    assert ledger.get(c.id).state is GRANTED
    assert ledger.check_invariants() == []


def test_inventory_upsert_is_idempotent_and_removal_drains(ledger: Ledger) -> None:
    nodes = [node("n1", gpus=2), node("n2", gpus=2)]
    assert ledger.upsert_nodes(nodes).added == ("n1", "n2")
    assert ledger.upsert_nodes(nodes).unchanged == ("n1", "n2")
    held = ledger.reserve(GpuRequest(gpus=2, gpu_models=["A100"], node_labels={}), "a")
    busy = held.grant.node
    idle = "n2" if busy == "n1" else "n1"

    assert ledger.remove_node(idle) == "removed"
    assert ledger.remove_node(busy) == "draining"
    with pytest.raises(NoCapacityError, match="not schedulable"):
        ledger.reserve(GpuRequest(gpus=1), "b")  # the only node is leaving
    assert [n.health for n in ledger.snapshot().nodes] == ["draining"]
    ledger.release(held.id)

    assert ledger.snapshot().nodes == ()
    assert ledger.remove_node(busy) == "absent"
    assert ledger.check_invariants() == []


def test_inventory_update_keeps_grants(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2, cpu=16000)])
    r = ledger.reserve(GpuRequest(gpu_milli=300, cpu_milli=4000), "a")
    change = ledger.upsert_nodes([node("n1", gpus=4, cpu=32000)])
    assert change.updated == ("n1",)
    snap = ledger.snapshot()
    assert snap.nodes[0].cpu_free == 28000
    assert free_milli(ledger)[("n1", r.grant.gpu_indices[0])] == 700
    with pytest.raises(InvalidInventoryError, match="drain the node"):
        ledger.upsert_nodes([node("n1", gpus=0)])
    assert ledger.check_invariants() == []


def test_cordoned_node_takes_no_new_grants(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.set_health("n1", "cordoned")
    r = ledger.reserve(GpuRequest(gpus=1), "a")
    assert r.state is WAITING
    ledger.set_health("n1", "healthy")
    assert ledger.get(r.id).state is GRANTED


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        pytest.param(GpuRequest(gpus=9), "gpus", id="more-gpus-than-any-node"),
        pytest.param(GpuRequest(gpus=1, gpu_models=["H100"]), "model", id="unknown-model"),
        pytest.param(GpuRequest(mig_profile="1g.5gb"), "mig", id="profile-not-in-inventory"),
        pytest.param(GpuRequest(gpus=1, cpu_milli=10_000_000), "cpu", id="huge-cpu"),
        pytest.param(GpuRequest(gpus=1, node_labels={"zone": "b"}), "label", id="missing-label"),
    ],
)
def test_request_that_can_never_fit_fails_at_once(ledger: Ledger, request_: GpuRequest, field: str) -> None:
    ledger.upsert_nodes([node("n1", gpus=8, mig={7: ["3g.40gb"]}, labels={"zone": "a"})])
    before = state_of(ledger)
    with pytest.raises(NoCapacityError) as info:
        ledger.reserve(request_, "a")
    assert info.value.reasons and field in str(info.value).lower() or field in info.value.reasons[0].reason
    assert state_of(ledger) == before


def test_empty_inventory_is_a_clear_error(ledger: Ledger) -> None:
    with pytest.raises(NoCapacityError, match="the inventory is empty"):
        ledger.reserve(GpuRequest(gpus=1), "a")
    assert ledger.snapshot().queue == ()


@pytest.mark.parametrize(
    ("call", "field"),
    [
        pytest.param(lambda ledger: ledger.reserve("1 gpu", "a"), "request", id="request-not-a-GpuRequest"),
        pytest.param(lambda ledger: ledger.reserve(GpuRequest(gpus=1), ""), "holder", id="empty-holder"),
        pytest.param(
            lambda ledger: ledger.reserve(GpuRequest(gpus=1), "a", ttl=-5), "ttl", id="negative-ttl"
        ),
        pytest.param(
            lambda ledger: ledger.reserve(GpuRequest(gpus=1), "a", timeout="soon"),
            "timeout",
            id="timeout-str",
        ),
        pytest.param(
            lambda ledger: ledger.reserve(GpuRequest(gpus=1), "a", reservation_id="x" * 65),
            "reservation_id",
            id="id-too-long",
        ),
        pytest.param(
            lambda ledger: ledger.reserve(GpuRequest(gpus=1), "a", reservation_id=""),
            "reservation_id",
            id="id-empty",  # issue 38: was replaced by a random id, the idempotency key dropped
        ),
    ],
)
def test_bad_arguments_are_typed_errors_and_change_nothing(ledger: Ledger, call, field: str) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    before = state_of(ledger)
    with pytest.raises(InvalidRequestError) as info:
        call(ledger)
    assert info.value.field == field
    assert state_of(ledger) == before


def test_uninitialised_database_says_how_to_create_it(ledger_url: str) -> None:
    with pytest.raises(LedgerSchemaError, match="gpupool ledger init"):
        Ledger(ledger_url).snapshot()


def test_snapshot_reports_allocation(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.reserve(GpuRequest(gpus=1), "a")
    ledger.reserve(GpuRequest(gpu_milli=500), "b")
    snap = ledger.snapshot()
    assert snap.gpu_capacity_milli == 4000 and snap.gpu_allocated_milli == 1500
    assert [g.holder for g in snap.grants] == ["a", "b"]


def test_setting_a_draining_node_healthy_cancels_its_removal(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    a = ledger.reserve(GpuRequest(gpus=1), "a")
    assert ledger.remove_node("n1") == "draining"
    ledger.set_health("n1", "healthy")
    b = ledger.reserve(GpuRequest(gpus=1), "b")
    ledger.release(a.id)
    ledger.release(b.id)
    assert [(n.name, n.health) for n in ledger.snapshot().nodes] == [("n1", "healthy")]


def test_two_ledgers_in_one_postgres_database_do_not_share_a_lock(pg_schema_url: str) -> None:
    import threading

    from sqlalchemy import create_engine

    from airflow_gpupool.ledger.db.engine import normalize_url, write_transaction

    first = Ledger.create(pg_schema_url)
    engine = create_engine(normalize_url(pg_schema_url))
    held, done = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with write_transaction(engine):
            held.set()
            done.wait(10)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    held.wait(5)
    try:
        # Same schema: the lock is taken; a write of the same ledger would wait.
        with engine.connect() as conn:
            got = conn.exec_driver_sql(
                "SELECT pg_try_advisory_xact_lock(7243000, hashtext(current_schema()))"
            ).scalar()
            other = conn.exec_driver_sql(
                "SELECT pg_try_advisory_xact_lock(7243000, hashtext('some_other_schema'))"
            ).scalar()
        assert (got, other) == (False, True)
    finally:
        done.set()
        holder.join()
        engine.dispose()
        first.close()


def test_spent_budget_holds_one_node_while_the_others_keep_working(make_ledger) -> None:
    ledger = make_ledger(max_overtakes=1)
    ledger.upsert_nodes(
        [
            node("n1", gpus=2, labels={"zone": "a"}),
            node("n2", gpus=2, labels={"zone": "b"}),
            node("n3", gpus=1, labels={"zone": "c"}),
        ]
    )

    def small(zone: str, holder: str):
        return ledger.reserve(GpuRequest(gpus=1, node_labels={"zone": zone}), holder)

    small("a", "on-n1")
    on_n2 = small("b", "on-n2")
    big = ledger.reserve(GpuRequest(gpus=2), "big")
    assert big.state is WAITING
    assert small("a", "passes-big").state is GRANTED  # its one overtake: the budget is spent

    # Now n2 (closest to fitting the big one) is held: zone-b work waits, zone-c work goes on.
    waits = small("b", "would-take-n2")
    elsewhere = small("c", "on-n3")
    assert waits.state is WAITING
    assert elsewhere.state is GRANTED and elsewhere.grant.node == "n3"

    ledger.release(on_n2.id)
    granted = ledger.get(big.id)
    assert granted.state is GRANTED and granted.grant.node == "n2"
    assert ledger.get(waits.id).state is WAITING
    assert ledger.check_invariants() == []


def test_inventory_growth_serves_the_queue_at_once(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "holder")
    waiting = ledger.reserve(GpuRequest(gpus=1), "waiter")
    assert waiting.state is WAITING

    ledger.upsert_nodes([node("n1", gpus=2)])  # a GPU added to the node

    assert ledger.get(waiting.id).state is GRANTED
    assert ledger.check_invariants() == []


def test_repartitioning_a_held_mig_slice_is_refused(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1, mig={0: ["3g.40gb"]})])
    ledger.reserve(GpuRequest(mig_profile="3g.40gb"), "holder")
    before = state_of(ledger)
    with pytest.raises(InvalidInventoryError, match="drain the node"):
        ledger.upsert_nodes([node("n1", gpus=1, mig={0: ["2g.20gb"]})])  # same slice id, new profile
    assert state_of(ledger) == before
