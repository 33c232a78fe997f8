"""Server-rendered HTML of the GPU pool page: the GPU map, grants, queue, history and chart.

Pure functions from ledger values to HTML strings; every ledger-provided string is escaped.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from airflow_gpupool.plugins.books import books_html
from airflow_gpupool.plugins.holders import rid_link, run_link, task_instance_url, team_link
from airflow_gpupool.resources import MIG_PROFILES, MILLI_PER_GPU
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow_gpupool.ledger import LedgerSnapshot, NodeRecord, Reservation, StartForecast
    from airflow_gpupool.plugins.pools import SnapshotIndex

#: Rows the grants and queue tables show (the JSON API has them all): long tables are paged.
MAX_ROWS = 100

UNHEALTHY = ("quarantined", "cordoned", "draining")


def team_colour(team: str) -> str:
    """Return a stable HSL colour for a team name.

    :param team: the team
    """
    hue = int(hashlib.sha1(team.encode()).hexdigest()[:6], 16) % 360
    return f"hsl({hue} 60% 42%)"


def duration(seconds: float) -> str:
    """Return ``seconds`` as ``45s``, ``12m 5s`` or ``3h 20m``.

    :param seconds: a duration
    """
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {s % 3600 // 60}m"


def countdown_html(deadline: float, now: float) -> str:
    """Return the seconds left until ``deadline`` as of ``now``, which the page's script ticks down.

    The text is right at render time without JavaScript; ``data-left`` is what the script counts
    down from (the browser's clock need not agree with the ledger's), ``data-deadline`` the
    deadline itself, seconds since the epoch on the ledger's clock. Whole seconds round up, as
    the script's do: 0s only once the deadline has come.

    :param deadline: when the countdown ends
    :param now: the render's time, on the same clock
    """
    left = max(0.0, deadline - now)
    return (
        f'<span class="countdown" data-deadline="{deadline:.3f}" data-left="{left:.3f}">'
        f"{duration(math.ceil(left))}</span>"
    )


def preempting_html(r: Reservation, now: float, link_base: str = "reservations/") -> str:
    """Return a preempting grant's state: its preemptor and the grace left to its deadline.

    :param r: a reservation in state ``preempting``
    :param now: the render's time, on the ledger's clock
    :param link_base: the path before a reservation id that opens its page
    """
    by = escape(r.preempted_by or "")
    preemptor = (
        f' for <a class="rid" href="{escape(link_base)}{by}" title="{by}"><code>{escape((r.preempted_by or "")[:12])}</code></a>'
        if r.preempted_by
        else ""
    )
    left = countdown_html(r.preempt_deadline, now) if r.preempt_deadline is not None else ""
    return f'<span class="state s-preempting">preempting</span>{preemptor}, {left} left'


def queued_ahead_mark(not_before: float | None) -> str:
    """Return the queued-ahead marker, the time before which it is not granted in its title.

    :param not_before: the request's ``not_before`` (None: not known any more)
    """
    until = "" if not_before is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(not_before))
    title = f' title="not granted before {until}"' if until else ""
    return f'<span class="mark queued-ahead"{title}>queued ahead</span>'


def holder_html(holder: str, ui_base: str) -> str:
    """Return the holder as a link to its task instance, or as plain text when it is not one.

    :param holder: the reservation's holder string
    :param ui_base: the Airflow UI's path prefix
    """
    ref = TaskTry.from_holder(holder)
    if ref is None:
        return f'<span class="holder">{escape(holder)}</span>'
    label = task_label(ref)
    return (
        f'<a class="ti" data-airflow-link href="{escape(task_instance_url(ref, ui_base))}" '
        f'title="{escape(holder)}">{escape(label)}</a>'
    )


def task_label(ref: TaskTry) -> str:
    """Return a try as people read it: ``train_dag / fit [3] · try 2`` (the map index when mapped).

    :param ref: the try a holder names
    """
    mapped = f" [{ref.map_index}]" if ref.map_index >= 0 else ""
    return f"{ref.dag_id} / {ref.task_id}{mapped} · try {ref.try_number}"


def _segment(r: Reservation, milli: int, label: str, ui_base: str) -> str:
    team = r.request.team
    ref = TaskTry.from_holder(r.holder)
    who = task_label(ref) if ref else r.holder
    preempting = r.state.value == "preempting"
    title = f"{team} · {who} · {label} · {r.id}" + (
        f" · preempting for {r.preempted_by}" if preempting else ""
    )
    body = f'<span class="team">{escape(team)}</span> <span class="who">{escape(who)}</span>'
    if ref is not None:
        body = f'<a data-airflow-link href="{escape(task_instance_url(ref, ui_base))}">{body}</a>'
    return (
        f'<div class="seg held{" preempting" if preempting else ""}" style="flex-basis:{milli / 10:.2f}%;background:{team_colour(team)}" '
        f'data-reservation="{escape(r.id)}" data-team="{escape(team)}" title="{escape(title)}">{body}</div>'
    )


def _free_segment(milli: int, label: str = "free", title: str | None = None) -> str:
    return (
        f'<div class="seg free" style="flex-basis:{milli / 10:.2f}%" title="{escape(title or label)}">'
        f"{escape(label)}</div>"
    )


def _mig_layout(held: Sequence[Reservation], mig_free: Sequence[tuple[str, str]]) -> str:
    """Spell a MIG GPU's slices out under its bar (``3g.40gb × 2: 1 held, 1 free``): the bar is too narrow."""
    counts: dict[str, list[int]] = {}
    for r in held:
        profile = str(r.grant.mig_profile if r.grant else "")
        counts.setdefault(profile, [0, 0])[0] += 1
    for _slice_id, profile in mig_free:
        counts.setdefault(profile, [0, 0])[1] += 1
    parts = [f"{escape(p)} × {h + f}: {h} held, {f} free" for p, (h, f) in sorted(counts.items())]
    return f'<div class="mig-layout">{" · ".join(parts)}</div>'


