"""Server-rendered HTML of one DAG run's GPU steps as one chain, and the history's link to it.

The page (``/gpupool/run?dag_id=&run_id=``, routed in :mod:`~airflow_gpupool.plugins.app`) shows
a strip of the steps with what joined each to the next (handed on, a gap), the steps' markers
(queued ahead, handed on, admitted as a run), then a table of every step. Pure functions from a
:class:`~airflow_gpupool.run_chain.RunChain` to HTML; every ledger-provided string is escaped.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from airflow_gpupool.plugins.holders import rid_link
from airflow_gpupool.plugins.page import duration, queued_ahead_mark, table_html

if TYPE_CHECKING:
    from airflow_gpupool.run_chain import RunChain, RunStep

__all__ = ["TERMS", "run_html"]

#: The chain's terms, as the page defines them.
TERMS = {
    "Gap": "from the latest end of the steps before it to this step's grant: the wait between steps "
    "(none for a parallel branch granted while the steps before it still ran).",
    "Handed on": "the ending step passed the part of its slice the next step needs to it, instead of "
    "releasing it (same node, no wait in the queue).",
    "Queued ahead": "the step entered the queue before its upstream ended: it keeps its place, but is "
    "not granted before its time.",
    "Admitted as a run": "the run's first GPU step was granted only once the whole run's peak fit.",
}


def _marks(step: RunStep) -> str:
    marks = []
    if step.queued_ahead:
        marks.append(queued_ahead_mark(step.not_before))
    if step.handed_on_from:
        marks.append(f'<span class="mark handed-from">handed on from {escape(step.handed_on_from)}</span>')
    if step.handed_on_to:
        marks.append(f'<span class="mark handed-to">handed on to {escape(step.handed_on_to)}</span>')
    if step.admitted_as_run:
        marks.append('<span class="mark admitted">admitted as a run</span>')
    return " ".join(marks)


def _joint(step: RunStep) -> str:
    """What joins a step to the one before it in the strip: a hand-on, a gap, or an overlap."""
    if step.handed_on_from:
        return '<li class="joint handed" title="the slice was handed on">handed on →</li>'
    if step.gap_before is not None:
        return f'<li class="joint gap" title="from the latest end of the steps before to this grant">gap {duration(step.gap_before)} →</li>'
    return '<li class="joint">→</li>'


def _strip(chain: RunChain) -> str:
    items = []
    for i, s in enumerate(chain.steps):
        if i:
            items.append(_joint(s))
        where = f"{s.node} · {s.gpus}" if s.node else "not granted"
        items.append(
            f'<li class="step s-{escape(s.state)}" data-reservation="{escape(s.reservation_id)}">'
            f'<b>{escape(s.task)}</b> · try {s.try_number}<br><span class="state s-{escape(s.state)}">'
            f"{escape(s.state)}</span> {escape(where)}<br>{_marks(s)}</li>"
        )
    return f'<ol class="chain">{"".join(items)}</ol>'


def run_html(chain: RunChain) -> str:
    """Return the body of a run's page: the chain's strip, its totals and a table of its steps.

    :param chain: the run's chain (:func:`~airflow_gpupool.run_chain.run_chain`)
    """
    rows = [
        [
            str(i),
            rid_link(s.reservation_id, "reservations/"),
            escape(s.task),
            str(s.try_number),
            f'<span class="state s-{escape(s.state)}">{escape(s.state)}</span>',
            escape(s.requested),
            escape(f"{s.node} / {s.gpus}" if s.node else ""),
            duration(s.waited),
            "" if s.gap_before is None else duration(s.gap_before),
            "" if s.held is None else duration(s.held),
            _marks(s),
            escape(s.message),
        ]
        for i, s in enumerate(chain.steps, 1)
    ]
    headers = [
        "#",
        "ID",
        "Task",
        "Try",
        "State",
        "Asked for",
        "Where",
        "Waited",
        "Gap",
        "Held",
        "Chain",
        "Message",
    ]
    admitted = " · admitted as a run" if chain.admitted_as_run else ""
    terms = "".join(f"<dt>{escape(t)}</dt><dd>{escape(d)}</dd>" for t, d in TERMS.items())
    return (
        f'<section class="run" data-dag="{escape(chain.dag_id)}" data-run="{escape(chain.run_id)}">'
        f"<h2>Run <code>{escape(chain.run_id)}</code> of {escape(chain.dag_id)}: its GPU steps</h2>"
        f'<p><a href="./">back to the GPU pool</a></p>'
        f'<p class="totals">{len(chain.steps)} steps · {chain.handed_on} handed on · '
        f"gaps {duration(chain.gap_seconds)} · first request to last end {duration(chain.span)}{admitted}</p>"
        f"{_strip(chain)}"
        f"{table_html(headers, rows, 'No GPU steps.', 'run-steps')}"
        f'<details class="terms"><summary>What these mean</summary><dl>{terms}</dl></details></section>'
    )
