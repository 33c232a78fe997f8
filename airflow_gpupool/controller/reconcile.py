"""Reconciliation: release grants whose pods finished or never appeared.

A grant is judged by the pods labelled with its reservation id (``gpupool.io/reservation-id``), in
all namespaces: kept while any of them is not finished, released when all have finished, or when
none has appeared within the grace period (the operator creates its pod after the grant).
:func:`reconcile` judges every grant of a cluster (``gpupool reconcile``), :func:`reconcile_grant`
one grant (the operator, on a lease renewal).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_gpupool.inventory.sync import list_nodes, list_objects
from airflow_gpupool.labels import RESERVATION_LABEL

if TYPE_CHECKING:
    from airflow_gpupool.ledger import Ledger
    from airflow_gpupool.ledger.models import Reservation

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "FINISHED_PHASES",
    "ReconcileResult",
    "reconcile",
    "reconcile_grant",
    "verdict",
]

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 300.0
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class ReconcileResult:
    """What one reconcile did.

    :param released: ``(reservation id, reason)`` of each grant released
    :param kept: grants whose pods are alive, or still within the grace period
    :param ignored: grants on nodes this cluster does not have (another cluster may share the ledger)
    """

    released: tuple[tuple[str, str], ...] = ()
    kept: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()

    def summary(self) -> str:
        """Return a one-line account such as ``1 released, 2 kept, 0 ignored``."""
        return f"{len(self.released)} released, {len(self.kept)} kept, {len(self.ignored)} ignored"

    def to_dict(self) -> dict[str, Any]:
        """Return primitives only (``--json``)."""
        return {
            "released": [{"id": rid, "reason": reason} for rid, reason in self.released],
            "kept": list(self.kept),
            "ignored": list(self.ignored),
        }


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def verdict(
    reservation: Reservation, pods: list[dict[str, Any]], now: float, grace_seconds: float
) -> str | None:
    """Return why a grant should be released, or None to keep it (pure: no I/O).

    :param reservation: a granted reservation
    :param pods: its pods (labelled with its id), as JSON dicts
    :param now: the time the grant is aged against
    :param grace_seconds: how long a grant may wait for its pod
    """
    if pods:
        if any(_phase(p) not in FINISHED_PHASES for p in pods):
            return None
        # Retries may leave older pods of the same reservation: name the newest.
        last = max(pods, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        meta = last["metadata"]
        return f"pod {meta.get('namespace', 'default')}/{meta.get('name')} finished ({_phase(last)})"
    assert reservation.grant is not None
    if now - reservation.grant.granted_at >= grace_seconds:
        return f"no pod for {grace_seconds:g}s"
    return None


def _pods_by_reservation(api: Any, selector: str) -> dict[str, list[dict[str, Any]]]:
    pods: dict[str, list[dict[str, Any]]] = {}
    for pod in list_objects(api.list_pod_for_all_namespaces, label_selector=selector):
        rid = ((pod.get("metadata") or {}).get("labels") or {}).get(RESERVATION_LABEL)
        if rid:
            pods.setdefault(rid, []).append(pod)
    return pods


def reconcile(
    ledger: Ledger,
    core_v1_api: Any,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: float | None = None,
    all_nodes: bool = False,
    id_prefix: str | None = None,
) -> ReconcileResult:
    """Release grants whose pods finished, or that have had no pod for ``grace_seconds``.

    Pods are found by their ``gpupool.io/reservation-id`` label, in all namespaces. A grant with a
    pod that is not finished is kept, whatever its other pods did (a retry's new pod beside the
    failed one).

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param grace_seconds: how long a grant may wait for its pod (the operator creates it after the grant)
    :param now: the time grants are aged against (default: the ledger's clock)
    :param all_nodes: also judge grants on nodes this cluster does not list; by default they are
        ignored, since a ledger shared by several clusters holds grants whose pods are elsewhere
    :param id_prefix: judge only reservations whose id starts with this (``gp-``: GpuPodOperator's)
    """
    snapshot = ledger.snapshot()
    now = snapshot.taken_at if now is None else now
    cluster_nodes = None if all_nodes else {n["metadata"]["name"] for n in list_nodes(core_v1_api)}
    pods = _pods_by_reservation(core_v1_api, RESERVATION_LABEL)
    released: list[tuple[str, str]] = []
    kept: list[str] = []
    ignored: list[str] = []
    for reservation in snapshot.grants:
        grant = reservation.grant
        if grant is None or (id_prefix and not reservation.id.startswith(id_prefix)):
            continue
        if cluster_nodes is not None and grant.node not in cluster_nodes:
            ignored.append(reservation.id)
            continue
        reason = verdict(reservation, pods.get(reservation.id, []), now, grace_seconds)
        if reason is None:
            kept.append(reservation.id)
            continue
        if ledger.release(reservation.id, reason=f"reconcile: {reason}").released:
            log.info("Released %s: %s", reservation.id, reason)
            released.append((reservation.id, reason))
    return ReconcileResult(tuple(released), tuple(kept), tuple(ignored))


def reconcile_grant(
    ledger: Ledger,
    core_v1_api: Any,
    reservation_id: str,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    now: float | None = None,
) -> str | None:
    """Reconcile one grant (from a lease renewal): release it if its pod finished or never came.

    :param ledger: the ledger
    :param core_v1_api: a ``kubernetes.client.CoreV1Api``
    :param reservation_id: the grant
    :param grace_seconds: how long the grant may wait for its pod
    :param now: the time the grant is aged against (default: the ledger's clock)
    :return: why it was released, or None when it was kept (or was no live grant)
    """
    reservation = ledger.get_or_none(reservation_id)
    if reservation is None or reservation.grant is None or reservation.state.ended:
        return None
    pods = _pods_by_reservation(core_v1_api, f"{RESERVATION_LABEL}={reservation_id}")
    reason = verdict(
        reservation, pods.get(reservation_id, []), ledger.now() if now is None else now, grace_seconds
    )
    if reason is None or not ledger.release(reservation_id, reason=f"reconcile: {reason}").released:
        return None
    return reason
