"""Which downstream GPU step of the same DAG run an ending step hands its slice on to (issue 40).

The DAG says it: a direct downstream task that is a GPU step (it has ``hand_on_request``), on
the same ledger, whose request is known without rendering templates, and whose other upstreams
are done. Anything the worker cannot see (a trigger rule that skips it, an upstream that
ends later than its state says) is left to the hold's bound: an unclaimed slice is released
at ``handoff_seconds``. Every reason a step is not handed on is logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow_gpupool.resources import GpuRequest

__all__ = [
    "DAG_PARAM",
    "DownstreamSkipMessages",
    "HandOnTarget",
    "downstream_request",
    "hand_on_target",
    "upstreams_pending",
]

#: A DAG param (or a run's conf key) that turns hand-on off for the whole run when false.
DAG_PARAM = "gpupool_hand_on"
#: Upstream states after which a downstream step may run next (one its trigger rule skips: the bound).
_DONE = frozenset({"success", "skipped"})


@dataclass(frozen=True)
class HandOnTarget:
    """The step a slice is handed on to: its task key and its request."""

    task_id: str
    task_key: str
    request: GpuRequest


def _opted_out(task: Any, context: Mapping[str, Any]) -> str | None:
    if not task.hand_on:
        return f"task {task.task_id} has hand_on=False"
    params = context.get("params") or {}
    if params.get(DAG_PARAM, True) is False:
        return f"the DAG's param {DAG_PARAM} is false"
    return None


def upstreams_pending(dag_id: str, run_id: str, task_ids: list[str]) -> list[str]:
    """Return which of ``task_ids`` of the run are not done yet; [] when the worker cannot tell."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    try:
        states = RuntimeTaskInstance.get_task_states(dag_id=dag_id, task_ids=task_ids, run_ids=[run_id])
    except Exception:  # outside a task runner: the hold's bound covers what cannot be seen
        return []
    of_run = states.get(run_id, {})
    return sorted(t for t in task_ids if of_run.get(t) not in _DONE)


@dataclass(frozen=True)
class DownstreamSkipMessages:
    """What a caller of :func:`downstream_request` logs for each reason a step is skipped.

    Each is a %-format of the step's task id; ``invalid`` also takes the error.
    """

    opted_out: str
    other_ledger: str
    invalid: str
    templated: str


def downstream_request(
    task: Any, downstream: Any, *, opted_in: bool, say: DownstreamSkipMessages, log: Any
) -> GpuRequest | None:
    """Return the request of a direct downstream GPU step ``task`` may plan for, or None (logged why).

    The step is skipped when it opted out, uses another ledger connection, or its request is
    invalid or templated (known only when it runs).

    :param task: the upstream GPU step
    :param downstream: its direct downstream GPU step
    :param opted_in: whether ``downstream`` takes part (its own flag for the caller's feature)
    :param say: the caller's log message for each reason
    """
    name = downstream.task_id
    if not opted_in:
        log.info(say.opted_out, name)
        return None
    if downstream.ledger_conn_id != task.ledger_conn_id:
        log.info(say.other_ledger, name)
        return None
    try:
        request = downstream.hand_on_request()
    except (GpuPoolError, ValueError) as e:
        log.warning(say.invalid, name, e)
        return None
    if request is None:
        log.info(say.templated, name)
        return None
    return request  # type: ignore[no-any-return]


_SAY = DownstreamSkipMessages(
    opted_out="GPU slice not handed on to %s: it has hand_on=False",
    other_ledger="GPU slice not handed on to %s: it uses another ledger connection",
    invalid="GPU slice not handed on to %s: its request is invalid (%s)",
    templated="GPU slice not handed on to %s: its request is templated (known only when it runs)",
)


def _candidate(task: Any, downstream: Any, context: Mapping[str, Any], log: Any) -> HandOnTarget | None:
    name = downstream.task_id
    request = downstream_request(task, downstream, opted_in=downstream.hand_on, say=_SAY, log=log)
    if request is None:
        return None
    ti = context["ti"]
    others = sorted(set(downstream.upstream_task_ids) - {task.task_id})
    pending = upstreams_pending(ti.dag_id, ti.run_id, others) if others else []
    if pending:
        log.info("GPU slice not handed on to %s: its upstream %s is not done", name, ", ".join(pending))
        return None
    key = TaskTry(ti.dag_id, name, ti.run_id, -1).task_key
    return HandOnTarget(name, key, request)


def hand_on_target(task: Any, context: Mapping[str, Any], log: Any) -> HandOnTarget | None:
    """Return the downstream GPU step the ending ``task`` hands its slice on to, or None (logged why).

    :param task: the ending GPU step (a :class:`~airflow_gpupool.operators.GpuPodOperator`)
    :param context: its Airflow context
    """
    steps = sorted(
        (t for t in task.downstream_list if callable(getattr(t, "hand_on_request", None))),
        key=lambda t: t.task_id,
    )
    if not steps:
        return None
    why = _opted_out(task, context)
    if why is not None:
        log.info("GPU slice not handed on: %s", why)
        return None
    for downstream in steps:
        target = _candidate(task, downstream, context, log)
        if target is not None:
            return target
    return None
