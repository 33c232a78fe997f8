"""A DAG's Airflow deadlines, set beside a waiting request's forecast: is the deadline still reachable?

An Airflow 3 ``DeadlineAlert`` (``DAG(deadline=...)``) is evaluated by the scheduler from its
metadata database, which task code may not read. The worker evaluates the references it can
from the task's own context, so the waiting trigger can compare them with the controller's
forecast:

- ``DeadlineReference.FIXED_DATETIME(dt)``: ``dt``;
- ``DeadlineReference.DAGRUN_LOGICAL_DATE``: the run's logical date (a run without one has none);
- ``DeadlineReference.DAGRUN_QUEUED_AT``: the run's start date, the closest the worker's context
  holds (a run starts after it was queued, so the deadline read is never earlier than Airflow's,
  and an early warning never false);
- ``AVERAGE_RUNTIME`` and custom references need the database: they are left out, and said so.

A deadline is unreachable when even the forecast's p10 (the start it has a 10 % chance to beat)
lies past it, or the forecast says the request never starts on the current nodes. The check is
on the task's start: a deadline the task can start by but not finish by is not flagged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_gpupool.forecast.words import clock_time, describe_forecast

if TYPE_CHECKING:
    from airflow_gpupool.ledger import StartForecast

__all__ = [
    "XCOM_DEADLINE_KEY",
    "DagDeadline",
    "DeadlinesMissed",
    "dag_deadlines",
    "deadlines_missed",
    "unreachable",
]

#: The XCom a GPU task pushes when its forecast makes a DAG deadline unreachable.
XCOM_DEADLINE_KEY = "gpupool_deadline"


@dataclass(frozen=True)
class DagDeadline:
    """One of a DAG run's deadlines, as the waiting trigger carries it.

    :param name: the alert's name, else its reference and interval
    :param at: when it falls due (epoch seconds)
    :param warned: the task already said it is unreachable (it says so once)
    """

    name: str
    at: float
    warned: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Return primitives (the trigger's serialized form)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DagDeadline:
        """Read :meth:`to_dict`'s form back."""
        return cls(str(data["name"]), float(data["at"]), bool(data.get("warned", False)))


def _base_time(reference: Any, dag_run: Any) -> datetime | None:
    """Return the reference's base time from the run, None where only the database knows it."""
    from airflow.sdk.definitions.deadline import (
        DagRunLogicalDateDeadline,
        DagRunQueuedAtDeadline,
        FixedDatetimeDeadline,
    )

    if isinstance(reference, FixedDatetimeDeadline):
        return reference._datetime  # the SDK keeps it there; no public reader
    if isinstance(reference, DagRunLogicalDateDeadline):
        return getattr(dag_run, "logical_date", None)
    if isinstance(reference, DagRunQueuedAtDeadline):
        return getattr(dag_run, "start_date", None)
    return None


def dag_deadlines(context: Mapping[str, Any], log: Any) -> list[DagDeadline]:
    """Return the deadlines of the task's DAG run that the worker can evaluate, earliest first.

    :param context: the task's Airflow context (its ``dag`` and ``dag_run``)
    :param log: where a deadline left out is said
    """
    dag, dag_run = context.get("dag"), context.get("dag_run")
    alerts = list(getattr(dag, "deadline", None) or ())
    if not alerts:
        return []
    try:
        import airflow.sdk.definitions.deadline  # noqa: F401 (where this task SDK keeps its deadline references)
    except ImportError:
        log.info("This Airflow's task SDK has no deadline references to read: deadlines are not compared")
        return []
    out = []
    for alert in alerts:
        base = _base_time(alert.reference, dag_run)
        interval = alert.interval
        if base is not None and not isinstance(interval, timedelta):
            interval = interval.resolve()  # a VariableInterval: the Variable, read on the worker
        label = alert.name or f"{alert.reference.reference_name} + {interval}"
        if base is None:
            log.info(
                "Deadline %s is not compared with the GPU forecast: only Airflow's database knows it", label
            )
            continue
        out.append(DagDeadline(label, (base + interval).timestamp()))
    return sorted(out, key=lambda d: d.at)


def unreachable(deadline: DagDeadline, forecast: StartForecast | None, now: float) -> str | None:
    """Say why ``forecast`` makes ``deadline`` unreachable; None while it may still be met.

    :param deadline: the DAG run's deadline
    :param forecast: the waiting request's stored forecast
    :param now: the time the words are for
    """
    if forecast is None:
        return None
    due = f"the DAG's deadline {deadline.name!r} ({clock_time(deadline.at, now)} UTC)"
    if forecast.status == "never":
        return f"cannot start before {due}: {forecast.reason}"
    if forecast.status != "forecast" or forecast.p10 is None or forecast.p10 <= deadline.at:
        return None
    return (
        f"cannot start before {due}: even its earliest likely start, {clock_time(forecast.p10, now)} UTC"
        f" (10 %), is later; {describe_forecast(forecast, now)}"
    )


@dataclass(frozen=True)
class DeadlinesMissed:
    """The deadlines a forecast makes unreachable, one of them not yet said: what every waiting path reports.

    :param missed: each unreachable deadline and why, earliest first
    :param deadlines: every deadline, those in ``missed`` now marked ``warned``
    :param forecast: the forecast that said so
    """

    missed: tuple[tuple[DagDeadline, str], ...]
    deadlines: tuple[DagDeadline, ...]
    forecast: StartForecast

    @property
    def new(self) -> list[str]:
        """Why each deadline not warned of before is unreachable (said once each)."""
        return [words for d, words in self.missed if not d.warned]

    @property
    def message(self) -> str:
        """Every unreachable deadline's words, joined."""
        return "; ".join(words for _, words in self.missed)

    def fields(self) -> dict[str, Any]:
        """Return primitives: ``unreachable`` (``name``, ``at``, ``message``), ``deadlines``, ``forecast``."""
        return {
            "unreachable": [{"name": d.name, "at": d.at, "message": words} for d, words in self.missed],
            "deadlines": [d.to_dict() for d in self.deadlines],
            "forecast": self.forecast.to_dict(),
        }


def deadlines_missed(
    deadlines: Sequence[DagDeadline], forecast: StartForecast | None, now: float
) -> DeadlinesMissed | None:
    """Return what ``forecast`` makes unreachable when a deadline not warned of yet is among it; else None.

    The one check of the deferred trigger and of the task waiting in place.

    :param deadlines: the DAG run's deadlines (:func:`dag_deadlines`), with what was said already
    :param forecast: the waiting request's stored forecast
    :param now: the time the words are for
    """
    missed = tuple((d, words) for d in deadlines if (words := unreachable(d, forecast, now)))
    if forecast is None or all(d.warned for d, _ in missed):
        return None
    names = {d.name for d, _ in missed}
    return DeadlinesMissed(
        missed, tuple(replace(d, warned=d.warned or d.name in names) for d in deadlines), forecast
    )
