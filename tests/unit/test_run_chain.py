"""A DAG run's GPU steps as one chain, from hand-made history rows: order, gaps and the hand-on markers."""

from __future__ import annotations

import pytest

from airflow_gpupool.ledger import HistoryEntry
from airflow_gpupool.run_chain import RunChain, StepMarks, run_chain, step_marks
from airflow_gpupool.task_try import TaskTry

T = 1_800_000_000.0


def step(
    task: str,
    created: float,
    granted: float | None = None,
    ended: float | None = None,
    *,
    try_number: int = 1,
    map_index: int = -1,
    message: str = "",
    not_before: float | None = None,
    run_id: str = "manual__1",
    dag_id: str = "pipe",
    gpus: tuple[int, ...] = (0,),
) -> HistoryEntry:
    """Build a history row of try ``try_number`` of ``task``, times in seconds from ``T``."""
    ref = TaskTry(dag_id, task, run_id, map_index, try_number, "w1")
    state = (
        "waiting" if granted is None and ended is None else ("released" if ended is not None else "granted")
    )
    now = T + 10_000
    waited_until = T + (granted if granted is not None else (ended if ended is not None else now - T))
    return HistoryEntry(
        id=ref.reservation_id,
        holder=ref.holder,
        team="vision",
        state=state,
        requested="1 GPU",
        gpu_milli=1000,
        created_at=T + created,
        granted_at=None if granted is None else T + granted,
        ended_at=None if ended is None else T + ended,
        waited=waited_until - (T + created),
        held=None if granted is None else (T + (ended if ended is not None else now - T)) - (T + granted),
        node="a1" if granted is not None else None,
        pool="train" if granted is not None else None,
        dag_id=dag_id,
        task_id=task,
        run_id=run_id,
        map_index=map_index,
        try_number=try_number,
        failure_class=None,
        message=message,
        gpu_indices=gpus if granted is not None else (),
        not_before=None if not_before is None else T + not_before,
    )


def chain_of(*rows: HistoryEntry, now: float = 10_000) -> RunChain:
    return run_chain(list(rows), "pipe", "manual__1", T + now)


@pytest.mark.parametrize(
    ("message", "marks"),
    [
        pytest.param("", StepMarks(), id="nothing"),
        pytest.param("released by holder", StepMarks(), id="a plain release"),
        pytest.param("handed on to evaluate", StepMarks(handed_on_to="evaluate"), id="to a task"),
        pytest.param(
            "handed on to evaluate; released the rest (3 GPUs)",
            StepMarks(handed_on_to="evaluate"),
            id="to, then the rest released",
        ),
        pytest.param(
            "Handed on to gp-0123abcd.", StepMarks(handed_on_to="gp-0123abcd"), id="an id, a full stop"
        ),
        pytest.param(
            "adopted: handed on from train (1 GPU)",
            StepMarks(handed_on_from="train"),
            id="from, in brackets after",
        ),
        pytest.param("admitted as a run: peak 5 GPUs fits", StepMarks(admitted_as_run=True), id="admitted"),
        pytest.param("handed onto x", StepMarks(), id="not the phrase"),
    ],
)
def test_step_marks_reads_the_phrases_it_keys_on(message: str, marks: StepMarks) -> None:
    assert step_marks(message) == marks


def test_steps_come_in_the_order_they_asked_with_the_gaps_between() -> None:
    chain = chain_of(
        step("evaluate", created=700, granted=760, ended=900),
        step("preprocess", created=0, granted=0, ended=100),
        step("train", created=100, granted=400, ended=700),
    )
    assert [s.task for s in chain.steps] == ["preprocess", "train", "evaluate"]
    assert [s.gap_before for s in chain.steps] == [None, 300.0, 60.0]
    assert [s.waited for s in chain.steps] == [0.0, 300.0, 60.0]
    assert chain.gap_seconds == 360.0 and chain.span == 900.0
    assert [(s.node, s.gpus, s.state) for s in chain.steps] == [("a1", "GPU 0", "released")] * 3
    assert not any(s.queued_ahead or s.handed_on_from or s.handed_on_to for s in chain.steps)


