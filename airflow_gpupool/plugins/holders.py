"""Read the task instance out of a reservation's holder string, and link to it in the Airflow UI."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class TaskRef:
    """The task instance a :class:`~airflow_gpupool.operators.GpuPodOperator` reservation belongs to.

    :param map_index: -1 for an unmapped task
    """

    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int
    host: str


def parse_holder(holder: str) -> TaskRef | None:
    """Parse ``dag_id/task_id/run_id/map-<i>/try-<n>@host``; return None for any other holder.

    A run id may itself contain ``/``: everything between the task id and ``map-`` is the run id.

    :param holder: the reservation's holder string
    """
    base, at, host = holder.rpartition("@")
    if not at:
        base, host = holder, ""
    parts = base.split("/")
    if len(parts) < 5 or not parts[-2].startswith("map-") or not parts[-1].startswith("try-"):
        return None
    try:
        map_index = int(parts[-2][4:])
        try_number = int(parts[-1][4:])
    except ValueError:
        return None
    run_id = "/".join(parts[2:-2])
    if not parts[0] or not parts[1] or not run_id:
        return None
    return TaskRef(parts[0], parts[1], run_id, map_index, try_number, host)


def task_instance_url(ref: TaskRef, ui_base: str = "") -> str:
    """Return the Airflow 3 UI path of the task instance (its mapped instance when mapped).

    :param ref: what :func:`parse_holder` returned
    :param ui_base: the Airflow UI's path prefix (empty when served at the root)
    """
    path = (
        f"{ui_base.rstrip('/')}/dags/{quote(ref.dag_id, safe='')}/runs/{quote(ref.run_id, safe='')}"
        f"/tasks/{quote(ref.task_id, safe='')}"
    )
    return f"{path}/mapped/{ref.map_index}" if ref.map_index >= 0 else path
