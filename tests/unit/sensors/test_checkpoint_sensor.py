"""CheckpointSensor in poke mode and around its trigger, on local and in-memory locations."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import TaskDeferred
from airflow.sdk import PokeReturnValue

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.sensors import CheckpointSensor, CheckpointStalledError
from airflow_gpupool.triggers import CheckpointTrigger

NOW = datetime.datetime.now(tz=datetime.UTC).isoformat()


class FakeTI:
    dag_id, task_id, run_id, try_number, map_index = "d", "watch", "r1", 1, -1

    def __init__(self) -> None:
        self.xcoms: list[tuple[str, Any]] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms.append((key, value))


def context() -> Any:
    ti = FakeTI()
    return {"ti": ti, "task_instance": ti}


def sensor(url: str, **kwargs: Any) -> CheckpointSensor:
    return CheckpointSensor(
        task_id="watch", checkpoint_dir=url, deferrable=False, poke_interval=0.01, **kwargs
    )


def test_poke_reports_each_new_step_to_xcom_and_prunes(location) -> None:
    task, ctx = sensor(location.url, keep_checkpoints=2), context()
    for step in (1, 2, 3):
        location.write(step, loss=1 / step, time=NOW)

    assert task.poke(ctx) is False
    assert ctx["ti"].xcoms[0] == ("checkpoint_step", 3)
    assert ctx["ti"].xcoms[1][1]["metrics"] == {"loss": pytest.approx(1 / 3)}
    assert location.steps() == ["step-000002", "step-000003"]
    assert task.poke(ctx) is False and len(ctx["ti"].xcoms) == 2, "nothing new, nothing pushed"


def test_poke_returns_the_final_manifest_on_completion(location) -> None:
    location.write(4, time=NOW)
    location.complete()

    done = sensor(location.url).poke(context())

    assert isinstance(done, PokeReturnValue) and done.is_done
    assert done.xcom_value["step"] == 4


def test_stall_fails_by_default(location) -> None:
    location.write(1, time="2026-01-01T00:00:00+00:00")
    task, ctx = sensor(location.url, max_interval=datetime.timedelta(seconds=60)), context()
    task._last_step, task._since = 1, 0.0

    with pytest.raises(CheckpointStalledError) as error:
        task.poke(ctx)
    assert (error.value.checkpoint_dir, error.value.last_step) == (location.url, 1)


def test_stall_escalates_once_per_quiet_interval_and_keeps_watching(location) -> None:
    calls: list[dict[str, Any]] = []
    location.write(1, time="2026-01-01T00:00:00+00:00")
    task = sensor(location.url, max_interval=60, on_stall="escalate", escalation_notifier=calls.append)
    task._last_step, task._since = 1, 0.0
    ctx = context()

    assert task.poke(ctx) is False
    assert task.poke(ctx) is False
    (call,) = calls
    assert call["gpupool_escalation"]["failure_class"] == "stalled"
    assert call["gpupool_escalation"]["last_checkpoint_step"] == 1
    assert "needs a person" in call["gpupool_escalation_message"]


def test_deferrable_execute_defers_and_redefers_after_progress(location) -> None:
    task = CheckpointSensor(task_id="watch", checkpoint_dir=location.url, deferrable=True, max_interval=30)
    with pytest.raises(TaskDeferred) as deferred:
        task.execute(context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, CheckpointTrigger) and trigger.last_step == -1 and trigger.max_interval == 30.0

    location.write(5, time=NOW)
    event = {
        "status": "progress",
        "message": "new",
        "step": 5,
        "manifest": {"step": 5, "time": NOW, "metrics": {}},
    }
    ctx = context()
    with pytest.raises(TaskDeferred) as again:
        task.execute_complete(ctx, event, last_step=-1, since=1.0)
    assert again.value.trigger.last_step == 5 and again.value.kwargs["last_step"] == 5
    assert ctx["ti"].xcoms[0] == ("checkpoint_step", 5)

    done = {"status": "completed", "message": "done", "step": 5, "manifest": event["manifest"]}
    assert task.execute_complete(context(), done, last_step=5, since=1.0)["step"] == 5


def test_bad_arguments_fail_at_parse_time() -> None:
    with pytest.raises(ConfigurationError, match="on_stall"):
        sensor("/x", on_stall="page")
    with pytest.raises(ConfigurationError, match="max_interval"):
        sensor("/x", max_interval=0)
    with pytest.raises(ConfigurationError, match="keep_checkpoints"):
        sensor("/x", keep_checkpoints=0)
    with pytest.raises(ConfigurationError, match="reschedule"):
        sensor("/x", max_interval=60, mode="reschedule")
