"""Admission by quota: may a team take a slice of a flavor now, within its quota or by borrowing?

Pure: a :class:`QuotaState` (the quotas and what every team holds now) answers one question,
:meth:`QuotaState.admit`, for a request of ``milli`` milli-GPU drawing on some flavors (the pool
and the GPU model of the node it would land on). The rules, Kueue's for a ClusterQueue in a cohort:

- a flavor nobody has a quota on is not governed: anyone may use it, as before quotas;
- a team with no quota at all is not governed either (teams with no quota keep today's behaviour);
- on a governed flavor, a team may hold up to its nominal quota (none declared: 0);
- above it, a team in a cohort may *borrow*: at most its borrowing limit above nominal (no limit
  when none is declared), and only what the other members of its cohort lend: each member lends
  what it leaves unused of its nominal quota, at most its lending limit (all of it when none is
  declared), less what other members already borrow. A member's *lending floor* (nominal minus
  lending limit) is never lent: it stays its own.

A request is admitted when every governed flavor it draws on admits it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, TeamQuota

__all__ = ["Admission", "AdmissionVerdict", "QuotaState"]


class Admission(str, Enum):
    """How a request would be admitted."""

    UNGOVERNED = "ungoverned"  # no quota applies
    WITHIN_QUOTA = "within_quota"
    BORROWING = "borrowing"
    REFUSED = "refused"


@dataclass(frozen=True)
class AdmissionVerdict:
    """The answer for one request: how it is admitted, what it borrows, or why not.

    :param borrowed_milli: per flavor, what it newly borrows (taken above its team's nominal quota)
    :param reason: why it is refused (empty when admitted)
    """

    admission: Admission
    borrowed_milli: tuple[tuple[Flavor, int], ...] = ()
    reason: str = ""

    @property
    def admitted(self) -> bool:
        """Whether the request may be granted now."""
        return self.admission is not Admission.REFUSED


@dataclass(frozen=True)
class QuotaState:
    """The quotas and what each team holds now.

    :param plan: the quotas
    :param used: milli-GPU held per (team, flavor), as :meth:`LedgerQuotas.usage` counts it
    """

    plan: QuotaPlan
    used: Mapping[tuple[str, Flavor], int]

    def admit(self, team: str, flavors: Iterable[Flavor], milli: int) -> AdmissionVerdict:
        """Say whether ``team`` may take ``milli`` more milli-GPU drawing on ``flavors``.

        :param team: the request's team
        :param flavors: the flavors the slice would draw on (its node's pool, its GPU model)
        :param milli: the slice's milli-GPU (a MIG slice: its compute share)
        """
        if not any(q.team == team for q in self.plan.quotas):
            return AdmissionVerdict(Admission.UNGOVERNED)
        governed = sorted({f for f in flavors if self._governed(f)})
        if not governed:
            return AdmissionVerdict(Admission.UNGOVERNED)
        borrowed: list[tuple[Flavor, int]] = []
        for flavor in governed:
            refusal, borrow = self._admit_one(team, flavor, milli)
            if refusal:
                return AdmissionVerdict(Admission.REFUSED, reason=refusal)
            if borrow:
                borrowed.append((flavor, borrow))
        return AdmissionVerdict(Admission.BORROWING if borrowed else Admission.WITHIN_QUOTA, tuple(borrowed))

    def lendable_milli(self, cohort: str, flavor: Flavor, *, besides: str) -> int:
        """Return what the cohort's members other than ``besides`` can still lend of ``flavor``."""
        members = [q for q in self._quotas(flavor) if q.cohort == cohort]
        offered = sum(self._lends(q) for q in members if q.team != besides)
        borrowed = sum(
            max(0, self._used(q.team, flavor) - q.nominal_milli) for q in members if q.team != besides
        )
        return max(0, offered - borrowed)

    # -- helpers -------------------------------------------------------------------------------

    def _admit_one(self, team: str, flavor: Flavor, milli: int) -> tuple[str, int]:
        """Return (why refused or "", milli borrowed) for one governed flavor."""
        quota = self._quota(team, flavor)
        nominal = quota.nominal_milli if quota is not None else 0
        after = self._used(team, flavor) + milli
        if after <= nominal:
            return "", 0
        borrow = after - nominal
        cohort = quota.cohort if quota is not None else self._cohort_of(team)
        if cohort is None:
            return (
                f"team {team} would hold {after / 1000:g} GPUs of {flavor}, above its quota of "
                f"{nominal / 1000:g}, and is in no cohort to borrow from"
            ), 0
        limit = quota.borrowing_limit_milli if quota is not None else None
        if limit is not None and borrow > limit:
            return (
                f"team {team} would borrow {borrow / 1000:g} GPUs of {flavor}, "
                f"above its borrowing limit of {limit / 1000:g}"
            ), 0
        available = self.lendable_milli(cohort, flavor, besides=team)
        if borrow > available:
            return (
                f"team {team} would borrow {borrow / 1000:g} GPUs of {flavor}; "
                f"the rest of cohort {cohort} lends {available / 1000:g}"
            ), 0
        return "", borrow - max(0, self._used(team, flavor) - nominal)

    def _governed(self, flavor: Flavor) -> bool:
        return any(q.flavor == flavor for q in self.plan.quotas)

    def _quotas(self, flavor: Flavor) -> list[TeamQuota]:
        return [q for q in self.plan.quotas if q.flavor == flavor]

    def _quota(self, team: str, flavor: Flavor) -> TeamQuota | None:
        return next((q for q in self.plan.quotas if q.team == team and q.flavor == flavor), None)

    def _cohort_of(self, team: str) -> str | None:
        return next((q.cohort for q in self.plan.quotas if q.team == team and q.cohort), None)

    def _used(self, team: str, flavor: Flavor) -> int:
        return self.used.get((team, flavor), 0)

    def _lends(self, quota: TeamQuota) -> int:
        """What a member offers its cohort: its unused nominal, at most its lending limit."""
        unused = max(0, quota.nominal_milli - self._used(quota.team, quota.flavor))
        return unused if quota.lending_limit_milli is None else min(unused, quota.lending_limit_milli)
