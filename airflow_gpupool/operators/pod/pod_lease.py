"""How a ``GpuPodOperator`` try holds its grant while the pod runs: the lease's side of the operator.

While the pod runs the grant's lease is renewed (by :class:`~airflow_gpupool.operators.pod.lease.LeaseRenewer`
in the worker, by :class:`~airflow_gpupool.triggers.pod.LeasedPodTrigger` when deferred), and a
preemptible try tells the ledger when its newest valid checkpoint was written, so a preemption
takes the victims that lose the least work first. When the lease is lost the pod is deleted (a
preemption victim's with what is left of its grace, waiting until it is gone) and its emergency
checkpoint is reported, all before the try fails and its slice is released. A grant that
ends after its pod did (reconcile released it first) is no lost lease: the pod's outcome decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger

from airflow_gpupool.controller.pod_deletion import settle_deleted_pod
from airflow_gpupool.ledger import FINISHED_PHASES
from airflow_gpupool.operators.pod.lease import LeaseRenewer, delete_pod
from airflow_gpupool.triggers.lease import lost_from_event
from airflow_gpupool.triggers.pod import LeasedPodTrigger

if TYPE_CHECKING:
    from airflow_gpupool.exceptions import LeaseLostError
    from airflow_gpupool.hooks.gpupool import GpuPoolHook
    from airflow_gpupool.operators.retries.checkpointing import TaskCheckpoints

__all__ = ["GpuPodLease"]


class GpuPodLease(KubernetesPodOperator):
    """The lease's side of :class:`~airflow_gpupool.operators.GpuPodOperator` (a base, not a task).

    The attributes below are set by ``GpuPodOperator.__init__``; ``_own_pod`` once the pod exists,
    ``_pod_done`` once the parent's ``cleanup`` has the pod's final state.
    """

    preemptible: bool
    lease_ttl: float | None
    ledger_conn_id: str | None
    checkpoint_dir: str | None
    checkpoint_conn_id: str | None
    gpu_hook: GpuPoolHook
    _held_id: str | None
    _own_pod: tuple[str, str] | None
    _pod_done: bool

    unschedulable_grace_seconds: float

    if TYPE_CHECKING:

        def _checkpoints(self) -> TaskCheckpoints | None:
            """The task's checkpoints (``GpuPodTries``')."""

        def granted_node(self) -> str | None:
            """The node the pod is pinned to (``UnschedulableFailFast``')."""

        def _release(self, rid: str, reason: str) -> None:
            """Release the slice (``GpuPodOperator``'s)."""

    def _lease_renewer(self, rid: str) -> LeaseRenewer:
        """Return the renewer of a sync pod's grant: it reconciles, reports checkpoints, deletes a lost pod."""
        ttl = self.lease_ttl or self.gpu_hook.options.lease_ttl_seconds
        reconcile = lambda: self._reconcile_own_grant(rid)  # noqa: E731
        return LeaseRenewer(
            self.gpu_hook,
            rid,
            ttl,
            self.log,
            reconcile,
            on_lost=self._delete_own_pod,
            pod_ended=self._own_pod_ended,
        )

    def _own_pod_ended(self) -> bool:
        """Whether the try's pod has ended: the parent has its final state, or its phase is final.

        Asked when the lease is lost: a grant released after its pod ended (reconcile got there
        first) lost nothing, and the try is what the pod did.

        :raises ApiException: the pod could not be read
        """
        if self._pod_done:
            return True  # the parent read it and is deleting it: gone or finished, its outcome is known
        if self._own_pod is None:
            return False
        namespace, name = self._own_pod
        pod = self.client.read_namespaced_pod(name, namespace)
        return getattr(pod.status, "phase", None) in FINISHED_PHASES

    def _reconcile_own_grant(self, rid: str) -> str | None:
        # The pod may take up to the launch timeout to appear; only then is "no pod" news.
        grace = float(self.startup_timeout_seconds) + 60
        released = self.gpu_hook.reconcile_grant(self.client, rid, grace_seconds=grace)
        if released is None:
            self._note_checkpoint(rid)
        return released

    def _note_checkpoint(self, rid: str) -> None:
        """Tell the ledger when the newest valid checkpoint was written: a preemption takes the
        victims that lose the least work since theirs first."""
        checkpoints = self._checkpoints()
        if checkpoints is not None and self.preemptible:
            self.gpu_hook.note_newest_checkpoint(rid, checkpoints.store)

    def defer(
        self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = None, timeout: Any = None
    ) -> Any:
        """Defer; a pod trigger is swapped for one that also renews the grant's lease."""
        if (
            isinstance(trigger, KubernetesPodTrigger)
            and not isinstance(trigger, LeasedPodTrigger)
            and self._held_id
        ):
            reported = self.checkpoint_dir if self.preemptible else None  # as _note_checkpoint
            trigger = LeasedPodTrigger.wrap(
                trigger,
                reservation_id=self._held_id,
                ledger_conn_id=self.ledger_conn_id,
                lease_ttl=self.lease_ttl or self.gpu_hook.options.lease_ttl_seconds,
                checkpoint_dir=reported,
                checkpoint_conn_id=self.checkpoint_conn_id if reported else None,
                # Fails fast, as the sync path does, when the pod cannot be placed on its node.
                granted_node=self.granted_node(),
                unschedulable_grace_seconds=self.unschedulable_grace_seconds,
            )
        return super().defer(trigger=trigger, method_name=method_name, kwargs=kwargs, timeout=timeout)

    def _lease_lost(self, event: dict[str, Any]) -> Any:
        """LeasedPodTrigger lost the pod's lease: delete the pod, fail the try."""
        self._own_pod = (event["namespace"], event["name"])
        lost = lost_from_event(event, event["name"])
        self._delete_own_pod(lost)
        raise lost

    def _delete_own_pod(self, lost: LeaseLostError) -> None:
        if self._own_pod is not None:
            why, grace = lost.classification.reason, lost.grace_seconds
            if lost.deadline is not None:
                # Counted now, not when the loss was seen: a deferred task may resume much later.
                grace = lost.grace_left(self.gpu_hook.now())
                self.log.info(
                    "%.1f s of the preemption grace are left now (of %.1f s when noticed)",
                    grace,
                    lost.grace_seconds,
                )
            delete_pod(self.client, *self._own_pod, why=why, log=self.log, grace_seconds=grace)
        if lost.preempted and self._held_id is not None:
            # The pod is gone, its emergency checkpoint written: the ledger learns how much work
            # the preemption took before the slice is released.
            self._note_checkpoint(self._held_id)

    def _release_off_the_pod(self, rid: str, why: str) -> None:
        """Release the slice once the try's pod no longer runs on it; a pod kept running keeps it.

        A pod being deleted (KPO's clean-up, ``on_kill``) is waited for until it is gone. A pod
        kept running (``on_kill_action`` or ``on_finish_action`` ``keep_pod``) still uses the
        slice: the grant is not released but left to lapse into an orphan, which the controller
        releases when the pod ends (or deletes it after ``orphan_grace_seconds``), and which a
        retry re-attaching to the pod adopts.

        :param rid: the grant
        :param why: for the log and the release
        """
        if self._own_pod_still_runs(why):
            self.log.warning(
                "Pod %s/%s was kept and still runs on GPU slice %s: the slice stays held until the pod "
                "ends (%s)",
                *(self._own_pod or ("?", "?")),
                rid,
                why,
            )
            return
        self._release(rid, why)

    def _own_pod_still_runs(self, why: str) -> bool:
        """Wait until the try's pod, if being deleted, is gone; return whether it was kept and still runs."""
        from kubernetes.client.exceptions import ApiException

        if self._own_pod is None:
            return False
        try:
            settle_deleted_pod(self.client, *self._own_pod, why=why)
            pod = self.client.read_namespaced_pod(self._own_pod[1], self._own_pod[0])
        except ApiException as e:
            if e.status != 404:
                self.log.exception("Could not tell whether pod %s/%s is gone", *self._own_pod)
            return False  # gone; or unknown: a slice held forever is worse than one freed early
        except Exception:
            self.log.exception("Could not tell whether pod %s/%s is gone", *self._own_pod)
            return False
        return getattr(pod.status, "phase", None) not in FINISHED_PHASES
