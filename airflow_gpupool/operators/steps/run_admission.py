"""Admission of a DAG run as a whole, from the DAG: which steps share an admission, and the run's peak.

A DAG asks for it with ``default_args={"gpu_admission": "run"}``, a task group with
``TaskGroup(..., default_args={"gpu_admission": "run"})``: every GPU step under it
(:class:`~airflow_gpupool.operators.GpuPodOperator`, :class:`~airflow_gpupool.operators.GpuJobOperator`,
``@task.gpu_pod``) then takes ``gpu_admission="run"``. The steps of one *scope* (the innermost task
group whose ``default_args`` name ``gpu_admission``, else the DAG) are admitted together: an entry
step (no GPU step of its scope upstream of it) reserves with the scope's
:class:`~airflow_gpupool.governance.runs.RunNeed`, the others reserve as usual
(:mod:`~airflow_gpupool.ledger.teams.run_gate` says what the ledger does with it).

The peak is read from the DAG when the entry step runs: each step's request as declared. A step
whose request is templated (or a mapped GPU step: how many copies is known only at run time)
makes the peak unknown: the run is then admitted step by step, as without ``gpu_admission``, and
the log says which step and why.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.governance.runs import RunNeed, peak_need
from airflow_gpupool.operators.request import REQUEST_FIELDS, templated
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow.sdk.types import Logger

__all__ = ["GPU_ADMISSION", "check_gpu_admission", "run_need"]

#: ``task``: each GPU step is admitted on its own (the default); ``run``: the run's steps together.
GPU_ADMISSION = ("task", "run")


def check_gpu_admission(value: Any) -> str:
    """Return ``value`` if it is ``task`` or ``run``.

    :raises InvalidRequestError: naming ``gpu_admission``
    """
    if value not in GPU_ADMISSION:
        raise InvalidRequestError(
            "gpu_admission", value, "'task' (each step alone) or 'run' (the run as a whole)"
        )
    return str(value)


def _scope(task: Any) -> str:
    """The group id of the innermost task group that sets ``gpu_admission`` ("" for the DAG)."""
    group = getattr(task, "task_group", None)
    while group is not None and group.group_id is not None:
        if "gpu_admission" in (getattr(group, "default_args", None) or {}):
            return str(group.group_id)
        group = group.parent_group
    return ""


def _admission(task: Any) -> str:
    if not hasattr(task, "partial_kwargs"):
        return str(getattr(task, "gpu_admission", "task"))
    # A mapped task keeps only its own arguments: what default_args would give it is read from them.
    if "gpu_admission" in task.partial_kwargs:
        return str(task.partial_kwargs["gpu_admission"])
    group = getattr(task, "task_group", None)
    while group is not None:
        if "gpu_admission" in (getattr(group, "default_args", None) or {}):
            return str(group.default_args["gpu_admission"])
        group = group.parent_group
    return str((task.dag.default_args or {}).get("gpu_admission", "task"))


def _is_gpu_step(task: Any) -> bool:
    cls = getattr(task, "operator_class", type(task))
    return isinstance(cls, type) and hasattr(cls, "gpu_request") and hasattr(cls, "gpu_hook")


def _declared(task: Any) -> GpuRequest | str:
    """Return the step's request as declared, or why it is unknown before the step runs."""
    if hasattr(task, "partial_kwargs"):
        return "it is mapped: how many copies run is known only at run time"
    fields = [getattr(task, f, None) for f in REQUEST_FIELDS] + [getattr(task, "container_resources", None)]
    if any(templated(v) for v in fields):
        return "its request is templated: its size is known only once it runs"
    declared = getattr(task, "declared_request", None) or task.gpu_request
    request: GpuRequest = declared()
    return request


def _milli(request: GpuRequest) -> int:
    return request.total_gpu_milli * (request.gang.min_members if request.gang is not None else 1)


def run_need(task: Any, context: Any, log: Logger) -> RunNeed | None:
    """Return the need ``task`` reserves with: its scope's peak if it is an entry step of a run admitted as a whole.

    None: the step reserves as usual (admitted per task, not an entry step, or the peak is unknown).
    """
    if getattr(task, "gpu_admission", "task") != "run":
        return None
    dag, scope = task.dag, _scope(task)
    steps = [
        t for t in dag.task_dict.values() if _is_gpu_step(t) and _admission(t) == "run" and _scope(t) == scope
    ]
    names = {t.task_id for t in steps}
    if names & set(task.get_flat_relative_ids(upstream=True)):
        return None  # a later step of the run: the run was admitted by its entry step
    milli: dict[str, int] = {}
    for step in steps:
        declared = _declared(step)
        if isinstance(declared, str):
            log.warning(
                "Run admission off for this run: the peak is unknown because step %s: %s. "
                "Each GPU step is admitted on its own",
                step.task_id,
                declared,
            )
            return None
        milli[step.task_id] = _milli(declared)
    downstream = {t.task_id: _ids(t.downstream_task_ids) for t in dag.task_dict.values()}
    tt = TaskTry.from_context(context)
    key = f"{tt.dag_id}/{tt.run_id}" + (f"/{scope}" if scope else "")
    need = peak_need(key, milli, downstream)
    how = (
        "exact" if need.exact else f"the sum of all {len(milli)} steps, too many to compute the peak exactly"
    )
    log.info(
        "Admission as a run (%s): %s (%s); this step waits until its team's quota, or the pool, can serve it",
        key,
        need.describe(),
        how,
    )
    return need


def _ids(ids: Iterable[str]) -> list[str]:
    return sorted(ids)
