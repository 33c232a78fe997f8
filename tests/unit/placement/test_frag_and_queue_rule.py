"""Fragmentation arithmetic against hand-computed values; the queue rule against its definition."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from airflow_gpupool.placement import ClusterSnapshot, GpuState, NodeState, TypicalShape, typical_shapes
from airflow_gpupool.placement.frag import Fragmentation
from airflow_gpupool.placement.queue import QueueEntry, queue_order, serve
from airflow_gpupool.placement.table import NodeTable
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest


def _node(frees: tuple[int, ...], cpu_free: int = 32000) -> NodeState:
    return NodeState(
        "n",
        64000,
        1024,
        tuple(GpuState(i, "G2", 16000, free_milli=f) for i, f in enumerate(frees)),
        cpu_free=cpu_free,
    )


SHAPES = (
    TypicalShape(4000, 500, 1, frozenset(), 0.5),  # half a GPU
    TypicalShape(8000, 1000, 2, frozenset(), 0.25),  # two whole GPUs
    TypicalShape(2000, 0, 0, frozenset(), 0.25),  # CPU only: every free milli is a fragment
)

# (id, GPU free milli, CPU free, expected fragmentation)
FRAG_CASES = [
    ("empty", (1000, 1000), 32000, 0.25 * 2000),
    ("one-sliver", (300, 1000), 32000, 0.5 * 300 + 0.25 * 1300 + 0.25 * 1300),
    ("cpu-starved", (1000, 1000), 3000, 0.5 * 2000 + 0.25 * 2000 + 0.25 * 2000),
    ("full", (0, 0), 32000, 0.0),
]


@pytest.mark.parametrize(
    ("frees", "cpu", "expected"), [c[1:] for c in FRAG_CASES], ids=[c[0] for c in FRAG_CASES]
)
def test_node_fragmentation(frees, cpu, expected):
    table = NodeTable()
    table.sync(ClusterSnapshot((_node(frees, cpu),)))
    frag = Fragmentation(SHAPES)
    frag.refresh(table, None)
    assert frag.value[0] == pytest.approx(expected)


def test_fragmentation_after_placement_matches_a_rescan():
    table = NodeTable()
    table.sync(ClusterSnapshot((_node((1000, 700, 450, 0)),)))
    frag = Fragmentation(SHAPES)
    frag.refresh(table, None)
    for gpu, milli in [(0, 500), (1, 300), (2, 450), (1, 200)]:
        after = frag.after(table, np.array([0]), np.array([gpu]), milli, 0, 1000)[0]
        frees = list(table.gpu_free[0])
        frees[gpu] -= milli
        check = NodeTable()
        check.sync(ClusterSnapshot((_node(tuple(frees), 31000),)))
        fresh = Fragmentation(SHAPES)
        fresh.refresh(check, None)
        assert after == pytest.approx(fresh.value[0])


def test_typical_shapes_cover_and_normalize():
    keys = [(1000, 500, 1, frozenset())] * 6 + [(1000, 1000, 1, frozenset())] * 3 + [(0, 0, 0, frozenset())]
    shapes = typical_shapes(Counter(keys), 0.9)
    assert [(s.gpu_milli, round(s.weight, 3)) for s in shapes] == [(500, 0.667), (1000, 0.333)]


def _reference_serve(entries, try_place, max_overtakes):
    # The rule as first written: quadratic, but obviously the definition.
    granted, blocked, counts, barrier = [], [], {}, None
    for entry in queue_order(entries):
        b = next((b for b in blocked if counts[b.request_id] >= max_overtakes), None)
        if b is not None:
            barrier = b.request_id
            break
        a = try_place(entry)
        if a is None:
            blocked.append(entry)
            counts[entry.request_id] = entry.overtakes
            continue
        granted.append(entry.request_id)
        for b in blocked:
            counts[b.request_id] += 1
    initial = {b.request_id: b.overtakes for b in blocked}
    return granted, {r: n for r, n in counts.items() if n != initial[r]}, barrier


@pytest.mark.parametrize("seed", range(20))
def test_serve_matches_reference_rule(seed):
    rng = random.Random(seed)
    entries = [
        QueueEntry(
            f"r{k}", GpuRequest(gpus=rng.choice([1, 2, 4]), priority=rng.choice([0, 1])), k, rng.randint(0, 3)
        )
        for k in range(30)
    ]

    def placer():
        free = {"gpus": rng.randint(0, 20)}

        def place(entry, held):
            assert held == frozenset(), "nothing can be held when no node can be"
            if entry.request.gpus <= free["gpus"]:
                free["gpus"] -= entry.request.gpus
                return Assignment("n", (), 1000, 0)
            return None

        return place

    state = rng.getstate()
    out = serve(entries, placer(), 3, hold=lambda entry, held: None)
    rng.setstate(state)
    reference_placer = placer()
    granted, overtakes, barrier = _reference_serve(entries, lambda e: reference_placer(e, frozenset()), 3)
    assert [e.request_id for e, _ in out.granted] == granted
    assert out.overtakes == overtakes
    assert out.barrier == barrier


def test_spent_budget_holds_one_node_and_backfill_goes_on_elsewhere():
    # Two 2-GPU nodes, each half used; a 2-GPU request waits behind a stream of 1-GPU ones.
    free = {"a": 1, "b": 1}

    def place(entry, held):
        for name in ("a", "b"):
            if name not in held and free[name] >= entry.request.gpus:
                free[name] -= entry.request.gpus
                return Assignment(name, (), 1000, 0)
        return None

    big = QueueEntry("big", GpuRequest(gpus=2), 0, overtakes=2)
    smalls = [QueueEntry(f"s{k}", GpuRequest(gpus=1), k + 1) for k in range(3)]

    out = serve([big, *smalls], place, max_overtakes=2, hold=lambda entry, held: "a")

    assert out.holds == {"big": ("a",)}
    assert out.barrier is None
    assert [(e.request_id, a.node) for e, a in out.granted] == [("s0", "b")], (
        "backfill only off the held node"
    )
    assert free == {"a": 1, "b": 0}


def test_hold_node_picks_the_closest_node_that_could_ever_fit():
    from airflow_gpupool.placement.queue import hold_node

    def gpu_node(name, total, free_gpus, cpu=64000):
        gpus = tuple(GpuState(i, "A100", 81920, 1000 if i < free_gpus else 0) for i in range(total))
        return NodeState(name, cpu, 262144, gpus)

    current = [gpu_node("small", 2, 2), gpu_node("far", 8, 1), gpu_node("near", 8, 6)]
    empty = [gpu_node("small", 2, 2), gpu_node("far", 8, 8), gpu_node("near", 8, 8)]
    request = GpuRequest(gpus=8)

    assert hold_node(current, empty, request, frozenset()) == "near"
    assert hold_node(current, empty, request, frozenset({"near"})) == "far"
    assert hold_node(current, empty, request, frozenset({"near", "far"})) is None
