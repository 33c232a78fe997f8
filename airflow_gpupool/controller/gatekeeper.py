"""The gatekeeper: admits the pods the executor hook gated, through the same ledger queue as the rest.

Each pass (:func:`gatekeep`) lists the pods once, reads one ledger snapshot, takes the pods still
carrying the ``gpupool.io/reservation`` gate (:mod:`airflow_gpupool.executor_hook`), highest
priority first, then oldest, and for each:

* reserves its request if the ledger does not know it yet (idempotent: the reservation id is
  derived from the pod's uid, the holder from its Airflow identity, host ``gatekeeper``), so it
  waits in the queue like any other request, at the priority of its PriorityClass when it takes
  it from there (:mod:`~airflow_gpupool.controller.priority_classes`; a class that cannot be read:
  a Warning Event and the request's own priority), on the capacity the default spot rule chooses
  (:mod:`~airflow_gpupool.controller.capacity`); a pod already queued or granted is read from the
  snapshot, not reserved again (the pass's one ``reap_if_due`` ends the waits past their timeout).
  A gated pod holds no worker slot and no GPU, so nothing needs to defer;
* once granted, binds the grant to the pod (by name and uid, all the pass's grants in one ledger
  write, before touching the pods: a gatekeeper dying in between leaves a gated pod on a held
  grant, admitted by the next pass, never a pod on a freed slice), then pins it with only what
  Kubernetes allows on a gated pod (one patch and one Event per pod): a ``nodeSelector`` entry
  for the granted node, the GPU toleration, the ``gpupool.io/reservation-id`` label (reconcile
  finds the grant's pod by it and frees the grant when the pod ends), annotations with the grant,
  and the gate removed (other gates stay);
* a refused binding (the hook said why), a promise to checkpoint on SIGTERM with nowhere to write
  (:func:`~airflow_gpupool.pod_options.check_sigterm_promise`), a request that can never fit, or
  one whose reservation timed out: an Event on the pod naming what blocked it, then the pod is deleted, so its task
  fails with that reason.

Gated pods of a pod group (``gpupool.io/gang``) are reserved as one gang and admitted together, at
the turn of the group's first pod (:mod:`~airflow_gpupool.controller.pod_groups`), through the
same priority, SIGTERM and spot rules as a single pod (its oldest pod's class; checkpointed when
every pod is); a gang's leader
is released only once no pod of its group lives (releasing it ends the gang).

Admitted pods hold a lease like any grant: each pass renews the grants of the live ones that are
past half their TTL, and releases those whose pod finished or is gone at once (reconcile would,
at its next interval). A waiting request whose pod went away is withdrawn.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_gpupool import settings
from airflow_gpupool.controller.admission import admission_patch, gatekeeper_event
from airflow_gpupool.controller.capacity import GatedCapacity
from airflow_gpupool.controller.pod_groups import (
    collect_groups,
    gate_group,
    group_key,
    group_leader_id,
    members_by_gang,
)
from airflow_gpupool.controller.priority_classes import PodPriorities
from airflow_gpupool.exceptions import GpuPoolError, NoCapacityError
from airflow_gpupool.executor_hook import GATEKEEPER_HOST, REFUSED, identity_from_annotations
from airflow_gpupool.inventory.sync import list_objects
from airflow_gpupool.labels import (
    BINDING_ANNOTATION,
    GANG_RESERVATION_ANNOTATION,
    REQUEST_ANNOTATION,
    RESERVATION_LABEL,
    SCHEDULING_GATE,
)
from airflow_gpupool.ledger import FINISHED_PHASES, ReservationState
from airflow_gpupool.pod_failures import describe_end
from airflow_gpupool.pod_options import check_sigterm_promise
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import RESERVATION_ID_PREFIX

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger, Reservation

__all__ = [
    "GATEKEEPER_HOST",
    "GateResult",
    "admission_patch",
    "gatekeep",
    "gated_reservation_id",
]

log = logging.getLogger(__name__)

REASON_ADMITTED = "GpuPoolAdmitted"
REASON_REFUSED = "GpuPoolBindingRefused"
REASON_TIMED_OUT = "GpuPoolReservationTimedOut"
REASON_NO_CAPACITY = "GpuPoolNoCapacity"
REASON_UNKNOWN_PRIORITY_CLASS = "GpuPoolUnknownPriorityClass"


@dataclass
class GateResult:
    """What one gatekeeper pass did, each list of ``namespace/name`` (``(pod, reason)`` for the deleted).

    :param admitted: pods granted, pinned and ungated
    :param waiting: pods whose request waits in the queue
    :param deleted: pods deleted, with why
    :param released: grants released because their pod finished
    :param withdrawn: waiting requests withdrawn because their pod went away
    :param renewed: grants of admitted pods renewed
    """

    admitted: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    withdrawn: list[str] = field(default_factory=list)
    renewed: int = 0

    def summary(self) -> str:
        """Return a one-line account such as ``2 admitted, 1 waiting, 0 deleted, ...``."""
        return (
            f"{len(self.admitted)} admitted, {len(self.waiting)} waiting, {len(self.deleted)} deleted, "
            f"{len(self.released)} released, {len(self.withdrawn)} withdrawn, {self.renewed} renewed"
        )


def gated_reservation_id(uid: str) -> str:
    """Return the reservation id of a gated pod: stable for the pod, new for a new pod.

    :param uid: the pod's uid
    """
    return RESERVATION_ID_PREFIX + hashlib.sha256(f"gate|{uid}".encode()).hexdigest()[:32]


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _name(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace', 'default')}/{_meta(pod).get('name')}"


def _namespace(pod: Mapping[str, Any]) -> str:
    return str(_meta(pod).get("namespace", "default"))


def _admission_order(pod: Mapping[str, Any], priorities: PodPriorities) -> tuple[int, str]:
    """Sort key of gated pods: the highest priority first (a PriorityClass's when the pod takes it
    from there), then the oldest (ties keep list order)."""
    try:
        priority = int(
            json.loads((_meta(pod).get("annotations") or {})[REQUEST_ANNOTATION]).get("priority", 0)
        )
    except (KeyError, TypeError, ValueError, AttributeError):  # refused later, with the reason
        priority = 0
    resolved = priorities.resolve(pod).priority
    return -(priority if resolved is None else resolved), str(_meta(pod).get("creationTimestamp") or "")


def _is_ours(pod: Mapping[str, Any]) -> bool:
    if GANG_RESERVATION_ANNOTATION in (_meta(pod).get("annotations") or {}):
        return False  # a gang Job's pod: GpuJobOperator holds the gang and pins it
    return any(g.get("name") == SCHEDULING_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _admitted_here(pod: Mapping[str, Any]) -> bool:
    """Return whether the gatekeeper admitted this pod (its label is the id derived from its uid)."""
    rid = (_meta(pod).get("labels") or {}).get(RESERVATION_LABEL)
    return bool(rid) and rid == gated_reservation_id(str(_meta(pod).get("uid")))


def _holder(pod: Mapping[str, Any]) -> str:
    who = identity_from_annotations(dict(_meta(pod).get("annotations") or {}))
    if who is not None:
        return who.holder
    return f"pod:{_name(pod)}@{GATEKEEPER_HOST}"


@dataclass(frozen=True)
class _Granted:
    pod: Mapping[str, Any]
    reservation: Reservation
    gang_id: str | None = None  # a pod group's: ungated with the rest of its group, or not at all


@dataclass
class _Pass:
    ledger: Ledger
    api: Any
    timeout: float | None
    capacity: GatedCapacity
    priorities: PodPriorities
    result: GateResult = field(default_factory=GateResult)
    #: The gangs of pod groups with a live pod: their leader is not released (that ends the gang).
    live_gangs: set[str] = field(default_factory=set)
    renewed_gangs: set[str] = field(default_factory=set)

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.create_namespaced_event(
                _meta(pod).get("namespace", "default"), gatekeeper_event(pod, kind, reason, message)
            )
        except ApiException as e:  # the event explains; the action matters
            log.warning("Could not record an event on pod %s: %s", _name(pod), e.reason)

    def refuse_bad(self, pod: Mapping[str, Any], why: object) -> None:
        """Refuse a pod whose request or group is bad."""
        self.refuse(pod, REASON_REFUSED, f"gpupool cannot admit this pod: {why}")

    def refuse(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        """Leave an Event saying why, then delete the pod: its task fails with that reason."""
        from kubernetes.client.exceptions import ApiException

        log.warning("Deleting gated pod %s: %s", _name(pod), message)
        self.event(pod, "Warning", reason, message)
        try:
            # Gated, the pod is on no node: the API server removes it at once, nothing to wait for.
            self.api.delete_namespaced_pod(_meta(pod)["name"], _meta(pod).get("namespace", "default"))
        except ApiException as e:
            if e.status != 404:
                raise
        self.result.deleted.append((_name(pod), message))

    def reservation_of(self, pod: Mapping[str, Any], known: Mapping[str, Reservation]) -> Reservation | None:
        """Return a gated pod's reservation: the pass's snapshot's, or reserved now; None when refused.

        A pod already queued or granted is not reserved again: its state is in the snapshot.
        """
        why = _refusal(pod)
        if why is not None:
            self.refuse_bad(pod, why)
            return None
        rid = gated_reservation_id(str(_meta(pod).get("uid")))
        if rid in known:
            return known[rid]
        text = str(_meta(pod)["annotations"][REQUEST_ANNOTATION])
        return self.reserve(
            pod,
            [pod],
            lambda: self.admission_request(GpuRequest.from_dict(json.loads(text)), pod, [pod]),
            rid,
        )

    def admission_request(
        self, request: GpuRequest, holder: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
    ) -> GpuRequest:
        """Return what to reserve for ``pods`` (one pod, or a group's live pods held by ``holder``'s task).

        The priority of ``holder``'s PriorityClass when it takes it from there (a class that cannot
        be read: a Warning Event on each pod, and the request's own), then the spot rule's capacity.

        :raises InvalidRequestError: a pod promises a checkpoint on SIGTERM with nowhere to write it
        """
        for pod in pods:
            check_sigterm_promise(request.checkpoint_on_sigterm, pod)
        resolved = self.priorities.resolve(holder)
        if resolved.problem is not None:
            message = f"gpupool: {resolved.problem}; reserved at priority {request.priority}"
            log.warning("Gated pod %s: %s", _name(holder), message)
            for pod in pods:
                self.event(pod, "Warning", REASON_UNKNOWN_PRIORITY_CLASS, message)
        elif resolved.priority is not None:
            request = replace(request, priority=resolved.priority)
        return self.capacity.apply(request, *pods)

    def reserve(
        self,
        holder: Mapping[str, Any],
        pods: Sequence[Mapping[str, Any]],
        request: Callable[[], GpuRequest],
        rid: str,
    ) -> Reservation | None:
        """Reserve ``request()`` held by ``holder``'s task; refuse ``pods`` when it is bad or can never fit."""
        try:
            return self.ledger.reserve(request(), _holder(holder), timeout=self.timeout, reservation_id=rid)
        except NoCapacityError as e:
            for pod in pods:
                self.refuse(pod, REASON_NO_CAPACITY, f"gpupool: the request can never fit this pool: {e}")
        except ValueError as e:  # a bad request (InvalidRequestError is one); an unreachable ledger is
            # not: it fails the step, retried at the next pass, and never deletes a pod
            for pod in pods:
                self.refuse_bad(pod, e)
        return None

    def sort_out(self, pod: Mapping[str, Any], reservation: Reservation, granted: list[_Granted]) -> None:
        """Count a waiting pod, refuse one whose reservation ended, or add a granted one to ``granted``."""
        if reservation.state is ReservationState.WAITING:
            self.result.waiting.append(_name(pod))
        elif reservation.grant is None or reservation.state.ended:
            self.refuse_ended(pod, reservation)
        else:
            granted.append(_Granted(pod, reservation))

    def refuse_ended(self, pod: Mapping[str, Any], reservation: Reservation) -> None:
        """Refuse a pod whose reservation ended before it was admitted (timed out, withdrawn)."""
        blocked = reservation.message or reservation.state.value
        self.refuse(
            pod,
            REASON_TIMED_OUT,
            f"gpupool: reservation {reservation.id} {reservation.state.value} after "
            f"{reservation.waited_seconds:.0f}s in the queue; blocked by: {blocked}",
        )

    def admit(self, granted: list[_Granted]) -> None:
        """Bind every granted pod in one ledger write, then pin and ungate each.

        Bound before the pod is touched: a gatekeeper dying in between leaves a gated pod on a
        held grant, which the next pass admits, never a pod on a freed slice.
        """
        if not granted:
            return
        bound = self.ledger.bind_many(
            {
                g.reservation.id: (_namespace(g.pod), str(_meta(g.pod)["name"]), str(_meta(g.pod).get("uid")))
                for g in granted
            }
        )
        failed = {g.reservation.id for g in granted if isinstance(bound[g.reservation.id], GpuPoolError)}
        broken = {g.gang_id for g in granted if g.reservation.id in failed}
        for g in granted:
            if g.reservation.id in failed:  # ended since the snapshot: the next pass refuses it
                log.warning(
                    "Could not bind %s to pod %s: %s", g.reservation.id, _name(g.pod), bound[g.reservation.id]
                )
            elif g.gang_id is not None and g.gang_id in broken:  # a group is ungated whole or not at all
                log.warning(
                    "Pod %s stays gated: a member of its gang %s could not be bound", _name(g.pod), g.gang_id
                )
            else:
                self.ungate(g.pod, g.reservation)

    def ungate(self, pod: Mapping[str, Any], reservation: Reservation) -> None:
        """Pin a bound pod to its grant, remove our gate and say so in an Event."""
        grant = reservation.grant
        assert grant is not None  # sorted out as granted
        self.api.patch_namespaced_pod(
            str(_meta(pod)["name"]), _namespace(pod), admission_patch(pod, reservation.id, grant)
        )
        self.event(
            pod,
            "Normal",
            REASON_ADMITTED,
            f"gpupool granted {reservation.request.describe()} on {grant.node} "
            f"(reservation {reservation.id}); scheduling gate removed",
        )
        log.info("Admitted gated pod %s on %s (%s)", _name(pod), grant.node, reservation.id)
        self.result.admitted.append(_name(pod))

    def release_if_gone(self, reservation: Reservation, uids: set[str]) -> None:
        """Release a grant of ours whose pod is gone (KubernetesPodOperator deletes its pod when done)."""
        grant = reservation.grant
        if not _ours(reservation) or grant is None or grant.pod_uid is None or grant.pod_uid in uids:
            return
        if self.keeps_leader(reservation):
            return
        reason = f"gatekeeper: pod {grant.pod_namespace}/{grant.pod_name} gone"
        if self.ledger.release(reservation.id, reason=reason).released:
            self.result.released.append(reservation.id)

    def tend(self, pod: Mapping[str, Any], grants: Mapping[str, Reservation], now: float) -> None:
        """Renew or release the grant of a pod this gatekeeper admitted."""
        rid = (_meta(pod).get("labels") or {}).get(RESERVATION_LABEL)
        reservation = grants.get(str(rid))
        if reservation is None or reservation.grant is None:
            return
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase in FINISHED_PHASES:
            if self.keeps_leader(reservation):
                return
            if self.ledger.release(
                reservation.id, reason=f"gatekeeper: pod {_name(pod)} finished ({describe_end(pod)})"
            ).released:
                self.result.released.append(reservation.id)
            return
        ttl = settings.lease_ttl_seconds()
        if reservation.gang_id is not None and reservation.gang_id in self.renewed_gangs:
            return  # renewing one member renewed them all
        if reservation.grant.expires_at - now < ttl / 2 or reservation.state is ReservationState.ORPHANED:
            try:
                self.ledger.renew(reservation.id, ttl)
            except GpuPoolError as e:  # ended meanwhile: reconcile deals with its pod
                log.warning("Could not renew %s of pod %s: %s", reservation.id, _name(pod), e)
                return
            self.result.renewed += 1
            if reservation.gang_id is not None:
                self.renewed_gangs.add(reservation.gang_id)

    def withdraw_if_gone(self, waiting: Reservation, gated_ids: set[str]) -> None:
        """Withdraw a waiting request of ours whose gated pod went away (a group's gang: all its pods)."""
        if waiting.gang_id is not None:  # an elastic member's growth ends with its gang
            gone = waiting.gang_index == 0 and waiting.gang_id not in self.live_gangs
        else:
            gone = waiting.id not in gated_ids
        if _ours(waiting) and gone:
            if self.ledger.release(waiting.id, reason="gatekeeper: its gated pod went away").released:
                self.result.withdrawn.append(waiting.id)

    def keeps_leader(self, reservation: Reservation) -> bool:
        """Return whether a gang leader must stay: releasing it ends the gang, while a pod of its group lives."""
        return reservation.gang_index == 0 and reservation.gang_id in self.live_gangs


