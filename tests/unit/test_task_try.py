"""TaskTry: the task try's identity and the strings the ledger keeps it under (pinned: stored data uses them)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from airflow_gpupool.task_try import TaskTry, parse_holder

RUN = "manual__2027-01-15T10:00:00+00:00"
MAPPED = TaskTry("retrain", "train", RUN, 3, 2, "worker-1")


def test_encodings_are_the_stored_strings() -> None:
    assert MAPPED.reservation_id == "gp-1f4e33d69d5927e2946a6753f50aa8c2"
    assert MAPPED.holder == f"retrain/train/{RUN}/map-3/try-2@worker-1"
    assert MAPPED.task_key == f"retrain/train/{RUN}/map-3"
    unmapped = TaskTry("retrain", "train", RUN)
    assert unmapped.reservation_id == "gp-176fb2af42ff33536cde5381930ffde3"
    assert unmapped.task_key == f"retrain/train/{RUN}/map--1"


def test_the_host_and_try_are_not_part_of_the_task_key() -> None:
    other = TaskTry("retrain", "train", RUN, 3, 3, "worker-2")
    assert other.task_key == MAPPED.task_key
    assert other.reservation_id != MAPPED.reservation_id
    assert TaskTry("retrain", "train", RUN, 3, 2, "elsewhere").reservation_id == MAPPED.reservation_id


def test_long_holders_and_keys_are_cut_to_the_column_width() -> None:
    long = TaskTry("d" * 300, "t" * 300, RUN)
    assert len(long.holder) == len(long.task_key) == 512


@pytest.mark.parametrize(
    "task",
    [
        pytest.param(MAPPED, id="mapped"),
        pytest.param(TaskTry("d", "t", "run/with/slash", -1, 1, "h"), id="slash-in-run-id"),
        pytest.param(TaskTry("d", "t", "r", 0, 4, ""), id="no-host"),
    ],
)
def test_the_holder_parses_back(task: TaskTry) -> None:
    assert TaskTry.from_holder(task.holder) == task
    assert parse_holder(task.holder) == task


@pytest.mark.parametrize(
    "holder",
    ["adhoc-notebook@laptop", "d/t/run/map-x/try-1@h", "d/t/run/map-1/try-y@h", "/t/run/map-1/try-1@h"],
)
def test_other_holders_are_no_task_try(holder: str) -> None:
    assert TaskTry.from_holder(holder) is None


def test_from_context_reads_the_task_instance() -> None:
    ti = SimpleNamespace(dag_id="retrain", task_id="train", run_id=RUN, map_index=3, try_number=2)
    assert TaskTry.from_context({"ti": ti}, host="worker-1") == MAPPED
    unmapped = SimpleNamespace(dag_id="retrain", task_id="train", run_id=RUN, try_number=1)
    assert TaskTry.from_context({"ti": unmapped}).map_index == -1


def test_importing_it_imports_no_airflow() -> None:
    code = "import sys, airflow_gpupool.task_try; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "'airflow'" not in loaded
