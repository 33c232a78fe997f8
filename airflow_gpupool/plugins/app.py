"""The GPU pool FastAPI app: the page, its JSON API and ``/metrics``, behind Airflow's login.

Mounted by :class:`~airflow_gpupool.plugins.gpupool.GpuPoolPlugin` at ``/gpupool`` on the
Airflow API server:

* ``GET /gpupool/`` the page (``?partial=1``: only its body, for the page's refresh; ``range``,
  ``team``, ``pool``, ``state``, ``dag_id`` and ``page`` choose the use's range and the history;
  ``open=<pool>`` (or ``*``) opens node pools of the map, ``rows=all`` shows every grant and waiter)
* ``GET /gpupool/api/v1/snapshot`` nodes, GPUs, grants (a preempting one's ``preempt_seconds_left``)
  and the queue (with why each waits)
* ``GET /gpupool/api/v1/history?limit=&offset=&team=&pool=&state=&dag_id=`` the history, newest first
* ``GET /gpupool/api/v1/usage?range=1h|24h|7d`` GPU-hours and share per team and pool, quotas
* ``GET /gpupool/api/v1/series?hours=`` allocation and fragmentation over time
* ``GET /gpupool/api/v1/explain/{reservation_id}`` why a reservation waits or how it ended
* ``GET /gpupool/run?dag_id=&run_id=`` one DAG run's GPU steps as one chain (handed on, queued
  ahead, gaps); ``GET /gpupool/api/v1/run?dag_id=&run_id=`` the same as JSON
* ``GET /gpupool/metrics`` Prometheus exposition
* the console (:mod:`airflow_gpupool.plugins.console`): ``GET /gpupool/teams/{team}``, a release's
  confirmation, ``POST /gpupool/actions/{action}`` behind the auth manager's pool permission

Every route needs an authenticated Airflow user: Airflow's own ``get_user`` dependency
reads the JWT from ``Authorization: Bearer`` or the UI's ``_token`` cookie (which the
browser sends to the page embedded in the Airflow UI), and answers 401 without one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

# FastAPI reads the route functions' annotations at runtime: what they name is imported here,
# and this module is imported only when the app is built (see plugins.gpupool._LazyApp).
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from airflow_gpupool.plugins import URL_PREFIX
from airflow_gpupool.plugins.history import PageView
from airflow_gpupool.plugins.readings import AppState, CachedLedger, FragmentationSampler, default_ledger

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger

__all__ = ["FragmentationSampler", "create_app", "page_view", "render_page"]

_STATIC = Path(__file__).parent / "static"


def _ui_base(root_path: str) -> str:
    # The page is mounted at <airflow base>/gpupool; the Airflow UI lives at <airflow base>/.
    return root_path[: -len(URL_PREFIX)] if root_path.endswith(URL_PREFIX) else ""


def _body(state: AppState, ui_base: str, view: PageView) -> str:
    from airflow_gpupool.ledger import LedgerDriftRecords, LedgerForecasts, LedgerHistory, usage_report
    from airflow_gpupool.plugins import page
    from airflow_gpupool.plugins.history import PAGE_SIZE, definitions_html, history_html, usage_html
    from airflow_gpupool.plugins.pools import map_html

    snapshot, frag = state.snapshot()
    why = state.explanations(snapshot)
    series = state.derived(("series", view.hours), lambda s: state.series(view.hours, s))
    ledger = state.ledger()
    history = LedgerHistory(ledger)
    entries = history.entries(view.where, limit=PAGE_SIZE, offset=(view.page - 1) * PAGE_SIZE)
    facets = state.derived(("facets",), lambda _s: history.facets())
    history_body = history_html(entries, history.count(view.where), view, facets, ui_base)
    usage = state.derived(("usage", view.hours), lambda s: usage_report(ledger, s, view.hours))
    query = {"range": view.range_name, **view.where.to_dict()}
    nodes = map_html(snapshot, ui_base, view.opened, query, LedgerDriftRecords(ledger).get())
    rows = None if view.all_rows else page.MAX_ROWS
    updated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.taken_at))
    return (
        f'<section class="summary">{page.summary_html(snapshot, frag)}'
        f'<div class="figure"><div class="k">Updated</div><div class="v small">{updated}</div></div></section>'
        f'<section class="map"><h2>GPU map</h2>{nodes}</section>'
        f'<section class="chart-box"><h2>Allocation and fragmentation</h2>'
        f"{page.chart_svg(series['allocation'], series['fragmentation'], series['since'], series['until'])}"
        f"{definitions_html(['Allocation', 'Fragmentation', 'MIG slice'])}</section>"
        f'<section class="usage"><h2>Use per team and node pool, last {view.range_name}</h2>{usage_html(usage, view)}</section>'
        f'<section class="grants"><h2>Grants ({len(snapshot.grants)})</h2>{page.grants_html(snapshot, ui_base, rows)}</section>'
        f'<section class="queue"><h2>Queue ({len(snapshot.queue)})</h2>{page.queue_html(snapshot, why, ui_base, rows, LedgerForecasts(ledger).get_many())}</section>'
        f'<section class="history"><h2>History</h2>{history_body}</section>'
    )


def page_view(
    range_name: str = "24h",
    team: str | None = None,
    pool: str | None = None,
    states: list[str] | None = None,
    dag_id: str | None = None,
    page_number: int = 1,
) -> PageView:
    """Return the view the page's query parameters choose, or answer 422 naming the bad one.

    :param range_name: ``1h``, ``24h`` or ``7d``
    :param states: reservation states (empty values ignored: the form's "any")
    """
    from airflow_gpupool.exceptions import InvalidRequestError
    from airflow_gpupool.ledger import RANGES, HistoryFilter

    if range_name not in RANGES:
        raise HTTPException(422, f"range={range_name!r}: choose one of {', '.join(RANGES)}")
    try:
        where = HistoryFilter(team or None, pool or None, tuple(s for s in states or () if s), dag_id or None)
    except InvalidRequestError as e:
        raise HTTPException(422, str(e)) from e
    return PageView(range_name, where, page_number)


def render_page(body: str, title: str = "GPU pool") -> str:
    """Return the whole HTML document around a rendered body.

    :param body: what the page's sections render to
    :param title: the document's title
    """
    css = (_STATIC / "gpupool.css").read_text()
    js = (_STATIC / "gpupool.js").read_text()
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{css}</style></head>"
        f'<body><header class="top"><h1>GPU pool</h1><span class="sub">nodes × GPUs × slices</span></header>'
        f'<main id="gpupool">{body}</main><script>{js}</script></body></html>'
    )


def create_app(ledger_factory: Callable[[], Ledger] | None = None, *, snapshot_ttl: float = 5.0) -> FastAPI:
    """Build the FastAPI app.

    :param ledger_factory: returns the ledger to show (called once, on first use); default:
        the ledger of the ``gpupool_default`` connection, else ``[gpupool] ledger_url``
    :param snapshot_ttl: seconds one ledger reading is shared by the page, the API and the metrics
    """
    from airflow.api_fastapi.core_api.security import get_user

    state = AppState(ledger_factory or default_ledger, snapshot_ttl)
    app = FastAPI(
        title="GPU pool",
        description="The airflow-gpupool ledger: GPU map, grants, queue, history and metrics.",
        dependencies=[Depends(get_user)],
    )
    app.state.gpupool = state
    _add_error_handlers(app, state)
    _add_page_route(app, state)
    _add_api_routes(app, state)
    _add_metrics_route(app, state)
    _add_reservation_route(app, state)
    _add_run_routes(app, state)
    from airflow_gpupool.plugins.console import add_console

    add_console(app, state, render_page)
    return app


def _add_error_handlers(app: FastAPI, state: AppState) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from airflow_gpupool.exceptions import GpuPoolError
    from airflow_gpupool.redact import scrub

    def ledger_unavailable(request: Request, exc: Exception) -> JSONResponse:
        # Not the page's fault: say which ledger failed and how, as the CLI would, and never
        # its password (a driver's message may quote the URL).
        detail = scrub(f"GPU ledger unavailable: {exc}", state.known_url())
        return JSONResponse({"detail": detail}, status_code=503)

    app.add_exception_handler(GpuPoolError, ledger_unavailable)
    app.add_exception_handler(SQLAlchemyError, ledger_unavailable)


#: The page's and the history API's filter parameters, as FastAPI reads them.
RangeParam = Annotated[str, Query(alias="range")]
StatesParam = Annotated[list[str] | None, Query(alias="state")]
PageParam = Annotated[int, Query(alias="page", ge=1, le=100_000)]


def _add_page_route(app: FastAPI, state: AppState) -> None:
    @app.get("/", response_class=HTMLResponse)
    def index(
        request: Request,
        partial: bool = False,
        range_name: RangeParam = "24h",
        team: str | None = None,
        pool: str | None = None,
        states: StatesParam = None,
        dag_id: str | None = None,
        page_number: PageParam = 1,
        opened: Annotated[list[str] | None, Query(alias="open", max_length=253)] = None,
        rows: Annotated[str | None, Query(pattern="^all$")] = None,
    ) -> HTMLResponse:
        view = replace(
            page_view(range_name, team, pool, states, dag_id, page_number),
            opened=tuple(o for o in opened or () if o),
            all_rows=rows == "all",
        )
        body = _body(state, _ui_base(request.scope.get("root_path", "")), view)
        return HTMLResponse(body if partial else render_page(body))


def _reservation_body(state: AppState, reservation_id: str, ui_base: str, task_try: str | None) -> str | None:
    """Return the body of a reservation's page, or ``None`` when the ledger has no such reservation.

    :param state: the app's state
    :param reservation_id: the reservation
    :param ui_base: the Airflow UI's path prefix
    :param task_try: the try the extra link names (``dag/task/run/map-N/try-T``): when it has no
        reservation of its own id, it adopted an earlier try's grant, whose page is shown
    """
    from airflow_gpupool.ledger import LedgerHistory, ReservationState, TaskAttempts
    from airflow_gpupool.plugins.reservation import reservation_html
    from airflow_gpupool.task_try import TaskTry

    ledger = state.ledger()
    reservation = ledger.get_or_none(reservation_id)
    asked = TaskTry.from_holder(task_try) if task_try else None
    adopted_by = None
    if reservation is None and asked is not None:
        adopted = LedgerHistory(ledger).held_by(asked)
        reservation = ledger.get_or_none(adopted) if adopted else None
        adopted_by = asked
    if reservation is None:
        return None
    waiting = reservation.state is ReservationState.WAITING
    explanation = ledger.explain(reservation.id) if waiting else None
    ref = TaskTry.from_holder(reservation.holder)
    attempts = [
        a
        for a in (TaskAttempts(ledger).history(ref.task_key) if ref else [])
        if a.reservation_id == reservation.id
    ]
    return reservation_html(reservation, explanation, attempts, ui_base, ledger.now(), adopted_by=adopted_by)


def _add_reservation_route(app: FastAPI, state: AppState) -> None:
    @app.get("/reservations/{reservation_id}", response_class=HTMLResponse)
    def reservation_page(
        request: Request,
        reservation_id: str,
        partial: bool = False,
        task_try: Annotated[str | None, Query(alias="try", max_length=512)] = None,
    ) -> HTMLResponse:
        ui_base = _ui_base(request.scope.get("root_path", ""))
        body = _reservation_body(state, reservation_id, ui_base, task_try)
        if body is None:
            raise HTTPException(status_code=404, detail=f"no reservation {reservation_id} in the ledger")
        return HTMLResponse(body if partial else render_page(body))


#: A DAG id or a run id, as the run routes read it.
NameParam = Annotated[str, Query(min_length=1, max_length=512)]


def _add_run_routes(app: FastAPI, state: AppState) -> None:
    from airflow_gpupool.run_chain import RunChain, read_run_chain

    def chain_of(dag_id: str, run_id: str) -> RunChain:
        chain = read_run_chain(state.ledger(), dag_id, run_id)
        if not chain.steps:
            raise HTTPException(404, f"no GPU step of run {run_id!r} of DAG {dag_id!r} in the ledger")
        return chain

    @app.get("/run", response_class=HTMLResponse)
    def run_page(dag_id: NameParam, run_id: NameParam, partial: bool = False) -> HTMLResponse:
        from airflow_gpupool.plugins.runs import run_html

        body = run_html(chain_of(dag_id, run_id))
        return HTMLResponse(body if partial else render_page(body, f"GPU pool · {dag_id} · {run_id}"))

    @app.get("/api/v1/run")
    def api_run(dag_id: NameParam, run_id: NameParam) -> dict[str, Any]:
        return chain_of(dag_id, run_id).to_dict()


def _add_api_routes(app: FastAPI, state: AppState) -> None:
    from airflow_gpupool.exceptions import UnknownReservationError
    from airflow_gpupool.ledger import LedgerDriftRecords, LedgerForecasts
    from airflow_gpupool.plugins.books import drift_json

    @app.get("/api/v1/snapshot")
    def api_snapshot() -> dict[str, Any]:
        snapshot, frag = state.snapshot()
        out = snapshot.to_dict()
        out["fragmentation"] = frag
        out["drift"] = drift_json(LedgerDriftRecords(state.ledger()).get())  # the controller's; read only
        why = state.explanations(snapshot)
        forecasts = LedgerForecasts(state.ledger()).get_many()  # the controller's; read only
        for entry in out["queue"]:
            entry["why"] = why.get(entry["id"], entry["message"])
            entry["forecast"] = f.to_dict() if (f := forecasts.get(entry["id"])) else None
        for entry in out["grants"]:
            # What the page counts down: the grace a preempting grant has left, as of the snapshot.
            deadline = entry["preempt_deadline"] if entry["state"] == "preempting" else None
            entry["preempt_seconds_left"] = (
                None if deadline is None else max(0.0, deadline - snapshot.taken_at)
            )
        return out

    @app.get("/api/v1/history")
    def api_history(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
        team: str | None = None,
        pool: str | None = None,
        states: StatesParam = None,
        dag_id: str | None = None,
    ) -> dict[str, Any]:
        from airflow_gpupool.ledger import LedgerHistory

        where = page_view(team=team, pool=pool, states=states, dag_id=dag_id).where
        history = LedgerHistory(state.ledger())
        entries = history.entries(where, limit=limit, offset=offset)
        return {
            "filter": where.to_dict(),
            "total": history.count(where),
            "offset": offset,
            "reservations": [e.to_dict() for e in entries],
        }

    @app.get("/api/v1/usage")
    def api_usage(range_name: RangeParam = "24h") -> dict[str, Any]:
        from airflow_gpupool.ledger import usage_report

        hours = page_view(range_name).hours
        return state.derived(("usage", hours), lambda s: usage_report(state.ledger(), s, hours)).to_dict()

    @app.get("/api/v1/series")
    def api_series(hours: Annotated[float, Query(gt=0, le=24 * 14)] = 6.0) -> dict[str, Any]:
        return state.derived(("series", hours), lambda s: state.series(hours, s))

    @app.get("/api/v1/explain/{reservation_id}")
    def api_explain(reservation_id: str) -> dict[str, Any]:
        try:
            explanation = state.ledger().explain(reservation_id)
            forecast = LedgerForecasts(state.ledger()).get(reservation_id)
            return {
                "id": reservation_id,
                "explanation": explanation,
                "forecast": forecast and forecast.to_dict(),
            }
        except UnknownReservationError as e:
            raise HTTPException(404, f"no reservation {reservation_id}") from e


def _add_metrics_route(app: FastAPI, state: AppState) -> None:
    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from airflow_gpupool.metrics.collector import GpuPoolCollector

        registry = CollectorRegistry(auto_describe=False)
        # The collector reads a URL and a snapshot: the process's cached reading stands in for the ledger.
        registry.register(GpuPoolCollector(cast("Ledger", CachedLedger(state))))
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
