"""Server-rendered HTML of the page's history (filters, pages) and its use per team and pool.

Pure functions from ledger values to HTML strings; every ledger-provided string is escaped.
The filters are a plain ``GET`` form: the page is its own action, so a filtered view is a URL
(shareable, and what the page's refresh fetches again), and forms work in Airflow's sandboxed iframe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from airflow_gpupool.ledger import RANGES, HistoryFilter, ReservationState
from airflow_gpupool.plugins.holders import rid_link, run_link, team_link
from airflow_gpupool.plugins.page import duration, holder_html, queued_ahead_mark, table_html, team_colour

if TYPE_CHECKING:
    from airflow_gpupool.ledger import HistoryEntry, PreemptionLoss, UsageReport

#: History rows per page.
PAGE_SIZE = 50

#: Short definitions of the page's terms, shown where the terms are.
TERMS = {
    "Allocation": "the share of all GPU compute held by grants (a MIG slice or a fraction counts its part).",
    "Fragmentation": "the share of free GPU compute that the typical requests (the shapes of the live grants "
    "and the queue) cannot use where it is: free, but in pieces too small or on nodes that lack CPU or memory.",
    "MIG slice": "a hardware partition of an A100/H100 (3g.40gb: 3 of 7 compute slices and 40 GB); "
    "the bar shows its compute part (3g).",
    "GPU-hours": "GPUs held × hours held in the range (a quarter GPU for 4 h is 1 GPU-hour; a MIG slice "
    "counts its compute share, 3g.40gb = 3/7 of an A100).",
    "Share": "this team's or pool's part of all GPU-hours used in the range.",
    "Utilization": "GPU-hours held in the pool over its GPUs × the range's hours.",
    "Preempted": "this team's grants that ended preempted in the range (taken back for more urgent work).",
    "Lost GPU-s": "work lost to those preemptions: each grant's GPUs (a MIG slice its compute share) × the "
    "seconds from its newest checkpoint reported to the ledger (its grant when none) to its end.",
    "Nominal": "the GPUs a team's quota guarantees in a flavor (a node pool or a GPU model).",
    "Borrowed": "GPUs held above nominal now, lent by other teams of the cohort while they do not use them.",
    "Lent": "the part of this team's unused nominal (within its lending limit) that its cohort borrows now, "
    "split among the cohort's lenders by what each may lend.",
    "GPU use now": "mean SM utilization that the node agents last reported for the GPUs this team holds "
    "(– where no agent reports): reserved against used.",
    "Waited": "from the request to its grant (or to its end when never granted).",
    "Held": "from the grant to the release, expiry or now.",
}


@dataclass(frozen=True)
class PageView:
    """What the page's query parameters chose: the range, the history's filter and page."""

    range_name: str = "24h"
    where: HistoryFilter = HistoryFilter()
    page: int = 1
    opened: tuple[str, ...] = ()
    all_rows: bool = False

    @property
    def hours(self) -> float:
        """The range in hours."""
        return RANGES[self.range_name]

    def query(self, **change: object) -> str:
        """Return the query string of this view with ``change`` applied (``?range=7d&team=nlp``)."""
        params: dict[str, object] = {
            "range": self.range_name,
            **self.where.to_dict(),
            "page": self.page,
            "open": list(self.opened),
            "rows": "all" if self.all_rows else None,
        }
        params.update(change)
        return "?" + urlencode(
            {k: v for k, v in params.items() if v not in (None, "", 1) or k == "range"}, doseq=True
        )


def definitions_html(terms: Sequence[str]) -> str:
    """Return the definitions of ``terms`` (keys of :data:`TERMS`) as a small list."""
    items = "".join(f"<dt>{escape(t)}</dt><dd>{escape(TERMS[t])}</dd>" for t in terms)
    return f'<details class="terms"><summary>What these mean</summary><dl>{items}</dl></details>'


def _range_links(view: PageView) -> str:
    links = [
        f'<a href="{escape(view.query(range=name, page=None))}" class="range{" on" if name == view.range_name else ""}">{name}</a>'
        for name in RANGES
    ]
    return f'<nav class="ranges" aria-label="time range">{"".join(links)}</nav>'


def _gpus(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def usage_html(report: UsageReport, view: PageView) -> str:
    """Return the use per team and per node pool over the range, and the quotas next to it."""
    teams = [
        [
            f'<span class="dot" style="background:{team_colour(t)}"></span>{team_link(t)}',
            f"{h:.2f}",
            f"{report.share(h):.1%}",
            f"{report.team_utilization[t]:.0%}" if t in report.team_utilization else "–",
            *_preempted_cells(report.preempted.get(t)),
        ]
        for t, h in report.by_team().items()
    ]
    pools = [
        [
            escape(p),
            str(report.pool_gpus.get(p, 0)),
            f"{h:.2f}",
            f"{report.share(h):.1%}",
            f"{report.utilization(p):.1%}",
        ]
        for p, h in report.by_pool().items()
    ]
    quotas = [
        [
            escape(q.team),
            escape(q.flavor),
            _gpus(q.nominal),
            _gpus(q.held),
            f'<b class="borrowed">{_gpus(q.borrowed)}</b>' if q.borrowed else "0",
            _gpus(q.unused),
            _gpus(q.lent),
        ]
        for q in report.quotas
    ]
    quota_table = (
        "<h3>Quotas now</h3>"
        + table_html(
            ["Team", "Flavor", "Nominal", "Held", "Borrowed", "Unused", "Lent"], quotas, "", "quotas"
        )
        if quotas
        else ""
    )
    return (
        f"{_range_links(view)}"
        f'<div class="usage-grid"><div><h3>By team ({report.total:.2f} GPU-hours)</h3>'
        f"{table_html(['Team', 'GPU-hours', 'Share', 'GPU use now', 'Preempted', 'Lost GPU-s'], teams, 'No GPU held in this range.', 'by-team')}</div>"
        f"<div><h3>By node pool</h3>"
        f"{table_html(['Pool', 'GPUs', 'GPU-hours', 'Share', 'Utilization'], pools, 'No node pools.', 'by-pool')}</div></div>"
        f"{quota_table}"
        f"{definitions_html(['GPU-hours', 'Share', 'Utilization', 'GPU use now', 'Preempted', 'Lost GPU-s', 'Nominal', 'Borrowed', 'Lent'])}"
    )


def _preempted_cells(loss: PreemptionLoss | None) -> list[str]:
    if loss is None:
        return ["0", "0"]
    return [str(loss.preemptions), f'<b class="lost">{loss.lost_gpu_seconds:,.0f}</b>']


def _select(name: str, label: str, options: Sequence[str], chosen: Sequence[str]) -> str:
    opts = "".join(
        f'<option value="{escape(o)}"{" selected" if o in chosen else ""}>{escape(o)}</option>'
        for o in options
    )
    return (
        f'<label>{escape(label)} <select name="{name}"><option value="">any</option>{opts}</select></label>'
    )


def filters_html(view: PageView, facets: Mapping[str, Sequence[str]]) -> str:
    """Return the history's filter form (team, pool, state, DAG), keeping the chosen range."""
    w = view.where
    states = [s.value for s in ReservationState]
    return (
        '<form class="filters" method="get" action="">'
        f'<input type="hidden" name="range" value="{escape(view.range_name)}">'
        + "".join(f'<input type="hidden" name="open" value="{escape(o)}">' for o in view.opened)
        + f"{_select('team', 'Team', facets.get('team', ()), [w.team or ''])}"
        f"{_select('pool', 'Pool', facets.get('pool', ()), [w.pool or ''])}"
        f"{_select('state', 'State', states, w.states)}"
        f"{_select('dag_id', 'DAG', facets.get('dag_id', ()), [w.dag_id or ''])}"
        '<button type="submit">Filter</button>'
        f'<a href="{escape(PageView(view.range_name, opened=view.opened).query())}">clear</a></form>'
    )


