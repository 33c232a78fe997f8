"""Escalation: one typed payload, handed to notifiers as JSON-ready primitives."""

from __future__ import annotations

import json
from typing import Any

from airflow_gpupool.notifiers import (
    ESCALATION_KEY,
    MESSAGE_KEY,
    Escalation,
    TriedAttempt,
    format_escalation,
    notify_escalation,
)
from airflow_gpupool.task_try import TaskTry

ESCALATION = Escalation(
    task=TaskTry("retrain", "train", "manual__1", 2, 3, "worker-1"),
    failure_class="application_error",
    reason="Error",
    decision="application_error: retries exhausted",
    exit_code=1,
    pod_name="train-abc",
    last_checkpoint_step=42,
    log_tail="epoch 9\nRuntimeError: boom\n",
    tried=(TriedAttempt(1, "preempted", "1 GPU", "retry", 7),),
    policy={"preempted": "retry"},
)


def test_primitives_are_the_documented_keys_and_round_trip() -> None:
    data = ESCALATION.to_dict()
    assert list(data) == [
        "dag_id", "task_id", "run_id", "map_index", "try_number", "failure_class", "reason", "exit_code",
        "pod_name", "last_checkpoint_step", "log_tail", "decision", "tried", "policy",
    ]  # fmt: skip
    assert data["tried"] == [
        {
            "try_number": 1,
            "failure_class": "preempted",
            "request": "1 GPU",
            "remedy": "retry",
            "checkpoint_step": 7,
        }
    ]
    back = Escalation.from_dict(json.loads(json.dumps(data)))
    # The host is not part of the payload: a notifier learns which try, not which machine.
    assert back == Escalation(
        **{**ESCALATION.__dict__, "task": TaskTry("retrain", "train", "manual__1", 2, 3)}
    )


def test_the_text_is_the_same_from_the_value_or_its_primitives() -> None:
    assert format_escalation(ESCALATION) == format_escalation(ESCALATION.to_dict())
    assert "  try 1: preempted on 1 GPU -> retry" in format_escalation(ESCALATION)


def test_notify_hands_the_notifier_the_context_plus_payload_and_text() -> None:
    calls: list[dict[str, Any]] = []
    notify_escalation(ESCALATION, {"run_id": "manual__1"}, calls.append)
    (context,) = calls
    assert context["run_id"] == "manual__1"
    assert context[ESCALATION_KEY] == ESCALATION.to_dict()
    assert context[MESSAGE_KEY] == format_escalation(ESCALATION)