def gpu_html(
    node: NodeRecord,
    gpu: Mapping[str, Any],
    held: Sequence[Reservation],
    mig_free: Sequence[tuple[str, str]],
    ui_base: str,
) -> str:
    """Return one GPU's bar: a segment per slice, filled by its holder.

    :param node: the GPU's node
    :param gpu: the GPU's record from the snapshot
    :param held: live grants on this GPU
    :param mig_free: free MIG slices of this GPU as ``(slice_id, profile)``
    :param ui_base: the Airflow UI's path prefix
    """
    idx = gpu["idx"]
    segments = []
    if gpu["partitioned"]:
        for r in held:
            g = r.grant
            profile = str(g.mig_profile if g else "")
            milli = MIG_PROFILES[profile].milli if profile in MIG_PROFILES else 0
            segments.append(_segment(r, milli, f"MIG {profile}", ui_base))
        for slice_id, profile in mig_free:
            milli = MIG_PROFILES[profile].milli if profile in MIG_PROFILES else 0
            # The compute part (``1g``) fits a seventh of a bar; the whole name is in the title.
            segments.append(_free_segment(milli, profile.split(".")[0], f"free MIG {profile} ({slice_id})"))
    else:
        used = 0
        for r in held:
            g = r.grant
            milli = g.milli_per_gpu if g else 0
            used += milli
            segments.append(_segment(r, milli, f"{milli / MILLI_PER_GPU:g} GPU", ui_base))
        if used < MILLI_PER_GPU:
            segments.append(
                _free_segment(MILLI_PER_GPU - used, f"free {(MILLI_PER_GPU - used) / MILLI_PER_GPU:g}")
            )
    mig = ' <span class="badge mig">MIG</span>' if gpu["partitioned"] else ""
    mem = f"{int(gpu['memory_mib']) // 1024} GiB"
    return (
        f'<div class="gpu" data-node="{escape(node.name)}" data-gpu="{idx}">'
        f'<div class="gpu-label">GPU {idx} · {escape(str(gpu["model"]))} · {mem}{mig}{_observed(gpu)}</div>'
        f'<div class="bar">{"".join(segments)}</div>'
        f"{_mig_layout(held, mig_free) if gpu['partitioned'] else ''}</div>"
    )


