"""Server-rendered HTML of a team's console page: its grants, queue, quota against use, preemptions and actions.

Pure functions from ledger values to HTML strings; every ledger-provided string is escaped.
Action forms are plain ``POST`` forms carrying the user's form token (:mod:`.guard`); a user the
auth manager does not let act sees the page without them, and a note saying what acting needs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from airflow_gpupool.plugins.forecast import forecast_cell
from airflow_gpupool.plugins.holders import rid_link
from airflow_gpupool.plugins.page import duration, holder_html, table_html, team_colour

if TYPE_CHECKING:
    from airflow_gpupool.ledger import (
        ConsoleAction,
        HistoryEntry,
        NodeRecord,
        QuotaUse,
        Reservation,
        StartForecast,
    )

__all__ = ["TeamView", "team_html", "use_chart_svg"]


@dataclass(frozen=True)
class TeamView:
    """What one render of a team's page shows.

    :param token: the user's form token, or None when the user may not act
    :param priorities: the lowest and highest priority the console may give
    :param series: the team's GPUs held over time, ``(time, GPUs)`` steps
    :param nominal: the team's nominal GPUs summed over its flavors (None: no quota)
    """

    team: str
    now: float
    grants: Sequence[Reservation]
    queue: Sequence[Reservation]
    why: Mapping[str, str]
    forecasts: Mapping[str, StartForecast]
    quotas: Sequence[QuotaUse]
    series: Sequence[tuple[float, float]]
    since: float
    nominal: float | None
    preempted: Sequence[HistoryEntry]
    lost_gpu_seconds: float
    nodes: Sequence[NodeRecord]
    actions: Sequence[ConsoleAction]
    token: str | None
    priorities: tuple[int, int]
    ui_base: str = ""


def _form(action: str, target: str, token: str, button: str, extra: str = "", team: str = "") -> str:
    return (
        f'<form class="act" method="post" action="../actions/{action}">'
        f'<input type="hidden" name="target" value="{escape(target)}">'
        f'<input type="hidden" name="team" value="{escape(team)}">'
        f'<input type="hidden" name="csrf" value="{escape(token)}">{extra}'
        f'<button type="submit" data-action="{action}" data-target="{escape(target)}">{escape(button)}</button></form>'
    )


def _where(r: Reservation) -> str:
    g = r.grant
    if g is None:
        return ""
    slot = f"{g.mig_slice} ({g.mig_profile})" if g.mig_slice else ",".join(map(str, g.gpu_indices))
    pod = f" · pod {g.pod_namespace}/{g.pod_name}" if g.pod_name else ""
    return escape(f"{g.node} / GPU {slot}{pod}")


def _grants(v: TeamView) -> str:
    rows = []
    for r in v.grants:
        g = r.grant
        act = (
            f'<a class="act release" href="../reservations/{escape(r.id)}/release">release…</a>'
            if v.token and r.state.value != "external"
            else ""
        )
        rows.append(
            [
                rid_link(r.id, "../reservations/"),
                holder_html(r.holder, v.ui_base),
                escape(r.request.describe()),
                _where(r),
                duration(v.now - g.granted_at) if g else "",
                escape(r.state.value),
                act,
            ]
        )
    headers = ["ID", "Task", "Slice", "Where", "Held", "State", ""]
    return table_html(headers, rows, "This team holds no GPU now.", "grants")


def _queue(v: TeamView) -> str:
    low, high = v.priorities
    rows = []
    for r in v.queue:
        acts = ""
        if v.token:
            field = (
                f'<input type="number" name="priority" min="{low}" max="{high}" value="{min(max(r.request.priority, low), high)}" '
                f'aria-label="new priority of {escape(r.id)}">'
            )
            acts = _form("priority", r.id, v.token, "set priority", field) + _form(
                "cancel", r.id, v.token, "cancel"
            )
        rows.append(
            [
                str(r.position or ""),
                rid_link(r.id, "../reservations/"),
                holder_html(r.holder, v.ui_base),
                str(r.request.priority),
                escape(r.request.describe()),
                duration(v.now - r.created_at),
                forecast_cell(v.forecasts.get(r.id), v.now),
                f'<span class="why">{escape(v.why.get(r.id) or r.message)}</span>',
                acts,
            ]
        )
    headers = ["#", "ID", "Task", "Priority", "Asks", "Waiting", "Expected start", "Why it waits", ""]
    note = (
        f'<p class="note">The console gives priorities {low} to {high}; urgent work starts at {high + 1}.</p>'
    )
    return table_html(headers, rows, "Nothing of this team waits.", "queue") + (note if v.token else "")


def use_chart_svg(series: Sequence[tuple[float, float]], nominal: float | None, t0: float, t1: float) -> str:
    """Return an inline SVG of the GPUs a team held from ``t0`` to ``t1``, its nominal quota as a dashed line.

    :param series: ``(time, GPUs)`` steps
    :param nominal: the nominal quota in GPUs (None: none drawn)
    """
    w, h = 600, 140
    top = max([v for _t, v in series] + [nominal or 0.0, 1.0]) * 1.1
    span = (t1 - t0) or 1.0

    def y(v: float) -> float:
        return h - v / top * h

    points = " ".join(f"{(t - t0) / span * w:.1f},{y(v):.1f}" for t, v in series)
    line = f'<polyline class="alloc" points="{points}"/>'
    if nominal is not None:
        line += f'<line class="nominal" x1="0" x2="{w}" y1="{y(nominal):.1f}" y2="{y(nominal):.1f}"/>'
    peak = max((v for _t, v in series), default=0.0)
    quota = f" · nominal {nominal:g} GPUs (dashed)" if nominal is not None else " · no quota stored"
    clock = "%d %b %H:%M" if t1 - t0 > 86400 else "%H:%M"
    return (
        f'<svg class="chart use" viewBox="0 0 {w} {h}" preserveAspectRatio="none" role="img" '
        f'aria-label="GPUs held over the last {duration(t1 - t0)}">{line}</svg>'
        f'<div class="legend">GPUs held, peak {peak:g}{quota} · {time.strftime(clock, time.gmtime(t0))} to '
        f"{time.strftime(clock, time.gmtime(t1))} UTC</div>"
    )


def _quotas(v: TeamView) -> str:
    rows = [
        [escape(q.flavor), f"{q.nominal:g}", f"{q.held:g}", f"{q.borrowed:g}", f"{q.lent:g}"]
        for q in v.quotas
    ]
    table = table_html(
        ["Flavor", "Nominal", "Held", "Borrowed", "Lent"], rows, "No quota stored for this team.", "quotas"
    )
    return use_chart_svg(v.series, v.nominal, v.since, v.now) + table


def _preempted(v: TeamView) -> str:
    rows = [
        [
            rid_link(e.id, "../reservations/"),
            holder_html(e.holder, v.ui_base),
            escape(e.requested),
            "" if e.held is None else duration(e.held),
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(e.ended_at)) if e.ended_at else "",
            escape(e.message),
        ]
        for e in v.preempted
    ]
    lost = f'<p class="lost-total">Work lost to preemption: <b class="lost">{v.lost_gpu_seconds:,.0f}</b> GPU-seconds</p>'
    headers = ["ID", "Task", "Asked", "Held", "Ended", "Why"]
    return lost + table_html(headers, rows, "No grant of this team was preempted in the range.", "preempted")


def _nodes(v: TeamView) -> str:
    rows = []
    for n in v.nodes:
        acts = ""
        if v.token:
            acts = "".join(
                _form(a, n.name, v.token, a, team=v.team)
                for a in ("cordon", "drain", "uncordon")
                if (a == "uncordon") == (n.health != "healthy")
            )
        why = f" · {n.health_reason}" if getattr(n, "health_reason", None) else ""
        rows.append(
            [
                escape(n.name),
                escape(n.node_pool),
                f'<span class="badge h-{escape(n.health)}">{escape(n.health)}</span>{escape(why)}',
                acts,
            ]
        )
    return table_html(
        ["Node", "Pool", "Health", ""], rows, "This team holds nothing on any node.", "node-health"
    )


def _actions(v: TeamView) -> str:
    rows = [
        [
            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(a.at)),
            escape(a.actor),
            escape(a.action),
            escape(a.target),
            escape(a.detail),
        ]
        for a in v.actions
    ]
    return table_html(
        ["When", "Who", "Action", "On", "What it did"],
        rows,
        "Nobody acted on this team's work yet.",
        "actions",
    )


def team_html(v: TeamView, flash: str | None = None, error: str | None = None, permission: str = "") -> str:
    """Return the body of a team's page.

    :param flash: what the last action did
    :param error: why the last action was refused
    :param permission: what acting needs, said to a user who may not
    """
    notes = f'<p class="flash" role="status">{escape(flash)}</p>' if flash else ""
    notes += f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    if v.token is None:
        notes += f'<p class="readonly">You may look but not act: acting needs {escape(permission)}.</p>'
    dot = f'<span class="dot" style="background:{team_colour(v.team)}"></span>'
    return (
        f'<div class="console"><section class="team" data-team="{escape(v.team)}"><h2>{dot}Team {escape(v.team)}</h2>'
        f'<p><a href="../">back to the GPU pool</a></p>{notes}</section>'
        f'<section class="grants"><h2>Grants ({len(v.grants)})</h2>{_grants(v)}</section>'
        f'<section class="queue"><h2>Queue ({len(v.queue)})</h2>{_queue(v)}</section>'
        f'<section class="quota"><h2>Quota against use</h2>{_quotas(v)}</section>'
        f'<section class="preemptions"><h2>Preemptions and lost work</h2>{_preempted(v)}</section>'
        f'<section class="team-nodes"><h2>Nodes it runs on</h2>{_nodes(v)}</section>'
        f'<section class="actions"><h2>Actions</h2>{_actions(v)}</section></div>'
    )
