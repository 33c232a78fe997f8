"""Equivalence classes kept up to date as node states change, against a scan from scratch."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpupool.ledger.queue.equivalence import EquivalenceIndex, node_signature
from airflow_gpupool.placement.snapshot import GpuState, NodeState

NAMES = [f"n{i}" for i in range(6)]


def state(name: str, free_milli: int, cpu_free: int) -> NodeState:
    gpu = GpuState(index=0, model="A100", memory_mib=81920, free_milli=free_milli, free_memory_mib=81920)
    return NodeState(name, 64000, 262144, (gpu,), cpu_free=cpu_free)


def from_scratch(nodes: dict[str, NodeState], skipped: set[str]) -> list[str]:
    """The first node of each class in inventory order, leaving out skipped ones."""
    seen, out = set(), []
    for node in nodes.values():
        signature = node_signature(node)
        if node.name not in skipped and signature not in seen:
            seen.add(signature)
            out.append(node.name)
    return out


changes = st.lists(
    st.tuples(
        st.sampled_from(NAMES),
        st.sampled_from([0, 250, 1000]),
        st.sampled_from([16000, 64000]),
        st.sets(st.sampled_from(NAMES), max_size=2),
        st.booleans(),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(changes)
def test_representatives_match_a_scan_from_scratch(steps: list[tuple[str, int, int, set[str], bool]]) -> None:
    nodes = {name: state(name, 1000, 64000) for name in NAMES}
    index = EquivalenceIndex()
    assert [n.name for n in index.representatives(nodes).nodes] == from_scratch(nodes, set())
    for name, milli, cpu, skipped, tell_changed in steps:
        nodes[name] = state(name, milli, cpu)
        got = index.representatives(nodes, frozenset(skipped), {name} if tell_changed else None)
        expected = from_scratch(nodes, skipped)
        # Within a class, a skipped first member gives way to the next one in inventory order.
        assert [n.name for n in got.nodes] == expected
        assert all(got_node is nodes[got_node.name] for got_node in got.nodes)


def test_members_that_come_and_go_do_not_pile_up() -> None:
    nodes = {name: state(name, 1000, 64000) for name in NAMES}
    index = EquivalenceIndex()
    for step in range(5000):
        name = NAMES[-1 - step % 2]  # members deep in the heap, not at its top
        nodes[name] = state(name, 250 if step % 4 < 2 else 1000, 64000)
        index.representatives(nodes, changed={name})
    assert max(len(heap) for heap in index._members.values()) <= 2 * len(NAMES) + 64


def test_a_node_that_leaves_the_inventory_leaves_its_class() -> None:
    nodes = {name: state(name, 1000, 64000) for name in NAMES}
    index = EquivalenceIndex()
    index.representatives(nodes)
    del nodes["n0"]
    smaller = dict(nodes)
    assert [n.name for n in index.representatives(smaller).nodes] == ["n1"]
