"""Drive an operator as Airflow's task runner does, without the runner: execute, deferrals, resumes."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

__all__ = ["FakeTaskInstance", "drive", "emulated_gpu_pod", "run_task", "run_trigger"]


class FakeTaskInstance:
    """The task-instance fields both operators read, and an in-memory XCom."""

    def __init__(self, task_id: str, retries: int) -> None:
        self.dag_id = "compat"
        self.task_id = task_id
        self.run_id = "manual__2027-01-01T00:00:00+00:00"
        self.map_index = -1
        self.try_number = 1
        self.max_tries = retries
        self.start_date = datetime.datetime.now(tz=datetime.UTC)
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def run_trigger(trigger: Any) -> Any:
    async def first_event() -> Any:
        async for event in trigger.run():
            return event
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first_event(), 60))


def drive(op: Any, context: dict[str, Any]) -> Any:
    """Run ``execute``, and each deferral's trigger and resume method, as the task runner would."""
    from airflow.sdk.exceptions import TaskDeferred

    def call() -> Any:
        return op.execute(context)

    step = call
    for _ in range(6):
        try:
            return step()
        except TaskDeferred as deferred:
            event = run_trigger(deferred.trigger)
            method = getattr(op, deferred.method_name)
            extra = deferred.kwargs or {}

            def step(method: Any = method, payload: Any = event.payload, extra: Any = extra) -> Any:
                return method(context, payload, **extra)

    raise AssertionError("deferred more than 6 times")


def emulated_gpu_pod(kubeconfig_path: str, task_id: str, **kwargs: Any) -> Any:
    """Return a ``GpuPodOperator`` for the emulator at ``kubeconfig_path``, polling fast; ``kwargs`` add to it."""
    from airflow_gpupool.operators import GpuPodOperator

    return GpuPodOperator(
        task_id=task_id,
        name=task_id,
        random_name_suffix=False,
        namespace="default",
        image="registry.example/train:1",
        config_file=kubeconfig_path,
        in_cluster=False,
        startup_check_interval_seconds=1,
        poll_interval=0.2,
        **kwargs,
    )


def run_task(op: Any, dag_id: str) -> FakeTaskInstance:
    """Drive ``op`` as try 1 of a task of a DAG ``dag_id``; return its task instance (XComs, state)."""
    from airflow.sdk import DAG

    ti = FakeTaskInstance(op.task_id, 0)
    drive(op, {"ti": ti, "task_instance": ti, "run_id": ti.run_id, "dag": DAG(dag_id, schedule=None)})
    return ti
