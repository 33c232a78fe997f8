"""GpuPodOperator: reserve a GPU slice from the ledger, then run a pod pinned to it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.common.compat.sdk import TaskDeferred

from airflow_gpupool import settings
from airflow_gpupool.binding import binding_for, check_binding_name
from airflow_gpupool.exceptions import ConfigurationError, GpuPoolError, ReservationTimeoutError
from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.ledger import Grant
from airflow_gpupool.operators.capacity import check_capacity, with_capacity
from airflow_gpupool.operators.escalation import EscalationPolicy
from airflow_gpupool.operators.links import GpuReservationLink  # kit (issue 15)
from airflow_gpupool.operators.pod.pod_lease import GpuPodLease
from airflow_gpupool.operators.pod.pod_pinning import GpuPodPinning
from airflow_gpupool.operators.pod.pod_reservation import GpuPodReservation
from airflow_gpupool.operators.pod.tries import XCOM_DEVICE_KEY, GpuPodTries
from airflow_gpupool.operators.pod.unschedulable import UNSCHEDULABLE_STATUS, UnschedulableFailFast
from airflow_gpupool.operators.request import (
    REQUEST_FIELDS,
    build_request,
    check_checkpoint_on_sigterm,
    check_keep_checkpoints,
    check_log_tail_lines,
    check_seconds,
    templated,
)
from airflow_gpupool.operators.steps.hand_on import hand_on_target
from airflow_gpupool.operators.steps.queue_ahead import plan_queue_ahead
from airflow_gpupool.operators.steps.run_admission import check_gpu_admission
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.task_try import TaskTry
from airflow_gpupool.triggers.lease import LEASE_LOST_STATUS

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpupool.checkpoints.manifest import CheckpointManifest
    from airflow_gpupool.operators.failures import Classification

__all__ = ["XCOM_DEVICE_KEY", "XCOM_GRANT_KEY", "GpuPodOperator"]

XCOM_GRANT_KEY = "gpupool_grant"


class GpuPodOperator(UnschedulableFailFast, GpuPodReservation, GpuPodPinning, GpuPodLease, GpuPodTries):
    """Reserve a GPU slice from the shared ledger, then run a Kubernetes pod pinned to it.

    Takes every argument of :class:`KubernetesPodOperator`, plus the request. The request
    is validated when the DAG is parsed (without I/O); the slice is released on success,
    failure, launch timeout, ``on_kill`` and reservation timeout.

    :param gpus: whole GPUs
    :param gpu_milli: a fraction of one GPU, in milli-GPU (1–999)
    :param gpu_memory_mib: GPU memory for a fraction
    :param mig_profile: a MIG profile such as ``1g.10gb``
    :param gpu_models: GPU models allowed
    :param node_labels: labels the node must carry
    :param prefer_node_labels: labels the node should carry (soft: among the nodes that fit equally
        well, one with all of them is chosen; the request never waits or fails for lack of them)
    :param workload_class: ``training``, ``inference`` or ``batch`` (never training beside inference)
    :param priority: queue priority, higher first
    :param team: the team the slice is accounted to
    :param preemptible: whether higher-priority work may take the slice back; a victim's pod
        gets SIGTERM and ``preemption_grace_seconds`` to write a checkpoint and exit, and its
        retry resumes from the newest checkpoint (see :mod:`airflow_gpupool.ledger.teams.preempting`)
    :param preemption_grace_seconds: that grace (default ``[gpupool] preemption_grace_seconds``)
    :param checkpoint_on_sigterm: the container writes a checkpoint to ``checkpoint_dir`` on SIGTERM
        within that grace, then exits; the ledger then ranks it, as a preemption victim, as losing
        no work (it is chosen before grants that would lose work since a periodic checkpoint).
        Needs ``checkpoint_dir``; only the request says so, nothing is set in the pod
    :param reservation_timeout: seconds the request may wait (default ``[gpupool] reservation_timeout_seconds``)
    :param lease_ttl: lease seconds, renewed while the pod runs (default ``[gpupool] lease_ttl_seconds``)
    :param ledger_conn_id: the ``gpupool`` connection; None for the ``[gpupool]`` configuration alone
    :param binding: slice binding strategy; default per node pool from the connection or configuration
    :param checkpoint_dir: checkpoint location passed to the container as ``GPUPOOL_CHECKPOINT_DIR``
    :param reservation_deferrable: wait for the slice deferred (no worker slot); default ``deferrable``
    :param checkpoint_conn_id: an Airflow connection for the checkpoint filesystem; None: fsspec's defaults
    :param keep_checkpoints: after the pod ends, prune to this many valid checkpoints (None: never)
    :param escalation: the escalation ladder: an :class:`EscalationPolicy`, or ``{"failure class":
        "remedy"}`` overrides of the default (see :mod:`airflow_gpupool.operators.escalation`)
    :param escalation_notifier: called once per task run when the ladder escalates (default
        :class:`~airflow_gpupool.notifiers.EscalationNotifier`); any Airflow notifier or callable
    :param log_tail_lines: lines of the container log kept for classification and escalation
    :param cpu_fallback: run the pod without a GPU instead of failing (not pinned, no slice; the
        container sees ``GPUPOOL_DEVICE=cpu``) when the reservation times out, and on the retry when
        the ladder chooses it (a GPU fault by default; see :mod:`airflow_gpupool.operators.escalation`)
    :param shm_size: a memory-backed ``/dev/shm`` of this size (``8Gi``), counted in the request's
        memory; data loaders with several workers need one
    :param capacity: ``on-demand``, ``spot`` or ``any``; None: the default rule (urgent work on
        on-demand, checkpointed preemptible training prefers cheap spot; see
        :mod:`airflow_gpupool.operators.capacity`)
    :param expected_duration: seconds a run is expected to take, for the default rule (None: long)
    :param fail_fast_on_forecast: while waiting deferred, give up (withdrawn, with the forecast in
        the error) once the controller's forecast puts even the earliest likely start (p10) beyond
        ``reservation_timeout``, or says "never, on the current nodes" (off by default)
    :param gpu_admission: ``task`` (each step on its own) or ``run``: the run's first GPU step is
        granted only once its team's quota (or the pool) serves the run's peak concurrent need, and
        a run that can never fit is refused up front (:mod:`~airflow_gpupool.operators.steps.run_admission`;
        usually set for a whole DAG or task group through ``default_args``)
    :param hand_on: on success, hand the part of the slice a direct downstream GPU step of the
        run needs on to it instead of releasing it (see :mod:`airflow_gpupool.operators.steps.hand_on`);
        False on either step, or the DAG param ``gpupool_hand_on`` false, turns it off
    :param handoff_seconds: how long a slice handed on waits for the downstream step to take it
        (default ``[gpupool] handoff_seconds``); then it is released
    :param queue_ahead: once granted, queue the direct downstream GPU steps its slice will not be
        handed on to ahead of its forecast end (:mod:`airflow_gpupool.operators.steps.queue_ahead`); False
        on either step, or the DAG param ``gpupool_queue_ahead`` false, turns it off
    :param queue_ahead_lead_seconds: as a downstream step, enter the queue this long before the
        upstream's forecast end (default ``[gpupool] queue_ahead_lead_seconds``)
    """

    template_fields: Sequence[str] = (
        *KubernetesPodOperator.template_fields,
        *REQUEST_FIELDS,
        "checkpoint_dir",
    )
    ui_color = "#76b900"
    # kit (issue 15): "GPU reservation" opens the try's reservation page.
    operator_extra_links = (*KubernetesPodOperator.operator_extra_links, GpuReservationLink())

    def __init__(
        self,
        *,
        gpus: int | str = 0,
        gpu_milli: int | str | None = None,
        gpu_memory_mib: int | str | None = None,
        mig_profile: str | None = None,
        gpu_models: Sequence[str] | str = (),
        node_labels: Mapping[str, str] | None = None,
        prefer_node_labels: Mapping[str, str] | None = None,
        workload_class: str = "batch",
        priority: int | str = 0,
        team: str = "default",
        preemptible: bool = False,
        preemption_grace_seconds: float | None = None,
        checkpoint_on_sigterm: bool = False,
        reservation_timeout: float | None = None,
        lease_ttl: float | None = None,
        ledger_conn_id: str | None = GpuPoolHook.default_conn_name,
        binding: str | None = None,
        checkpoint_dir: str | None = None,
        reservation_deferrable: bool | None = None,
        checkpoint_conn_id: str | None = None,
        keep_checkpoints: int | None = 5,
        escalation: EscalationPolicy | Mapping[str, str] | None = None,
        escalation_notifier: Any = None,
        log_tail_lines: int = 50,
        shm_size: str | None = None,
        cpu_fallback: bool = False,
        capacity: str | None = None,
        expected_duration: float | None = None,
        fail_fast_on_forecast: bool = False,
        gpu_admission: str = "task",
        hand_on: bool = True,
        handoff_seconds: float | None = None,
        queue_ahead: bool = True,
        queue_ahead_lead_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(hand_on, bool):
            raise ConfigurationError(f"task {self.task_id}: hand_on must be True or False, not {hand_on!r}")
        self.hand_on = hand_on
        if not isinstance(queue_ahead, bool):
            raise ConfigurationError(
                f"task {self.task_id}: queue_ahead must be True or False, not {queue_ahead!r}"
            )
        self.queue_ahead, self.queue_ahead_lead_seconds = queue_ahead, queue_ahead_lead_seconds
        self.handoff_seconds = handoff_seconds
        self.fail_fast_on_forecast = fail_fast_on_forecast
        self.gpu_admission = check_gpu_admission(gpu_admission)
        self.gpus = gpus
        self.gpu_milli = gpu_milli
        self.gpu_memory_mib = gpu_memory_mib
        self.mig_profile = mig_profile
        self.gpu_models = gpu_models
        self.node_labels = node_labels
        self.prefer_node_labels = prefer_node_labels
        self.workload_class = workload_class
        self.priority = priority
        self.team = team
        self.preemptible = preemptible
        self.preemption_grace_seconds = preemption_grace_seconds
        self.checkpoint_on_sigterm = checkpoint_on_sigterm
        self.reservation_timeout = reservation_timeout
        self.lease_ttl = lease_ttl
        self.ledger_conn_id = ledger_conn_id
        self.binding = binding
        self.checkpoint_dir = checkpoint_dir
        self.reservation_deferrable = reservation_deferrable
        self.checkpoint_conn_id = checkpoint_conn_id
        self.keep_checkpoints = keep_checkpoints
        self.escalation = EscalationPolicy.of(escalation, cpu_fallback=cpu_fallback)
        self.escalation_notifier = escalation_notifier
        self.log_tail_lines = log_tail_lines
        self.shm_size = shm_size
        self.cpu_fallback = cpu_fallback
        self.capacity = capacity
        check_capacity(capacity)
        self.expected_duration = expected_duration
        self._typical_seconds: float | None = None  # the task's recent successful runs (execute only)
        self._cpu_fallback_active = False
        self._grant: Grant | None = None
        self._held_id: str | None = None
        self._request_override: GpuRequest | None = None
        self._resume_from: CheckpointManifest | None = None
        self._failure: tuple[Classification, str] | None = None
        self._drift: Classification | None = None  # the node lacked the granted GPUs (UnschedulableFailFast)
        self._own_pod: tuple[str, str] | None = None  # (namespace, name) once created
        self._pod_done = False  # the parent's cleanup has the pod's final state
        self._adopted = False  # the grant is an earlier try's, whose running pod the parent re-attaches to
        check_keep_checkpoints(keep_checkpoints)
        check_log_tail_lines(log_tail_lines)
        check_seconds("reservation_timeout", reservation_timeout)
        check_seconds("lease_ttl", lease_ttl)
        check_seconds("expected_duration", expected_duration)
        check_seconds("preemption_grace_seconds", preemption_grace_seconds)
        check_seconds("handoff_seconds", handoff_seconds)
        check_seconds("queue_ahead_lead_seconds", queue_ahead_lead_seconds)
        check_checkpoint_on_sigterm(checkpoint_on_sigterm, checkpoint_dir)
        # Parse-time validation, no I/O: fail the DAG import, not the run, on a bad request. A
        # templated field (container_resources included, a KPO template field) is checked once
        # rendered, when the request is built in execute.
        fields = [getattr(self, f) for f in REQUEST_FIELDS] + [self.container_resources]
        if not any(templated(value) for value in fields):
            request = self.gpu_request()
            if binding is not None:
                binding_for(request, binding, f"task {self.task_id}")
        elif binding is not None:
            check_binding_name(binding, f"task {self.task_id}")

    def gpu_request(self) -> GpuRequest:
        """Return this try's request: the task's own, or the larger one an earlier try's escalation chose."""
        return self._request_override or self.declared_request()

    def hand_on_request(self) -> GpuRequest | None:
        """Return the request an upstream step hands its slice on for; None while it is templated."""
        fields = [getattr(self, f) for f in REQUEST_FIELDS] + [self.container_resources]
        return None if any(templated(value) for value in fields) else self.declared_request()

    def declared_request(self) -> GpuRequest:
        """Return the task's request, built from its (rendered) arguments, its capacity a node label."""
        request = build_request(
            {name: getattr(self, name) for name in REQUEST_FIELDS},
            workload_class=self.workload_class,
            preemptible=self.preemptible,
            container_resources=self.container_resources,
            shm_size=self.shm_size,
            checkpoint_on_sigterm=self.checkpoint_on_sigterm,
        )
        if self.preemption_grace_seconds is not None:
            request = replace(request, preemption_grace_seconds=self.preemption_grace_seconds)
        expected = self.expected_duration if self.expected_duration is not None else self._typical_seconds
        return with_capacity(
            request,
            check_capacity(self.capacity),
            checkpointed=self.checkpoint_dir is not None,
            expected_seconds=expected,
        )

    @cached_property
    def gpu_hook(self) -> GpuPoolHook:  # type: ignore[override]
        """The ledger hook, created on first use (never at parse time)."""
        if self.binding is not None:
            # The task's binding applies on every node pool: placement may use any of them.
            return GpuPoolHook(self.ledger_conn_id, binding=self.binding, node_pool_bindings={})
        return GpuPoolHook(self.ledger_conn_id)

    def granted_node(self) -> str | None:
        """Return the node this try's slice was granted on (its pod is pinned there); kit (issue 15)."""
        return self._grant.node if self._grant is not None else None

    # -- execute ---------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Reserve the slice, wait for it (deferred or in place), then run the pinned pod.

        Runs the CPU fallback instead when an earlier try's failure chose it.
        """
        rid = TaskTry.from_context(context).reservation_id
        if self._load_ladder_choice(context):
            return self._run_cpu_fallback(context, rid)
        try:
            return self._reserve_and_run(context)
        except ReservationTimeoutError as e:
            return self._timed_out(context, rid, e)

    def _run_granted(self, context: Context, rid: str, grant: Grant) -> Any:
        self._grant, self._held_id = grant, rid
        request = self.gpu_request()
        try:
            self._binding_for(request, grant)
        except ConfigurationError:
            self._release(rid, "the slice cannot be bound to a pod")
            raise
        where = grant.mig_slice or ",".join(map(str, grant.gpu_indices))
        self.log.info(
            "Granted %s on node %s GPU %s; launching the pod", request.describe(), grant.node, where
        )
        context["ti"].xcom_push(key=XCOM_GRANT_KEY, value={"reservation_id": rid, **grant.to_dict()})
        try:
            plan_queue_ahead(self, context, rid, grant, self.log)
        except Exception as e:  # the next steps then reserve when they run: this step runs on
            self.log.warning("Nothing queued ahead of %s: %s: %s", rid, type(e).__name__, e)
        checkpoints = self._checkpoints()
        if checkpoints is not None:
            self._resume_from = checkpoints.resume_point(context["ti"].try_number, rid)
        renewer = self._lease_renewer(rid)
        renewer.start()
        try:
            run = lambda: super(GpuPodOperator, self).execute(context)  # noqa: E731
            return self._run_then_release(context, rid, lambda: renewer.guard(run), "task")
        finally:
            renewer.stop()

    def _release(self, rid: str, reason: str, context: Context | None = None) -> None:
        """Release the slice; with ``context`` (the pod succeeded), hand part of it on to the next GPU step."""
        target = None
        if context is not None:
            try:
                target = hand_on_target(self, context, self.log)
            except Exception as e:  # a downstream the DAG got wrong must not keep the slice: released
                self.log.warning("GPU slice %s not handed on: %s: %s", rid, type(e).__name__, e)
        if target is not None:
            hold = self.handoff_seconds or settings.handoff_seconds()
            try:
                handed = self.gpu_hook.hand_on(
                    rid, target.task_key, target.request, hold_seconds=hold, reason=reason
                )
                self.log.info("GPU slice %s: %s", rid, handed.message)
            except GpuPoolError as e:  # nothing handed on: the slice is released below (idempotent)
                self.log.warning("GPU slice %s not handed on to %s: %s", rid, target.task_id, e)
                target = None
        if target is None:
            # Succeeded (a context): what queued ahead of it stays; else it is withdrawn.
            result = self.gpu_hook.release(rid, reason, keep_queued_ahead=context is not None)
            if result is not None:
                self.log.info("GPU slice %s: %s", rid, result.message)
        self._held_id = None
        checkpoints = self._checkpoints()
        if checkpoints is not None:
            checkpoints.retain(rid)

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        """Finish the deferred pod like the parent, then release the slice."""
        # An adopted grant keeps the id of the try that made it: the trigger's event carries it.
        rid = event.get("reservation_id") or TaskTry.from_context(context).reservation_id
        self._held_id = rid
        self._load_ladder_choice(context)
        if event.get("status") == LEASE_LOST_STATUS:
            return self._run_then_release(context, rid, lambda: self._lease_lost(event), "pod")
        if event.get("status") == UNSCHEDULABLE_STATUS:
            return self._run_then_release(context, rid, lambda: self.unplaceable(event), "pod")
        return self._run_then_release(
            context, rid, lambda: super(GpuPodOperator, self).trigger_reentry(context, event), "pod"
        )

    def _run_then_release(self, context: Context, rid: str, run: Callable[[], Any], what: str) -> Any:
        """Run the pod part; record how it ended, then release the slice, on every path but deferral."""
        try:
            result = run()
        except TaskDeferred:
            raise  # the pod runs on; LeasedPodTrigger renews the lease, trigger_reentry releases
        except Exception as e:
            try:
                outcome = self._failed(context, rid, e)
            finally:
                self._release_off_the_pod(rid, f"{what} failed: {type(e).__name__}")
            raise outcome  # noqa: B904 (_failed sets the cause)
        except BaseException as e:
            self._release_off_the_pod(rid, f"{what} failed: {type(e).__name__}")
            raise
        self._release(rid, "pod succeeded", context)
        return result

    def on_kill(self) -> None:
        """Delete the pod like the parent, wait until it is gone, then release the slice.

        A pod kept running (``on_kill_action="keep_pod"``) keeps its slice until it ends.
        """
        try:
            super().on_kill()
        finally:
            if self._held_id:
                self._release_off_the_pod(self._held_id, "task killed")