def _observed(gpu: Mapping[str, Any]) -> str:
    """What the node agent last saw on a GPU (issue 17): use, an unverified UUID, quarantine, a leak."""
    parts = []
    if gpu.get("utilization") is not None:
        parts.append(f"{gpu['utilization']}% busy, {gpu.get('memory_used_mib')} MiB used")
    if not gpu.get("uuid_verified"):
        parts.append("UUID unverified")
    if gpu.get("health", "healthy") != "healthy":
        parts.append(f'<span class="badge h-quarantined">{escape(str(gpu["health"]))}</span>')
    leak = gpu.get("leak")
    if isinstance(leak, dict):
        parts.append(f'<span class="badge h-quarantined">leak {leak.get("memory_mib")} MiB</span>')
    return "".join(f" · {p}" for p in parts)


def node_html(
    node: NodeRecord, snapshot: LedgerSnapshot, ui_base: str, index: SnapshotIndex | None = None
) -> str:
    """Return one node's card: its health, heartbeat and GPUs.

    :param node: the node
    :param snapshot: the snapshot it comes from (grants and free MIG slices)
    :param ui_base: the Airflow UI's path prefix
    :param index: the snapshot's grants and free MIG slices by node (built here when not given)
    """
    if index is None:
        from airflow_gpupool.plugins.pools import SnapshotIndex

        index = SnapshotIndex.of(snapshot)
    by_gpu = index.grants.get(node.name, {})
    mig_free = index.mig_free.get(node.name, {})
    health = escape(node.health)
    beat = (
        f"heartbeat {duration(snapshot.taken_at - node.heartbeat_at)} ago"
        if node.heartbeat_at is not None
        else "no heartbeat"
    )
    gpus = "".join(
        gpu_html(node, g, by_gpu.get(g["idx"], []), mig_free.get(g["idx"], ()), ui_base) for g in node.gpus
    )
    return (
        f'<article class="node health-{health}" data-node="{escape(node.name)}">'
        f'<header><h3>{escape(node.name)}</h3><span class="badge pool">{escape(node.node_pool)}</span>'
        f'<span class="badge h-{health}" title="set by {escape(node.health_source)}">{health}</span></header>'
        f'<div class="meta">CPU {node.cpu_free / 1000:g}/{node.cpu_milli / 1000:g} free · '
        f"memory {node.memory_free // 1024}/{node.memory_mib // 1024} GiB free · {beat}</div>"
        f"{books_html(index.books.get(node.name), index.cluster.get(node.name))}{gpus or '<div class=meta>no GPUs</div>'}</article>"
    )


def table_html(headers: Sequence[str], rows: Sequence[Sequence[str]], empty: str, css: str) -> str:
    """Return a table of already escaped cells, or the ``empty`` text when there are no rows.

    :param headers: the column titles
    :param rows: the cells (HTML) of each row
    :param empty: what to say when there are no rows
    :param css: the table's class
    """
    if not rows:
        return f'<p class="empty">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _where(r: Reservation) -> str:
    g = r.grant
    if g is None:
        return ""
    slot = f"{g.mig_slice} ({g.mig_profile})" if g.mig_slice else ",".join(map(str, g.gpu_indices))
    return escape(f"{g.node} / GPU {slot}")


