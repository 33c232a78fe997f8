"""Pod groups for the gatekeeper (pure): which pods form a group, its gang, which pod takes which member.

Pods annotated ``gpupool.io/gang: NAME`` (:mod:`airflow_gpupool.pod_gang`) form the group
``NAME`` of their namespace. The gatekeeper (:mod:`~airflow_gpupool.controller.gatekeeper`)
reserves a group as one gang reservation once at least its minimum of pods exist, and admits its
gated pods together: each granted member not yet bound to a live pod goes to one gated pod (in
completion-index order, then by name), and a pass admits either enough pods to keep the group at
its minimum or none. This module decides; the gatekeeper does the ledger and API calls.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from airflow_gpupool import settings
from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.labels import (
    COMPLETION_INDEX_ANNOTATION,
    GANG_ANNOTATION,
    GANG_MIN_ANNOTATION,
    GANG_RESERVATION_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GANG_TOPOLOGY_ANNOTATION,
    PRIORITY_CLASS_ANNOTATION,
    REQUEST_ANNOTATION,
    RESERVATION_LABEL,
    SCHEDULING_GATE,
)
from airflow_gpupool.ledger import FINISHED_PHASES, ReservationState
from airflow_gpupool.pod_gang import PodGang, pod_gang
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import RESERVATION_ID_PREFIX

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger, Reservation

__all__ = [
    "PodGroup",
    "assign_members",
    "collect_groups",
    "gate_group",
    "group_key",
    "group_leader_id",
    "group_request",
    "member_order",
    "members_by_gang",
    "oldest",
]

log = logging.getLogger(__name__)

#: The annotations every pod of a group must agree on (the request carries its priority and its
#: promise to checkpoint on SIGTERM; a PriorityClass it takes its priority from is beside it).
_AGREED = (
    REQUEST_ANNOTATION,
    PRIORITY_CLASS_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GANG_MIN_ANNOTATION,
    GANG_TOPOLOGY_ANNOTATION,
)


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return _meta(pod).get("annotations") or {}


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _live(pod: Mapping[str, Any]) -> bool:
    return ((pod.get("status") or {}).get("phase") or "Pending") not in FINISHED_PHASES


def group_key(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return ``(namespace, group name)`` of a pod of a pod group, or None (a gang Job's pods are not)."""
    annotations = _annotations(pod)
    name = annotations.get(GANG_ANNOTATION)
    if name is None or GANG_RESERVATION_ANNOTATION in annotations:
        return None
    return str(_meta(pod).get("namespace", "default")), name


def member_order(pod: Mapping[str, Any]) -> tuple[int, str]:
    """Sort key of a group's pods: the Job's completion index when there is one, then the name."""
    try:
        index = int(_annotations(pod)[COMPLETION_INDEX_ANNOTATION])
    except (KeyError, ValueError):
        index = 1 << 30
    return index, str(_meta(pod).get("name"))


@dataclass
class PodGroup:
    """The pods of one group, from one pod list.

    :param namespace: the group's namespace
    :param name: its name
    :param pods: every pod of the group, finished ones too
    """

    namespace: str
    name: str
    pods: list[dict[str, Any]] = field(default_factory=list)

    @property
    def live(self) -> list[dict[str, Any]]:
        """The pods not finished (gated ones included)."""
        return [p for p in self.pods if _live(p)]

    @property
    def gated(self) -> list[dict[str, Any]]:
        """The pods still gated, in member order."""
        return sorted((p for p in self.pods if _gated(p)), key=member_order)

    def agreed(self) -> tuple[PodGang, str]:
        """Return the gang the group's live pods ask for and the request text they share.

        :raises InvalidRequestError: a pod's annotations are malformed, the pods disagree on the
            request, size, minimum or topology, or there are more pods than the size
        """
        live = self.live
        for key in _AGREED:
            values = {_annotations(p).get(key) for p in live}
            if len(values) > 1:
                seen = ", ".join(f"{_meta(p).get('name')}={_annotations(p).get(key)!r}" for p in live)
                raise InvalidRequestError(key, seen, f"the same value on every pod of gang {self.name}")
        gang = pod_gang(_annotations(live[0]))
        assert gang is not None  # grouped by its annotation
        if len(live) > gang.size:
            raise InvalidRequestError(
                GANG_SIZE_ANNOTATION, gang.size, f"at least the {len(live)} pods of gang {self.name}"
            )
        return gang, _annotations(live[0]).get(REQUEST_ANNOTATION, "")


def collect_groups(pods: Iterable[dict[str, Any]]) -> dict[tuple[str, str], PodGroup]:
    """Return the pod groups of a pod list, by ``(namespace, name)``."""
    groups: dict[tuple[str, str], PodGroup] = {}
    for pod in pods:
        key = group_key(pod)
        if key is not None:
            groups.setdefault(key, PodGroup(*key)).pods.append(pod)
    return groups


def group_request(text: str, gang: PodGang, default_topology_keys: tuple[str, ...]) -> GpuRequest:
    """Return the gang request of a group: the member shape its pods share, with its gang.

    :raises InvalidRequestError: the request text is malformed
    """
    try:
        data = json.loads(text)
    except ValueError:
        raise InvalidRequestError(REQUEST_ANNOTATION, text, "a JSON request") from None
    member = GpuRequest.from_dict(data)
    return GpuRequest.from_dict({**member.to_dict(), "gang": gang.spec(default_topology_keys).to_dict()})


def oldest(group: PodGroup) -> dict[str, Any]:
    """Return a group's oldest pod (by creation time, then name): its task holds the gang."""
    return min(
        group.pods, key=lambda p: (str(_meta(p).get("creationTimestamp") or ""), str(_meta(p).get("name")))
    )


