"""Team quotas kept in the ledger: applied as a whole from a quota file, listed with their usage.

``apply`` checks the plan against the inventory (every flavor, and every pool the headroom
names, must be a node pool or a GPU model the ledger has) and replaces the stored quotas and
headroom in one write transaction: a refused plan changes nothing. ``usage`` counts, per team and flavor, the milli-GPU its live grants hold
(orphans included: they still hold their slice), in the units of
:mod:`airflow_gpupool.governance.quotas`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, insert, select

from airflow_gpupool import settings
from airflow_gpupool.exceptions import QuotaFileError
from airflow_gpupool.governance.capacity import headroom_overcommit
from airflow_gpupool.governance.quota_capacity import nominals_above_capacity
from airflow_gpupool.governance.quotas import Flavor, Headroom, QuotaPlan, TeamQuota, gpu_milli_of_mig
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.teams.plan import (
    HEADROOM_EVERY_POOL,
    QUOTA_VERSION_KEY,
    read_headroom,
    read_plan,
    read_quotas,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from airflow_gpupool.ledger.db.models import Grant, Reservation
    from airflow_gpupool.ledger.store.access import LedgerAccess
    from airflow_gpupool.ledger.store.transactions import Tx

__all__ = ["QUOTA_VERSION_KEY", "AppliedQuotas", "LedgerQuotas", "grant_milli", "read_quotas"]


@dataclass(frozen=True)
class AppliedQuotas:
    """What ``apply`` changed: ``team flavor`` keys added, changed and removed, and whether the headroom changed.

    :param warnings: what the plan promises that it cannot always keep (one line each), applied anyway
    """

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    headroom_changed: bool = False
    #: Quotas larger than their flavor (:func:`~airflow_gpupool.governance.quota_capacity.nominals_above_capacity`).
    warnings: tuple[str, ...] = ()
    #: The headroom as stored: its urgent priority a number (``[gpupool] urgent_priority`` when the file names none).
    headroom: Headroom = field(default_factory=Headroom)
    #: Pools whose non-urgent nominal quotas exceed what their headroom leaves (:func:`~airflow_gpupool.governance.capacity.headroom_overcommit`).
    headroom_warnings: tuple[str, ...] = ()

    def summary(self) -> str:
        """Return ``2 added, 1 changed, 0 removed``."""
        return f"{len(self.added)} added, {len(self.changed)} changed, {len(self.removed)} removed"


def grant_milli(grant: Grant) -> int:
    """Return the milli-GPU a grant counts against its team's quota (a MIG slice: its compute share)."""
    if grant.mig_profile is not None:
        return gpu_milli_of_mig(grant.mig_profile, grant.gpu_model)
    return len(grant.gpu_indices) * grant.milli_per_gpu


class LedgerQuotas:
    """Store and read team quotas in a ledger (schema v6 or later).

    :param ledger: the ledger
    """

    def __init__(self, ledger: LedgerAccess) -> None:
        self.ledger = ledger

    def apply(self, plan: QuotaPlan, *, dry_run: bool = False, strict: bool = False) -> AppliedQuotas:
        """Replace the stored quotas with ``plan`` (idempotent); with ``dry_run`` only say what would change.

        A nominal quota above what its flavor holds is applied with a warning (as Kueue applies it),
        refused with ``strict``.

        :raises QuotaFileError: a flavor names no node pool or GPU model of the ledger, or, with
            ``strict``, a nominal quota is above what its flavor holds (nothing written)
        """

        headroom = _resolved(plan.headroom)

        def run(tx: Tx) -> AppliedQuotas:
            self._check_flavors(tx.conn, plan)
            oversized = nominals_above_capacity(plan, _flavor_capacity(tx.conn))
            if strict and oversized:
                raise oversized[0].error()
            before = {_key(q): q for q in read_quotas(tx.conn)}
            after = {_key(q): q for q in plan.quotas}
            applied = AppliedQuotas(
                tuple(sorted(after.keys() - before.keys())),
                tuple(sorted(k for k in after.keys() & before.keys() if after[k] != before[k])),
                tuple(sorted(before.keys() - after.keys())),
                read_headroom(tx.conn) != headroom,
                tuple(map(str, oversized)),
                headroom,
                _headroom_warnings(tx.conn, plan, headroom),
            )
            if dry_run or not (
                applied.added or applied.changed or applied.removed or applied.headroom_changed
            ):
                return applied
            tx.conn.execute(delete(schema.quotas))
            if plan.quotas:
                tx.conn.execute(insert(schema.quotas), [_row(q, tx.now) for q in plan.quotas])
            tx.conn.execute(delete(schema.headroom))
            if plan.quotas and headroom.active:
                tx.conn.execute(insert(schema.headroom), _headroom_rows(headroom, tx.now))
            _stamp_quota_version(tx, tx.version if plan.quotas else 0)
            return applied

        return self.ledger.write(run)

    def list(self) -> QuotaPlan:
        """Return the stored quotas and headroom."""
        return self.ledger.read(read_plan)

    def usage(self, grants: tuple[Reservation, ...] | None = None) -> dict[tuple[str, Flavor], int]:
        """Return the milli-GPU held per (team, flavor), for the flavors of each grant's pool and model.

        :param grants: the live grants (default: the ledger's now)
        """
        held: dict[tuple[str, Flavor], int] = defaultdict(int)
        for reservation in self.ledger.snapshot().grants if grants is None else grants:
            grant = reservation.grant
            if grant is None:
                continue
            milli = grant_milli(grant)
            held[(reservation.request.team, Flavor("pool", grant.node_pool))] += milli
            if grant.gpu_model:
                held[(reservation.request.team, Flavor("model", grant.gpu_model))] += milli
        return dict(held)

    @staticmethod
    def _check_flavors(conn: Connection, plan: QuotaPlan) -> None:
        pools = set(conn.execute(select(schema.nodes.c.node_pool).distinct()).scalars())
        models = set(conn.execute(select(schema.gpus.c.model).distinct()).scalars())
        known = {"pool": pools, "model": models}
        for quota in plan.quotas:
            flavor = quota.flavor
            if flavor.name not in known[flavor.kind]:
                have = ", ".join(sorted(known[flavor.kind])) or "none yet"
                raise QuotaFileError(
                    f"{quota.path}.flavor.{flavor.kind}" if quota.path else f"flavor {flavor}",
                    flavor.name,
                    f"a {flavor.kind} of the ledger's inventory ({have})",
                    team=quota.team,
                )
        for pool, _ in plan.headroom.pools:
            if pool not in pools:
                have = ", ".join(sorted(pools)) or "none yet"
                raise QuotaFileError(
                    f"headroom.pools.{pool}", pool, f"a pool of the ledger's inventory ({have})"
                )


