"""The interleaved bench's turns: both runs warm up unmeasured, then share time in A B B A order."""

from __future__ import annotations

import itertools

from airflow_gpupool.bench.phases import phases


def test_one_run_is_one_measured_phase() -> None:
    assert list(phases(1)) == [(0, True)]


def test_two_runs_warm_up_unmeasured_then_alternate_a_b_b_a() -> None:
    turns = list(itertools.islice(phases(2), 10))
    assert turns[:2] == [(0, False), (1, False)]
    assert [turn for turn, measured in turns[2:]] == [0, 1, 1, 0, 0, 1, 1, 0]
    assert all(measured for _, measured in turns[2:])