def _refusal(pod: Mapping[str, Any]) -> str | None:
    """Return why the executor hook refused a gated pod, or None when it did not."""
    annotations = _meta(pod).get("annotations") or {}
    binding = str(annotations.get(BINDING_ANNOTATION, ""))
    if binding.startswith(REFUSED) or not annotations.get(REQUEST_ANNOTATION):
        return (
            binding.partition(": ")[2] or "no gpupool.io/request annotation (not gated by the executor hook)"
        )
    return None


def _ours(reservation: Reservation) -> bool:
    return reservation.holder.endswith(f"@{GATEKEEPER_HOST}")


def gatekeep(ledger: Ledger, core_v1_api: Any, *, timeout: float | None = None) -> GateResult:
    """Admit, wait or refuse each gated pod; renew or release the grants of admitted pods.

    One pod list and one ledger snapshot per pass. Only pods new to the ledger are reserved (one
    transaction each, highest priority first, then oldest); the pods granted in the pass are
    bound in one transaction.

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param timeout: seconds a gated pod may wait in the queue (default
        ``[gpupool] reservation_timeout_seconds``)
    :raises ConfigurationError: the spot rule's options are malformed (before any pod is touched)
    """
    run = _Pass(ledger, core_v1_api, timeout, GatedCapacity.from_settings(), PodPriorities(core_v1_api))
    pods = list(list_objects(core_v1_api.list_pod_for_all_namespaces))
    ledger.reap_if_due()  # waits past their timeout end here, since queued pods are not reserved again
    snapshot = ledger.snapshot()
    grants = {r.id: r for r in snapshot.grants}
    known = {**grants, **{r.id: r for r in snapshot.queue}}
    gated = sorted((p for p in pods if _is_ours(p)), key=lambda p: _admission_order(p, run.priorities))
    groups = collect_groups(pods)
    run.live_gangs = {group_leader_id(g, known) for g in groups.values() if g.live}
    members = members_by_gang(snapshot.grants)
    granted: list[_Granted] = []
    seen: set[tuple[str, str]] = set()
    for pod in gated:
        key = group_key(pod)
        if key is None or _refusal(pod) is not None:
            reservation = run.reservation_of(pod, known)
            if reservation is not None:
                run.sort_out(pod, reservation, granted)
        elif key not in seen:  # a group's turn comes with its first pod's
            seen.add(key)
            granted.extend(_Granted(p, m, m.gang_id) for p, m in gate_group(run, groups[key], known, members))
    run.admit(granted)
    for pod in pods:
        if not _is_ours(pod) and (_admitted_here(pod) or group_key(pod) is not None):
            run.tend(pod, grants, snapshot.taken_at)
    uids = {str(_meta(p).get("uid")) for p in pods}
    for reservation in snapshot.grants:
        run.release_if_gone(reservation, uids)
    gated_ids = {gated_reservation_id(str(_meta(p).get("uid"))) for p in gated}
    for waiting in snapshot.queue:
        run.withdraw_if_gone(waiting, gated_ids)
    return run.result
