"""Gang reservations on real SQLite and PostgreSQL ledgers: all or nothing, one queue entry, one lease."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from airflow_gpupool.exceptions import InvalidGangError, LeaseExpiredError, NoCapacityError
from airflow_gpupool.ledger import Gang, Ledger, ReservationState
from airflow_gpupool.resources import GangSpec, GpuRequest
from tests.ledger_fixtures import FakeClock, node

GRANTED = ReservationState.GRANTED
WAITING = ReservationState.WAITING
ZONE = "topology.kubernetes.io/zone"


def gang_of(members: int, minimum: int | None = None, keys: tuple[str, ...] = (), **kw: object) -> GpuRequest:
    spec = GangSpec(members, members if minimum is None else minimum, keys)
    return GpuRequest(gpus=1, gang=spec, **kw)  # type: ignore[arg-type]


def per_node(gang: Gang) -> Counter[str]:
    return Counter(m.grant.node for m in gang.granted if m.grant is not None)


@pytest.fixture
def ledger(make_ledger: Callable[..., Ledger]) -> Ledger:
    return make_ledger()


def test_a_gang_is_granted_all_or_nothing_across_nodes(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])
    single = ledger.reserve(GpuRequest(gpus=1), "single", reservation_id="s1")
    waiting = ledger.reserve(gang_of(4), "trainer", reservation_id="g")

    assert waiting.state is WAITING and waiting.grant is None
    assert (waiting.gang_id, waiting.gang_index) == ("g", 0)
    gang = ledger.gang("g")
    assert gang.state is WAITING and [m.id for m in gang.members] == ["g"] and gang.granted == ()
    assert [r.id for r in ledger.snapshot().grants] == ["s1"]  # three GPUs are free, none taken
    assert ledger.check_invariants() == []

    ledger.release(single.id)

    gang = ledger.gang("g.2")  # a member's id finds its gang too
    assert gang.leader_id == "g" and gang.state is GRANTED
    assert [m.id for m in gang.members] == ["g", "g.1", "g.2", "g.3"]
    assert [m.gang_index for m in gang.members] == [0, 1, 2, 3]
    assert {m.gang_id for m in gang.members} == {"g"} and {m.holder for m in gang.members} == {"trainer"}
    assert per_node(gang) == {"n1": 2, "n2": 2}
    assert len({m.grant.granted_at for m in gang.granted if m.grant}) == 1  # one transaction
    assert gang.members[1].request == GpuRequest(gpus=1) and gang.members[0].request.gang == GangSpec(4, 4)
    assert ledger.check_invariants() == []


def test_a_gang_is_one_queue_entry_with_its_place(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(GpuRequest(gpus=2), "hog", reservation_id="hog")
    ledger.reserve(GpuRequest(gpus=1), "first", reservation_id="a")
    gang = ledger.reserve(gang_of(2), "trainer", reservation_id="g")
    ledger.reserve(GpuRequest(gpus=1), "last", reservation_id="b")

    assert gang.position == 2
    assert ledger.queue_positions() == {"a": 1, "g": 2, "b": 3}
    ledger.release("hog")  # two GPUs free: "a" takes one, the gang does not fit in the other, "b" backfills
    assert ledger.get("a").state is GRANTED and ledger.get("b").state is GRANTED
    assert ledger.queue_positions() == {"g": 1} and ledger.gang("g").granted == ()
    ledger.release("a")
    assert ledger.gang("g").state is WAITING  # one GPU free: still none of it
    ledger.release("b")
    assert len(ledger.gang("g").granted) == 2
    assert ledger.check_invariants() == []


def test_placement_prefers_fewer_nodes_then_one_topology_domain(ledger: Ledger) -> None:
    ledger.upsert_nodes(
        [
            node("a", gpus=2, labels={ZONE: "x"}),
            node("b", gpus=2, labels={ZONE: "y"}),
            node("c", gpus=2, labels={ZONE: "y"}),
            node("big", gpus=4),
        ]
    )
    ledger.reserve(gang_of(4, keys=(ZONE,)), "t", reservation_id="first")
    assert per_node(ledger.gang("first")) == {"big": 4}  # one node beats one zone on two

    ledger.reserve(gang_of(4, keys=(ZONE,)), "t", reservation_id="second")
    assert per_node(ledger.gang("second")) == {"b": 2, "c": 2}  # zone y, not a and b
    assert ledger.check_invariants() == []


def test_an_elastic_gang_is_admitted_at_its_minimum_and_grows_when_capacity_frees(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    ledger.reserve(GpuRequest(gpus=1), "other", reservation_id="o1")
    ledger.reserve(GpuRequest(gpus=1), "other", reservation_id="o2")
    admitted = ledger.reserve(gang_of(4, minimum=2), "elastic", reservation_id="e")

    assert admitted.state is GRANTED
    gang = ledger.gang("e")
    assert [m.state for m in gang.members] == [GRANTED, GRANTED, WAITING, WAITING]
    assert ledger.queue_positions() == {"e.2": 1, "e.3": 2}
    assert ledger.check_invariants() == []

    ledger.release("o1")
    assert [m.state for m in ledger.gang("e").members] == [GRANTED, GRANTED, GRANTED, WAITING]
    ledger.release("o2")
    gang = ledger.gang("e")
    assert len(gang.granted) == 4 and per_node(gang) == {"n1": 4}
    assert ledger.check_invariants() == []


def test_an_elastic_gang_takes_what_is_free_at_once(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=3)])
    ledger.reserve(gang_of(4, minimum=2), "elastic", reservation_id="e")
    assert [m.state for m in ledger.gang("e").members] == [GRANTED, GRANTED, GRANTED, WAITING]


def test_releasing_the_leader_ends_the_whole_gang_and_a_member_alone(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])
    ledger.reserve(GpuRequest(gpus=1), "other", reservation_id="other")  # leaves three GPUs
    ledger.reserve(gang_of(4, minimum=3), "t", reservation_id="g")
    assert [m.state for m in ledger.gang("g").members] == [GRANTED, GRANTED, GRANTED, WAITING]

    alone = ledger.release("g.2")
    assert alone.released and ledger.get("g.2").state is ReservationState.RELEASED
    assert ledger.get("g").state is GRANTED and ledger.get("g.1").state is GRANTED
    assert ledger.get("g.3").state is GRANTED  # the freed GPU goes to the gang's growth
    assert ledger.check_invariants() == []

    result = ledger.release("g")
    assert result.released and result.state is GRANTED
    states = [m.state for m in ledger.gang("g").members]
    assert states == [ReservationState.RELEASED] * 4
    assert [r.id for r in ledger.snapshot().grants] == ["other"]
    assert ledger.release("g").released is False
    assert ledger.check_invariants() == []


def test_releasing_a_gang_withdraws_its_growth(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(gang_of(4, minimum=2), "t", reservation_id="g")
    ledger.release("g")
    assert [m.state for m in ledger.gang("g").members] == [ReservationState.RELEASED] * 2 + [
        ReservationState.CANCELLED
    ] * 2
    assert ledger.queue_positions() == {}
    assert ledger.check_invariants() == []


def test_a_waiting_gang_times_out_naming_what_blocks_it(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])
    ledger.reserve(GpuRequest(gpus=2), "hog", reservation_id="hog", ttl=3600)
    ledger.reserve(gang_of(3), "t", reservation_id="g", timeout=60)
    explained = ledger.explain("g")
    assert "2 of the 3 members of gang of 3 × 1 GPU" in explained and "fit now" in explained
    assert "takes 2 of the gang's 3 members" in explained

    clock.advance(61)
    reaped = ledger.reap()

    assert reaped.timed_out == ("g",)
    timed_out = ledger.get("g")
    assert timed_out.state is ReservationState.TIMED_OUT and "2 of the 3 members" in timed_out.message
    assert [m.id for m in ledger.gang("g").members] == ["g"]
    assert ledger.check_invariants() == []


def test_renewing_or_adopting_renews_every_member(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])
    ledger.reserve(gang_of(4, minimum=3), "t", reservation_id="g", ttl=60)
    clock.advance(30)
    renewed = ledger.renew("g", ttl=100)
    assert renewed.grant is not None and renewed.grant.expires_at == clock.now + 100
    gang = ledger.gang("g")
    assert {m.grant.expires_at for m in gang.granted if m.grant} == {clock.now + 100}
    assert len(gang.granted) == 4

    clock.advance(10)
    adopted = ledger.adopt("g.1", "retry", ttl=50)  # any member: the gang's lease is one
    assert adopted.holder == "retry"
    gang = ledger.gang("g")
    assert {(m.holder, m.grant.expires_at) for m in gang.granted if m.grant} == {("retry", clock.now + 50)}
    ledger.release("g.3")
    with pytest.raises(LeaseExpiredError):
        ledger.renew("g.3")
    assert ledger.check_invariants() == []


def test_the_lease_of_a_gang_expires_whole(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=1)])
    ledger.reserve(gang_of(4, minimum=3), "t", reservation_id="g", ttl=60)
    clock.advance(61)
    reaped = ledger.reap()
    assert sorted(reaped.expired) == ["g", "g.1", "g.2"]
    states = [m.state for m in ledger.gang("g").members]
    assert states == [ReservationState.EXPIRED] * 3 + [ReservationState.CANCELLED]
    assert ledger.snapshot().grants == () and ledger.queue_positions() == {}
    assert ledger.check_invariants() == []


def test_a_bound_member_keeps_the_whole_gang_orphaned(ledger: Ledger, clock: FakeClock) -> None:
    ledger.upsert_nodes([node("n1", gpus=2)])
    ledger.reserve(gang_of(2), "t", reservation_id="g", ttl=60)
    bound = ledger.bind("g.1", namespace="ml", name="worker-1", uid="u1")
    assert bound.grant is not None and bound.grant.pod_name == "worker-1"
    clock.advance(61)
    reaped = ledger.reap()
    assert sorted(reaped.orphaned) == ["g", "g.1"] and reaped.expired == ()
    assert {m.state for m in ledger.gang("g").members} == {ReservationState.ORPHANED}
    assert ledger.check_invariants() == []
    renewed = ledger.renew("g")
    assert renewed.state is GRANTED
    assert {m.state for m in ledger.gang("g").members} == {GRANTED}


def test_bad_gangs_are_refused_and_nothing_is_written(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=1)])
    with pytest.raises(NoCapacityError) as never:
        ledger.reserve(gang_of(4), "t", reservation_id="too-big")
    assert "takes 2 of the gang's 4 members" in str(never.value)
    with pytest.raises(InvalidGangError):
        ledger.reserve(gang_of(12), "t", reservation_id="x" * 62)  # "x…x.11" would not fit 64
    single = ledger.reserve(GpuRequest(gpus=1), "t", reservation_id="single")
    with pytest.raises(InvalidGangError):
        ledger.gang(single.id)
    assert ledger.get_or_none("too-big") is None and ledger.queue_positions() == {}
    assert ledger.check_invariants() == []
