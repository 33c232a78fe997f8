"""The failure ladder of a GPU task: what happens after a try fails, and what the task raises.

A failed try is classified (from what the operator read off its pod before the pod was deleted),
its exception annotated (never replaced: a DAG written for KubernetesPodOperator catches what it
always caught), recorded in the ledger, so that a retry on any worker knows what failed before it, and decided
by the task's :class:`~airflow_gpupool.operators.escalation.EscalationPolicy`: retry as before,
retry with a larger slice, fail at once, or escalate to a person. It runs before the slice is
released, so the outcome is recorded first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowFailException, AirflowSkipException

from airflow_gpupool import settings
from airflow_gpupool.exceptions import LeaseLostError
from airflow_gpupool.governance.capacity import Capacity
from airflow_gpupool.operators.capacity import with_capacity
from airflow_gpupool.operators.escalation import Decision, EscalationPolicy, Remedy, decide, describe_policy
from airflow_gpupool.operators.failures import (
    FAILURE_ATTRIBUTE,
    HOST_OOM_REASON,
    Classification,
    FailureClass,
    FailureReport,
    annotate,
    classify,
)

if TYPE_CHECKING:
    from airflow.sdk.types import Logger

    from airflow_gpupool.checkpoints.store import CheckpointStore
    from airflow_gpupool.hooks.gpupool import GpuPoolHook
    from airflow_gpupool.placement.snapshot import ClusterSnapshot
    from airflow_gpupool.resources import GpuRequest
    from airflow_gpupool.task_try import TaskTry

__all__ = ["XCOM_FAILURE_KEY", "FailedTry", "FailureLadder"]

#: The XCom a failed try pushes: its :class:`FailureReport` as a dict.
XCOM_FAILURE_KEY = FAILURE_ATTRIBUTE


@dataclass(frozen=True)
class FailedTry:
    """What the operator knows of a try that failed.

    :param task: the try
    :param reservation_id: its reservation
    :param request: the request it ran with
    :param retries_left: whether Airflow would retry the task
    :param gpu_model: the GPU model of its grant (None: it was never granted)
    :param observed: the class and log tail read off its pod before deletion (None: no pod was read)
    :param checkpoints: the task's checkpoint store, if it has one
    :param cpu_fallback: whether the task has a CPU-only variant the ladder may choose
    """

    task: TaskTry
    reservation_id: str
    request: GpuRequest
    retries_left: bool
    gpu_model: str | None = None
    observed: tuple[Classification, str] | None = None
    checkpoints: CheckpointStore | None = None
    cpu_fallback: bool = False


class FailureLadder:
    """Walk a task's escalation ladder after a failed try; remember the tries in the ledger.

    :param hook: the ledger hook (the attempts record and the inventory)
    :param policy: the task's ladder
    :param notifier: called when the ladder escalates (default
        :class:`~airflow_gpupool.notifiers.EscalationNotifier`)
    :param log: the task's log
    """

    def __init__(
        self,
        hook: GpuPoolHook,
        policy: EscalationPolicy,
        *,
        notifier: Callable[[Any], Any] | None = None,
        log: Logger,
    ) -> None:
        self._hook = hook
        self._policy = policy
        self._notifier = notifier
        self._log = log

    def escalated_request(self, task: TaskTry) -> GpuRequest | None:
        """Return the larger request an earlier try's out-of-memory failure chose, if any.

        :param task: the try about to run
        """
        if task.try_number <= 1:
            return None
        larger = [a.next_request for a in self._hook.attempt_history(task.task_key) if a.next_request]
        if not larger:
            return None
        self._log.info("An earlier try ran out of memory; this try asks for %s", larger[-1].describe())
        return larger[-1]

    def after_evictions(self, task: TaskTry, request: GpuRequest) -> GpuRequest:
        """Return the request on on-demand capacity only once this task run was evicted often enough.

        ``[gpupool] evictions_before_on_demand`` evicted tries (default 2; 0: never) and the rest
        of the run's tries keep off spot: a node pool that keeps taking its nodes back costs more
        in lost work than on-demand does.

        :param task: the try about to run
        :param request: the request it would make
        """
        limit = settings.evictions_before_on_demand()
        if task.try_number <= 1 or limit == 0:
            return request
        history = self._hook.attempt_history(task.task_key)
        evicted = [a.try_number for a in history if a.failure_class == FailureClass.EVICTED.value]
        if len(evicted) < limit:
            return request
        self._log.warning(
            "Tries %s of this task run were evicted (%d, [gpupool] evictions_before_on_demand is %d); "
            "this try runs on on-demand capacity only",
            ", ".join(map(str, evicted)),
            len(evicted),
            limit,
        )
        return with_capacity(request, Capacity.ON_DEMAND, checkpointed=False, expected_seconds=None)

    def after_preemption(self, task: TaskTry, request: GpuRequest) -> GpuRequest:
        """Return the request of a preempted try's retry: it queues at its own priority, preempting nobody.

        Preemption never cascades: a victim's retry takes its turn instead of taking a slice
        from work below it.

        :param task: the try about to run
        :param request: the request it would make
        """
        if task.try_number <= 1 or not request.preempts:
            return request
        history = self._hook.attempt_history(task.task_key)
        if not any(a.failure_class == FailureClass.PREEMPTED.value for a in history):
            return request
        self._log.info(
            "An earlier try of this task run was preempted: this try waits its turn, preempting nobody"
        )
        return replace(request, preempts=False)

    def cpu_fallback_chosen(self, task: TaskTry) -> bool:
        """Return whether an earlier try of this task run was failed over to the CPU fallback.

        Sticky for the run: once the GPU was given up, later tries do not go back to it.

        :param task: the try about to run
        """
        if task.try_number <= 1:
            return False
        chosen = [
            a for a in self._hook.attempt_history(task.task_key) if a.remedy == Remedy.CPU_FALLBACK.value
        ]
        if chosen:
            self._log.warning(
                "The failure ladder chose the CPU fallback after try %s (%s); this try runs without a GPU "
                "(GPUPOOL_DEVICE=cpu)",
                chosen[0].try_number,
                chosen[0].failure_class,
            )
        return bool(chosen)

    def failed(self, context: Mapping[str, Any], failed: FailedTry, error: Exception) -> BaseException:
        """Classify a failed try, record it, walk the ladder; return the exception to raise.

        KubernetesPodOperator's contract is kept: the exception returned is ``error`` itself
        (same type, same message), the class and the decision added to it
        (:func:`~airflow_gpupool.operators.failures.annotate`: the ``gpupool_failure``
        attribute and a note). Only where the ladder stops retries Airflow would make is it an
        ``AirflowFailException`` instead, carrying ``error``'s message, with ``error`` as its cause.

        :param context: the task's context (passed on to the notifier; its ``ti`` gets the XCom)
        :param failed: the try
        :param error: what the try failed with
        """
        if isinstance(error, AirflowSkipException | AirflowFailException):
            return error
        classification, tail = self._classify(failed, error)
        newest = failed.checkpoints.newest() if failed.checkpoints is not None else None
        step = newest.step if newest else None
        decision = self._decide(failed, classification)
        report = FailureReport(
            classification, decision.remedy.value, decision.reason, decision.retry, step, tail
        )
        annotate(error, report)
        self._log.error("Try %s failed: %s; %s", failed.task.try_number, report.error(), decision.reason)
        self._publish(context, report)
        if self._record(failed, classification, decision, step):
            self._notify(context, failed, classification, step, tail, decision.reason)
        if decision.retry or not failed.retries_left:
            # Retried, or failed anyway (no retries left): KPO's exception, as it was.
            return error
        fail = AirflowFailException(str(error))
        fail.__cause__ = error
        return annotate(fail, report)

    def _publish(self, context: Mapping[str, Any], report: FailureReport) -> None:
        ti = context.get("ti")
        if ti is None:
            return
        try:
            ti.xcom_push(key=XCOM_FAILURE_KEY, value=report.to_dict())
        except Exception:
            # The pod's failure must surface as it is; the XCom is an addition.
            self._log.exception("Could not push the %s XCom", XCOM_FAILURE_KEY)

    @staticmethod
    def _classify(failed: FailedTry, error: Exception) -> tuple[Classification, str]:
        if isinstance(error, LeaseLostError):
            # What the deleted pod looked like says nothing: the lease is why it stopped.
            lost, (seen, tail) = error.classification, failed.observed or (None, "")
            return replace(lost, pod_name=lost.pod_name or (seen.pod_name if seen else None)), tail
        if failed.observed is not None:
            return failed.observed
        classification = classify(None, error=error)
        if classification.failure_class is FailureClass.UNKNOWN:
            classification = Classification(FailureClass.UNKNOWN, f"{type(error).__name__}: {error}")
        return classification, ""

    def _decide(self, failed: FailedTry, classification: Classification) -> Decision:
        failure_class = classification.failure_class
        cluster: ClusterSnapshot | None = None
        if self._policy.remedy(failure_class) is Remedy.RETRY_LARGER:
            try:
                cluster = self._hook.empty_cluster()
            except Exception:
                self._log.exception("Reading the inventory failed; no larger slice can be chosen")
        return decide(
            self._policy,
            failure_class,
            failed.request,
            retries_left=failed.retries_left,
            failed_model=failed.gpu_model,
            cluster=cluster,
            # Host memory (OOMKilled) is as short on the CPU: only a GPU out of memory falls back.
            cpu_fallback=failed.cpu_fallback and classification.reason != HOST_OOM_REASON,
        )

    def _record(
        self, failed: FailedTry, classification: Classification, decision: Decision, step: int | None
    ) -> bool:
        """Record the failed try in the ledger; return whether this caller must notify a person."""
        from airflow_gpupool.ledger import TaskAttempt

        task = failed.task
        attempt = TaskAttempt(
            task_key=task.task_key,
            try_number=task.try_number,
            reservation_id=failed.reservation_id,
            failure_class=classification.failure_class.value,
            remedy=decision.remedy.value,
            request=failed.request,
            message=f"{classification.reason}: {decision.reason}",
            exit_code=classification.exit_code,
            next_request=decision.next_request,
            gpu_model=failed.gpu_model,
            checkpoint_step=step,
        )
        try:
            self._hook.record_attempt(attempt)
            return decision.escalate and self._hook.claim_escalation(task.task_key, task.try_number)
        except Exception:
            # The pod's failure must still surface; a person hears of it, even if twice.
            self._log.exception(
                "Recording try %s in the ledger failed; the next try will not know it", task.try_number
            )
            return decision.escalate

    def _notify(
        self,
        context: Mapping[str, Any],
        failed: FailedTry,
        classification: Classification,
        step: int | None,
        tail: str,
        why: str,
    ) -> None:
        from airflow_gpupool.notifiers.escalation import Escalation, TriedAttempt, notify_escalation

        tried = tuple(
            TriedAttempt(a.try_number, a.failure_class, a.request.describe(), a.remedy, a.checkpoint_step)
            for a in self._hook.attempt_history(failed.task.task_key)
        )
        escalation = Escalation(
            task=failed.task,
            failure_class=classification.failure_class.value,
            reason=classification.reason,
            decision=why,
            exit_code=classification.exit_code,
            pod_name=classification.pod_name,
            last_checkpoint_step=step,
            log_tail=tail,
            tried=tried,
            policy=describe_policy(self._policy),
        )
        try:
            notify_escalation(escalation, context, self._notifier)
        except Exception:
            # A broken notifier must not hide the task's own failure.
            self._log.exception("The escalation notifier failed")
