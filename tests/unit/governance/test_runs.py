"""The peak concurrent GPU need of a DAG run: hand-made DAGs, and a property against brute force."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.governance import runs
from airflow_gpupool.governance.quotas import Flavor, parse_quota_file
from airflow_gpupool.governance.runs import RunNeed, ordered_pairs, peak_need, quota_ceiling_milli

CASES = {
    # name: (milli per GPU step, edges, expected peak, expected steps)
    "chain": ({"a": 1000, "b": 4000, "c": 1000}, [("a", "b"), ("b", "c")], 4000, ("b",)),
    "fan-out": (
        {"prep": 1000, "t1": 2000, "t2": 2000, "eval": 1000},
        [("prep", "t1"), ("prep", "t2"), ("t1", "eval"), ("t2", "eval")],
        4000,
        ("t1", "t2"),
    ),
    # The path a -> cpu -> b orders a before b although cpu needs no GPU.
    "through a CPU task": ({"a": 2000, "b": 3000}, [("a", "cpu"), ("cpu", "b")], 3000, ("b",)),
    "independent": ({"a": 500, "b": 250, "c": 1000}, [], 1750, ("a", "b", "c")),
    # Two chains a1->a2, b1->b2: the heaviest antichain crosses them (a2 with b1).
    "crossing chains": (
        {"a1": 1000, "a2": 3000, "b1": 2500, "b2": 1000},
        [("a1", "a2"), ("b1", "b2")],
        5500,
        ("a2", "b1"),
    ),
    # A MIG 3g.40gb slice counts 429 milli; a heavy single step beats two light parallel ones.
    "one heavy beats two light": (
        {"big": 8000, "x": 429, "y": 500},
        [("x", "big"), ("y", "big")],
        8000,
        ("big",),
    ),
    "no GPU step": ({"cpu": 0}, [], 0, ()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_peak_of_hand_made_dags(name: str) -> None:
    milli, edges, peak, steps = CASES[name]
    down: dict[str, list[str]] = {}
    for a, b in edges:
        down.setdefault(a, []).append(b)
    need = peak_need("dag/run", milli, down)
    assert (need.peak_milli, need.steps, need.exact) == (peak, steps, True)


def test_past_the_limit_the_need_is_the_sum_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "EXACT_STEPS_LIMIT", 2)
    need = peak_need("k", {"a": 1000, "b": 1000, "c": 1000}, {"a": ["b"], "b": ["c"]})
    assert (need.peak_milli, need.exact) == (3000, False)
    assert need.describe() == "at most 3 GPUs at once (a, b, c)"


def test_a_bad_need_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequestError) as e:
        RunNeed("", 1000)
    assert e.value.field == "run_need.key"
    with pytest.raises(InvalidRequestError) as e:
        RunNeed("k", -1)
    assert e.value.field == "run_need.peak_milli"


def _brute_force(milli: dict[str, int], before: set[tuple[str, str]]) -> int:
    steps = sorted(milli)
    best = 0
    for size in range(1, len(steps) + 1):
        for group in combinations(steps, size):
            if all((a, b) not in before and (b, a) not in before for a, b in combinations(group, 2)):
                best = max(best, sum(milli[s] for s in group))
    return best


@st.composite
def _dags(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, list[str]]]:
    n = draw(st.integers(1, 9))
    names = [f"t{i}" for i in range(n)]
    # Edges only from a lower index to a higher one: acyclic by construction.
    edges = draw(
        st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] < e[1]))
    )
    weights = st.sampled_from([0, 143, 250, 429, 500, 1000, 2000, 4000, 8000])
    milli = {name: draw(weights) for name in names}
    down: dict[str, list[str]] = {}
    for a, b in edges:
        down.setdefault(names[a], []).append(names[b])
    return milli, down


@settings(max_examples=400, deadline=None)
@given(_dags())
def test_peak_is_the_heaviest_antichain(dag: tuple[dict[str, int], dict[str, list[str]]]) -> None:
    milli, down = dag
    need = peak_need("k", milli, down)
    gpu = {s: m for s, m in milli.items() if m > 0}
    before = ordered_pairs(gpu, down)
    assert need.peak_milli == _brute_force(gpu, before)
    # The steps named are an antichain and make up the peak.
    assert sum(milli[s] for s in need.steps) == need.peak_milli
    assert not any((a, b) in before or (b, a) in before for a, b in combinations(need.steps, 2))


CEILINGS = {
    # name: (quota file teams, team, expected ceiling in milli-GPU on pool a100; None: not governed)
    "nominal, no cohort": (
        [{"name": "v", "quotas": [{"flavor": {"pool": "a100"}, "nominal": 3}]}],
        "v",
        3000,
    ),
    "borrows what the cohort lends, at most its limit": (
        [
            {
                "name": "v",
                "cohort": "lab",
                "quotas": [{"flavor": {"pool": "a100"}, "nominal": 2, "borrowing_limit": 1}],
            },
            {"name": "n", "cohort": "lab", "quotas": [{"flavor": {"pool": "a100"}, "nominal": 4}]},
        ],
        "v",
        3000,
    ),
    "a lending limit keeps the lender's floor": (
        [
            {"name": "v", "cohort": "lab", "quotas": [{"flavor": {"pool": "a100"}, "nominal": 2}]},
            {
                "name": "n",
                "cohort": "lab",
                "quotas": [{"flavor": {"pool": "a100"}, "nominal": 4, "lending_limit": 1.5}],
            },
        ],
        "v",
        3500,
    ),
    "a team with no quota is not governed": (
        [{"name": "v", "quotas": [{"flavor": {"pool": "a100"}, "nominal": 3}]}],
        "other",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(CEILINGS))
def test_quota_ceiling(name: str) -> None:
    teams, team, expected = CEILINGS[name]
    plan = parse_quota_file({"teams": teams})
    assert quota_ceiling_milli(plan, team, [Flavor("pool", "a100"), Flavor("model", "A100")]) == expected
