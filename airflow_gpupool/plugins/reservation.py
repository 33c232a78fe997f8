"""The page of one reservation: where it ran, how long it waited and held its slice, and why it ended.

The operator extra link "GPU reservation" (:class:`~airflow_gpupool.operators.links.GpuReservationLink`)
opens it for a task try: ``/gpupool/reservations/<id>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from airflow_gpupool.plugins.holders import run_link
from airflow_gpupool.plugins.page import duration, holder_html, preempting_html

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Reservation, TaskAttempt
    from airflow_gpupool.task_try import TaskTry


def _clock(at: float | None) -> str:
    import time

    return "" if at is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _where(r: Reservation) -> str:
    g = r.grant
    if g is None:
        return "not granted"
    slot = (
        f"MIG slice {g.mig_slice} ({g.mig_profile})"
        if g.mig_slice
        else "GPU " + ",".join(map(str, g.gpu_indices))
    )
    pod = f", pod {g.pod_namespace}/{g.pod_name}" if g.pod_name else ""
    return f"{g.node} (node pool {g.node_pool}), {slot}{pod}"


def reservation_facts(r: Reservation, now: float) -> list[tuple[str, str]]:
    """Return the reservation's facts as ``(term, value)`` pairs, values plain text.

    :param r: the reservation
    :param now: the current time (waits and holds still running end here)
    """
    granted_at = r.grant.granted_at if r.grant else None
    waited_until = granted_at if granted_at is not None else (r.ended_at or now)
    held = None if granted_at is None else (r.ended_at or now) - granted_at
    facts = [
        ("State", r.state.value),
        ("Team", r.request.team),
        ("Asked for", r.request.describe()),
        ("Ran on", _where(r)),
        ("Requested", _clock(r.created_at)),
        (
            "Waited",
            duration(max(0.0, waited_until - r.created_at)) + ("" if granted_at or r.ended_at else " so far"),
        ),
        ("Held", "" if held is None else duration(max(0.0, held)) + ("" if r.ended_at else " so far")),
        ("Ended", _clock(r.ended_at)),
        ("Preempted for", r.preempted_by or ""),
        ("Grace until", _clock(r.preempt_deadline) if r.state.value == "preempting" else ""),
        ("Last checkpoint", _clock(r.checkpoint_at)),
        ("Why", r.message),
    ]
    return [(term, value) for term, value in facts if value]


def reservation_html(
    r: Reservation,
    explanation: str | None,
    attempts: Sequence[TaskAttempt],
    ui_base: str,
    now: float,
    *,
    adopted_by: TaskTry | None = None,
) -> str:
    """Return the body of a reservation's page.

    :param r: the reservation
    :param explanation: why it waits now (the ledger's ``explain``), for a waiting request
    :param attempts: the failure records of this reservation's task try
    :param ui_base: the Airflow UI's path prefix
    :param now: the current time
    :param adopted_by: the try whose link led here, when it adopted this earlier try's grant
    """
    rows = "".join(f"<dt>{escape(t)}</dt><dd>{escape(v)}</dd>" for t, v in reservation_facts(r, now))
    why = f'<p class="why">{escape(explanation)}</p>' if explanation else ""
    if r.state.value == "preempting":
        # Its page sits beside its preemptor's: ``reservations/<id>``.
        why += f'<p class="preempting">{preempting_html(r, now, link_base="")}: its pod must end by then.</p>'
    failed = "".join(
        f"<li>try {a.try_number}: <b>{escape(a.failure_class)}</b> → {escape(a.remedy)}: {escape(a.message)}</li>"
        for a in attempts
    )
    tries = f'<h3>Failure record</h3><ul class="attempts">{failed}</ul>' if failed else ""
    adopted = (
        f'<p class="adopted">Try {adopted_by.try_number} re-attached to the pod of an earlier try and '
        f"adopted its grant: this is that reservation.</p>"
        if adopted_by is not None
        else ""
    )
    return (
        f'<section class="reservation"><h2>Reservation <code>{escape(r.id)}</code></h2>'
        f'<p>{holder_html(r.holder, ui_base)}{run_link(r.holder, "../run")} · <a href="../">back to the GPU pool</a></p>'
        f'{adopted}<dl class="facts">{rows}</dl>{why}{tries}</section>'
    )
