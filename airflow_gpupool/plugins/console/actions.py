"""The console's actions on the ledger: each checked, carried out by a ``Ledger`` method, and recorded.

Every action names its target (a reservation id or a node) and answers with what it did, in
words, or raises :class:`~airflow_gpupool.plugins.console.guard.ConsoleActionRefusedError` with the HTTP
status and a plain reason: 404 for an unknown target, 409 for one in the wrong state (a
granted request cannot be cancelled, only released), 422 for a bad value. The history records
who did it twice: in the reservation's own message (its release reason) and in the ledger's
actions (:class:`~airflow_gpupool.ledger.LedgerActions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_gpupool.exceptions import ConsoleActionRefusedError

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger, Reservation

__all__ = ["ActionForm", "ActionResult", "perform", "pod_fate", "priority_range"]

_NODE_HEALTH = {"cordon": "cordoned", "drain": "draining", "uncordon": "healthy"}
_VIA = "in the GPU pool console"


@dataclass(frozen=True)
class ActionForm:
    """What a console form posts: the target, the team page it came from, and the action's values."""

    target: str
    team: str | None = None
    priority: str | None = None
    confirm: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ActionResult:
    """What an action did: the team whose page shows it, and a sentence."""

    team: str
    message: str


def priority_range(ledger: Ledger) -> tuple[int, int]:
    """Return the priorities the console may give a waiting request: 0 up to just below urgent.

    Urgent work (``priority >= urgent_priority``: the stored headroom's, else ``[gpupool]
    urgent_priority``) may hold the headroom and preempt: a DAG asks for that, the console does
    not hand it out.
    """
    from airflow_gpupool import settings
    from airflow_gpupool.ledger import LedgerQuotas

    stored = LedgerQuotas(ledger).list().headroom.urgent_priority
    urgent = stored if isinstance(stored, int) else settings.urgent_priority()
    return 0, max(0, urgent - 1)


def pod_fate(r: Reservation) -> str:
    """Say what becomes of a grant's pod when the console releases the grant."""
    if r.gang_id is not None:
        return f"This grant is a member of gang {r.gang_id}: the release ends every member. " + _one_pod_fate(
            r
        )
    return _one_pod_fate(r)


def _one_pod_fate(r: Reservation) -> str:
    g = r.grant
    if g is None or not g.pod_name:
        return (
            "No pod is bound to this grant yet. The slice is free at once; if its task creates the pod "
            "later, its binding fails and the task stops."
        )
    return (
        f"Pod {g.pod_namespace}/{g.pod_name} runs on this grant. It is revoked as a preemption is: the "
        "task's next lease renewal is refused, so it deletes the pod (SIGTERM first: the training may "
        "write a checkpoint) within the request's preemption grace, and the try fails as preempted "
        "(its retries decide what follows). The slice passes on only once the pod is gone; past the "
        "grace the controller deletes the pod."
    )


def perform(ledger: Ledger, action: str, form: ActionForm, actor: str) -> ActionResult:
    """Carry out ``action`` for ``actor`` and record it.

    :raises ConsoleActionRefusedError: unknown action or target, wrong state, bad value
    """
    from airflow_gpupool.exceptions import InvalidRequestError
    from airflow_gpupool.ledger import LedgerActions

    if action in _NODE_HEALTH:
        result = _node(ledger, action, form, actor)
        target, team = form.target, form.team
    elif action in ("cancel", "release", "priority"):
        r = _reservation(ledger, form.target)
        result = {"cancel": _cancel, "release": _release, "priority": _priority}[action](
            ledger, r, form, actor
        )
        target, team = r.id, r.request.team
    else:
        raise ConsoleActionRefusedError(
            404, f"no console action {action!r}: cancel, release, priority, cordon, drain or uncordon"
        )
    try:
        LedgerActions(ledger).record(actor, action, target, team=team, detail=result.message)
    except InvalidRequestError as e:
        raise ConsoleActionRefusedError(422, str(e)) from e
    return result


def _reservation(ledger: Ledger, rid: str) -> Reservation:
    r = ledger.get_or_none(rid) if rid else None
    if r is None:
        raise ConsoleActionRefusedError(404, f"no reservation {rid!r} in the ledger")
    return r


def _leader(r: Reservation) -> str:
    # A gang waits and ends as one: acting on a member acts on its leader.
    return r.gang_id or r.id


def _cancel(ledger: Ledger, r: Reservation, form: ActionForm, actor: str) -> ActionResult:
    if r.state.value != "waiting":
        raise ConsoleActionRefusedError(
            409, f"reservation {r.id} is {r.state.value}, not waiting: only a waiting request is cancelled"
        )
    ledger.release(_leader(r), reason=f"cancelled by {actor} {_VIA}")
    return ActionResult(r.request.team, f"cancelled waiting request {_leader(r)}")


def _release(ledger: Ledger, r: Reservation, form: ActionForm, actor: str) -> ActionResult:
    if not r.state.holds or r.state.value == "external":
        raise ConsoleActionRefusedError(
            409, f"reservation {r.id} is {r.state.value}: only a grant this project made is released"
        )
    if form.confirm != "yes":
        raise ConsoleActionRefusedError(400, f"confirm the release of {r.id} first: {pod_fate(r)}")
    from airflow_gpupool.ledger import ReleaseResult

    done = ledger.revoke(_leader(r), by=f"{actor} {_VIA}")
    if isinstance(done, ReleaseResult):
        return ActionResult(r.request.team, f"released grant {_leader(r)}: {done.message}")
    return ActionResult(r.request.team, f"revoked grant {_leader(r)}: {done.message}")


def _priority(ledger: Ledger, r: Reservation, form: ActionForm, actor: str) -> ActionResult:
    from airflow_gpupool.exceptions import InvalidRequestError

    low, high = priority_range(ledger)
    raw = (form.priority or "").strip()
    if not raw.lstrip("-").isdigit() or not low <= int(raw) <= high:
        raise ConsoleActionRefusedError(
            422,
            f"priority={raw!r}: give a whole number from {low} to {high} (urgent work starts at {high + 1})",
        )
    if r.state.value != "waiting":
        raise ConsoleActionRefusedError(
            409,
            f"reservation {r.id} is {r.state.value}, not waiting: only a waiting request's priority changes",
        )
    try:
        ledger.set_priority(_leader(r), int(raw))
    except InvalidRequestError as e:  # it left the queue since it was read
        raise ConsoleActionRefusedError(409, str(e)) from e
    return ActionResult(
        r.request.team, f"priority of {_leader(r)} changed from {r.request.priority} to {int(raw)}"
    )


def _node(ledger: Ledger, action: str, form: ActionForm, actor: str) -> ActionResult:
    from airflow_gpupool.exceptions import InvalidInventoryError

    if not form.team:
        raise ConsoleActionRefusedError(422, "team is missing: post the form from a team's page")
    note = f": {form.reason.strip()}" if form.reason and form.reason.strip() else ""
    try:
        changed = ledger.set_health(
            form.target, _NODE_HEALTH[action], source="admin", reason=f"{action} by {actor} {_VIA}{note}"
        )
    except InvalidInventoryError as e:
        raise ConsoleActionRefusedError(404, f"no node {form.target!r} in the ledger") from e
    what = {
        "cordon": "cordoned: no new grants, live grants run on",
        "drain": "draining: no new grants, and it leaves the ledger once its last grant ends",
        "uncordon": "healthy: takes new grants again",
    }[action]
    return ActionResult(
        form.team, f"node {form.target} {what}" if changed else f"node {form.target} unchanged"
    )
