"""What the page writes for people: task tries, MIG slices, the chart's time axis, the view's URL."""

from __future__ import annotations

import time

import pytest

from airflow_gpupool.ledger import HistoryFilter
from airflow_gpupool.plugins.history import PageView
from airflow_gpupool.plugins.page import chart_svg, holder_html, task_label, time_ticks
from airflow_gpupool.task_try import TaskTry

T = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


@pytest.mark.parametrize(
    ("holder", "label"),
    [
        pytest.param("train/fit/manual__1/map--1/try-1@vm", "train / fit · try 1", id="unmapped"),
        pytest.param("embed/enc/sched__1/map-3/try-2@w", "embed / enc [3] · try 2", id="mapped"),
    ],
)
def test_a_task_try_reads_as_dag_task_and_try(holder: str, label: str) -> None:
    ref = TaskTry.from_holder(holder)
    assert ref is not None and task_label(ref) == label
    assert f">{label}</a>" in holder_html(holder, "")


def test_a_holder_that_is_no_task_stays_as_it_is() -> None:
    assert holder_html("notebook@laptop", "") == '<span class="holder">notebook@laptop</span>'


@pytest.mark.parametrize(
    ("span", "step"),
    [
        pytest.param(200, 60, id="minutes"),
        pytest.param(6 * 3600, 3600, id="hours"),
        pytest.param(7 * 86400, 86400 * 2, id="a-week"),
    ],
)
def test_time_ticks_are_round_and_at_most_six(span: float, step: float) -> None:
    ticks = time_ticks(T + 7, T + 7 + span)
    assert 1 <= len(ticks) <= 6
    assert all(t % step == 0 for t in ticks) and ticks == sorted(ticks)
    assert T + 7 <= ticks[0] and ticks[-1] <= T + 7 + span


def test_the_chart_has_a_time_axis_and_percent_axis() -> None:
    svg = chart_svg([(T, 0.5), (T + 3600, 0.25)], [], T, T + 3600)
    for at in (T, T + 1800, T + 3600):
        assert f">{time.strftime('%H:%M', time.gmtime(at))}</span>" in svg
    assert ">25%</text>" in svg and ">75%</text>" in svg and "0–100 %" in svg


def test_the_view_is_a_url_that_keeps_the_range_and_filters() -> None:
    view = PageView("7d", HistoryFilter(team="nlp", states=("released", "expired")), 2)
    assert view.query() == "?range=7d&team=nlp&state=released&state=expired&page=2"
    assert view.query(page=1) == "?range=7d&team=nlp&state=released&state=expired"
