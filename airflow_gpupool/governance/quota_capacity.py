"""Quotas against the inventory: a nominal quota larger than what its flavor holds.

Kueue accepts such a quota (a ClusterQueue's nominal quota is not checked against the cluster),
and so does ``gpupool quota apply`` unless told ``--strict``: the team can never hold all of it,
and it reads as a promise the pool cannot keep, so it is worth a warning that names both numbers.
Pure: the ledger passes what each flavor holds (:class:`~airflow_gpupool.ledger.LedgerQuotas`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from airflow_gpupool.exceptions import QuotaFileError
from airflow_gpupool.governance.quotas import Flavor, QuotaPlan, TeamQuota

__all__ = ["QuotaAboveCapacity", "nominals_above_capacity"]


@dataclass(frozen=True)
class QuotaAboveCapacity:
    """A quota whose nominal is above what its flavor holds in the inventory.

    :param capacity_milli: what the flavor holds, in milli-GPU
    """

    quota: TeamQuota
    capacity_milli: int

    def __str__(self) -> str:
        q = self.quota
        where = f" ({q.path}.nominal)" if q.path else ""
        return (
            f"team {q.team}'s nominal quota of {_count(q.nominal_milli)} on {q.flavor}{where} is above "
            f"the {_count(self.capacity_milli)} that {q.flavor.kind} holds in the ledger's inventory"
        )

    def error(self) -> QuotaFileError:
        """Return the error ``quota apply --strict`` refuses the quota with."""
        q = self.quota
        nominal = q.nominal_milli // 1000 if q.nominal_milli % 1000 == 0 else q.nominal_milli / 1000
        return QuotaFileError(
            f"{q.path}.nominal" if q.path else f"nominal on {q.flavor}",
            nominal,
            f"a number of GPUs at most the {_count(self.capacity_milli)} {q.flavor} holds "
            "in the ledger's inventory (--strict; without it the quota is applied with a warning, as Kueue does)",
            team=q.team,
        )


def _count(milli: int) -> str:
    """Say ``1 GPU``, ``8 GPUs``, ``0.5 GPUs``."""
    return "1 GPU" if milli == 1000 else f"{milli / 1000:g} GPUs"


def nominals_above_capacity(
    plan: QuotaPlan, capacity_milli: Mapping[Flavor, int]
) -> tuple[QuotaAboveCapacity, ...]:
    """Return the quotas nominally larger than their flavor (each says both numbers as text).

    :param plan: the quotas about to be applied
    :param capacity_milli: the milli-GPU each flavor holds in the inventory (a pool's GPUs, a model's)
    """
    return tuple(
        QuotaAboveCapacity(quota, capacity_milli.get(quota.flavor, 0))
        for quota in plan.quotas
        if quota.nominal_milli > capacity_milli.get(quota.flavor, 0)
    )
