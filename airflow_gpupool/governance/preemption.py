"""Preemption: which grants a waiting request may take capacity from, and which lose the least work.

A grant may be a victim only if it is ``preemptible`` (never otherwise), has run at least
``min_runtime_seconds`` (no thrashing), and either has a lower priority than the preemptor, or
is *borrowed* (its team is above its nominal quota) while the preemptor's team reclaims its own
nominal quota. A request that was itself preempted does not preempt in turn (no cascades).

Victims are chosen to lose the least work: the GPU-seconds since each victim's newest valid
checkpoint (since its start when it has none), then the lowest priority, then the newest grant;
taken in that order until enough is freed. The ledger gives each victim a grace period to write
an emergency checkpoint before its slice passes on.

:attr:`VictimOrder.KUEUE` is the order Kueue uses instead (borrowing workloads first, then the
lowest priority, then the most recently admitted), blind to checkpoints: the simulator's
``kueue-like`` policy compares against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = ["Preemptor", "VictimCandidate", "VictimOrder", "choose_victims", "may_preempt", "lost_gpu_seconds"]


class VictimOrder(str, Enum):
    """How eligible victims are ranked."""

    LEAST_WORK_LOST = "least-work-lost"  # ours: GPU-seconds since the newest checkpoint first
    KUEUE = "kueue"  # borrowed first, then lowest priority, then newest


@dataclass(frozen=True)
class VictimCandidate:
    """A live grant that might be preempted.

    :param milli: the milli-GPU it holds (a MIG slice: its compute share)
    :param checkpoint_at: when its newest valid checkpoint was written; None: none yet
    :param borrowed: its team holds more than its nominal quota of this flavor
    """

    reservation_id: str
    priority: int
    preemptible: bool
    granted_at: float
    milli: int
    checkpoint_at: float | None = None
    borrowed: bool = False


@dataclass(frozen=True)
class Preemptor:
    """The waiting request.

    :param reclaims: its team is within its nominal quota (it may take back what others borrow)
    :param was_preempted: it is the retry of a preempted try (it does not preempt in turn)
    """

    priority: int
    milli: int
    reclaims: bool = False
    was_preempted: bool = False


def lost_gpu_seconds(victim: VictimCandidate, now: float) -> float:
    """Return the GPU-seconds of work a victim loses if stopped now (since its newest checkpoint)."""
    since = (
        max(victim.granted_at, victim.checkpoint_at)
        if victim.checkpoint_at is not None
        else victim.granted_at
    )
    return victim.milli / 1000 * max(0.0, now - since)


def choose_victims(
    preemptor: Preemptor,
    candidates: Sequence[VictimCandidate],
    *,
    free_milli: int,
    now: float,
    min_runtime_seconds: float,
    order: VictimOrder = VictimOrder.LEAST_WORK_LOST,
) -> tuple[VictimCandidate, ...] | None:
    """Return the victims that free enough for ``preemptor`` losing the least work, or None.

    :param candidates: the live grants where the preemptor would be placed
    :param free_milli: what is free there already
    :param now: the ledger's time
    :param min_runtime_seconds: a grant younger than this is never a victim
    :param order: how victims are ranked (ours by default)
    """
    if preemptor.was_preempted or free_milli >= preemptor.milli:
        return None if preemptor.was_preempted else ()
    eligible = [c for c in candidates if may_preempt(preemptor, c, now, min_runtime_seconds)]
    if order is VictimOrder.KUEUE:
        eligible.sort(key=lambda c: (not c.borrowed, c.priority, -c.granted_at))
    else:
        eligible.sort(key=lambda c: (lost_gpu_seconds(c, now), c.priority, -c.granted_at))
    chosen: list[VictimCandidate] = []
    freed = free_milli
    for victim in eligible:
        if freed >= preemptor.milli:
            break
        chosen.append(victim)
        freed += victim.milli
    return tuple(chosen) if freed >= preemptor.milli else None


def may_preempt(preemptor: Preemptor, victim: VictimCandidate, now: float, min_runtime: float) -> bool:
    """Return whether ``victim`` may lose its slice to ``preemptor`` now (the rule in the module docstring)."""
    if preemptor.was_preempted:
        return False
    if not victim.preemptible or now - victim.granted_at < min_runtime:
        return False
    return victim.priority < preemptor.priority or (victim.borrowed and preemptor.reclaims)
