"""How a ``GpuPodOperator`` try starts and how a failed one ends: the ladder's side of the operator.

A try starts with what earlier tries of the run chose (a larger request after running out of
memory, or the CPU fallback); a failed try is classified in ``cleanup`` (before the pod is
deleted) and walked up the :class:`~airflow_gpupool.operators.retries.ladder.FailureLadder`. The CPU
fallback runs the task's pod without a GPU (``GPUPOOL_DEVICE=cpu``): after a reservation timeout,
or when the ladder chose it for an earlier try.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.common.compat.sdk import TaskDeferred

from airflow_gpupool.operators.failures import Classification, read_failure
from airflow_gpupool.operators.retries.checkpointing import TaskCheckpoints
from airflow_gpupool.operators.retries.ladder import FailedTry, FailureLadder
from airflow_gpupool.task_try import TaskTry

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s

    from airflow_gpupool.exceptions import ReservationTimeoutError
    from airflow_gpupool.hooks.gpupool import GpuPoolHook
    from airflow_gpupool.ledger import Grant
    from airflow_gpupool.operators.escalation import EscalationPolicy
    from airflow_gpupool.resources import GpuRequest

__all__ = ["XCOM_DEVICE_KEY", "GpuPodTries"]

#: Pushed as ``"cpu"`` when the task ran its CPU fallback.
XCOM_DEVICE_KEY = "gpupool_device"


class GpuPodTries(KubernetesPodOperator):
    """The ladder's side of :class:`~airflow_gpupool.operators.GpuPodOperator` (a base, not a task).

    The attributes below are set by ``GpuPodOperator.__init__``.
    """

    escalation: EscalationPolicy
    escalation_notifier: Any
    cpu_fallback: bool
    checkpoint_dir: str | None
    checkpoint_conn_id: str | None
    keep_checkpoints: int | None
    _cpu_fallback_active: bool
    _grant: Grant | None
    _request_override: GpuRequest | None
    _failure: tuple[Classification, str] | None
    _drift: Classification | None
    _pod_done: bool
    gpu_hook: GpuPoolHook

    def gpu_request(self) -> GpuRequest:
        """Return this try's request (``GpuPodOperator``'s)."""
        raise NotImplementedError

    @cached_property
    def failure_ladder(self) -> FailureLadder:
        """The task's failure ladder, created on first use (never at parse time)."""
        return FailureLadder(self.gpu_hook, self.escalation, notifier=self.escalation_notifier, log=self.log)

    def _checkpoints(self) -> TaskCheckpoints | None:
        return TaskCheckpoints.of(
            self.checkpoint_dir, conn_id=self.checkpoint_conn_id, keep=self.keep_checkpoints, log=self.log
        )

    def _load_ladder_choice(self, context: Context) -> bool:
        """Take what earlier tries' failures chose (a larger request, on-demand capacity after evictions).

        Return whether they chose the CPU fallback.
        """
        task = TaskTry.from_context(context)
        larger = self.failure_ladder.escalated_request(task)
        if larger is not None:
            self._request_override = larger
        request = self.gpu_request()
        moved = self.failure_ladder.after_preemption(task, self.failure_ladder.after_evictions(task, request))
        if moved != request:
            self._request_override = moved
        return self.cpu_fallback and self.failure_ladder.cpu_fallback_chosen(task)

    def _timed_out(self, context: Context, rid: str, error: ReservationTimeoutError) -> Any:
        """Fail with the timeout (through the ladder), or run the CPU fallback: degraded, not stopped."""
        if not self.cpu_fallback:
            raise self._failed(context, rid, error)
        self.log.warning("%s; running the CPU fallback (GPUPOOL_DEVICE=cpu)", error)
        return self._run_cpu_fallback(context, rid)

    def _run_cpu_fallback(self, context: Context, rid: str) -> Any:
        """Run the parent's pod without a GPU (no slice held); a failure walks the ladder as any try's."""
        self._cpu_fallback_active = True
        context["ti"].xcom_push(key=XCOM_DEVICE_KEY, value="cpu")
        try:
            return KubernetesPodOperator.execute(self, context)
        except TaskDeferred:
            raise  # deferrable: trigger_reentry finishes the pod
        except Exception as e:
            raise self._failed(context, rid, e)  # noqa: B904 (_failed sets the cause)

    def cleanup(
        self,
        pod: k8s.V1Pod,
        remote_pod: k8s.V1Pod,
        xcom_result: dict[str, Any] | None = None,
        context: Context | None = None,
    ) -> None:
        """Read why a failed pod failed (status, events, log tail) before the parent deletes it."""
        self._pod_done = True  # its outcome is known now: a lease lost from here on lost nothing
        phase = getattr(getattr(remote_pod, "status", None), "phase", None)
        if remote_pod is not None and not self._killed and phase != "Succeeded":
            self._failure = read_failure(self, pod, remote_pod)
        super().cleanup(pod, remote_pod, xcom_result=xcom_result, context=context)

    def _observed(self) -> tuple[Classification, str] | None:
        """Return the try's class and log tail: wrong books (the node lacked its GPUs) outrank what the pod showed."""
        if self._drift is None:
            return self._failure
        return self._drift, self._failure[1] if self._failure is not None else ""

    def _failed(self, context: Context, rid: str, error: Exception) -> BaseException:
        """Walk the failure ladder for this try; return the exception to raise (before the release)."""
        ti = context["ti"]
        checkpoints = self._checkpoints()
        failed = FailedTry(
            task=TaskTry.from_context(context),
            reservation_id=rid,
            request=self.gpu_request(),
            retries_left=ti.try_number <= int(getattr(ti, "max_tries", self.retries) or 0),
            gpu_model=self._grant.gpu_model if self._grant else None,
            observed=self._observed(),
            checkpoints=checkpoints.store if checkpoints is not None else None,
            cpu_fallback=self.cpu_fallback,
        )
        return self.failure_ladder.failed(context, failed, error)