def group_leader_id(group: PodGroup, known: Mapping[str, Reservation]) -> str:
    """Return the id of a group's gang: the one its admitted pods run under, else derived from its oldest pod.

    Derived from the namespace, the name and the uid of the oldest pod (by creation time, then
    name): stable while that pod exists, new for a group made again. Short enough for member ids.

    :param known: the ledger's live reservations by id (an admitted pod's label is a member's id)
    """
    for pod in group.pods:
        member = known.get(str((_meta(pod).get("labels") or {}).get(RESERVATION_LABEL)))
        if member is not None and member.gang_id is not None:
            return member.gang_id
    oldest = min(
        group.pods, key=lambda p: (str(_meta(p).get("creationTimestamp") or ""), str(_meta(p).get("name")))
    )
    seed = f"group|{group.namespace}|{group.name}|{_meta(oldest).get('uid')}"
    # 35 characters: within ledger.gangs.leader_id_limit for any size (at least 60)
    return RESERVATION_ID_PREFIX + hashlib.sha256(seed.encode()).hexdigest()[:32]


def assign_members(
    group: PodGroup, members: Sequence[Reservation], min_members: int
) -> list[tuple[dict[str, Any], Reservation]]:
    """Return the gated pods of a group to admit now, each with its granted member.

    A member bound to a live pod keeps it (a gated one, bound by a pass that died before its
    patch, is admitted with it); the others go to the gated pods in member order. The
    group's admitted live pods and these together must reach its minimum, else none is admitted:
    a group is never ungated piecemeal below its minimum.

    :param group: the group
    :param members: the gang's members that hold a slice now
    :param min_members: the gang's minimum
    """
    live_uids = {str(_meta(p).get("uid")) for p in group.live}
    running = sum(1 for p in group.live if not _gated(p))
    holding = sorted((m for m in members if m.grant is not None), key=lambda m: m.gang_index or 0)
    bound = {m.grant.pod_uid: m for m in holding if m.grant is not None and m.grant.pod_uid in live_uids}
    pairs = [(p, bound[str(_meta(p).get("uid"))]) for p in group.gated if str(_meta(p).get("uid")) in bound]
    unpaired = [p for p in group.gated if str(_meta(p).get("uid")) not in bound]
    free = [m for m in holding if m not in bound.values()]
    pairs += zip(unpaired, free, strict=False)
    if running + len(pairs) < min_members:
        return []
    return pairs


def members_by_gang(grants: Iterable[Reservation]) -> dict[str, list[Reservation]]:
    """Return the holding members of each gang among ``grants``, by gang id."""
    found: dict[str, list[Reservation]] = {}
    for reservation in grants:
        if reservation.gang_id is not None:
            found.setdefault(reservation.gang_id, []).append(reservation)
    return found


class GroupGate(Protocol):
    """What :func:`gate_group` needs of the gatekeeper's pass."""

    ledger: Ledger
    result: Any

    def refuse_bad(self, pod: Mapping[str, Any], why: object) -> None: ...

    def refuse_ended(self, pod: Mapping[str, Any], reservation: Reservation) -> None: ...

    def admission_request(
        self, request: GpuRequest, holder: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
    ) -> GpuRequest: ...

    def reserve(
        self,
        holder: Mapping[str, Any],
        pods: Sequence[Mapping[str, Any]],
        request: Callable[[], GpuRequest],
        rid: str,
    ) -> Reservation | None: ...


def gate_group(
    run: GroupGate,
    group: PodGroup,
    known: Mapping[str, Reservation],
    members: Mapping[str, list[Reservation]],
) -> list[tuple[dict[str, Any], Reservation]]:
    """Reserve a pod group as one gang, or let it wait, or refuse its gated pods; return those to admit now.

    Fewer live pods than the minimum: nothing is reserved. The gang's reservation is read from
    the pass's snapshot (``known``, ``members``), reserved when new (one read more when granted
    at once) as the pass makes a single pod's request (``run.admission_request``: the oldest
    pod's PriorityClass, every live pod's promise to checkpoint on SIGTERM, the spot rule). Pods that disagree, a bad request, a gang that can never fit or that ended: every
    gated pod of the group is refused. The pods not admitted count as waiting.

    :param run: the gatekeeper's pass
    :param group: the group (it has a gated pod)
    :param known: the snapshot's live reservations by id
    :param members: the snapshot's holding gang members, by gang id
    """
    gated = group.gated
    try:
        gang, text = group.agreed()
    except ValueError as e:
        for pod in gated:
            run.refuse_bad(pod, e)
        return []
    leader_id = group_leader_id(group, known)
    names = [_name(p) for p in gated]
    leader = known.get(leader_id)
    if leader is None and len(group.live) < gang.min_members:
        log.info("gang %s: %d of %d pods exist", group.name, len(group.live), gang.min_members)
        run.result.waiting.extend(names)
        return []
    held = members.get(leader_id, [])
    if leader is None:
        holder = oldest(group)
        leader = run.reserve(
            holder,
            gated,
            lambda: run.admission_request(
                group_request(text, gang, settings.gang_topology_keys()), holder, group.live
            ),
            leader_id,
        )
        if leader is None:
            return []
        if leader.state.holds:
            held = list(run.ledger.gang(leader_id).granted)
    if leader.state is ReservationState.WAITING:
        run.result.waiting.extend(names)
        return []
    if leader.grant is None or leader.state.ended:
        for pod in gated:
            run.refuse_ended(pod, leader)
        return []
    chosen = assign_members(group, held, gang.min_members)
    admitted = {id(p) for p, _ in chosen}
    run.result.waiting.extend(_name(p) for p in gated if id(p) not in admitted)
    return chosen


def _name(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace', 'default')}/{_meta(pod).get('name')}"
