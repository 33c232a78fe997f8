"""The console's routes on the plugin app: a team's page, a release's confirmation and the actions.

A form post answers ``303 See Other`` back to the team's page with what it did (``?done=``);
a refused one answers its status (403, 404, 409, 422, 400) with a plain page saying why and a
link back, so a person sees the reason and a client reads the status.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Annotated, Any, Protocol
from urllib.parse import quote, urlencode

# FastAPI reads the routes' annotations at runtime: what they name is imported here, and this
# module is imported only when the app is built (see plugins.gpupool._LazyApp).
from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from airflow_gpupool.exceptions import ConsoleActionRefusedError
from airflow_gpupool.plugins.console.actions import ActionForm, perform, pod_fate, priority_range
from airflow_gpupool.plugins.console.guard import (
    PERMISSION,
    actor_name,
    check_form,
    form_token,
    may_act,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

    from airflow_gpupool.ledger import Ledger, LedgerSnapshot
    from airflow_gpupool.plugins.console.team_page import TeamView

__all__ = ["add_console"]

#: The signed-in user, as Airflow's login resolves it.
CurrentUser = Annotated[Any, Depends(get_user)]
#: Preempted grants and actions a team's page lists (newest first).
_LISTED = 50


class ConsoleState(Protocol):
    """What the console needs of the app's state: the ledger, its cached reading, and a way to drop it."""

    def ledger(self) -> Ledger: ...
    def snapshot(self) -> tuple[LedgerSnapshot, float]: ...
    def explanations(self, snapshot: LedgerSnapshot) -> dict[str, str]: ...
    def invalidate(self) -> None: ...


def add_console(app: FastAPI, state: ConsoleState, render: Any) -> None:
    """Add the console's routes to ``app``.

    :param state: the app's ledger and cached reading
    :param render: wraps a body in the page's document (``plugins.app.render_page``)
    """

    @app.get("/teams/{team}", response_class=HTMLResponse)
    def team_page(
        request: Request,
        team: str,
        user: CurrentUser,
        done: Annotated[str | None, Query(max_length=500)] = None,
        error: Annotated[str | None, Query(max_length=500)] = None,
        range_name: Annotated[str, Query(alias="range")] = "24h",
        partial: bool = False,
    ) -> HTMLResponse:
        from airflow_gpupool.ledger import RANGES
        from airflow_gpupool.plugins.console.team_page import team_html

        if range_name not in RANGES:
            raise HTTPException(422, f"range={range_name!r}: choose one of {', '.join(RANGES)}")
        view = _team_view(state, team, RANGES[range_name], _ui_base(request), user)
        body = team_html(view, done, error, PERMISSION)
        return HTMLResponse(body if partial else render(body, f"GPU pool · {team}"))

    @app.get("/reservations/{reservation_id}/release", response_class=HTMLResponse)
    def confirm_release(reservation_id: str, user: CurrentUser) -> HTMLResponse:
        if not may_act(user):
            return _refused(
                ConsoleActionRefusedError(
                    403, f"{actor_name(user)} may not release grants: it needs {PERMISSION}"
                ),
                render,
            )
        r = state.ledger().get_or_none(reservation_id)
        if r is None or not r.state.holds:
            what = "no reservation" if r is None else f"reservation {r.state.value}, not a grant:"
            return _refused(
                ConsoleActionRefusedError(404 if r is None else 409, f"{what} {reservation_id}"), render
            )
        body = (
            f'<section class="confirm"><h2>Release grant <code>{escape(r.id)}</code> of team {escape(r.request.team)}?</h2>'
            f'<p class="fate">{escape(pod_fate(r))}</p>'
            f'<form class="act" method="post" action="../../actions/release">'
            f'<input type="hidden" name="target" value="{escape(r.id)}">'
            f'<input type="hidden" name="csrf" value="{escape(form_token(user))}">'
            f'<input type="hidden" name="confirm" value="yes">'
            f'<button type="submit" data-action="release">Release it</button></form>'
            f'<p><a href="../../teams/{escape(quote(r.request.team, safe=""))}">keep it</a></p></section>'
        )
        return HTMLResponse(render(body, "GPU pool · release"))

    @app.post("/actions/{action}", response_model=None)
    def act(
        request: Request,
        action: str,
        user: CurrentUser,
        target: Annotated[str, Form(max_length=253)] = "",
        team: Annotated[str | None, Form(max_length=253)] = None,
        priority: Annotated[str | None, Form(max_length=32)] = None,
        confirm: Annotated[str | None, Form(max_length=8)] = None,
        reason: Annotated[str | None, Form(max_length=500)] = None,
        csrf: Annotated[str | None, Form(max_length=128)] = None,
    ) -> Response:
        try:
            if not may_act(user):
                raise ConsoleActionRefusedError(
                    403, f"{actor_name(user)} may not act on the GPU pool: it needs {PERMISSION}"
                )
            check_form(request, user, csrf)
            form = ActionForm(
                target=target, team=team or None, priority=priority, confirm=confirm, reason=reason
            )
            result = perform(state.ledger(), action, form, actor_name(user))
        except ConsoleActionRefusedError as e:
            return _refused(e, render)
        state.invalidate()
        where = f"{_root(request)}/teams/{quote(result.team, safe='')}?{urlencode({'done': result.message[:500]})}"
        return RedirectResponse(where, status_code=303)


