"""Random gangs, singles, releases and lease expiry: no gang ever holds part of its minimum.

A hypothesis state machine on SQLite and PostgreSQL reserves fixed and elastic gangs beside
single requests, releases leaders, members and singles, renews, binds, advances the clock and
reaps. After every step: the ledger's invariants hold (:meth:`Ledger.check_invariants`, gang
rules included), and every gang either holds nothing or holds at least its ``min_members``,
all granted in one transaction, unless the test itself released some of its members.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
)

from airflow_gpupool.resources import GangSpec, GpuRequest
from tests.integration.ledger.test_ledger_properties import ReservingMachine, run_ledger_machine
from tests.ledger_fixtures import node

ZONE = "topology.kubernetes.io/zone"
NODES = (
    node("n1", gpus=2, labels={ZONE: "a"}),
    node("n2", gpus=2, labels={ZONE: "a"}),
    node("n3", gpus=2, labels={ZONE: "b"}),
    node("n4", gpus=1, cpu=8000),
)
SHAPES = ({"gpus": 1}, {"gpu_milli": 500}, {"gpus": 2})
singles = st.builds(
    lambda shape, priority: GpuRequest(**shape, priority=priority),
    st.sampled_from(SHAPES),
    st.sampled_from([0, 0, 1]),
)
gangs = st.builds(
    lambda shape, size, minimum, keys, priority: GpuRequest(
        **shape, priority=priority, gang=GangSpec(size, min(minimum, size), keys)
    ),
    st.sampled_from(SHAPES[:2]),
    st.integers(2, 4),
    st.integers(1, 4),
    st.sampled_from([(), (ZONE,)]),
    st.sampled_from([0, 1]),
)


class GangMachine(ReservingMachine):
    """Gangs beside singles; after each call, no gang holds fewer than its minimum by the pool's doing."""

    def __init__(self) -> None:
        super().__init__()
        self.gangs: dict[str, GangSpec] = {}
        # Gangs whose members the test released one by one: those may hold fewer than their minimum.
        self.shrunk: set[str] = set()

    @initialize()
    def load_inventory(self) -> None:
        self.ledger.upsert_nodes(NODES)

    @rule(request=singles, ttl=st.sampled_from([30, 600]), timeout=st.sampled_from([60, 900]))
    def reserve_single(self, request: GpuRequest, ttl: int, timeout: int) -> None:
        self._reserve(request, "h", ttl, timeout)  # every shape fits the empty inventory: none refused

    @rule(request=gangs, ttl=st.sampled_from([30, 600]), timeout=st.sampled_from([60, 900]))
    def reserve_gang(self, request: GpuRequest, ttl: int, timeout: int) -> None:
        reservation = self._reserve(request, "h", ttl, timeout)  # a gang's minimum fits too
        assert request.gang is not None
        self.gangs[reservation.id] = request.gang
        assert (reservation.gang_id, reservation.gang_index) == (reservation.id, 0)

    @precondition(lambda self: self.gangs)
    @rule(data=st.data())
    def release_member(self, data: st.DataObject) -> None:
        leader = data.draw(st.sampled_from(sorted(self.gangs)), label="gang")
        members = self.ledger.gang(leader).members[1:]
        if members:
            member = data.draw(st.sampled_from(members), label="member")
            if self.ledger.release(member.id).released:
                self.shrunk.add(leader)

    @precondition(lambda self: self.gangs)
    @rule(data=st.data())
    def bind_member(self, data: st.DataObject) -> None:
        leader = data.draw(st.sampled_from(sorted(self.gangs)), label="gang")
        holding = self.ledger.gang(leader).granted
        if holding:
            member = data.draw(st.sampled_from(holding), label="bind")
            self.ledger.bind(member.id, namespace="ml", name=f"pod-{member.id}", uid=f"uid-{member.id}")

    @invariant()
    def no_gang_holds_part_of_its_minimum(self) -> None:
        assert self.ledger.check_invariants() == []
        for leader, spec in self.gangs.items():
            gang = self.ledger.gang(leader)
            assert gang.spec == spec
            if gang.members[0].grant is None:  # waiting, or ended before it was ever granted
                assert [m.id for m in gang.members] == [leader], "a member exists while its gang waits"
                continue
            core = gang.members[: spec.min_members]
            assert len(core) == spec.min_members, "a gang was granted fewer members than its minimum"
            assert len({m.grant.granted_at for m in core if m.grant}) == 1, "its minimum came in two grants"
            holding = gang.granted
            if holding and leader not in self.shrunk:
                assert len(holding) >= spec.min_members, (
                    f"gang {leader} holds {len(holding)} of {spec.min_members}"
                )
            if not holding:
                assert all(m.state.ended for m in gang.members), "growth outlived its gang"


@pytest.mark.parametrize(
    ("backend", "examples"),
    [
        pytest.param("sqlite", 60, id="sqlite"),
        pytest.param("postgresql", 25, id="postgresql", marks=pytest.mark.postgres),
    ],
)
def test_gangs_never_hold_part_of_their_minimum(backend: str, examples: int, tmp_path: Path) -> None:
    run_ledger_machine(GangMachine, backend, tmp_path, examples=examples)
