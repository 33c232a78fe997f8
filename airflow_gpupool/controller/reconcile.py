"""Reconciliation: release grants whose pods finished, vanished or never appeared; end orphans.

A grant is judged by the pods labelled with its reservation id (``gpupool.io/reservation-id``), in
all namespaces: kept while any of them is not finished, released when all have finished, when its
bound pod is gone, or when no pod has appeared within the grace period (the operator creates its
pod after the grant). A grant released because its pod ended says how the pod ended, classed by
the operators' own rules (:func:`~airflow_gpupool.pod_failures.describe_end`): reconcile may get
there before the pod's operator, whose record of the try must then agree with it.

An *orphaned* grant (its lease expired while a pod was bound to it: its worker died) still holds
its slice. It is released as soon as its pods are finished or gone; while one still runs it is
kept for ``orphan_grace_seconds`` after it became orphaned (time for a retry to re-attach and
renew it), then its pods are deleted, with an Event on each saying why, and the slice freed once
they are gone (:mod:`~airflow_gpupool.controller.pod_deletion`): a deleted pod runs on while it
terminates. A pass sends every such ``DELETE`` first and then waits for the pods together, so it
lasts about the longest grace, not their sum. A preemption victim orphaned at its deadline has had its grace: its pods are removed
with ``gracePeriodSeconds=0``.

:func:`reconcile` judges every grant of a cluster (``gpupool reconcile``), :func:`reconcile_grant`
one grant (the operator, on a lease renewal).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_gpupool import settings
from airflow_gpupool.controller.gang_pods import live_member_pod, replacements_by_member
from airflow_gpupool.controller.orphan_pods import ORPHAN_EVENT_REASON, delete_orphan_pod
from airflow_gpupool.controller.pod_deletion import PodDeletion, finish_deletion
from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.inventory.sync import list_nodes, list_objects
from airflow_gpupool.labels import GANG_RESERVATION_LABEL, RESERVATION_LABEL
from airflow_gpupool.ledger import FINISHED_PHASES, ReservationState
from airflow_gpupool.pod_failures import describe_end
from airflow_gpupool.task_try import RESERVATION_ID_PREFIX

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger, Reservation

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "FINISHED_PHASES",
    "OPERATOR_ID_PREFIX",
    "ORPHAN_EVENT_REASON",
    "ReconcileResult",
    "check_grace",
    "reconcile",
    "reconcile_grant",
    "verdict",
]

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 300.0
#: The reservation ids GpuPodOperator makes (:attr:`airflow_gpupool.task_try.TaskTry.reservation_id`):
#: by default reconcile judges only these, never a grant made by hand.
OPERATOR_ID_PREFIX = RESERVATION_ID_PREFIX


@dataclass(frozen=True)
class ReconcileResult:
    """What one reconcile did.

    :param released: ``(reservation id, reason)`` of each grant released
    :param kept: grants whose pods are alive, or still within the grace period
    :param ignored: grants on nodes this cluster does not have (another cluster may share the ledger)
    :param orphans_kept: orphaned grants whose pods still run, within ``orphan_grace_seconds``
    :param orphans_released: orphaned grants released (also in ``released``)
    :param deleted: ``(reservation id, namespace/name)`` of each pod deleted because its
        orphaned grant's grace ran out
    """

    released: tuple[tuple[str, str], ...] = ()
    kept: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    orphans_kept: tuple[str, ...] = ()
    orphans_released: tuple[str, ...] = ()
    deleted: tuple[tuple[str, str], ...] = ()

    def summary(self) -> str:
        """Return a one-line account such as ``1 released, 2 kept, 0 ignored; orphans: ...``."""
        return (
            f"{len(self.released)} released, {len(self.kept)} kept, {len(self.ignored)} ignored; "
            f"orphans: {len(self.orphans_kept)} kept, {len(self.orphans_released)} released, "
            f"{len(self.deleted)} pod(s) deleted"
        )

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (``--json``)."""
        return {
            "released": [{"id": rid, "reason": reason} for rid, reason in self.released],
            "kept": list(self.kept),
            "ignored": list(self.ignored),
            "orphans": {
                "kept": list(self.orphans_kept),
                "released": list(self.orphans_released),
                "deleted": [{"id": rid, "pod": pod} for rid, pod in self.deleted],
            },
        }


