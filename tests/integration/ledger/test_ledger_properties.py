"""Random operation sequences against a real ledger keep it consistent after every step.

A hypothesis state machine drives reserve, release, renew, reap, clock advances and inventory
changes (upsert, removal, health) on a small inventory with a MIG-partitioned GPU, on SQLite
and on PostgreSQL, each example on a fresh database.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import create_engine, select
from sqlalchemy.engine import make_url

from airflow_gpupool.exceptions import InvalidInventoryError, LeaseExpiredError, NoCapacityError
from airflow_gpupool.ledger import Ledger, Reservation, ReservationState
from airflow_gpupool.ledger.db import schema as ledger_schema
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.resources import GpuKind, GpuRequest, NodeHealth, NodeInventory
from tests.ledger_fixtures import POSTGRES_URL, FakeClock, node, require_postgres

#: Each node's possible inventories; variant 0 is loaded first. n4 starts absent.
VARIANTS: dict[str, tuple[NodeInventory, ...]] = {
    "n1": (
        node("n1", gpus=2, mig={1: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}, cpu=32000, mem=131072),
        node("n1", gpus=2, mig={1: ["3g.40gb", "3g.40gb"]}, cpu=32000, mem=131072),
        node("n1", gpus=2, cpu=32000, mem=131072),
    ),
    "n2": (
        node("n2", gpus=2, cpu=32000, mem=131072, labels={"zone": "b"}),
        node("n2", gpus=3, cpu=32000, mem=131072, labels={"zone": "b"}),
        node("n2", gpus=1, cpu=16000, mem=65536, labels={"zone": "b"}),
    ),
    "n3": (
        node("n3", gpus=1, model="T4", memory_mib=15360, cpu=8000, mem=32768),
        node("n3", gpus=2, model="T4", memory_mib=15360, cpu=8000, mem=32768),
    ),
    "n4": (node("n4", gpus=1, model="H100", cpu=16000, mem=65536, mig={0: ["7g.80gb"]}),),
}

SHAPES: tuple[dict[str, Any], ...] = (
    {"gpus": 1},
    {"gpus": 2},
    {"gpus": 3},
    {"gpus": 1, "gpu_models": ["T4"]},
    {"gpus": 1, "node_labels": {"zone": "b"}},
    {"gpus": 1, "gpu_memory_mib": 40960},
    {"gpu_milli": 250},
    {"gpu_milli": 500, "gpu_memory_mib": 20480},
    {"gpu_milli": 700, "gpu_models": ["T4"]},
    {"gpu_milli": 300, "gpu_memory_mib": 12288, "gpu_models": ["T4", "A100"]},
    {"mig_profile": "3g.40gb"},
    {"mig_profile": "2g.20gb"},
    {"mig_profile": "1g.10gb"},
    {"mig_profile": "7g.80gb"},
    {},
)

requests = st.builds(
    lambda shape, workload, priority, cpu: GpuRequest(
        **shape, workload_class=workload, priority=priority, cpu_milli=cpu, memory_mib=cpu * 2
    ),
    st.sampled_from(SHAPES),
    st.sampled_from(["training", "inference", "batch"]),
    st.sampled_from([0, 0, 1, 5]),
    st.sampled_from([1000, 4000, 12000]),
)


GRANTED = ReservationState.GRANTED
WAITING = ReservationState.WAITING


@dataclass(frozen=True)
class Tracked:
    """What the test knows of a reservation it made."""

    priority: int
    arrival: int
    ttl: int


def state_of(ledger: Ledger) -> tuple[Any, ...]:
    """Everything a call that raised must leave unchanged."""
    snap = ledger.snapshot()
    return (
        snap.cluster,
        snap.nodes,
        tuple((r.id, r.state, r.grant) for r in snap.grants),
        tuple((r.id, r.state, r.position) for r in snap.queue),
    )


class Database:
    """A fresh, empty ledger database per example: a new SQLite file or PostgreSQL schema."""

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.backend = backend
        self.tmp_path = tmp_path
        self.schema: str | None = None

    def new_url(self) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.tmp_path}/{uuid.uuid4().hex}.db"
        self.schema = f"gpupool_p_{uuid.uuid4().hex[:12]}"
        self._admin(f"CREATE SCHEMA {self.schema}")
        url = make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={self.schema}"})
        return url.render_as_string(hide_password=False)

    def drop(self) -> None:
        if self.schema is not None:
            self._admin(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            self.schema = None

    @staticmethod
    def _admin(sql: str) -> None:
        engine = create_engine(normalize_url(POSTGRES_URL))
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
        engine.dispose()


def run_ledger_machine(
    machine: type[RuleBasedStateMachine],
    backend: str,
    tmp_path: Path,
    *,
    examples: int,
    steps: int = 25,
    fixed: bool = False,
) -> None:
    """Run a ledger state machine, each example on a fresh database of ``backend``.

    :param machine: a state machine whose ``database`` attribute this sets
    :param backend: ``sqlite`` or ``postgresql`` (required in CI)
    :param examples: how many random sequences
    :param steps: how many calls each at most
    :param fixed: the same sequences every run, and the first failure reported as found (not
        shrunk): for runs that must fail, against a planted break
    """
    if backend == "postgresql":
        require_postgres()
    bound = type(f"{machine.__name__}_{backend}", (machine,), {"database": Database(backend, tmp_path)})
    run_state_machine_as_test(
        bound,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            derandomize=fixed,
            phases=[Phase.generate] if fixed else list(Phase),
        ),
    )


class ReservingMachine(RuleBasedStateMachine):
    """A ledger on a fake clock whose reservations are released, renewed and reaped at random.

    Subclasses reserve (through :meth:`_reserve`) and state their invariants.
    """

    database: Database
    #: The no-starvation bound: small, so budgets are spent and nodes held within a few steps.
    max_overtakes = 2
    #: More options of the ledger (a subclass's preemption timings).
    ledger_options: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.ledger = Ledger.create(
            self.database.new_url(),
            clock=self.clock,
            policy="bestfit",
            max_overtakes=self.max_overtakes,
            **self.ledger_options,
        )
        self.ids: list[str] = []

    def teardown(self) -> None:
        self.ledger.close()
        self.database.drop()

    def _reserve(self, request: GpuRequest, holder: str, ttl: int, timeout: int) -> Reservation:
        rid = f"r{len(self.ids) + 1:04d}"
        reservation = self.ledger.reserve(request, holder, ttl=ttl, timeout=timeout, reservation_id=rid)
        self.ids.append(rid)
        return reservation

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.ledger.release(data.draw(st.sampled_from(self.ids), label="release"))

    @precondition(lambda self: self.ids)
    @rule(data=st.data(), ttl=st.sampled_from([None, 45]))
    def renew(self, data: st.DataObject, ttl: int | None) -> None:
        try:
            self.ledger.renew(data.draw(st.sampled_from(self.ids), label="renew"), ttl=ttl)
        except LeaseExpiredError:
            pass

    @rule(seconds=st.sampled_from([10, 31, 46, 61, 601]))
    def advance_and_reap(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.ledger.reap()


class LedgerMachine(RuleBasedStateMachine):
    """Random ledger calls; after each, the ledger's invariants and its queue/grant views hold."""

    database: Database

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.url = self.database.new_url()
        self.ledger = Ledger.create(self.url, clock=self.clock, policy="bestfit", max_overtakes=2)
        self.reader = create_engine(normalize_url(self.url))
        self.tracked: dict[str, Tracked] = {}
        self.live: set[str] = set()
        self.arrivals = 0

    def teardown(self) -> None:
        self.ledger.close()
        self.reader.dispose()
        self.database.drop()

    # -- helpers ------------------------------------------------------------------------

    def expect_unchanged_on(self, errors: tuple[type[Exception], ...], call: Callable[[], Any]) -> Any:
        before = state_of(self.ledger)
        try:
            return call()
        except errors:
            assert state_of(self.ledger) == before, "a call that raised changed the ledger"
            return None

    def pick(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.tracked)), label="reservation")

    # -- rules --------------------------------------------------------------------------

    @initialize()
    def load_inventory(self) -> None:
        change = self.ledger.upsert_nodes([VARIANTS[n][0] for n in ("n1", "n2", "n3")])
        assert change.added == ("n1", "n2", "n3")

    @rule(
        batch=st.lists(requests, min_size=1, max_size=3),
        ttl=st.sampled_from([30, 600]),
        timeout=st.sampled_from([60, 900]),
    )
    def reserve(self, batch: list[GpuRequest], ttl: int, timeout: int) -> None:
        for request in batch:
            self.reserve_one(request, ttl, timeout)

    def reserve_one(self, request: GpuRequest, ttl: int, timeout: int) -> None:
        # Ids in arrival order: generation draws from them, so they must not be random.
        rid = f"r{self.arrivals + 1:05d}"
        reservation = self.expect_unchanged_on(
            (NoCapacityError,),
            lambda: self.ledger.reserve(request, "holder", ttl=ttl, timeout=timeout, reservation_id=rid),
        )
        if reservation is None:
            return
        assert reservation.id not in self.tracked
        assert reservation.state in (ReservationState.GRANTED, ReservationState.WAITING)
        assert (reservation.grant is not None) == (reservation.state is ReservationState.GRANTED)
        assert reservation.request == request
        self.arrivals += 1
        self.tracked[reservation.id] = Tracked(request.priority, self.arrivals, ttl)
        self.live.add(reservation.id)

    @precondition(lambda self: self.tracked)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        rid = self.pick(data)
        before = self.ledger.get(rid).state
        result = self.ledger.release(rid)
        after = self.ledger.get(rid).state
        if result.released:
            # The release transaction first expires what is due and serves the queue, which may
            # grant a request that waited: then the grant is what it releases.
            assert result.state is before or (before is WAITING and result.state is GRANTED)
            ended = {GRANTED: ReservationState.RELEASED, WAITING: ReservationState.CANCELLED}
            assert after is ended[result.state]
        elif before.ended:
            assert result.state is before is after
        else:  # the release transaction first expired it: the lease ran out, or the wait did
            assert (
                result.state
                is after
                is {GRANTED: ReservationState.EXPIRED, WAITING: ReservationState.TIMED_OUT}[before]
            )

    @precondition(lambda self: self.tracked)
    @rule(data=st.data(), ttl=st.sampled_from([None, 45]))
    def renew(self, data: st.DataObject, ttl: int | None) -> None:
        rid = self.pick(data)
        renewed = self.expect_unchanged_on((LeaseExpiredError,), lambda: self.ledger.renew(rid, ttl=ttl))
        if renewed is not None:
            assert renewed.state is ReservationState.GRANTED and renewed.grant is not None
            expected_ttl = ttl if ttl is not None else self.tracked[rid].ttl
            assert renewed.grant.expires_at == self.clock.now + expected_ttl

    @rule()
    def reap(self) -> None:
        result = self.ledger.reap()
        for rid in result.expired:
            assert self.ledger.get(rid).state is ReservationState.EXPIRED
        for rid in result.timed_out:
            assert self.ledger.get(rid).state is ReservationState.TIMED_OUT

    @rule(seconds=st.sampled_from([1, 10, 29, 31, 44, 59, 61, 601, 901]))
    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(data=st.data())
    def upsert(self, data: st.DataObject) -> None:
        names = data.draw(st.lists(st.sampled_from(sorted(VARIANTS)), min_size=1, max_size=2, unique=True))
        nodes = [data.draw(st.sampled_from(VARIANTS[n]), label=n) for n in names]
        self.expect_unchanged_on((InvalidInventoryError,), lambda: self.ledger.upsert_nodes(nodes))

    @rule(name=st.sampled_from(sorted(VARIANTS)))
    def remove_node(self, name: str) -> None:
        self.ledger.reap()  # any write first expires what is due, which may finish a drain
        present = name in {n.name for n in self.ledger.snapshot().nodes}
        outcome = self.ledger.remove_node(name)
        assert outcome in (("removed", "draining") if present else ("absent",))
        health = {n.name: n.health for n in self.ledger.snapshot().nodes}
        assert health.get(name) == (NodeHealth.DRAINING.value if outcome == "draining" else None)

    @rule(name=st.sampled_from(sorted(VARIANTS)), health=st.sampled_from(list(NodeHealth)))
    def set_health(self, name: str, health: NodeHealth) -> None:
        self.ledger.reap()  # any write first expires what is due, which may finish a drain
        present = name in {n.name for n in self.ledger.snapshot().nodes}
        before = state_of(self.ledger)
        try:
            self.ledger.set_health(name, health)
        except InvalidInventoryError as e:
            assert not present and e.field == "node" and e.value == name
            assert state_of(self.ledger) == before
            return
        assert present
        assert {n.name: n.health for n in self.ledger.snapshot().nodes}[name] == health.value

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def ledger_is_consistent(self) -> None:
        assert self.ledger.check_invariants() == []
        snap = self.ledger.snapshot()
        grant_ids = [r.id for r in snap.grants]
        queue_ids = [r.id for r in snap.queue]
        live = set(grant_ids) | set(queue_ids)
        assert len(live) == len(grant_ids) + len(queue_ids), "a reservation is both granted and waiting"
        assert live <= self.live, "an ended reservation came back, or an unknown one appeared"
        for rid in self.live - live:
            assert self.ledger.get(rid).state.ended
        self.live = live
        self.check_grants(snap)
        self.check_queue(snap)

    def check_grants(self, snap: Any) -> None:
        nodes = {n.name: n for n in snap.nodes}
        with self.reader.connect() as conn:
            slices = {
                (m.node, m.slice_id): (m.gpu_idx, m.profile, m.holder)
                for m in conn.execute(select(ledger_schema.mig_slices))
            }
        for r in snap.grants:
            g, request = r.grant, r.request
            assert r.state is ReservationState.GRANTED and r.position is None and g is not None
            assert g.node in nodes, f"grant {r.id} on a node that does not exist"
            gpus = {gpu["idx"]: gpu for gpu in nodes[g.node].gpus}
            assert set(g.gpu_indices) <= set(gpus), f"grant {r.id} on GPUs that do not exist"
            assert set(request.node_labels) <= set(nodes[g.node].labels.items())
            if request.gpu_models:
                assert {gpus[i]["model"] for i in g.gpu_indices} <= request.gpu_models
            if request.kind is GpuKind.MIG:
                assert len(g.gpu_indices) == 1 and gpus[g.gpu_indices[0]]["partitioned"]
                assert slices[(g.node, g.mig_slice)] == (g.gpu_indices[0], request.mig_profile, r.id)
                assert g.mig_profile == request.mig_profile
            else:
                assert g.mig_slice is None
                assert not any(gpus[i]["partitioned"] for i in g.gpu_indices)
                assert len(g.gpu_indices) == request.gpus
                milli = request.gpu_milli if request.kind is GpuKind.FRACTION else 1000
                assert all(g.milli_per_gpu == milli for _ in g.gpu_indices)

    def check_queue(self, snap: Any) -> None:
        for r in snap.queue:
            assert r.state is ReservationState.WAITING and r.grant is None
        assert [r.position for r in snap.queue] == list(range(1, len(snap.queue) + 1))
        ids = [r.id for r in snap.queue]
        order = sorted(ids, key=lambda rid: (-self.tracked[rid].priority, self.tracked[rid].arrival))
        assert ids == order, "queue is not in (priority desc, arrival) order"


@pytest.mark.parametrize(
    ("backend", "examples"),
    [
        pytest.param("sqlite", 20, id="sqlite"),
        pytest.param("postgresql", 10, id="postgresql", marks=pytest.mark.postgres),
    ],
)
def test_random_operation_sequences_keep_the_ledger_consistent(
    backend: str, examples: int, tmp_path: Path
) -> None:
    run_ledger_machine(LedgerMachine, backend, tmp_path, examples=examples)
