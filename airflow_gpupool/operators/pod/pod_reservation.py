"""How a ``GpuPodOperator`` try reserves its slice and waits for it: the ledger queue's side of the operator.

A try that is not granted at once waits deferred (:class:`~airflow_gpupool.triggers.ReservationTrigger`)
or in place (read-only, :mod:`~airflow_gpupool.operators.pod.waiting`); a retry first settles what
earlier tries left (re-attaching to a running pod adopts its grant). The forecast's rule for spot
capacity learns the task's typical run time first, where it matters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

from airflow_gpupool.exceptions import GpuPoolError, ReservationTimeoutError
from airflow_gpupool.forecast.deadlines import dag_deadlines
from airflow_gpupool.ledger import Grant, ReservationState
from airflow_gpupool.operators.capacity import check_capacity, duration_matters, typical_run
from airflow_gpupool.operators.pod.waiting import (
    deferral_after_deadline,
    reservation_deferral,
    wait_in_place,
)
from airflow_gpupool.operators.retries.reattach import EarlierTries
from airflow_gpupool.operators.steps.run_admission import run_need
from airflow_gpupool.task_try import TaskTry
from airflow_gpupool.triggers.queue_life import describe_queue_life
from airflow_gpupool.triggers.reservation import ReservationEventStatus

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpupool.forecast.deadlines import DagDeadline
    from airflow_gpupool.hooks.gpupool import GpuPoolHook
    from airflow_gpupool.resources import GpuRequest

__all__ = ["GpuPodReservation"]


class GpuPodReservation(KubernetesPodOperator):
    """The ledger queue's side of :class:`~airflow_gpupool.operators.GpuPodOperator` (a base, not a task).

    The attributes below are set by ``GpuPodOperator.__init__``.
    """

    expected_duration: float | None
    capacity: str | None
    checkpoint_dir: str | None
    lease_ttl: float | None
    reservation_timeout: float | None
    reservation_deferrable: bool | None
    ledger_conn_id: str | None
    fail_fast_on_forecast: bool
    gpu_hook: GpuPoolHook
    _typical_seconds: float | None
    _request_override: GpuRequest | None
    _adopted: bool

    if TYPE_CHECKING:

        def gpu_request(self) -> GpuRequest:
            """This try's request (``GpuPodOperator``'s)."""

        def declared_request(self) -> GpuRequest:
            """The task's own request (``GpuPodOperator``'s)."""

        def _run_granted(self, context: Context, rid: str, grant: Grant) -> Any:
            """Run the pod on the grant (``GpuPodOperator``'s)."""

        def _timed_out(self, context: Context, rid: str, error: ReservationTimeoutError) -> Any:
            """End a try whose reservation timed out (``GpuPodTries``')."""

        def _load_ladder_choice(self, context: Context) -> bool:
            """Take what earlier tries' failures chose (``GpuPodTries``')."""

    def _reserve_and_run(self, context: Context) -> Any:
        task = TaskTry.from_context(context)
        self._learn_typical_run(task)
        request = self.gpu_request()
        options = self.gpu_hook.options
        if task.try_number > 1:
            earlier = EarlierTries(self.gpu_hook, self.client, self.namespace or "default", self.log)
            ttl = self.lease_ttl or options.lease_ttl_seconds
            adopted = earlier.settle(task, durable=bool(self.reattach_on_restart), ttl=ttl)
            if adopted is not None:
                self._adopted = True
                return self._run_granted(context, adopted.reservation_id, adopted.grant)
        rid = task.reservation_id
        timeout = self.reservation_timeout or options.reservation_timeout_seconds
        self.log.info("Reserving %s from the GPU ledger as %s", request.describe(), rid)
        reservation = self.gpu_hook.reserve(
            request,
            task.holder,
            reservation_id=rid,
            ttl=self.lease_ttl,
            timeout=timeout,
            run_need=run_need(self, context, self.log),
            task_key=task.task_key,
        )
        if reservation.state is ReservationState.GRANTED:
            assert reservation.grant is not None
            if reservation.message and reservation.message.startswith("handed on from"):
                self.log.info("Took over the GPU slice %s", reservation.message)
            return self._run_granted(context, rid, reservation.grant)
        if reservation.state is not ReservationState.WAITING:
            raise GpuPoolError(f"reservation {rid} is {reservation.state.value}: {reservation.message}")
        self.log.info("No GPU slice fits now; %s", self.gpu_hook.explain(rid))
        deadlines = dag_deadlines(context, self.log)
        if self._defer_reservation():
            self.defer(
                **reservation_deferral(
                    rid,
                    self.ledger_conn_id,
                    timeout,
                    options.poll_interval_seconds,
                    fail_fast_on_forecast=self.fail_fast_on_forecast,
                    deadlines=[d.to_dict() for d in deadlines],
                )
            )
        grant = self._wait_in_place(context, rid, options.poll_interval_seconds, deadlines)
        return self._run_granted(context, rid, grant)

    def _learn_typical_run(self, task: TaskTry) -> None:
        """Take how long this task's recent successful runs took, where the spot rule needs it."""
        if self.expected_duration is None and self._request_override is None:
            capacity, checkpointed = check_capacity(self.capacity), self.checkpoint_dir is not None
            if duration_matters(self.declared_request(), capacity, checkpointed=checkpointed):
                self._typical_seconds = typical_run(self.gpu_hook, task, self.log)

    def _defer_reservation(self) -> bool:
        return self.deferrable if self.reservation_deferrable is None else self.reservation_deferrable

    def _wait_in_place(
        self, context: Context, rid: str, poll_interval: float, deadlines: list[DagDeadline]
    ) -> Grant:
        # Read-only waiting (the queue is served by writers and the controller): see operators/pod/waiting.py.
        grant, life = wait_in_place(
            self.gpu_hook, rid, poll_interval, self.log, deadlines=deadlines, ti=context["ti"]
        )
        self.log.info("Reservation %s %s", rid, describe_queue_life(life))
        return grant

    def execute_granted(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after ReservationTrigger: run the pod, or fail with what blocked the request."""
        self._load_ladder_choice(context)
        rid = event["reservation_id"]
        status = event["status"]
        if status == ReservationEventStatus.GRANTED.value:
            # The triggerer's wait lines may not outlive the pod phase in the stored log: this one does.
            self.log.info("Reservation %s %s", rid, describe_queue_life(event.get("queue_life")))
            return self._run_granted(context, rid, Grant.from_dict(event["grant"]))
        if status == ReservationEventStatus.DEADLINE.value:  # said once; the request keeps its place
            self.defer(
                **deferral_after_deadline(
                    self.gpu_hook,
                    self.ledger_conn_id,
                    context["ti"],
                    event,
                    self.log,
                    fail_fast_on_forecast=self.fail_fast_on_forecast,
                )
            )
        self.gpu_hook.release(rid, reason=f"reservation {status}")
        if status == ReservationEventStatus.TIMEOUT.value:
            reservation = self.gpu_hook.get(rid)
            error = ReservationTimeoutError(rid, reservation.waited_seconds, [event["message"]])
            return self._timed_out(context, rid, error)
        if status == ReservationEventStatus.FORECAST.value:  # fail_fast_on_forecast
            raise GpuPoolError(f"reservation {rid} withdrawn: {event['message']}")
        raise GpuPoolError(f"waiting for reservation {rid} failed: {event['message']}")
