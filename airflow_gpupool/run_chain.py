"""One DAG run's GPU steps as one chain: each try's reservation in order, how it passed on, and the gaps.

A run's GPU steps are the reservations its task tries hold or held (their holders name the run).
:func:`run_chain` orders them as they asked and marks how each step came by its slice: queued
ahead (it waited in its place with a ``not_before``), handed on from the step before (the ending
step passed its slice on instead of releasing it) or admitted with its run as a whole; and the
gap from the end of the steps before each step to its grant, the wait a hand-on is there to remove.

The markers are read from what the ledger keeps (:func:`step_marks` says which words), so the
chain is a pure function of the run's history rows: the page, its JSON API and ``gpupool chain``
show the same chain.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow_gpupool.ledger import HistoryEntry, Ledger

__all__ = ["RunChain", "RunStep", "StepMarks", "read_run_chain", "run_chain", "step_marks"]

_HANDED_ON = re.compile(r"\bhanded on (?P<way>to|from) (?P<who>[^\s,;()\[]+(?: \[\d+\])?)", re.IGNORECASE)
_ADMITTED_AS_RUN = re.compile(r"\badmitted (?:as|with) (?:a|its) (?:dag )?run\b", re.IGNORECASE)


@dataclass(frozen=True)
class StepMarks:
    """What a step's ledger message says of its hand-on and admission.

    :param handed_on_to: whom its slice was handed on to, as the message names it
    :param handed_on_from: whose slice it adopted, as the message names it
    :param admitted_as_run: it was admitted with its DAG run as a whole
    """

    handed_on_to: str | None = None
    handed_on_from: str | None = None
    admitted_as_run: bool = False


def step_marks(message: str) -> StepMarks:
    """Read the hand-on and run-admission markers from a reservation's stored message.

    Keys on words in the message (the release reason once it ended, else why it waits):
    ``handed on to <who>`` (an ending step passed its slice on), ``handed on from <who>`` (a
    step adopted an upstream's slice) and ``admitted as a run`` (also ``admitted with its run``).
    ``<who>`` is the first word after them (with a mapped task's `` [N]``), trailing ``.`` and
    ``:`` cut: a task id, a holder, a task key or a reservation id, which :func:`run_chain`
    resolves to a step of the run.

    :param message: the reservation's message
    """
    to = frm = None
    for match in _HANDED_ON.finditer(message):
        who = match["who"].rstrip(".:")
        if match["way"].lower() == "to":
            to = to or who
        else:
            frm = frm or who
    return StepMarks(to, frm, bool(_ADMITTED_AS_RUN.search(message)))


@dataclass(frozen=True)
class RunStep:
    """One GPU step of a run: one try's reservation.

    :param task: the task (``task [3]`` when mapped)
    :param waited: seconds from its request to its grant (or to its end, or to now)
    :param gap_before: seconds from the latest end among the steps before it to its grant (None:
        not granted, or granted before any step before it ended: the first, a parallel branch)
    :param queued_ahead: it was queued ahead of its task (a ``not_before`` while it waits ahead, or
        its ``ahead_of`` upstream, kept)
    :param handed_on_from: the step (its task) whose slice it adopted
    :param handed_on_to: the step (its task) it handed its slice on to
    :param admitted_as_run: it was admitted with its DAG run as a whole (its message says so, or
        its reservation carries the run's peak: the run gate's own record)
    """

    reservation_id: str
    task: str
    task_id: str
    map_index: int
    try_number: int
    state: str
    requested: str
    node: str | None
    gpus: str
    created_at: float
    granted_at: float | None
    ended_at: float | None
    waited: float
    held: float | None
    gap_before: float | None
    queued_ahead: bool
    not_before: float | None
    handed_on_from: str | None
    handed_on_to: str | None
    admitted_as_run: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        """Return primitives (the JSON API's form)."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class RunChain:
    """A DAG run's GPU steps in the order they asked.

    :param gap_seconds: the gaps between steps, summed
    :param span: seconds from the first request to the last step's end (or to now)
    """

    dag_id: str
    run_id: str
    steps: tuple[RunStep, ...]
    gap_seconds: float
    span: float

    @property
    def handed_on(self) -> int:
        """How many steps adopted a slice handed on to them."""
        return sum(1 for s in self.steps if s.handed_on_from)

    @property
    def admitted_as_run(self) -> bool:
        """Whether any step says the run was admitted as a whole."""
        return any(s.admitted_as_run for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        """Return primitives (the JSON API's form)."""
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "steps": [s.to_dict() for s in self.steps],
            "gap_seconds": self.gap_seconds,
            "span": self.span,
            "handed_on": self.handed_on,
            "admitted_as_run": self.admitted_as_run,
        }


def _task(e: HistoryEntry) -> str:
    return f"{e.task_id} [{e.map_index}]" if e.map_index is not None and e.map_index >= 0 else str(e.task_id)


def _asked(e: HistoryEntry) -> tuple[float, str, int, int, str]:
    """The order of steps: when they asked; at the same time, by task, map index and try."""
    return (e.created_at, str(e.task_id), -1 if e.map_index is None else e.map_index, e.try_number, e.id)


def _names(e: HistoryEntry) -> set[str]:
    """Every name a hand-on message may give the step ``e``."""
    names = {e.id, e.holder, e.holder.rpartition("@")[0] or e.holder, str(e.task_id), _task(e)}
    if (ref := TaskTry.from_holder(e.holder)) is not None:
        names.add(ref.task_key)
    return names


def _gpus(e: HistoryEntry) -> str:
    if e.mig_slice:
        return f"MIG {e.mig_slice}"
    return ("GPU " + ",".join(map(str, e.gpu_indices))) if e.gpu_indices else ""


def _find(who: str | None, rows: Sequence[HistoryEntry], order: Sequence[int]) -> int | None:
    """Return the index of the first step in ``order`` that ``who`` names, or None."""
    return next((k for k in order if who is not None and who in _names(rows[k])), None)


def _hand_ons(rows: Sequence[HistoryEntry], marks: Sequence[StepMarks]) -> tuple[list[str | None], ...]:
    """Return each step's ``handed_on_to`` and ``handed_on_from``, both sides of each hand-on filled in.

    A name that no step of the run answers to is kept as the message gives it.
    """
    n = len(rows)
    to = [m.handed_on_to for m in marks]
    frm = [m.handed_on_from for m in marks]
    for i, m in enumerate(marks):
        # The downstream asks after its upstream; one found earlier (clock skew) still counts.
        if (j := _find(m.handed_on_to, rows, [*range(i + 1, n), *range(i)])) is not None:
            to[i], frm[j] = _task(rows[j]), _task(rows[i])
    for k, m in enumerate(marks):
        if (up := _find(m.handed_on_from, rows, [*reversed(range(k)), *range(k + 1, n)])) is not None:
            to[up], frm[k] = _task(rows[k]), _task(rows[up])
    return to, frm


def _gaps(rows: Sequence[HistoryEntry]) -> list[float | None]:
    """Return each step's gap: from the latest end among the steps before it to its grant.

    None for a step not granted, or granted before any earlier step ended (a parallel branch).
    """
    ends: list[float] = []  # the earlier steps' ends, sorted
    gaps: list[float | None] = []
    for e in rows:
        before = bisect.bisect_right(ends, e.granted_at) if e.granted_at is not None else 0
        gaps.append(e.granted_at - ends[before - 1] if e.granted_at is not None and before else None)
        if e.ended_at is not None:
            bisect.insort(ends, e.ended_at)
    return gaps


def run_chain(entries: Sequence[HistoryEntry], dag_id: str, run_id: str, now: float) -> RunChain:
    """Return the chain of a DAG run's GPU steps from its history rows.

    Steps are ordered by when they asked (a step queued ahead asks before its upstream ends).
    A hand-on is read from either side: the ending step's ``handed on to <who>``, or the
    adopting step's ``handed on from <who>`` (:func:`step_marks`).

    :param entries: the run's reservations (:meth:`~airflow_gpupool.ledger.LedgerHistory.of_run`);
        rows of other runs are left out
    :param dag_id: the DAG
    :param run_id: the DAG run
    :param now: the ledger's time (the span of a run still going ends here)
    """
    rows = sorted((e for e in entries if (e.dag_id, e.run_id) == (dag_id, run_id)), key=_asked)
    marks = [step_marks(e.message) for e in rows]
    to, frm = _hand_ons(rows, marks)
    gaps = _gaps(rows)
    steps = []
    for i, e in enumerate(rows):
        steps.append(
            RunStep(
                reservation_id=e.id,
                task=_task(e),
                task_id=str(e.task_id),
                map_index=-1 if e.map_index is None else e.map_index,
                try_number=e.try_number,
                state=e.state,
                requested=e.requested,
                node=e.node,
                gpus=_gpus(e),
                created_at=e.created_at,
                granted_at=e.granted_at,
                ended_at=e.ended_at,
                waited=e.waited,
                held=e.held,
                gap_before=gaps[i],
                queued_ahead=e.not_before is not None or e.ahead_of is not None,
                not_before=e.not_before,
                handed_on_from=frm[i],
                handed_on_to=to[i],
                admitted_as_run=marks[i].admitted_as_run or e.run_peak_milli is not None,
                message=e.message,
            )
        )
    ends = [e.ended_at if e.ended_at is not None else now for e in rows]
    span = max(ends) - rows[0].created_at if rows else 0.0
    total_gap = sum(s.gap_before or 0.0 for s in steps)
    return RunChain(dag_id, run_id, tuple(steps), total_gap, max(0.0, span))


def read_run_chain(ledger: Ledger, dag_id: str, run_id: str) -> RunChain:
    """Read a DAG run's reservations from the ledger and return their chain (no steps: none there).

    :param ledger: the ledger
    :param dag_id: the DAG
    :param run_id: the DAG run
    """
    from airflow_gpupool.ledger import LedgerHistory

    return run_chain(LedgerHistory(ledger).of_run(dag_id, run_id), dag_id, run_id, ledger.now())
