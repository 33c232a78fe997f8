"""Hand-on (a slice passed to the next step) and ``not_before`` in the queue rule, against their definitions."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpupool.placement.accounting import allocate, hand_on
from airflow_gpupool.placement.queue import QueueEntry, is_due, serve
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest


def node(gpus: int = 4, model: str = "A100") -> NodeState:
    return NodeState("n1", 64000, 262144, tuple(GpuState(i, model, 81920) for i in range(gpus)))


def whole(n: int, model: str | None = None) -> GpuRequest:
    return GpuRequest(cpu_milli=1000, memory_mib=1024, gpus=n, gpu_models=(model,) if model else ())


def fraction(milli: int) -> GpuRequest:
    return GpuRequest(cpu_milli=1000, memory_mib=1024, gpu_milli=milli)


def _granted(
    n: NodeState, request: GpuRequest, gpus: tuple[int, ...], milli: int
) -> tuple[NodeState, Assignment]:
    memory = 81920 if milli == 1000 else milli * 81920 // 1000
    assignment = Assignment("n1", gpus, milli, memory)
    return allocate(n, request, assignment), assignment


# (id, upstream request, its GPUs, milli per GPU, downstream request, GPUs the downstream may get or None)
HAND_ON_CASES = [
    ("one-of-four", whole(4), (0, 1, 2, 3), 1000, whole(1), {0, 1, 2, 3}),
    ("half-of-one", whole(1), (2,), 1000, fraction(500), {2}),
    ("the-same-shape", whole(2), (1, 3), 1000, whole(2), {1, 3}),
    ("bigger-than-the-slice", whole(1), (0,), 1000, whole(2), None),
    ("more-than-a-fractions-share", fraction(500), (0,), 500, fraction(700), None),
    ("a-whole-gpu-from-a-fraction", fraction(500), (0,), 500, whole(1), None),
    ("another-model", whole(2), (0, 1), 1000, whole(1, "H100"), None),
]


@pytest.mark.parametrize(
    ("up", "gpus", "milli", "down", "expected"),
    [c[1:] for c in HAND_ON_CASES],
    ids=[c[0] for c in HAND_ON_CASES],
)
def test_hand_on_takes_only_part_of_the_upstreams_slice(
    up: GpuRequest, gpus: tuple[int, ...], milli: int, down: GpuRequest, expected: set[int] | None
) -> None:
    taken, held = _granted(node(), up, gpus, milli)
    got = hand_on(taken, up, held, down, frozenset())
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.node == "n1"
        assert set(got.gpu_indices) <= expected
        assert len(got.gpu_indices) == max(1, down.gpus)


def test_hand_on_never_takes_the_free_share_beside_the_slice() -> None:
    # The upstream held half of GPU 0, the other half is free: a 700 downstream fits the GPU once
    # the upstream ends, but 200 of it would be capacity any waiting request could have had.
    up = fraction(500)
    taken, held = _granted(node(1), up, (0,), 500)
    assert hand_on(taken, up, held, fraction(700), frozenset()) is None
    assert hand_on(taken, up, held, fraction(500), frozenset()) is not None


def _entries() -> list[QueueEntry]:
    return [
        QueueEntry("ahead", whole(1), 0, not_before=100.0),
        QueueEntry("later", whole(1), 1),
    ]


def test_a_request_is_not_granted_before_not_before_and_keeps_its_place() -> None:
    tried: list[str] = []

    def place(entry: QueueEntry, held: frozenset[str]) -> Assignment:
        tried.append(entry.request_id)
        return Assignment("n1", (0,), 1000, 81920)

    early = serve(_entries(), place, 8, lambda e, h: None, now=50.0)
    assert [e.request_id for e, _ in early.granted] == ["later"]
    assert tried == ["later"]  # never even placed before it is due
    assert early.overtakes == {"ahead": 1}  # its wait counts for no-starvation
    tried.clear()
    due = serve(_entries(), place, 8, lambda e, h: None, now=100.0)
    assert [e.request_id for e, _ in due.granted] == ["ahead", "later"]  # its place was kept


def test_without_now_every_request_is_due_as_the_ledger_serves_today() -> None:
    granted = serve(_entries(), lambda e, h: Assignment("n1", (0,), 1000, 81920), 8, lambda e, h: None)
    assert [e.request_id for e, _ in granted.granted] == ["ahead", "later"]
    assert is_due(_entries()[0], None)


def test_a_request_not_yet_due_may_hold_a_node_to_drain_it() -> None:
    spent = replace(_entries()[0], overtakes=8)
    outcome = serve([spent, _entries()[1]], lambda e, h: None, 8, lambda e, h: "n1", now=0.0)
    assert outcome.holds == {"ahead": ("n1",)}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=1, max_size=12),
    st.floats(0, 100),
    st.integers(0, 12),
)
def test_no_request_is_ever_granted_before_its_not_before(
    not_befores: list[float | None], now: float, room: int
) -> None:
    # Planted break (checked once): serve without its is_due check fails this on the first example
    # with a not_before after now.
    entries = [QueueEntry(str(i), whole(1), i, not_before=nb) for i, nb in enumerate(not_befores)]
    left = [room]

    def place(entry: QueueEntry, held: frozenset[str]) -> Assignment | None:
        if left[0] <= 0:
            return None
        left[0] -= 1
        return Assignment("n1", (0,), 1000, 81920)

    outcome = serve(entries, place, 3, lambda e, h: "n1", now=now)
    assert all(e.not_before is None or e.not_before <= now for e, _ in outcome.granted)
    due = [e for e in entries if is_due(e, now)]
    assert len(outcome.granted) == min(room, len(due)) or outcome.barrier is not None
