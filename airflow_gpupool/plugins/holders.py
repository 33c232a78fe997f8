"""Link a reservation's task try to its task instance in the Airflow UI."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from airflow_gpupool.task_try import TaskTry


def task_instance_url(task: TaskTry, ui_base: str = "") -> str:
    """Return the Airflow 3 UI path of the task instance (its mapped instance when mapped).

    :param task: the try, as :meth:`TaskTry.from_holder` reads it from a holder string
    :param ui_base: the Airflow UI's path prefix (empty when served at the root)
    """
    path = (
        f"{ui_base.rstrip('/')}/dags/{quote(task.dag_id, safe='')}/runs/{quote(task.run_id, safe='')}"
        f"/tasks/{quote(task.task_id, safe='')}"
    )
    return f"{path}/mapped/{task.map_index}" if task.map_index >= 0 else path