def _lease_left(r: Reservation, now: float) -> str:
    g = r.grant
    if g is None:
        return ""
    if r.state.value == "preempting":
        return preempting_html(r, now)
    if r.state.value != "orphaned":
        return duration(g.expires_at - now)
    # Its lease expired while its pod ran on: the slice stays held until the pod is gone.
    pod = escape(f"{g.pod_namespace}/{g.pod_name}")
    return f'<span class="state s-orphaned">orphaned</span> pod <code>{pod}</code>'


def _more(shown: int, total: int) -> str:
    if shown >= total:
        return ""
    return f'<p class="more">Showing {shown} of {total}: all are in <a href="api/v1/snapshot">the JSON API</a>.</p>'


def grants_html(snapshot: LedgerSnapshot, ui_base: str, max_rows: int | None = MAX_ROWS) -> str:
    """Return the table of live grants (the first ``max_rows``).

    :param snapshot: a ledger snapshot
    :param ui_base: the Airflow UI's path prefix
    :param max_rows: at most this many rows (None: all)
    """
    now = snapshot.taken_at
    rows = [
        [
            rid_link(r.id),
            holder_html(r.holder, ui_base) + run_link(r.holder),
            f'<span class="dot" style="background:{team_colour(r.request.team)}"></span>{team_link(r.request.team)}',
            escape(str(getattr(r.request.workload_class, "value", r.request.workload_class))),
            escape(r.request.describe()),
            _where(r),
            duration(now - r.grant.granted_at) if r.grant else "",
            _lease_left(r, now),
        ]
        for r in snapshot.grants[:max_rows]
    ]
    headers = ["ID", "Task", "Team", "Class", "Slice", "Where", "Held", "Lease left"]
    return table_html(headers, rows, "No grants.", "grants") + _more(len(rows), len(snapshot.grants))


def queue_html(
    snapshot: LedgerSnapshot,
    why: Mapping[str, str],
    ui_base: str,
    max_rows: int | None = MAX_ROWS,
    forecasts: Mapping[str, StartForecast] | None = None,
) -> str:
    """Return the queue table: position, what is asked, the wait so far, the expected start and why it waits.

    :param snapshot: a ledger snapshot
    :param why: :meth:`~airflow_gpupool.ledger.Ledger.explain` of each waiting reservation
    :param ui_base: the Airflow UI's path prefix
    :param max_rows: at most this many rows, the head of the queue (None: all)
    :param forecasts: the controller's stored forecasts, by reservation id
    """
    from airflow_gpupool.plugins.forecast import forecast_cell

    now = snapshot.taken_at
    forecasts = forecasts or {}
    rows = [
        [
            str(r.position or ""),
            rid_link(r.id),
            holder_html(r.holder, ui_base) + run_link(r.holder),
            team_link(r.request.team),
            str(r.request.priority),
            escape(r.request.describe()),
            duration(now - r.created_at),
            forecast_cell(forecasts.get(r.id), now),
            (queued_ahead_mark(r.not_before) + " " if r.not_before is not None else "")
            + f'<span class="why">{escape(why.get(r.id) or r.message)}</span>',
        ]
        for r in snapshot.queue[:max_rows]
    ]
    headers = ["#", "ID", "Task", "Team", "Priority", "Asks", "Waiting", "Expected start", "Why it waits"]
    return table_html(headers, rows, "Nobody is waiting.", "queue") + _more(len(rows), len(snapshot.queue))


def _polyline(points: Sequence[tuple[float, float]], t0: float, t1: float, width: int, height: int) -> str:
    span = (t1 - t0) or 1.0
    coords = " ".join(
        f"{(t - t0) / span * width:.1f},{height - min(max(v, 0.0), 1.0) * height:.1f}" for t, v in points
    )
    return coords


