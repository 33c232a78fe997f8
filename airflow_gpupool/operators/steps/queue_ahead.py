"""Which downstream GPU steps of the same DAG run queue ahead of a granted step, and when (issue 40).

When a GPU step is granted, each direct downstream GPU step that its slice will not be handed
on to (hand-on off for it, or its request does not fit within the slice: another team, a gang
or MIG profile, more GPUs) enters the queue ahead of time: at ``grant time + forecast - lead``,
not granted before ``grant time + forecast``, where the forecast is the step's
``expected_duration`` or the median of its recent successful runs in the ledger's history. The
downstream steps are found as hand-on finds them (:mod:`~airflow_gpupool.operators.steps.hand_on`);
templated requests are not queued ahead. Every reason a step is not queued ahead is logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpupool import settings
from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.operators.steps.hand_on import DAG_PARAM as HAND_ON_PARAM
from airflow_gpupool.operators.steps.hand_on import DownstreamSkipMessages, downstream_request
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Grant
    from airflow_gpupool.resources import GpuRequest

__all__ = ["DAG_PARAM", "may_be_handed_on", "plan_queue_ahead", "upstream_forecast"]

#: A DAG param (or a run's conf key) that turns queue ahead off for the whole run when false.
DAG_PARAM = "gpupool_queue_ahead"


def may_be_handed_on(upstream: GpuRequest, downstream: GpuRequest) -> bool:
    """Whether ``downstream`` may fit within ``upstream``'s slice (hand-on decides at the end; this is its pre-check)."""
    if downstream.team != upstream.team or downstream.gang is not None or upstream.gang is not None:
        return False
    if downstream.mig_profile is not None or upstream.mig_profile is not None:
        return False
    if upstream.gpus:
        return downstream.gpus <= upstream.gpus
    return downstream.gpus == 0 and (downstream.gpu_milli or 0) <= (upstream.gpu_milli or 0)


def upstream_forecast(task: Any, log: Any) -> float | None:
    """Return the seconds ``task`` is expected to run: its ``expected_duration``, else its recent runs' median."""
    if task.expected_duration is not None:
        return float(task.expected_duration)
    try:
        typical = task.gpu_hook.typical_run_seconds(task.dag_id, task.task_id)
    except GpuPoolError as e:
        log.warning("No forecast of %s's run time: %s", task.task_id, e)
        return None
    return None if typical is None else float(typical[0])


def _params_off(context: Mapping[str, Any]) -> str | None:
    params = context.get("params") or {}
    if params.get(DAG_PARAM, True) is False:
        return f"the DAG's param {DAG_PARAM} is false"
    return None


_SAY = DownstreamSkipMessages(
    opted_out="Not queued ahead: %s has queue_ahead=False",
    other_ledger="Not queued ahead: %s uses another ledger connection",
    invalid="Not queued ahead: %s's request is invalid (%s)",
    templated="Not queued ahead: %s's request is templated (known only when it runs)",
)


def _target(
    task: Any, downstream: Any, context: Mapping[str, Any], log: Any
) -> tuple[str, GpuRequest] | None:
    name = downstream.task_id
    request = downstream_request(task, downstream, opted_in=downstream.queue_ahead, say=_SAY, log=log)
    if request is None:
        return None
    params = context.get("params") or {}
    handed = task.hand_on and downstream.hand_on and params.get(HAND_ON_PARAM, True) is not False
    if handed and may_be_handed_on(task.gpu_request(), request):
        log.info("Not queued ahead: %s may be handed this step's slice when it ends", name)
        return None
    ti = context["ti"]
    return TaskTry(ti.dag_id, name, ti.run_id, -1).task_key, request


def plan_queue_ahead(task: Any, context: Mapping[str, Any], rid: str, grant: Grant, log: Any) -> list[str]:
    """Queue the direct downstream GPU steps of the granted ``task`` ahead of its end; return their ids.

    :param task: the granted GPU step (a :class:`~airflow_gpupool.operators.GpuPodOperator`)
    :param rid: its grant
    :param grant: what it was granted (``granted_at`` on the ledger's clock)
    """
    steps = sorted(
        (t for t in task.downstream_list if callable(getattr(t, "hand_on_request", None))),
        key=lambda t: t.task_id,
    )
    if not steps:
        return []
    why = "this step has queue_ahead=False" if not task.queue_ahead else _params_off(context)
    if why is not None:
        log.info("Nothing queued ahead: %s", why)
        return []
    forecast = upstream_forecast(task, log)
    if forecast is None:
        log.info(
            "Nothing queued ahead: no forecast of this step's run time (no expected_duration, no history)"
        )
        return []
    planned = []
    for downstream in steps:
        target = _target(task, downstream, context, log)
        if target is None:
            continue
        key, request = target
        lead = downstream.queue_ahead_lead_seconds
        lead = settings.queue_ahead_lead_seconds() if lead is None else lead
        not_before = grant.granted_at + forecast
        result = task.gpu_hook.queue_ahead(
            rid,
            key,
            request,
            enter_at=min(not_before, max(grant.granted_at, not_before - lead)),
            not_before=not_before,
        )
        log.info("%s: %s", downstream.task_id, result.message)
        if result.ahead_id is not None:
            planned.append(result.ahead_id)
    return planned