def _outcome(e: HistoryEntry) -> str:
    failed = f' <span class="failure">{escape(e.failure_class)}</span>' if e.failure_class else ""
    ahead = " " + queued_ahead_mark(e.not_before) if e.not_before is not None else ""
    return f'<span class="state s-{escape(e.state)}">{escape(e.state)}</span>{failed}{ahead}'


def history_html(
    entries: Sequence[HistoryEntry],
    total: int,
    view: PageView,
    facets: Mapping[str, Sequence[str]],
    ui_base: str,
) -> str:
    """Return the filter form, one page of the history and the links to the other pages.

    :param entries: the page's entries, newest first
    :param total: how many entries the filter matches
    :param view: the page's range, filter and page number
    :param facets: the values each filter offers
    :param ui_base: the Airflow UI's path prefix
    """
    rows = [
        [
            rid_link(e.id),
            holder_html(e.holder, ui_base) + run_link(e.holder),
            str(e.try_number or ""),
            f'<span class="dot" style="background:{team_colour(e.team)}"></span>{escape(e.team)}',
            escape(e.pool or ""),
            escape(e.requested),
            duration(e.waited),
            "" if e.held is None else duration(e.held),
            _outcome(e),
            escape(e.message),
        ]
        for e in entries
    ]
    headers = ["ID", "Task", "Try", "Team", "Pool", "Requested", "Waited", "Held", "Outcome", "Message"]
    pages = max(1, -(-total // PAGE_SIZE))
    nav = ""
    if pages > 1:
        prev = (
            f'<a rel="prev" href="{escape(view.query(page=view.page - 1))}">newer</a>'
            if view.page > 1
            else ""
        )
        nxt = (
            f'<a rel="next" href="{escape(view.query(page=view.page + 1))}">older</a>'
            if view.page < pages
            else ""
        )
        nav = f'<nav class="pages">{prev} page {view.page} of {pages} ({total} reservations) {nxt}</nav>'
    return (
        f"{filters_html(view, facets)}"
        f"{table_html(headers, rows, 'No reservation matches.', 'history')}{nav}"
        f"{definitions_html(['Waited', 'Held'])}"
    )