def chart_svg(
    allocation: Sequence[tuple[float, float]],
    fragmentation: Sequence[tuple[float, float]],
    t0: float,
    t1: float,
) -> str:
    """Return an inline SVG of allocation and fragmentation (0–100 %) from ``t0`` to ``t1``.

    :param allocation: ``(time, share)`` points
    :param fragmentation: ``(time, share)`` samples
    :param t0: left edge, seconds since the epoch
    :param t1: right edge
    """
    w, h = 600, 160
    grid = "".join(
        f'<line x1="0" x2="{w}" y1="{h - p * h:.0f}" y2="{h - p * h:.0f}" class="grid"/>'
        f'<text x="2" y="{h - p * h - 2:.0f}" class="axis">{int(p * 100)}%</text>'
        for p in (0.25, 0.5, 0.75)
    )
    lines = f'<polyline class="alloc" points="{_polyline(allocation, t0, t1, w, h)}"/>'
    if len(fragmentation) == 1:
        # One sample so far: hold it to the right edge so that it shows.
        fragmentation = [fragmentation[0], (t1, fragmentation[0][1])]
    if fragmentation:
        lines += f'<polyline class="frag" points="{_polyline(fragmentation, t0, t1, w, h)}"/>'
    return (
        f'<svg class="chart" viewBox="0 0 {w} {h}" preserveAspectRatio="none" role="img" '
        f'aria-label="GPU allocation and fragmentation over the last {duration(t1 - t0)}">{grid}{lines}</svg>'
        f"{_time_axis(t0, t1)}"
        f'<div class="legend"><span class="l-alloc">allocation</span> <span class="l-frag">fragmentation</span>'
        f" · 0–100 % of the GPUs · {_clock(t0)} to {_clock(t1)} UTC (last {duration(t1 - t0)})</div>"
    )


#: Tick steps of the time axis, in seconds: the first that gives at most 6 ticks is used.
_TICK_STEPS = (60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400)


def time_ticks(t0: float, t1: float) -> list[float]:
    """Return round times between ``t0`` and ``t1`` for the chart's time axis (at most 6).

    :param t0: left edge, seconds since the epoch
    :param t1: right edge
    """
    span = max(t1 - t0, 1.0)
    step = next((s for s in _TICK_STEPS if span / s <= 6), 86400 * (1 + int(span // (6 * 86400))))
    first = -(-t0 // step) * step
    return [first + i * step for i in range(int((t1 - first) // step) + 1)]


def _time_axis(t0: float, t1: float) -> str:
    # HTML under the SVG: text inside a preserveAspectRatio="none" chart would be stretched.
    span = (t1 - t0) or 1.0
    fmt = "%d %b %H:%M" if t1 - t0 > 86400 else "%H:%M"
    ticks = "".join(
        f'<span style="left:{(t - t0) / span * 100:.1f}%">{time.strftime(fmt, time.gmtime(t))}</span>'
        for t in time_ticks(t0, t1)
    )
    return f'<div class="xaxis" aria-hidden="true">{ticks}</div>'


def _clock(at: float) -> str:
    return time.strftime("%H:%M", time.gmtime(at))


def summary_html(snapshot: LedgerSnapshot, fragmentation: float) -> str:
    """Return the headline figures.

    :param snapshot: a ledger snapshot
    :param fragmentation: the cluster's fragmentation ratio (0–1)
    """
    unhealthy = sum(1 for n in snapshot.nodes if n.health in UNHEALTHY)
    gpus = sum(len(n.gpus) for n in snapshot.nodes)
    figures = [
        ("Allocation", f"{snapshot.allocation:.1%}"),
        ("Fragmentation", f"{fragmentation:.1%}"),
        ("Nodes", f"{len(snapshot.nodes)}" + (f" ({unhealthy} not schedulable)" if unhealthy else "")),
        ("GPUs", str(gpus)),
        ("Grants", str(len(snapshot.grants))),
        ("Waiting", str(len(snapshot.queue))),
    ]
    return "".join(
        f'<div class="figure"><div class="k">{k}</div><div class="v">{escape(v)}</div></div>'
        for k, v in figures
    )
