"""GPU-hours per team and node pool over a time range, from the reservations the ledger keeps.

A grant counts from its grant to its end (or to ``until`` while it still holds) clipped to the
range, times the milli-GPU it holds in the quota's units (:func:`~airflow_gpupool.ledger.teams.quotas.grant_milli`:
a MIG slice counts its compute share). Shares are of the GPU-hours used in the range; a pool's
utilization is of its GPUs' hours (today's inventory: the ledger keeps no history of it).
Stored quotas are listed next to what each team holds now: nominal, borrowed (held above
nominal) and lent (what its cohort borrows, shared among the cohort's lenders in proportion to what
each may lend). Reserved against used: the SM utilization the node agents last reported for the
GPUs each team's grants hold (teams whose GPUs no agent reports are left out).

Work lost to preemption (:func:`preemption_losses`): a grant that ended ``preempted`` lost its
GPUs (counted as above) times the time from its newest valid checkpoint the holder reported
(``checkpoint_at``, :meth:`~airflow_gpupool.ledger.Ledger.note_checkpoint`; its grant when none)
to its end. The page's use per team and the metrics both read it; it needs no column of its own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, or_, select, update

from airflow_gpupool.governance.quotas import gpu_milli_of_mig
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.models import ReservationState
from airflow_gpupool.ledger.teams.quotas import LedgerQuotas

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, Connection

    from airflow_gpupool.governance.quotas import TeamQuota
    from airflow_gpupool.ledger.db.models import LedgerSnapshot
    from airflow_gpupool.ledger.store.access import LedgerAccess

__all__ = [
    "RANGES",
    "PreemptionLoss",
    "QuotaUse",
    "UsageReport",
    "preemption_losses",
    "quota_uses",
    "usage_report",
]

#: The ranges the page offers, by name, in hours.
RANGES = {"1h": 1.0, "24h": 24.0, "7d": 168.0}


@dataclass(frozen=True)
class QuotaUse:
    """One stored quota next to what its team holds of that flavor now, in GPUs."""

    team: str
    flavor: str
    nominal: float
    held: float
    lent: float = 0.0

    @property
    def borrowed(self) -> float:
        """GPUs held above nominal (borrowed from the cohort)."""
        return max(0.0, self.held - self.nominal)

    @property
    def unused(self) -> float:
        """Nominal GPUs not held now (what the team may lend)."""
        return max(0.0, self.nominal - self.held)

    def to_dict(self) -> dict[str, Any]:
        """Return primitives."""
        return {
            "team": self.team,
            "flavor": self.flavor,
            "nominal": self.nominal,
            "held": self.held,
            "borrowed": self.borrowed,
            "unused": self.unused,
            "lent": self.lent,
        }


@dataclass(frozen=True)
class PreemptionLoss:
    """A team's grants that ended preempted, and the GPU-seconds of work they lost.

    :param preemptions: grants that ended ``preempted``
    :param lost_gpu_seconds: their GPUs × the seconds from their newest reported checkpoint
        (their grant when none) to their end
    """

    team: str
    preemptions: int
    lost_gpu_seconds: float


@dataclass(frozen=True)
class UsageReport:
    """GPU-hours over ``[since, until]`` by ``(team, pool)``, the pools' GPU counts, and the quotas."""

    since: float
    until: float
    gpu_hours: dict[tuple[str, str], float]
    pool_gpus: dict[str, int]
    quotas: tuple[QuotaUse, ...]
    team_utilization: dict[str, float] = field(default_factory=dict)
    #: Grants that ended preempted in the range, and the work they lost, per team.
    preempted: dict[str, PreemptionLoss] = field(default_factory=dict)

    @property
    def hours(self) -> float:
        """The range's length in hours."""
        return (self.until - self.since) / 3600

    def by_team(self) -> dict[str, float]:
        """GPU-hours per team, over all pools."""
        out: dict[str, float] = defaultdict(float)
        for (team, _pool), hours in self.gpu_hours.items():
            out[team] += hours
        return dict(sorted(out.items()))

    def by_pool(self) -> dict[str, float]:
        """GPU-hours per node pool (every pool of the inventory, 0 when unused)."""
        out: dict[str, float] = dict.fromkeys(sorted(self.pool_gpus), 0.0)
        for (_team, pool), hours in self.gpu_hours.items():
            out[pool] = out.get(pool, 0.0) + hours
        return out

    @property
    def total(self) -> float:
        """GPU-hours used in the range, all teams and pools."""
        return sum(self.gpu_hours.values())

    def share(self, hours: float) -> float:
        """Return ``hours`` as a share (0–1) of all GPU-hours used in the range."""
        return hours / self.total if self.total > 0 else 0.0

    def utilization(self, pool: str) -> float:
        """Return the share (0–1) of the pool's GPU-hours that was held in the range."""
        capacity = self.pool_gpus.get(pool, 0) * self.hours
        return self.by_pool().get(pool, 0.0) / capacity if capacity > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return primitives (the JSON API's form)."""
        teams = self.by_team()
        pools = self.by_pool()
        return {
            "since": self.since,
            "until": self.until,
            "total_gpu_hours": self.total,
            "teams": [
                {
                    "team": t,
                    "gpu_hours": h,
                    "share": self.share(h),
                    "utilization": self.team_utilization.get(t),
                    "preemptions": self.preempted[t].preemptions if t in self.preempted else 0,
                    "lost_gpu_seconds": self.preempted[t].lost_gpu_seconds if t in self.preempted else 0.0,
                }
                for t, h in teams.items()
            ],
            "pools": [
                {
                    "pool": p,
                    "gpus": self.pool_gpus.get(p, 0),
                    "gpu_hours": h,
                    "share": self.share(h),
                    "utilization": self.utilization(p),
                }
                for p, h in pools.items()
            ],
            "team_pools": [
                {"team": t, "pool": p, "gpu_hours": h, "share_of_pool": h / pools[p] if pools[p] else 0.0}
                for (t, p), h in sorted(self.gpu_hours.items())
            ],
            "quotas": [q.to_dict() for q in self.quotas],
        }


def _milli(row: Any, models: dict[tuple[str, int], str]) -> int:
    indices = json.loads(row.gpu_indices or "[]")
    if row.mig_slice is not None:
        profile = json.loads(row.request).get("mig_profile") or ""
        model = models.get((row.node, indices[0])) if indices else None
        return gpu_milli_of_mig(profile, model)
    return len(indices) * int(row.milli_per_gpu or 0)


def _gpu_models(conn: Connection, rows: Sequence[Any]) -> dict[tuple[str, int], str]:
    """The model of each GPU by ``(node, index)``, read only when a row holds a MIG slice."""
    g = schema.gpus.c
    if not any(row.mig_slice is not None for row in rows):
        return {}
    return {(row.node, row.idx): row.model for row in conn.execute(select(g.node, g.idx, g.model))}


def _slice_columns() -> tuple[Any, ...]:
    """The columns that say a grant's team, slice and lifetime (what :func:`_milli` reads)."""
    r = schema.reservations.c
    return (r.team, r.node, r.gpu_indices, r.milli_per_gpu, r.mig_slice, r.request, r.granted_at, r.ended_at)


def _gpu_hours(conn: Connection, since: float, until: float) -> dict[tuple[str, str], float]:
    r, n = schema.reservations.c, schema.nodes.c
    rows = conn.execute(
        select(*_slice_columns(), n.node_pool)
        .select_from(schema.reservations.outerjoin(schema.nodes, n.name == r.node))
        .where(r.granted_at.is_not(None), r.granted_at < until, or_(r.ended_at.is_(None), r.ended_at > since))
    ).all()
    models = _gpu_models(conn, rows)
    out: dict[tuple[str, str], float] = defaultdict(float)
    for row in rows:
        seconds = min(row.ended_at if row.ended_at is not None else until, until) - max(row.granted_at, since)
        if seconds > 0:
            out[(row.team, row.node_pool or "(removed node)")] += _milli(row, models) / 1000 * seconds / 3600
    return dict(out)


def preemption_losses(conn: Connection, since: float | None = None) -> dict[str, PreemptionLoss]:
    """Return, per team, the grants that ended ``preempted`` (after ``since``) and the work they lost.

    :param conn: an open read transaction
    :param since: count only those that ended after it (None: every one, those pruned from the
        history included, so counters read from it never go down)
    """
    r = schema.reservations.c
    ended = r.ended_at > since if since is not None else r.ended_at.is_not(None)
    count, lost = _losses(conn, ended)
    if since is None:
        for row in conn.execute(select(schema.team_totals)):
            count[row.team] += int(row.preempted_grants)
            lost[row.team] += row.lost_gpu_ms / 1000
    return {team: PreemptionLoss(team, count[team], lost[team]) for team in sorted(count) if count[team]}


def carry_preemption_losses(conn: Connection, ids: Sequence[str]) -> None:
    """Add what the reservations ``ids``, about to be pruned, count in :func:`preemption_losses` to the team totals."""
    count, lost = _losses(conn, schema.reservations.c.id.in_(ids))
    t = schema.team_totals.c
    for team in count:
        kept = conn.execute(select(schema.team_totals).where(t.team == team)).first()
        grants, lost_ms = count[team], round(lost[team] * 1000)
        if kept is None:
            conn.execute(
                insert(schema.team_totals).values(team=team, preempted_grants=grants, lost_gpu_ms=lost_ms)
            )
        else:
            conn.execute(
                update(schema.team_totals)
                .where(t.team == team)
                .values(
                    preempted_grants=kept.preempted_grants + grants, lost_gpu_ms=kept.lost_gpu_ms + lost_ms
                )
            )


def _losses(conn: Connection, where: ColumnElement[bool]) -> tuple[dict[str, int], dict[str, float]]:
    """Count the preempted grants matching ``where`` and the GPU-seconds they lost, per team."""
    r = schema.reservations.c
    query = select(*_slice_columns(), r.checkpoint_at).where(
        r.state == ReservationState.PREEMPTED.value, r.granted_at.is_not(None), r.ended_at.is_not(None), where
    )
    rows = conn.execute(query).all()
    models = _gpu_models(conn, rows)
    count: dict[str, int] = defaultdict(int)
    lost: dict[str, float] = defaultdict(float)
    for row in rows:
        start = row.granted_at if row.checkpoint_at is None else max(row.granted_at, row.checkpoint_at)
        count[row.team] += 1
        lost[row.team] += _milli(row, models) / 1000 * max(0.0, row.ended_at - start)
    return count, lost


def usage_report(ledger: LedgerAccess, snapshot: LedgerSnapshot, hours: float) -> UsageReport:
    """Return GPU-hours by team and pool over the ``hours`` before the snapshot, and the quotas' use now.

    :param ledger: the ledger
    :param snapshot: a snapshot of it: "now", the inventory's pools and the live grants
    :param hours: the range's length
    """
    until = snapshot.taken_at
    since = until - hours * 3600
    used, preempted = ledger.read(
        lambda conn: (_gpu_hours(conn, since, until), preemption_losses(conn, since))
    )
    pool_gpus: dict[str, int] = defaultdict(int)
    for node in snapshot.nodes:
        pool_gpus[node.node_pool] += len(node.gpus)
    return UsageReport(
        since,
        until,
        used,
        dict(pool_gpus),
        quota_uses(ledger, snapshot),
        _team_utilization(snapshot),
        preempted,
    )


def quota_uses(ledger: LedgerAccess, snapshot: LedgerSnapshot) -> tuple[QuotaUse, ...]:
    """Return each stored quota beside what its team holds, borrows and lends of its flavor now.

    Empty when no quota is stored. The page, ``gpupool status`` and the metrics all read this.

    :param ledger: the ledger (its quotas are read)
    :param snapshot: a snapshot of it: the live grants
    """
    quotas = LedgerQuotas(ledger)
    plan = quotas.list().quotas
    if not plan:
        return ()
    held = quotas.usage(snapshot.grants)
    uses = [
        QuotaUse(q.team, str(q.flavor), q.nominal_milli / 1000, held.get((q.team, q.flavor), 0) / 1000)
        for q in plan
    ]
    return _with_lent(plan, uses)


def _with_lent(plan: tuple[TeamQuota, ...], uses: list[QuotaUse]) -> tuple[QuotaUse, ...]:
    """Share what each cohort borrows of a flavor among its lenders, by what each may lend.

    Borrowed capacity has no single lender in the ledger (a grant takes free capacity, not a
    team's), so the proportional split is the account, as Kueue reports a cohort's lending.
    """
    lendable: list[float] = []
    for quota, use in zip(plan, uses, strict=True):
        limit = use.unused if quota.lending_limit_milli is None else quota.lending_limit_milli / 1000
        lendable.append(min(use.unused, limit) if quota.cohort else 0.0)
    borrowed: dict[tuple[str, str], float] = defaultdict(float)
    offered: dict[tuple[str, str], float] = defaultdict(float)
    for quota, use, may_lend in zip(plan, uses, lendable, strict=True):
        if quota.cohort:
            borrowed[(quota.cohort, use.flavor)] += use.borrowed
            offered[(quota.cohort, use.flavor)] += may_lend
    out = []
    for quota, use, may_lend in zip(plan, uses, lendable, strict=True):
        key = (quota.cohort or "", use.flavor)
        total = offered.get(key, 0.0)
        lent = min(may_lend, borrowed.get(key, 0.0) * may_lend / total) if total > 0 else 0.0
        out.append(replace(use, lent=lent))
    return tuple(out)


def _team_utilization(snapshot: LedgerSnapshot) -> dict[str, float]:
    """Return each team's mean SM utilization (0–1) over the GPUs its grants hold, as agents last reported."""
    samples: dict[str, list[float]] = defaultdict(list)
    for node in snapshot.nodes:
        for gpu in node.gpus:
            for use in (gpu.get("usage") or {}).values():
                if "team" in use:
                    samples[use["team"]].append((use.get("utilization") or 0) / 100.0)
    return {team: sum(values) / len(values) for team, values in sorted(samples.items())}
