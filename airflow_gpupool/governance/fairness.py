"""Queue order with fairness: priority first; within a priority, the team furthest below its share; then FIFO.

A team's *share* is its nominal quota (summed over flavors) when it has one, else an equal
share of the pool's capacity among the teams that hold or want GPUs. Its *standing* is what it
holds over its share: the lowest standing is served first, so a team that has had little gets
the next slice before a team that has had much, at equal priority. Priority still comes first
(urgent work is never held back for fairness), and arrival order breaks ties, so equal teams
keep FIFO. The queue's no-starvation rule (a request overtaken too often is held for) is
applied on top of this order by the ledger, unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from airflow_gpupool.governance.quotas import QuotaPlan

__all__ = ["FairShare", "Queued"]


class Queued(Protocol):
    """What the order needs of a waiting request."""

    @property
    def team(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def created_at(self) -> float: ...


@dataclass(frozen=True)
class FairShare:
    """Each team's share of the pool and what it holds now.

    :param plan: the quotas (teams with a nominal quota have it as their share)
    :param held_milli: milli-GPU each team holds now, all flavors together
    :param capacity_milli: the pool's GPU capacity, shared equally among teams without a quota
    """

    plan: QuotaPlan
    held_milli: Mapping[str, int]
    capacity_milli: int

    def shares(self, teams: Iterable[str]) -> dict[str, float]:
        """Return each team's share in milli-GPU: its nominal quota, or an equal part of the capacity."""
        nominal: dict[str, int] = defaultdict(int)
        for quota in self.plan.quotas:
            nominal[quota.team] += quota.nominal_milli
        everyone = set(teams) | set(self.held_milli)
        without = sorted(t for t in everyone if t not in nominal)
        equal = self.capacity_milli / len(everyone) if everyone else 0.0
        return {**{t: float(nominal[t]) for t in everyone if t in nominal}, **{t: equal for t in without}}

    def standing(self, team: str, shares: Mapping[str, float]) -> float:
        """Return what ``team`` holds over its share (0: nothing yet; above 1: more than its share)."""
        share = shares.get(team, 0.0)
        held = self.held_milli.get(team, 0)
        if share <= 0:
            return float("inf") if held else 0.0
        return held / share

    def order(self, queue: Sequence[Queued]) -> list[Queued]:
        """Return the queue in serving order: priority, then standing, then arrival."""
        shares = self.shares(q.team for q in queue)
        return sorted(queue, key=lambda q: (-q.priority, self.standing(q.team, shares), q.created_at))
