"""Where a GPU task may run: on-demand capacity, spot, or either.

The ledger keeps every node with a ``gpupool.io/capacity-type`` label (``spot`` or
``on-demand``), so the choice is a node label of the request:

- ``capacity="on-demand"`` or ``"spot"``: the request must land there (a hard label);
- ``capacity="any"``: either;
- no ``capacity``: the default rule (:func:`~airflow_gpupool.governance.capacity.default_capacity`):
  urgent work (priority at or above ``[gpupool] urgent_priority``, or the ``inference`` class)
  must land on on-demand; checkpointed, preemptible training *prefers* spot (a soft label: it
  still runs on on-demand when no spot node fits) when ``[gpupool] spot_price_ratio`` is under
  0.6 for an expected run under an hour, under 0.4 for longer; everything else may use either.
  The expected run is the task's ``expected_duration``, else the median of its recent
  successful runs in the ledger (read only when the price makes the length matter), else long.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_gpupool import settings
from airflow_gpupool.governance.capacity import Capacity, default_capacity, is_urgent
from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
from airflow_gpupool.resources import GpuRequest

if TYPE_CHECKING:
    from airflow.sdk.types import Logger

    from airflow_gpupool.hooks.gpupool import GpuPoolHook
    from airflow_gpupool.task_try import TaskTry

__all__ = ["check_capacity", "duration_matters", "resolve_capacity", "typical_run", "with_capacity"]


def check_capacity(value: Any) -> Capacity | None:
    """Read a task's ``capacity`` argument (None: the default rule).

    :raises InvalidRequestError: not one of on-demand, spot, any
    """
    return None if value is None else Capacity.of(value)


def duration_matters(request: GpuRequest, capacity: Capacity | None, *, checkpointed: bool) -> bool:
    """Whether the default rule's choice depends on how long a run is expected to take.

    It does when the rule chooses differently for a short run and a long one (checkpointed,
    preemptible training with a spot price between the two ratios); only then is the length
    worth a ledger read.

    :param request: the task's request
    :param capacity: the task's ``capacity`` argument (not None: the rule does not apply)
    :param checkpointed: whether the task writes checkpoints
    """
    if capacity is not None or CAPACITY_TYPE_LABEL in dict(request.node_labels):
        return False
    short = resolve_capacity(request, None, checkpointed=checkpointed, expected_seconds=0)
    long = resolve_capacity(request, None, checkpointed=checkpointed, expected_seconds=None)
    return short != long


def typical_run(hook: GpuPoolHook, task: TaskTry, log: Logger) -> float | None:
    """Return the median seconds of the task's recent successful runs in the ledger (None: none yet).

    :param hook: the ledger hook
    :param task: the try about to reserve
    :param log: the task's log, told what the rule takes
    """
    typical = hook.typical_run_seconds(task.dag_id, task.task_id)
    if typical is None:
        log.info("No successful run of this task in the ledger yet: the spot rule takes its run as long")
        return None
    seconds, runs = typical
    log.info(
        "This task's last %d successful runs took a median %.0f s: the spot rule takes that", runs, seconds
    )
    return seconds


def resolve_capacity(
    request: GpuRequest, capacity: Capacity | None, *, checkpointed: bool, expected_seconds: float | None
) -> tuple[Capacity, bool]:
    """Return where the request runs and whether that is required (False: only preferred).

    :param request: the task's request (priority, class, preemptibility)
    :param capacity: the task's ``capacity`` argument, or None for the default rule
    :param checkpointed: whether the task writes checkpoints (its retry resumes)
    :param expected_seconds: how long a run is expected to take (None: unknown, taken as long)
    """
    if capacity is not None:
        return capacity, True
    urgent = is_urgent(request.priority, request.workload_class.value, settings.urgent_priority())
    chosen = default_capacity(
        urgent=urgent,
        checkpointed=checkpointed,
        preemptible=request.preemptible,
        workload_class=request.workload_class.value,
        price_ratio=settings.spot_price_ratio(),
        expected_seconds=expected_seconds,
    )
    return chosen, chosen is Capacity.ON_DEMAND


def with_capacity(
    request: GpuRequest, capacity: Capacity | None, *, checkpointed: bool, expected_seconds: float | None
) -> GpuRequest:
    """Return the request with its capacity as a node label (required or preferred; none for ``any``).

    :param request: the task's request
    :param capacity: the task's ``capacity`` argument, or None for the default rule
    :param checkpointed: whether the task writes checkpoints
    :param expected_seconds: how long a run is expected to take
    """
    if capacity is None and CAPACITY_TYPE_LABEL in dict(request.node_labels):
        return request  # the task names the capacity type among its node labels: that is its choice
    chosen, required = resolve_capacity(
        request, capacity, checkpointed=checkpointed, expected_seconds=expected_seconds
    )
    if chosen is Capacity.ANY:
        return request
    label = (CAPACITY_TYPE_LABEL, chosen.value)
    if required:
        return replace(request, node_labels=(*_without_capacity(request.node_labels), label))
    return replace(request, prefer_node_labels=(*_without_capacity(request.prefer_node_labels), label))


def _without_capacity(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(pair for pair in labels if pair[0] != CAPACITY_TYPE_LABEL)
