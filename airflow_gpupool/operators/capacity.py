"""Where a GPU task may run: on-demand capacity, spot, or either.

The ledger keeps every node with a ``gpupool.io/capacity-type`` label (``spot`` or
``on-demand``), so the choice is a node label of the request:

- ``capacity="on-demand"`` or ``"spot"``: the request must land there (a hard label);
- ``capacity="any"``: either;
- no ``capacity``: the default rule (:func:`~airflow_gpupool.governance.capacity.default_capacity`,
  applied by :func:`~airflow_gpupool.governance.capacity.apply_capacity`, as for gated pods):
  urgent work (priority at or above ``[gpupool] urgent_priority``, or the ``inference`` class)
  must land on on-demand; checkpointed, preemptible training *prefers* spot (a soft label: it
  still runs on on-demand when no spot node fits) when ``[gpupool] spot_price_ratio`` is under
  0.6 for an expected run under an hour, under 0.4 for longer; everything else may use either.
  The expected run is the task's ``expected_duration``, else the median of its recent
  successful runs in the ledger (read only when the price makes the length matter), else long.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_gpupool import settings
from airflow_gpupool.governance.capacity import Capacity, apply_capacity, choose_capacity, names_capacity
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
    if capacity is not None or names_capacity(request.node_labels):
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
    return choose_capacity(
        request, capacity, checkpointed=checkpointed, expected_seconds=expected_seconds, **_rule()
    )


def with_capacity(
    request: GpuRequest, capacity: Capacity | None, *, checkpointed: bool, expected_seconds: float | None
) -> GpuRequest:
    """Return the request with its capacity as a node label (required or preferred; none for ``any``).

    A request whose node labels name the capacity type (``gpupool.io/capacity-type`` or a cloud's
    label) keeps that choice when ``capacity`` is None.

    :param request: the task's request
    :param capacity: the task's ``capacity`` argument, or None for the default rule
    :param checkpointed: whether the task writes checkpoints
    :param expected_seconds: how long a run is expected to take
    """
    return apply_capacity(
        request, capacity, checkpointed=checkpointed, expected_seconds=expected_seconds, **_rule()
    )


def _rule() -> dict[str, Any]:
    """The ``[gpupool]`` options of the default rule."""
    return {"urgent_priority": settings.urgent_priority(), "price_ratio": settings.spot_price_ratio()}
