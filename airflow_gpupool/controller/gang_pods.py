"""Which gated pods of a gang Job may be pinned now, each to its gang member (pure).

GpuJobOperator pins its Job's pods (:mod:`~airflow_gpupool.operators.gang.gang_pins`) and, deferred,
LeasedJobTrigger pins the replacements the Job creates for failed pods; both decide here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpupool.exceptions import GpuPoolError
from airflow_gpupool.labels import (
    COMPLETION_INDEX_ANNOTATION,
    GANG_RESERVATION_LABEL,
    JOB_NAME_LABEL,
    RESERVATION_LABEL,
    SCHEDULING_GATE,
)
from airflow_gpupool.ledger import member_id

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Gang, Reservation

__all__ = ["JOB_NAME_LABEL", "live_member_pod", "pods_to_pin", "replacements_by_member"]
#: Pod phases after which a pod holds no slice any more.
_ENDED = ("Succeeded", "Failed")


def pods_to_pin(
    pods: list[dict[str, Any]], gang: Gang, members: dict[int, Reservation], log: Any
) -> list[tuple[dict[str, Any], Reservation]]:
    """Return the gated pods of a gang Job that may be pinned now, each with its member (pure).

    A gated pod whose completion index has another pod still on the member's slice (scheduled,
    not ``Succeeded`` or ``Failed``: the Job controller may replace a terminating pod before it
    is gone) waits: two pods never share a member. Once that pod ended or is gone, the gated one
    is its replacement and takes the member over.

    :param pods: the Job's live pods, as JSON
    :param gang: the granted gang
    :param members: the gang's granted members, by index
    :param log: where to say that a replacement waits
    :raises GpuPoolError: a gated pod has no member (an index outside the gang)
    """
    chosen: list[tuple[dict[str, Any], Reservation]] = []
    for pod in pods:
        if not _gated(pod):
            continue
        index = _completion_index(pod)
        member = members.get(index) if index is not None else None
        if member is None or member.grant is None:
            raise GpuPoolError(
                f"pod {pod['metadata']['name']} has completion index {index}; "
                f"the gang {gang.leader_id} has members {sorted(members)}"
            )
        running = [
            other["metadata"]["name"]
            for other in pods
            if other is not pod
            and _completion_index(other) == index
            and not _gated(other)
            and (other.get("status") or {}).get("phase") not in _ENDED
        ]
        if running or any(chosen_member is member for _, chosen_member in chosen):
            log.info(
                "Pod %s waits gated: member %s's slice still runs pod %s",
                pod["metadata"]["name"],
                index,
                ", ".join(running) or "(another replacement)",
            )
            continue
        chosen.append((pod, member))
    return chosen


def replacements_by_member(pods: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Return the gang Jobs' gated pods not pinned yet, by the id of the member each will take (pure).

    Reconcile counts them as the member's pods: a member whose pod failed keeps its slice while
    the Job's replacement for it waits to be pinned.

    :param pods: pods labelled ``gpupool.io/gang-reservation``, as JSON
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        leader, index = labels.get(GANG_RESERVATION_LABEL), _completion_index(pod)
        if not leader or index is None or RESERVATION_LABEL in labels or not _gated(pod):
            continue
        found.setdefault(member_id(leader, index), []).append(pod)
    return found


def live_member_pod(
    leader: Reservation, members: Iterable[Reservation], pods: Mapping[str, list[dict[str, Any]]]
) -> str | None:
    """Return a live pod of another holding member of ``leader``'s gang, or None (pure).

    Releasing a gang's leader ends the whole gang: while another member's pod runs, the leader
    is kept, whatever became of its own pod.

    :param leader: a reservation (None is returned unless it is a gang's member 0)
    :param members: holding reservations (those of other gangs are ignored)
    :param pods: the pods of each reservation, by its id
    """
    if leader.gang_index != 0 or leader.gang_id is None:
        return None
    for member in members:
        if member.gang_id != leader.gang_id or member.id == leader.id or not member.state.holds:
            continue
        for pod in pods.get(member.id, []):
            if (pod.get("status") or {}).get("phase") not in _ENDED:
                return f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"
    return None


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _completion_index(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