def test_the_ending_steps_release_reason_marks_both_sides_of_a_hand_on() -> None:
    chain = chain_of(
        step("train", created=0, granted=0, ended=600, message="handed on to evaluate"),
        step("evaluate", created=600, granted=600),
        step("export", created=601),
    )
    train, evaluate, export = chain.steps
    assert (train.handed_on_to, train.handed_on_from) == ("evaluate", None)
    assert (evaluate.handed_on_from, evaluate.handed_on_to) == ("train", None)
    assert evaluate.gap_before == 0.0 and export.handed_on_from is None
    assert chain.handed_on == 1


def test_the_adopting_steps_message_alone_marks_the_hand_on_too() -> None:
    upstream = TaskTry("pipe", "train", "manual__1", -1, 2, "w1")
    chain = chain_of(
        step("train", created=0, granted=0, ended=50, message="pod failed"),
        step("train", created=60, granted=60, ended=600, try_number=2),
        step("evaluate", created=600, granted=600, message=f"handed on from {upstream.reservation_id}"),
    )
    assert [s.handed_on_to for s in chain.steps] == [None, "evaluate", None]
    assert chain.steps[2].handed_on_from == "train"  # the named try, read back as its task


def test_a_hand_on_to_a_mapped_step_and_to_no_step_of_the_run() -> None:
    chain = chain_of(
        step("train", created=0, granted=0, ended=100, message="handed on to score [1]"),
        step("score", created=100, granted=100, map_index=0),
        step("score", created=100, granted=100, map_index=1),
        step("tune", created=200, granted=200, ended=300, message="handed on to elsewhere"),
    )
    assert [s.task for s in chain.steps] == ["train", "score [0]", "score [1]", "tune"]
    assert [s.handed_on_from for s in chain.steps] == [None, None, "train", None]
    # A name no step of the run answers to is shown as the message gave it.
    assert chain.steps[3].handed_on_to == "elsewhere"


def test_a_step_queued_ahead_and_a_step_granted_before_the_previous_ended() -> None:
    chain = chain_of(
        step("train", created=0, granted=0),
        step("evaluate", created=500, not_before=900),
        step("side", created=10, granted=20),
        now=600,
    )
    train, side, evaluate = chain.steps
    assert evaluate.queued_ahead and evaluate.not_before == T + 900 and evaluate.state == "waiting"
    assert not train.queued_ahead and not side.queued_ahead
    # Nothing ended yet: no gap anywhere, and the run spans to now.
    assert [s.gap_before for s in chain.steps] == [None, None, None]
    assert chain.span == 600.0


def test_rows_of_other_runs_are_left_out_and_an_empty_run_has_no_steps() -> None:
    chain = chain_of(
        step("train", created=0, granted=0),
        step("train", created=0, granted=0, run_id="x/manual__1"),
        step("train", created=0, granted=0, dag_id="other"),
    )
    assert len(chain.steps) == 1
    empty = run_chain([], "pipe", "manual__1", T)
    assert empty.steps == () and empty.span == 0.0 and empty.gap_seconds == 0.0


def test_admission_as_a_run_and_the_json_form() -> None:
    chain = chain_of(
        step("train", created=0, granted=30, ended=100, message="admitted as a run; handed on to evaluate"),
        step("evaluate", created=100, granted=100, ended=160),
    )
    data = chain.to_dict()
    assert data["admitted_as_run"] is True and data["handed_on"] == 1
    assert [s["task"] for s in data["steps"]] == ["train", "evaluate"]
    assert data["steps"][1] | {"reservation_id": "", "created_at": 0} == {
        "reservation_id": "",
        "task": "evaluate",
        "task_id": "evaluate",
        "map_index": -1,
        "try_number": 1,
        "state": "released",
        "requested": "1 GPU",
        "node": "a1",
        "gpus": "GPU 0",
        "created_at": 0,
        "granted_at": T + 100,
        "ended_at": T + 160,
        "waited": 0.0,
        "held": 60.0,
        "gap_before": 0.0,
        "queued_ahead": False,
        "not_before": None,
        "handed_on_from": "train",
        "handed_on_to": None,
        "admitted_as_run": False,
        "message": "",
    }


def test_a_parallel_branch_has_no_gap_and_a_join_waits_from_the_latest_end() -> None:
    # ``right`` was granted while ``left`` still held its slice; ``join`` waits from the later end.
    chain = chain_of(
        step("left", created=0, granted=0, ended=300),
        step("right", created=10, granted=50, ended=200),
        step("join", created=300, granted=330),
    )
    assert [s.gap_before for s in chain.steps] == [None, None, 30.0]
    assert chain.gap_seconds == 30.0
