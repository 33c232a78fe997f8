"""CheckpointTrigger on a local directory and an fsspec memory filesystem."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from airflow_gpupool.triggers import CheckpointEventStatus, CheckpointTrigger


def first_event(trigger: CheckpointTrigger, timeout: float = 5.0) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        gen = trigger.run()
        try:
            event = await asyncio.wait_for(gen.__anext__(), timeout)
        finally:
            await gen.aclose()
        return event.payload

    return asyncio.run(run())


def test_serialize_is_the_exact_constructor_arguments_and_round_trips() -> None:
    trigger = CheckpointTrigger(
        "s3://bucket/run",
        conn_id="aws_default",
        last_step=3,
        since=1.5,
        max_interval=600.0,
        poll_interval=10.0,
    )
    path, kwargs = trigger.serialize()

    assert path == "airflow_gpupool.triggers.checkpoint.CheckpointTrigger"
    assert kwargs == {
        "checkpoint_dir": "s3://bucket/run",
        "conn_id": "aws_default",
        "last_step": 3,
        "since": 1.5,
        "max_interval": 600.0,
        "poll_interval": 10.0,
    }
    assert CheckpointTrigger(**kwargs).serialize() == (path, kwargs)


def test_reports_progress_with_the_newest_valid_step(location) -> None:
    location.write(1, loss=2.0)
    location.write(2, loss=1.0)
    location.write(3, manifest=b"garbage")  # corrupt: skipped

    event = first_event(CheckpointTrigger(location.url, last_step=1, poll_interval=0.01))

    assert event["status"] == CheckpointEventStatus.PROGRESS.value
    assert event["step"] == 2 and event["manifest"]["metrics"] == {"loss": 1.0}
    assert event["checkpoint_dir"] == location.url and event["message"] == "new checkpoint at step 2"


def test_waits_for_a_new_step_then_reports_it(location) -> None:
    location.write(1)

    async def scenario() -> dict[str, Any]:
        trigger = CheckpointTrigger(location.url, last_step=1, poll_interval=0.01)
        task = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.1)
        assert not task.done(), "nothing new yet"
        location.write(2)
        return (await asyncio.wait_for(task, 5)).payload

    assert asyncio.run(scenario())["step"] == 2


def test_stall_when_no_new_checkpoint_within_max_interval(location) -> None:
    location.write(1, time="2026-01-01T00:00:00+00:00")

    started = time.time()
    event = first_event(CheckpointTrigger(location.url, last_step=1, max_interval=0.2, poll_interval=0.01))

    assert event["status"] == CheckpointEventStatus.STALLED.value and event["step"] == 1
    assert time.time() - started >= 0.2


def test_completion_marker_completes(location) -> None:
    location.write(1)
    location.write(2, manifest=None)  # incomplete: skipped
    location.complete()

    event = first_event(CheckpointTrigger(location.url, last_step=1, poll_interval=0.01))

    assert event["status"] == CheckpointEventStatus.COMPLETED.value and event["step"] == 1


def test_an_exception_becomes_an_error_event() -> None:
    event = first_event(CheckpointTrigger("nosuchproto://bucket/x", poll_interval=0.01))

    assert event["status"] == CheckpointEventStatus.ERROR.value
    assert event["message"].startswith("ValueError") and event["step"] is None