def _refused(e: ConsoleActionRefusedError, render: Any) -> HTMLResponse:
    body = (
        f'<section class="refused"><h2>Not done</h2><p class="error" role="alert">{escape(e.message)}</p>'
        f'<p><a href="javascript:history.back()">back</a></p></section>'
    )
    return HTMLResponse(render(body, "GPU pool · not done"), status_code=e.status)


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _ui_base(request: Request) -> str:
    from airflow_gpupool.plugins import URL_PREFIX

    root = _root(request)
    return root[: -len(URL_PREFIX)] if root.endswith(URL_PREFIX) else ""


def _team_view(state: ConsoleState, team: str, hours: float, ui_base: str, user: Any) -> TeamView:
    from airflow_gpupool.ledger import (
        HistoryFilter,
        LedgerActions,
        LedgerForecasts,
        LedgerHistory,
        allocation_series,
        held_spans,
        usage_report,
    )
    from airflow_gpupool.plugins.console.team_page import TeamView

    ledger = state.ledger()
    snapshot, _ = state.snapshot()
    now = snapshot.taken_at
    since = now - hours * 3600
    grants = [r for r in snapshot.grants if r.request.team == team]
    queue = [r for r in snapshot.queue if r.request.team == team]
    report = usage_report(ledger, snapshot, hours)
    quotas = [q for q in report.quotas if q.team == team]
    loss = report.preempted.get(team)
    held_on = {r.grant.node for r in grants if r.grant}
    spans = held_spans(ledger.url, since, team)
    starts = [s.start for s in spans if s.start > since]
    if starts and len(starts) == len(spans):
        # Everything happened inside the range: zoom to it, as the overview's chart does.
        since = max(since, min(starts) - max(60.0, (now - min(starts)) * 0.05))
    return TeamView(
        team=team,
        now=now,
        grants=grants,
        queue=queue,
        why={**{r.id: r.message for r in queue}, **state.explanations(snapshot)},
        forecasts=LedgerForecasts(ledger).get_many([r.id for r in queue]),
        quotas=quotas,
        series=allocation_series(spans, 1000, since, now),
        since=since,
        nominal=sum(q.nominal for q in quotas) if quotas else None,
        preempted=LedgerHistory(ledger).entries(HistoryFilter(team, states=("preempted",)), limit=_LISTED),
        lost_gpu_seconds=loss.lost_gpu_seconds if loss else 0.0,
        nodes=[n for n in snapshot.nodes if n.name in held_on or n.health != "healthy"],
        actions=LedgerActions(ledger).entries(team, limit=_LISTED),
        token=form_token(user) if may_act(user) else None,
        priorities=priority_range(ledger),
        ui_base=ui_base,
    )
