"""Which steps share a run's admission, and the peak an entry step reserves with (from real DAG objects)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, TaskGroup

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.operators import GpuJobOperator, GpuPodOperator
from airflow_gpupool.operators.steps.run_admission import run_need

log = logging.getLogger("test")


@dataclass
class _Ti:
    dag_id: str
    task_id: str
    run_id: str = "manual__1"
    map_index: int = -1
    try_number: int = 1


def need(task: Any) -> Any:
    return run_need(task, {"ti": _Ti(task.dag_id, task.task_id)}, log)


def step(task_id: str, **kwargs: Any) -> GpuPodOperator:
    return GpuPodOperator(task_id=task_id, image="train:1", **kwargs)


def dag(**default_args: Any) -> DAG:
    return DAG("pipe", schedule=None, start_date=datetime(2026, 1, 1), default_args=default_args)


def test_the_entry_step_reserves_with_the_peak_and_the_later_ones_alone() -> None:
    with dag(gpu_admission="run"):
        prep = step("prep", gpus=1)
        split = EmptyOperator(task_id="split")
        train = [
            step("train_a", gpus=2),
            step("train_b", gpu_milli=500),
            step("train_c", mig_profile="3g.40gb"),
        ]
        evaluate = step("evaluate", gpus=1)
        prep >> split >> train >> evaluate
    got = need(prep)
    # 2 + 0.5 + a 3g.40gb slice's 3/7 (429 milli): the three trainings at once.
    assert (got.key, got.peak_milli, got.steps, got.exact) == (
        "pipe/manual__1",
        2929,
        ("train_a", "train_b", "train_c"),
        True,
    )
    assert [need(t) for t in (*train, evaluate)] == [None] * 4


def test_a_gang_counts_all_its_members() -> None:
    with dag(gpu_admission="run"):
        prep = step("prep", gpus=1)
        job = GpuJobOperator(task_id="ddp", members=3, gpus=2, image="train:1")
        prep >> job
    assert need(prep).peak_milli == 6000


def test_steps_admitted_per_task_are_none_of_the_run() -> None:
    with dag():
        a = step("a", gpus=1, gpu_admission="run")
        b = step("b", gpus=4)  # per task: not counted, and no path orders it
    assert (need(a).peak_milli, need(a).steps) == (1000, ("a",))
    assert need(b) is None


def test_a_task_group_is_its_own_scope() -> None:
    with dag():
        outside = step("outside", gpus=8)
        with TaskGroup("tune", default_args={"gpu_admission": "run"}):
            first = step("first", gpus=1)
            sweep = [step(f"trial_{i}", gpus=1) for i in range(3)]
            first >> sweep
        outside >> first
    got = need(first)
    assert (got.key, got.peak_milli) == ("pipe/manual__1/tune", 3000)
    assert need(outside) is None


def test_a_templated_request_turns_run_admission_off_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    with dag(gpu_admission="run"):
        prep = step("prep", gpus=1)
        train = step("train", gpus="{{ params.gpus }}")
        prep >> train
    with caplog.at_level(logging.WARNING, logger="test"):
        assert need(prep) is None
    assert "step train: its request is templated" in caplog.text


def test_a_mapped_gpu_step_turns_run_admission_off(caplog: pytest.LogCaptureFixture) -> None:
    with dag(gpu_admission="run"):
        prep = step("prep", gpus=1)
        trials = GpuPodOperator.partial(task_id="trial", image="train:1", gpus=1).expand(
            arguments=[["1"], ["2"]]
        )
        prep >> trials
    with caplog.at_level(logging.WARNING, logger="test"):
        assert need(prep) is None
    assert "step trial: it is mapped" in caplog.text


@pytest.mark.parametrize("bad", ["dag", "", None, 1])
def test_a_bad_gpu_admission_fails_at_parse_time(bad: Any) -> None:
    with pytest.raises(InvalidRequestError) as e:
        step("x", gpus=1, gpu_admission=bad)
    assert e.value.field == "gpu_admission"
    with pytest.raises(InvalidRequestError):
        GpuJobOperator(task_id="j", members=2, gpus=1, image="train:1", gpu_admission=bad)


def test_task_gpu_pod_takes_it_from_default_args() -> None:
    from airflow.sdk import task

    @task.gpu_pod(image="train:1", gpus=2)
    def train() -> None: ...

    @task.gpu_pod(image="train:1", gpus=1)
    def prep() -> None: ...

    with dag(gpu_admission="run"):
        first = prep()
        first >> train()
    assert need(first.operator).peak_milli == 2000