def _flavor_capacity(conn: Connection) -> dict[Flavor, int]:
    """Return the milli-GPU each pool and each GPU model holds in the inventory (a GPU counts 1000)."""
    rows = conn.execute(
        select(schema.nodes.c.node_pool, schema.gpus.c.model).join(
            schema.gpus, schema.gpus.c.node == schema.nodes.c.name
        )
    ).all()
    capacity: dict[Flavor, int] = defaultdict(int)
    for pool, model in rows:
        capacity[Flavor("pool", pool)] += 1000
        capacity[Flavor("model", model)] += 1000
    return dict(capacity)


def _stamp_quota_version(tx: Tx, version: int) -> None:
    """Stamp the quotas' version (0: none stored), so the queue service knows at no extra read.

    The inventory generation moves too: a concurrent grant placed before the change then
    answers ``serialize`` instead of bypassing admission.
    """
    values = {"meta_key": QUOTA_VERSION_KEY, "meta_value": version}
    if tx.quota_version is None:  # under the write lock: nobody adds the key meanwhile
        tx.conn.execute(insert(schema.ledger_meta).values(key=QUOTA_VERSION_KEY, value=version))
    else:
        tx.conn.execute(sql.BUMP_META, values)
    tx.quota_version = version
    tx.dirty = tx.inventory_changed = True


def _headroom_warnings(conn: Connection, plan: QuotaPlan, headroom: Headroom) -> tuple[str, ...]:
    """Warn of each pool whose nominal quotas add up to more than it holds outside its headroom."""
    if not headroom.active:
        return ()
    nominal: dict[str, int] = defaultdict(int)
    for quota in plan.quotas:
        if quota.flavor.kind == "pool":
            nominal[quota.flavor.name] += quota.nominal_milli
    n, g = schema.nodes.c, schema.gpus.c
    counts = conn.execute(
        select(n.node_pool, func.count())
        .select_from(schema.gpus.join(schema.nodes, g.node == n.name))
        .group_by(n.node_pool)
        .order_by(n.node_pool)
    )
    found = (
        headroom_overcommit(pool, nominal[pool], count * 1000, headroom.share(pool))
        for pool, count in counts
        if pool in nominal
    )
    return tuple(line for line in found if line)


def _resolved(headroom: Headroom) -> Headroom:
    """The headroom as stored: its urgent priority fixed now (every writer then agrees on it)."""
    if not headroom.active:
        return Headroom()
    if headroom.urgent_priority is not None:
        return headroom
    return Headroom(
        headroom.share_milli, headroom.pools, headroom.lend_to_preemptible, settings.urgent_priority()
    )


def _headroom_rows(headroom: Headroom, now: float) -> list[dict[str, Any]]:
    shares = [(HEADROOM_EVERY_POOL, headroom.share_milli), *headroom.pools]
    return [
        {
            "pool": pool,
            "share_milli": share,
            "lend_to_preemptible": headroom.lend_to_preemptible,
            "urgent_priority": headroom.urgent_priority,
            "updated_at": now,
        }
        for pool, share in shares
    ]


def _key(quota: TeamQuota) -> str:
    return f"{quota.team} {quota.flavor}"


def _row(quota: TeamQuota, now: float) -> dict[str, Any]:
    return {
        "team": quota.team,
        "flavor": str(quota.flavor),
        "cohort": quota.cohort,
        "nominal_milli": quota.nominal_milli,
        "borrowing_limit_milli": quota.borrowing_limit_milli,
        "lending_limit_milli": quota.lending_limit_milli,
        "updated_at": now,
    }
