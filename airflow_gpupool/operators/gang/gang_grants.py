"""What GpuJobOperator does with a gang's grants that needs no Kubernetes: bind, renew, describe.

One Job template serves every member, so the members' slices must bind alike
(:func:`member_binding`); the gang has one lease, lost when any member of its minimum ended
(:class:`GangLease`, what :class:`~airflow_gpupool.operators.pod.lease.LeaseRenewer` renews).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_gpupool.binding import binding_for
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.operators.pod.pod_spec import slice_facts

if TYPE_CHECKING:
    from airflow_gpupool.binding import PodBinding
    from airflow_gpupool.hooks.gpupool import GpuPoolHook
    from airflow_gpupool.ledger import Gang, Grant, Reservation
    from airflow_gpupool.resources import GpuRequest

__all__ = ["GangLease", "describe_members", "member_binding"]


def member_binding(
    gang: Gang, request: GpuRequest, binding_name: Callable[[str], str], task_id: str
) -> PodBinding:
    """Return the binding of a gang's slices; refuse one that differs per member.

    :param gang: the granted gang
    :param request: one member's request
    :param binding_name: the binding strategy of a node pool
    :param task_id: for the error
    :raises ConfigurationError: a member's slice binds otherwise (device env or claims), or not at all
    """
    bound = []
    for member in gang.granted:
        grant = member.grant
        assert grant is not None
        facts = slice_facts(grant)
        where = f"task {task_id} on node pool {grant.node_pool}"
        bound.append(binding_for(request, binding_name(grant.node_pool), where).bind(facts))
    if any(
        (b.limits, b.env, b.resource_claim) != (bound[0].limits, bound[0].env, bound[0].resource_claim)
        for b in bound
    ):
        raise ConfigurationError(
            f"task {task_id}: the gang's slices bind differently per member (device env or claims); "
            "one Job template serves every member: use a binding the device plugin resolves, such as whole"
        )
    return bound[0]


class GangLease:
    """What :class:`~airflow_gpupool.operators.pod.lease.LeaseRenewer` renews for a gang: all of it.

    :param hook: the ledger hook
    """

    def __init__(self, hook: GpuPoolHook) -> None:
        self._hook = hook

    def renew(self, reservation_id: str, ttl: float | None = None) -> Gang:
        """Renew every member; a member of the gang's minimum that ended loses the lease.

        :raises LeaseExpiredError: the leader, or a member of the minimum, holds nothing
        """
        return self._hook.renew_gang(reservation_id, ttl)

    def get(self, reservation_id: str) -> Reservation:
        """Read the leader (a gang is never a preemption victim, so it is never ``preempting``)."""
        return self._hook.get(reservation_id)


def describe_members(gang: Gang) -> str:
    """Return where the gang's granted members are, ``node:gpus`` each, for the log."""
    return ", ".join(_where(m.grant) for m in gang.granted)


def _where(grant: Grant | None) -> str:
    if grant is None:
        return "?"
    return f"{grant.node}:{grant.mig_slice or ','.join(map(str, grant.gpu_indices))}"
