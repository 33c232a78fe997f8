"""A DeadlineAlert callback that says which DAG run missed its deadline (it runs in the triggerer)."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["log_missed_deadline"]

log = logging.getLogger(__name__)


async def log_missed_deadline(context: dict[str, Any], **kwargs: Any) -> str:
    """Log the DAG run that missed its deadline; return the line (Airflow stores a callback's result).

    Pass it as ``AsyncCallback(log_missed_deadline)``. Airflow calls it with the run
    (``context["dag_run"]``) and the deadline (``context["deadline"]``). A GPU task that saw the
    miss coming left the ``gpupool_deadline`` XCom in the same run, readable through Airflow's
    REST API (``.../taskInstances/{task_id}/xcomEntries/gpupool_deadline``).

    :param context: what Airflow passes: ``dag_run`` and ``deadline``
    :param kwargs: the alert's own ``kwargs``, added to the line
    """
    run = context.get("dag_run") or {}
    deadline = context.get("deadline") or {}
    line = (
        f"DAG run {run.get('dag_id')}/{run.get('dag_run_id') or run.get('run_id')} missed its deadline"
        f" {deadline.get('deadline_time')}"
    )
    if kwargs:
        line += f" ({', '.join(f'{k}={v}' for k, v in sorted(kwargs.items()))})"
    log.warning("%s", line)
    return line