def check_grace(name: str, value: Any) -> float:
    """Return ``value`` as a number of seconds >= 0.

    :raises InvalidRequestError: negative, NaN, or not a number
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < 0:
        raise InvalidRequestError(name, value, "a number of seconds >= 0")
    return float(value)


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name')}"


def verdict(
    reservation: Reservation, pods: list[dict[str, Any]], now: float, grace_seconds: float
) -> str | None:
    """Return why a grant should be released, or None to keep it (pure: no I/O).

    :param reservation: a granted (or orphaned) reservation
    :param pods: its pods (labelled with its id), as JSON dicts
    :param now: the time the grant is aged against
    :param grace_seconds: how long a grant may wait for its pod
    """
    if pods:
        if any(_phase(p) not in FINISHED_PHASES for p in pods):
            return None
        # Retries may leave older pods of the same reservation: name the newest.
        last = max(pods, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        return f"pod {_name(last)} finished ({describe_end(last)})"
    grant = reservation.grant
    assert grant is not None
    if grant.pod_uid is not None:
        return f"pod {grant.pod_namespace}/{grant.pod_name} gone"
    # Bound by name alone, the pod may be on its way: judged like an unbound grant.
    if now - grant.granted_at >= grace_seconds:
        return f"no pod for {grace_seconds:g}s"
    return None


def _pods_by_reservation(api: Any, selector: str) -> dict[str, list[dict[str, Any]]]:
    pods: dict[str, list[dict[str, Any]]] = {}
    for pod in list_objects(api.list_pod_for_all_namespaces, label_selector=selector):
        rid = ((pod.get("metadata") or {}).get("labels") or {}).get(RESERVATION_LABEL)
        if rid:
            pods.setdefault(rid, []).append(pod)
    return pods


@dataclass
class _Reconcile:
    """One pass over the grants of a snapshot (see :func:`reconcile`)."""

    ledger: Ledger
    api: Any
    now: float
    grace_seconds: float
    orphan_grace_seconds: float
    pods: dict[str, list[dict[str, Any]]]
    grants: tuple[Reservation, ...] = ()
    released: list[tuple[str, str]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    orphans_kept: list[str] = field(default_factory=list)
    orphans_released: list[str] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)
    #: orphans whose pods this pass deleted: released by :meth:`finish` once those pods are gone
    ending: list[tuple[Reservation, str, list[PodDeletion]]] = field(default_factory=list)

    def judge(self, reservation: Reservation) -> None:
        orphaned = reservation.state is ReservationState.ORPHANED
        pods = self.pods.get(reservation.id, [])
        reason = verdict(reservation, pods, self.now, self.grace_seconds)
        if reason is None and orphaned:
            reason = self._end_orphan(reservation, pods)
            if reason is not None:
                return  # released by finish(), once its deleted pods are gone
        self._settle(reservation, reason, orphaned)

    def finish(self) -> None:
        """Wait for the pods this pass deleted (all terminating at once), then release their grants."""
        for reservation, reason, deletions in self.ending:
            for deletion in deletions:
                # The slice is released after this returns: never while the pod still runs on it.
                finish_deletion(self.api, deletion, why=reason)
            self._settle(reservation, reason, orphaned=True)

    def _settle(self, reservation: Reservation, reason: str | None, orphaned: bool) -> None:
        """Keep the grant (``reason`` None, or a gang leader whose gang still runs) or release it."""
        if reason is not None and (running := live_member_pod(reservation, self.grants, self.pods)):
            log.info(
                "Keeping gang leader %s (%s): its gang's pod %s still runs", reservation.id, reason, running
            )
            reason = None  # releasing the leader would end the whole gang
        if reason is None:
            (self.orphans_kept if orphaned else self.kept).append(reservation.id)
            return
        if self.ledger.release(reservation.id, reason=f"reconcile: {reason}").released:
            log.info("Released %s: %s", reservation.id, reason)
            self.released.append((reservation.id, reason))
            if orphaned:
                self.orphans_released.append(reservation.id)

    def _end_orphan(self, reservation: Reservation, pods: list[dict[str, Any]]) -> str | None:
        """Delete the live pods of an orphan whose grace ran out; return why, or None to keep it."""
        since = reservation.orphaned_at if reservation.orphaned_at is not None else self.now
        # A preemption victim orphaned at its deadline had its grace already: its pod goes now.
        preempted = reservation.preempt_deadline is not None
        grace = 0.0 if preempted else self.orphan_grace_seconds
        if self.now - since < grace:
            return None
        # Its holder may have renewed it since the snapshot: then its pods are not orphans.
        current = self.ledger.get_or_none(reservation.id)
        if current is None or current.state is not ReservationState.ORPHANED:
            return None
        live = [p for p in pods if _phase(p) not in FINISHED_PHASES]
        names = ", ".join(_name(p) for p in live)
        if preempted:
            reason = f"preemption grace ended: deleted pod {names}"
            message = (
                f"gpupool: reservation {reservation.id} was preempted for {reservation.preempted_by} and "
                "its pod outlived its grace; deleting the pod to pass its GPU slice on"
            )
        else:
            reason = f"orphaned for over {self.orphan_grace_seconds:g}s: deleted pod {names}"
            message = (
                f"gpupool: the lease of reservation {reservation.id} expired and nobody renewed it for "
                f"{self.orphan_grace_seconds:g}s; deleting the pod to free its GPU slice"
            )
        deletions: list[PodDeletion] = []
        for pod in live:
            log.warning("Deleting pod %s of orphaned grant %s: %s", _name(pod), reservation.id, message)
            # A victim past its deadline had its grace (the holder's delete gave it): none more.
            pod_grace = 0.0 if preempted else None
            deletion = delete_orphan_pod(self.api, pod, message, self.now, grace_seconds=pod_grace)
            if deletion is not None:
                deletions.append(deletion)
            self.deleted.append((reservation.id, _name(pod)))
        self.ending.append((reservation, reason, deletions))
        return reason


def reconcile(
    ledger: Ledger,
    core_v1_api: Any,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    orphan_grace_seconds: float | None = None,
    now: float | None = None,
    all_nodes: bool = False,
    id_prefix: str | None = None,
    include_manual: bool = False,
    still_leading: Callable[[], bool] | None = None,
) -> ReconcileResult:
    """Release grants whose pods finished, vanished, or that have had no pod for ``grace_seconds``.

    Pods are found by their ``gpupool.io/reservation-id`` label, in all namespaces. A grant with a
    pod that is not finished is kept, whatever its other pods did (a retry's new pod beside the
    failed one); an orphaned one only for ``orphan_grace_seconds``, then its pods are deleted. A
    gang member's pods include the gated replacement its Job made for it (``gpupool.io/gang-reservation``
    label and the completion index), not pinned yet.

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param grace_seconds: how long a grant may wait for its pod (the operator creates it after the grant)
    :param orphan_grace_seconds: how long an orphaned grant's pod may run on (default
        ``[gpupool] orphan_grace_seconds``)
    :param now: the time grants are aged against (default: the ledger's clock)
    :param all_nodes: also judge grants on nodes this cluster does not list; by default they are
        ignored, since a ledger shared by several clusters holds grants whose pods are elsewhere
    :param id_prefix: judge only reservations whose id starts with this
    :param include_manual: also judge grants GpuPodOperator did not make (ids not starting ``gp-``)
    :param still_leading: asked before each grant; once it says False the pass stops (a controller
        replica that lost its Lease must not act beside the new leader)
    :raises InvalidRequestError: a grace is negative or NaN
    """
    grace = check_grace("grace_seconds", grace_seconds)
    orphan_grace = check_grace(
        "orphan_grace_seconds",
        settings.orphan_grace_seconds() if orphan_grace_seconds is None else orphan_grace_seconds,
    )
    snapshot = ledger.snapshot()
    cluster_nodes = None if all_nodes else {n["metadata"]["name"] for n in list_nodes(core_v1_api)}
    pods = _pods_by_reservation(core_v1_api, RESERVATION_LABEL)
    gang_pods = list_objects(core_v1_api.list_pod_for_all_namespaces, label_selector=GANG_RESERVATION_LABEL)
    for member, waiting in replacements_by_member(gang_pods).items():
        pods.setdefault(member, []).extend(waiting)  # a failed member's replacement, not pinned yet
    run = _Reconcile(
        ledger,
        core_v1_api,
        snapshot.taken_at if now is None else now,
        grace,
        orphan_grace,
        pods,
        snapshot.grants,
    )
    ignored: list[str] = []
    for reservation in snapshot.grants:
        grant = reservation.grant
        if grant is None or not _judged(reservation.id, id_prefix, include_manual):
            continue
        if cluster_nodes is not None and grant.node not in cluster_nodes:
            ignored.append(reservation.id)
            continue
        if still_leading is not None and not still_leading():
            log.warning(
                "Reconcile stopped after %d grant(s): this controller no longer leads",
                len(run.kept) + len(run.released),
            )
            break
        run.judge(reservation)
    run.finish()
    return ReconcileResult(
        tuple(run.released),
        tuple(run.kept),
        tuple(ignored),
        tuple(run.orphans_kept),
        tuple(run.orphans_released),
        tuple(run.deleted),
    )


def _judged(reservation_id: str, id_prefix: str | None, include_manual: bool) -> bool:
    if not include_manual and not reservation_id.startswith(OPERATOR_ID_PREFIX):
        return False
    return not id_prefix or reservation_id.startswith(id_prefix)


def reconcile_grant(
    ledger: Ledger,
    core_v1_api: Any,
    reservation_id: str,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: float | None = None,
) -> str | None:
    """Reconcile one grant (from a lease renewal): release it if its pod finished, went or never came.

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param reservation_id: the grant
    :param grace_seconds: how long the grant may wait for its pod
    :param now: the time the grant is aged against (default: the ledger's clock)
    :return: why it was released, or None when it was kept (or was no live grant)
    :raises InvalidRequestError: ``grace_seconds`` is negative or NaN
    """
    grace = check_grace("grace_seconds", grace_seconds)
    reservation = ledger.get_or_none(reservation_id)
    if reservation is None or reservation.grant is None or reservation.state.ended:
        return None
    pods = _pods_by_reservation(core_v1_api, f"{RESERVATION_LABEL}={reservation_id}")
    reason = verdict(reservation, pods.get(reservation_id, []), ledger.now() if now is None else now, grace)
    if reason is None or not ledger.release(reservation_id, reason=f"reconcile: {reason}").released:
        return None
    return reason
