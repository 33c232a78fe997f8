"""A DAG's Airflow deadlines read on the worker, and whether a forecast makes them unreachable."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG, AsyncCallback, DeadlineAlert, DeadlineReference

from airflow_gpupool.forecast.deadlines import DagDeadline, dag_deadlines, deadlines_missed, unreachable
from airflow_gpupool.ledger import StartForecast
from airflow_gpupool.notifiers.deadline import log_missed_deadline

LOGICAL = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
STARTED = datetime(2026, 12, 7, 10, 5, tzinfo=UTC)
FIXED = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def alert(reference: object, minutes: int, name: str | None = None) -> DeadlineAlert:
    return DeadlineAlert(
        reference=reference,  # type: ignore[arg-type]
        interval=timedelta(minutes=minutes),
        callback=AsyncCallback(log_missed_deadline),
        name=name,
    )


def context(*alerts: DeadlineAlert, logical_date: datetime | None = LOGICAL) -> dict[str, object]:
    dag = DAG("d", schedule=None, deadline=list(alerts) or None)
    return {"dag": dag, "dag_run": SimpleNamespace(logical_date=logical_date, start_date=STARTED)}


def test_each_reference_the_worker_can_evaluate_earliest_first(caplog: pytest.LogCaptureFixture) -> None:
    ctx = context(
        alert(DeadlineReference.DAGRUN_QUEUED_AT, 60, "queued + 1 h"),
        alert(DeadlineReference.DAGRUN_LOGICAL_DATE, 30),
        alert(DeadlineReference.FIXED_DATETIME(FIXED), 0, "fixed"),
        alert(DeadlineReference.AVERAGE_RUNTIME(), 10, "average"),
    )
    with caplog.at_level(logging.INFO):
        deadlines = dag_deadlines(ctx, logging.getLogger("t"))
    assert deadlines == [
        DagDeadline("fixed", FIXED.timestamp()),
        DagDeadline("DagRunLogicalDateDeadline + 0:30:00", (LOGICAL + timedelta(minutes=30)).timestamp()),
        DagDeadline("queued + 1 h", (STARTED + timedelta(hours=1)).timestamp()),
    ]
    assert "Deadline average is not compared with the GPU forecast" in caplog.text


def test_no_deadline_and_no_logical_date_give_nothing() -> None:
    log = logging.getLogger("t")
    assert dag_deadlines(context(), log) == []
    assert (
        dag_deadlines(context(alert(DeadlineReference.DAGRUN_LOGICAL_DATE, 5), logical_date=None), log) == []
    )


def test_round_trip() -> None:
    d = DagDeadline("x", 12.5, warned=True)
    assert DagDeadline.from_dict(d.to_dict()) == d


NOW = 1_000_000.0
DUE = DagDeadline("in an hour", NOW + 3600)


def forecast(p10: float | None, status: str = "forecast") -> StartForecast:
    if p10 is None:
        return StartForecast("r", NOW, status, reason="never, on the current nodes")
    return StartForecast("r", NOW, status, p10, p10 + 600, p10 + 1200, 1, 1, "replays")


@pytest.mark.parametrize(
    ("case", "verdict"),
    [
        ("p10 before the deadline", None),
        ("p10 exactly at the deadline", None),
        ("no forecast yet", None),
        ("unknown", None),
        ("p10 past the deadline", "cannot start before the DAG's deadline 'in an hour'"),
        ("never", "cannot start before the DAG's deadline 'in an hour' ("),
    ],
)
def test_unreachable_only_when_even_p10_is_late(case: str, verdict: str | None) -> None:
    f = {
        "p10 before the deadline": forecast(NOW + 3000),
        "p10 exactly at the deadline": forecast(NOW + 3600),
        "no forecast yet": None,
        "unknown": StartForecast("r", NOW, "unknown", reason="gangs are not forecast yet"),
        "p10 past the deadline": forecast(NOW + 3601),
        "never": forecast(None, "never"),
    }[case]
    words = unreachable(DUE, f, NOW)
    if verdict is None:
        assert words is None
        return
    assert words is not None and words.startswith(verdict)
    if case == "never":
        assert words.endswith(": never, on the current nodes")
    else:
        assert "(10 %), is later; expected start" in words


def test_the_callback_says_which_run_missed() -> None:
    import asyncio

    ctx = {"dag_run": {"dag_id": "d", "dag_run_id": "r1"}, "deadline": {"deadline_time": "2026-12-07T11:00"}}
    line = asyncio.run(log_missed_deadline(ctx, team="recsys"))
    assert line == "DAG run d/r1 missed its deadline 2026-12-07T11:00 (team=recsys)"


LATER = DagDeadline("in a day", NOW + 86400)


def test_deadlines_missed_says_each_deadline_once() -> None:
    late = forecast(NOW + 7200)  # past the hour, before the day
    first = deadlines_missed([DUE, LATER], late, NOW)
    assert first is not None
    assert [d.name for d, _ in first.missed] == ["in an hour"]
    assert first.new == [first.message] and first.message.startswith("cannot start before the DAG's deadline")
    assert first.deadlines == (DagDeadline(DUE.name, DUE.at, warned=True), LATER)
    assert first.fields() == {
        "unreachable": [{"name": "in an hour", "at": DUE.at, "message": first.message}],
        "deadlines": [d.to_dict() for d in first.deadlines],
        "forecast": late.to_dict(),
    }
    # Said already: nothing more, the same forecast or a later one that misses no other deadline.
    assert deadlines_missed(first.deadlines, late, NOW) is None
    assert deadlines_missed(first.deadlines, forecast(NOW + 9000), NOW) is None
    # A forecast that now misses the day too: only the day is new, both are listed.
    both = deadlines_missed(first.deadlines, forecast(NOW + 90000), NOW)
    assert both is not None
    assert [d.name for d, _ in both.missed] == ["in an hour", "in a day"]
    assert len(both.new) == 1 and both.new[0].startswith("cannot start before the DAG's deadline 'in a day'")
    assert all(d.warned for d in both.deadlines)


@pytest.mark.parametrize(
    "f",
    [None, forecast(NOW + 60), StartForecast("r", NOW, "unknown", reason="gangs are not forecast yet")],
    ids=["no forecast", "reachable", "unknown"],
)
def test_deadlines_missed_is_none_while_every_deadline_may_be_met(f: StartForecast | None) -> None:
    assert deadlines_missed([DUE, LATER], f, NOW) is None
    assert deadlines_missed([], forecast(None, "never"), NOW) is None
