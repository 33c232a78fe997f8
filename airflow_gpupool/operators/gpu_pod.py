"""GpuPodOperator: reserve a GPU slice from the ledger, then run a pod pinned to it."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from airflow.sdk.exceptions import TaskDeferred

from airflow_gpupool import settings
from airflow_gpupool.checkpoints.manifest import RESUME_ENV, CheckpointManifest
from airflow_gpupool.exceptions import (
    ConfigurationError,
    GpuPoolError,
    InvalidRequestError,
    ReservationTimeoutError,
)
from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.ledger.models import Grant, ReservationState
from airflow_gpupool.operators.binding import SliceFacts, binding_for, check_binding_name
from airflow_gpupool.operators.escalation import Decision, EscalationPolicy, Remedy, decide, describe_policy
from airflow_gpupool.operators.failures import Classification, FailureClass, classify, error_for
from airflow_gpupool.operators.pod_spec import pin_pod
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.triggers.pod import LeasedPodTrigger
from airflow_gpupool.triggers.reservation import ReservationEventStatus, ReservationTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s

    from airflow_gpupool.checkpoints.store import CheckpointStore
    from airflow_gpupool.ledger.attempts import TaskAttempts

XCOM_GRANT_KEY = "gpupool_grant"
_INT_FIELDS = ("gpus", "gpu_milli", "gpu_memory_mib", "priority")


def _templated(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping):
        return any(_templated(k) or _templated(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_templated(v) for v in value)
    return False


class _LeaseRenewer(threading.Thread):
    """Renew a grant's lease every ``ttl / 3`` while a sync pod runs.

    Each round first reconciles the grant with its pod: a pod that finished or vanished
    behind the operator's back gives its slice back instead of holding it until the TTL.
    """

    def __init__(
        self,
        hook: GpuPoolHook,
        reservation_id: str,
        ttl: float,
        log: Any,
        reconcile: Callable[[], str | None],
    ) -> None:
        super().__init__(name=f"gpupool-lease-{reservation_id}", daemon=True)
        self._hook, self._id, self._ttl, self._log, self._reconcile = (
            hook,
            reservation_id,
            ttl,
            log,
            reconcile,
        )
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self._ttl / 3):
            try:
                released = self._reconcile()
                if released is not None:
                    self._log.error("GPU slice %s released by reconcile: %s", self._id, released)
                    return
                self._hook.renew(self._id, self._ttl)
            except GpuPoolError as e:
                self._log.error("Lease of %s can no longer be renewed: %s", self._id, e)
                return
            except Exception:
                self._log.exception("Renewing the lease of %s failed; will retry", self._id)

    def stop(self) -> None:
        self._stopped.set()


# The operator arguments that make up the GPU request (templated, so checked at run time if templated).
_REQUEST_FIELDS = (
    "gpus",
    "gpu_milli",
    "gpu_memory_mib",
    "mig_profile",
    "gpu_models",
    "node_labels",
    "priority",
    "team",
)


class GpuPodOperator(KubernetesPodOperator):
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
    :param workload_class: ``training``, ``inference`` or ``batch`` (never training beside inference)
    :param priority: queue priority, higher first
    :param team: the team the slice is accounted to
    :param preemptible: whether higher-priority work may take the slice back
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
    """

    template_fields: Sequence[str] = (
        *KubernetesPodOperator.template_fields,
        *_REQUEST_FIELDS,
        "checkpoint_dir",
    )
    ui_color = "#76b900"

    def __init__(
        self,
        *,
        gpus: int | str = 0,
        gpu_milli: int | str | None = None,
        gpu_memory_mib: int | str | None = None,
        mig_profile: str | None = None,
        gpu_models: Sequence[str] | str = (),
        node_labels: Mapping[str, str] | None = None,
        workload_class: str = "batch",
        priority: int | str = 0,
        team: str = "default",
        preemptible: bool = False,
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gpus = gpus
        self.gpu_milli = gpu_milli
        self.gpu_memory_mib = gpu_memory_mib
        self.mig_profile = mig_profile
        self.gpu_models = gpu_models
        self.node_labels = node_labels
        self.workload_class = workload_class
        self.priority = priority
        self.team = team
        self.preemptible = preemptible
        self.reservation_timeout = reservation_timeout
        self.lease_ttl = lease_ttl
        self.ledger_conn_id = ledger_conn_id
        self.binding = binding
        self.checkpoint_dir = checkpoint_dir
        self.reservation_deferrable = reservation_deferrable
        self.checkpoint_conn_id = checkpoint_conn_id
        self.keep_checkpoints = keep_checkpoints
        self.escalation = EscalationPolicy.of(escalation)
        self.escalation_notifier = escalation_notifier
        self.log_tail_lines = log_tail_lines
        self._grant: Grant | None = None
        self._held_id: str | None = None
        self._request_override: GpuRequest | None = None
        self._resume_from: CheckpointManifest | None = None
        self._failure: tuple[Classification, str] | None = None
        if keep_checkpoints is not None and (isinstance(keep_checkpoints, bool) or keep_checkpoints < 1):
            raise InvalidRequestError(
                "keep_checkpoints", keep_checkpoints, "an integer of at least 1, or None"
            )
        for name, value in (("reservation_timeout", reservation_timeout), ("lease_ttl", lease_ttl)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise InvalidRequestError(name, value, "a positive number of seconds")
        # Parse-time validation, no I/O: fail the DAG import, not the run, on a bad request.
        if not any(_templated(getattr(self, f)) for f in _REQUEST_FIELDS):
            request = self.gpu_request()
            if binding is not None:
                binding_for(request, binding, f"task {self.task_id}")
        elif binding is not None:
            check_binding_name(binding, f"task {self.task_id}")

    def gpu_request(self) -> GpuRequest:
        """Return this try's request: the task's own, or the larger one an earlier try's escalation chose."""
        return self._request_override or self.declared_request()

    def declared_request(self) -> GpuRequest:
        """Return the task's request, built from its (rendered) arguments."""
        values: dict[str, Any] = {}
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    value = int(value.strip())
                except ValueError:
                    raise InvalidRequestError(name, value, "an integer (after templating)") from None
            values[name] = value
        models = self.gpu_models
        if isinstance(models, str):
            models = [m for m in models.replace(",", "|").split("|") if m]
        return GpuRequest(
            cpu_milli=self._cpu_milli(),
            memory_mib=self._memory_mib(),
            mig_profile=self.mig_profile or None,
            gpu_models=frozenset(models or ()),
            node_labels=tuple((self.node_labels or {}).items()),
            workload_class=self.workload_class,  # type: ignore[arg-type]
            team=self.team,
            preemptible=self.preemptible,
            **values,
        )

    def _requested(self, key: str) -> str | None:
        resources = self.container_resources
        requests = getattr(resources, "requests", None) or {}
        return requests.get(key)

    def _cpu_milli(self) -> int:
        raw = self._requested("cpu")
        if raw is None:
            return 1000
        text = str(raw)
        return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)

    def _memory_mib(self) -> int:
        from airflow_gpupool.inventory.yaml_file import memory_to_mib

        raw = self._requested("memory")
        return 1024 if raw is None else memory_to_mib("container_resources.requests.memory", raw)

    @cached_property
    def gpu_hook(self) -> GpuPoolHook:
        """The ledger hook, created on first use (never at parse time)."""
        return GpuPoolHook(self.ledger_conn_id)

    # -- identity -----------------------------------------------------------------------------

    @staticmethod
    def reservation_id_for(context: Context) -> str:
        """Return the reservation id of this task try: stable across deferrals, new per retry."""
        ti = context["ti"]
        key = f"{ti.dag_id}|{ti.task_id}|{ti.run_id}|{getattr(ti, 'map_index', -1)}|{ti.try_number}"
        return "gp-" + hashlib.sha256(key.encode()).hexdigest()[:32]

    @staticmethod
    def _holder(context: Context) -> str:
        ti = context["ti"]
        return (
            f"{ti.dag_id}/{ti.task_id}/{ti.run_id}/map-{getattr(ti, 'map_index', -1)}"
            f"/try-{ti.try_number}@{socket.gethostname()}"
        )[:512]

    # -- execute ---------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Reserve the slice, wait for it (deferred or in place), then run the pinned pod."""
        self._load_escalated_request(context)
        try:
            return self._reserve_and_run(context)
        except ReservationTimeoutError as e:
            raise self._failed(context, self.reservation_id_for(context), e)  # noqa: B904 (cause set by _failed)

    def _reserve_and_run(self, context: Context) -> Any:
        request = self.gpu_request()
        options = self.gpu_hook.options
        rid = self.reservation_id_for(context)
        timeout = self.reservation_timeout or options.reservation_timeout_seconds
        self.log.info("Reserving %s from the GPU ledger as %s", request.describe(), rid)
        reservation = self.gpu_hook.reserve(
            request, self._holder(context), reservation_id=rid, ttl=self.lease_ttl, timeout=timeout
        )
        if reservation.state is ReservationState.GRANTED:
            assert reservation.grant is not None
            return self._run_granted(context, rid, reservation.grant)
        if reservation.state is not ReservationState.WAITING:
            raise GpuPoolError(f"reservation {rid} is {reservation.state.value}: {reservation.message}")
        self.log.info("No GPU slice fits now; %s", self.gpu_hook.ledger.explain(rid))
        if self._defer_reservation():
            self.defer(
                trigger=ReservationTrigger(
                    rid, self.ledger_conn_id, poll_interval=options.poll_interval_seconds
                ),
                method_name="execute_granted",
                timeout=timedelta(seconds=timeout + 5 * options.poll_interval_seconds + 60),
            )
        return self._run_granted(context, rid, self._wait_in_place(rid, options.poll_interval_seconds))

    def _defer_reservation(self) -> bool:
        return self.deferrable if self.reservation_deferrable is None else self.reservation_deferrable

    def _wait_in_place(self, rid: str, poll_interval: float) -> Grant:
        while True:
            self.gpu_hook.reap()
            reservation = self.gpu_hook.get(rid)
            if reservation.state is ReservationState.GRANTED and reservation.grant is not None:
                return reservation.grant
            if reservation.state is ReservationState.TIMED_OUT:
                raise ReservationTimeoutError(
                    rid, time.time() - reservation.created_at, [reservation.message]
                )
            if reservation.state.ended:
                raise GpuPoolError(
                    f"reservation {rid} ended as {reservation.state.value}: {reservation.message}"
                )
            self.log.info("Waiting for a GPU slice; %s", self.gpu_hook.ledger.explain(rid))
            time.sleep(poll_interval)

    def execute_granted(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after ReservationTrigger: run the pod, or fail with what blocked the request."""
        self._load_escalated_request(context)
        rid = event["reservation_id"]
        status = event["status"]
        if status == ReservationEventStatus.GRANTED.value:
            return self._run_granted(context, rid, Grant.from_dict(event["grant"]))
        self.gpu_hook.release(rid, reason=f"reservation {status}")
        if status == ReservationEventStatus.TIMEOUT.value:
            reservation = self.gpu_hook.get(rid)
            error = ReservationTimeoutError(rid, time.time() - reservation.created_at, [event["message"]])
            raise self._failed(context, rid, error)
        raise GpuPoolError(f"waiting for reservation {rid} failed: {event['message']}")

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
        self._find_resume_point(context, rid)
        ttl = self.lease_ttl or self.gpu_hook.options.lease_ttl_seconds
        renewer = _LeaseRenewer(self.gpu_hook, rid, ttl, self.log, lambda: self._reconcile_own_grant(rid))
        renewer.start()
        try:
            return self._run_then_release(
                context, rid, lambda: super(GpuPodOperator, self).execute(context), "task"
            )
        finally:
            renewer.stop()

    def _reconcile_own_grant(self, rid: str) -> str | None:
        from airflow_gpupool.controller.reconcile import reconcile_grant

        # The pod may take up to the launch timeout to appear; only then is "no pod" news.
        grace = float(self.startup_timeout_seconds) + 60
        return reconcile_grant(self.gpu_hook.ledger, self.client, rid, grace_seconds=grace)

    def _binding_for(self, request: GpuRequest, grant: Grant) -> Any:
        options = self.gpu_hook.options
        name = self.binding or options.node_pool_bindings.get(grant.node_pool) or options.binding
        return binding_for(request, name, f"task {self.task_id} on node pool {grant.node_pool}")

    def _release(self, rid: str, reason: str) -> None:
        result = self.gpu_hook.release(rid, reason)
        if result is not None:
            self.log.info("GPU slice %s: %s", rid, result.message)
        self._held_id = None
        self._retain_checkpoints(rid)

    # -- the pod --------------------------------------------------------------------------------

    def build_pod_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Pod:
        """Build the parent's pod, then pin it to the granted slice."""
        pod = super().build_pod_request_obj(context, dry_run=dry_run)
        if self._grant is None or self._held_id is None:
            return pod
        request = self.gpu_request()
        grant = self._grant
        facts = SliceFacts(
            gpus=len(grant.gpu_indices) if grant.mig_slice is None else 0,
            gpu_uuids=grant.gpu_uuids,
            milli_per_gpu=grant.milli_per_gpu,
            gpu_memory_mib=grant.gpu_memory_mib,
            mig_profile=grant.mig_profile,
        )
        pinned = pin_pod(
            pod,
            reservation_id=self._held_id,
            grant=grant,
            request=request,
            binding=self._binding_for(request, grant).bind(facts),
            container_name=self.base_container_name,
            checkpoint_dir=self.checkpoint_dir,
            priority_class=settings.workload_priority_classes().get(request.workload_class.value),
        )
        if self._resume_from is not None:
            container = next(
                (c for c in pinned.spec.containers if c.name == self.base_container_name),
                pinned.spec.containers[0],
            )
            from kubernetes.client import models as k8s_models

            env = [e for e in (container.env or []) if e.name != RESUME_ENV]
            container.env = [*env, k8s_models.V1EnvVar(name=RESUME_ENV, value=self._resume_from.location)]
        return pinned

    def defer(
        self,
        *,
        trigger: Any,
        method_name: str,
        kwargs: dict[str, Any] | None = None,
        timeout: timedelta | int | float | None = None,
    ) -> Any:
        """Defer; a pod trigger is swapped for one that also renews the grant's lease."""
        if (
            isinstance(trigger, KubernetesPodTrigger)
            and not isinstance(trigger, LeasedPodTrigger)
            and self._held_id
        ):
            trigger = LeasedPodTrigger.wrap(
                trigger,
                reservation_id=self._held_id,
                ledger_conn_id=self.ledger_conn_id,
                lease_ttl=self.lease_ttl or self.gpu_hook.options.lease_ttl_seconds,
            )
        return super().defer(trigger=trigger, method_name=method_name, kwargs=kwargs, timeout=timeout)

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        """Finish the deferred pod like the parent, then release the slice."""
        rid = self.reservation_id_for(context)
        self._held_id = rid
        self._load_escalated_request(context)
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
                self._release(rid, f"{what} failed: {type(e).__name__}")
            raise outcome  # noqa: B904 (_failed sets the cause)
        except BaseException as e:
            self._release(rid, f"{what} failed: {type(e).__name__}")
            raise
        self._release(rid, "pod succeeded")
        return result

    def on_kill(self) -> None:
        """Delete the pod like the parent, then release the slice."""
        try:
            super().on_kill()
        finally:
            if self._held_id:
                self._release(self._held_id, "task killed")

    # -- checkpoints, failure classification, escalation -----------------------------------------

    @staticmethod
    def task_key(context: Context) -> str:
        """Return the task instance's key without the try: what its tries share in the ledger."""
        ti = context["ti"]
        return f"{ti.dag_id}/{ti.task_id}/{ti.run_id}/map-{getattr(ti, 'map_index', -1)}"[:512]

    @cached_property
    def attempts(self) -> TaskAttempts:
        """The failed tries of this task, kept in the ledger (every worker sees them)."""
        from airflow_gpupool.ledger.attempts import TaskAttempts

        return TaskAttempts(self.gpu_hook.ledger)

    def _checkpoints(self) -> CheckpointStore | None:
        if not self.checkpoint_dir:
            return None
        from airflow_gpupool.checkpoints.store import CheckpointStore

        return CheckpointStore(self.checkpoint_dir, conn_id=self.checkpoint_conn_id)

    def _load_escalated_request(self, context: Context) -> None:
        """Take the larger request an earlier try's out-of-memory failure chose, if any."""
        if context["ti"].try_number <= 1:
            return
        larger = [a.next_request for a in self.attempts.history(self.task_key(context)) if a.next_request]
        if larger:
            self._request_override = larger[-1]
            self.log.info("An earlier try ran out of memory; this try asks for %s", larger[-1].describe())

    def _find_resume_point(self, context: Context, rid: str) -> None:
        """On a retry, resume from the newest valid checkpoint, pinned against pruning meanwhile."""
        store = self._checkpoints()
        if store is None or context["ti"].try_number <= 1:
            return
        newest = store.newest()
        if newest is None:
            self.log.info("No valid checkpoint at %s; this retry starts from the beginning", store.url)
            return
        store.pin(newest.step, rid)
        self._resume_from = newest
        self.log.info("Resuming from checkpoint step %d at %s", newest.step, newest.location)

    def _retain_checkpoints(self, rid: str) -> None:
        store = self._checkpoints()
        if store is None:
            return
        try:
            store.unpin(rid)
            if self.keep_checkpoints is not None:
                pruned = store.prune(self.keep_checkpoints)
                if pruned:
                    self.log.info("Pruned checkpoint steps %s (keeping %d)", pruned, self.keep_checkpoints)
        except Exception:
            self.log.exception("Checkpoint retention at %s failed; the checkpoints stay", store.url)

    def cleanup(
        self,
        pod: k8s.V1Pod,
        remote_pod: k8s.V1Pod,
        xcom_result: dict | None = None,
        context: Context | None = None,
    ) -> None:
        """Read why a failed pod failed (status, events, log tail) before the parent deletes it."""
        phase = getattr(getattr(remote_pod, "status", None), "phase", None)
        if remote_pod is not None and not self._killed and phase != "Succeeded":
            self._failure = self._read_failure(pod, remote_pod)
        super().cleanup(pod, remote_pod, xcom_result=xcom_result, context=context)

    def _read_failure(self, pod: k8s.V1Pod, remote_pod: k8s.V1Pod) -> tuple[Classification, str]:
        from kubernetes.client import ApiClient

        try:
            remote_pod = self.pod_manager.read_pod(pod)
        except Exception:
            self.log.warning("Could not re-read pod %s; classifying its last known state", pod.metadata.name)
        events: list[dict[str, Any]] = []
        tail = ""
        try:
            events = [
                {"reason": e.reason, "message": e.message}
                for e in self.pod_manager.read_pod_events(pod).items
            ]
        except Exception:
            self.log.warning("Could not read the events of pod %s", pod.metadata.name)
        try:
            raw = self.client.read_namespaced_pod_log(
                name=pod.metadata.name,
                namespace=pod.metadata.namespace,
                container=self.base_container_name,
                tail_lines=self.log_tail_lines,
                _preload_content=False,
            )
            tail = raw.data.decode("utf-8", errors="replace")
        except Exception:
            self.log.info("No log tail for pod %s", pod.metadata.name)
        data = ApiClient().sanitize_for_serialization(remote_pod)
        return classify(data, events, tail, container=self.base_container_name), tail

    def _failed(self, context: Context, rid: str, error: Exception) -> BaseException:
        """Classify a failed try, record it, walk the ladder; return the exception to raise.

        Runs before the slice is released, so the outcome is recorded first.
        """
        from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

        if isinstance(error, AirflowSkipException | AirflowFailException):
            return error
        classification, tail = self._failure or (classify(None, error=error), "")
        if classification.failure_class is FailureClass.UNKNOWN and self._failure is None:
            classification = Classification(FailureClass.UNKNOWN, f"{type(error).__name__}: {error}")
        store = self._checkpoints()
        newest = store.newest() if store is not None else None
        step = newest.step if newest else None
        typed: BaseException = error
        if not isinstance(error, ReservationTimeoutError):
            typed = error_for(classification, last_checkpoint=step, log_tail=tail)
            typed.__cause__ = error
        ti = context["ti"]
        decision = self._decide(classification.failure_class, ti)
        self.log.error("Try %s failed: %s; %s", ti.try_number, typed, decision.reason)
        if self._record(context, rid, classification, decision, step):
            self._notify(context, classification, step, tail, decision.reason)
        if decision.retry:
            return typed
        fail = AirflowFailException(f"{typed} ({decision.reason})")
        fail.__cause__ = typed
        return fail

    def _decide(self, failure_class: FailureClass, ti: Any) -> Decision:
        cluster = None
        if self.escalation.remedy(failure_class) is Remedy.RETRY_LARGER:
            try:
                cluster = self.gpu_hook.ledger.empty_cluster()
            except Exception:
                self.log.exception("Reading the inventory failed; no larger slice can be chosen")
        return decide(
            self.escalation,
            failure_class,
            self.gpu_request(),
            retries_left=ti.try_number <= int(getattr(ti, "max_tries", self.retries) or 0),
            failed_model=self._grant.gpu_model if self._grant else None,
            cluster=cluster,
        )

    def _record(
        self, context: Context, rid: str, classification: Classification, decision: Decision, step: int | None
    ) -> bool:
        """Record the failed try in the ledger; return whether this caller must notify a person."""
        from airflow_gpupool.ledger.attempts import TaskAttempt

        ti = context["ti"]
        key = self.task_key(context)
        attempt = TaskAttempt(
            task_key=key,
            try_number=ti.try_number,
            reservation_id=rid,
            failure_class=classification.failure_class.value,
            remedy=decision.remedy.value,
            request=self.gpu_request(),
            message=f"{classification.reason}: {decision.reason}",
            exit_code=classification.exit_code,
            next_request=decision.next_request,
            gpu_model=self._grant.gpu_model if self._grant else None,
            checkpoint_step=step,
        )
        try:
            self.attempts.record(attempt)
            return decision.escalate and self.attempts.claim_escalation(key, ti.try_number)
        except Exception:
            # The pod's failure must still surface; a person hears of it, even if twice.
            self.log.exception(
                "Recording try %s in the ledger failed; the next try will not know it", ti.try_number
            )
            return decision.escalate

    def _notify(
        self, context: Context, classification: Classification, step: int | None, tail: str, why: str
    ) -> None:
        from airflow_gpupool.notifiers.escalation import (
            ESCALATION_KEY,
            MESSAGE_KEY,
            EscalationNotifier,
            format_escalation,
        )

        ti = context["ti"]
        tried = [
            {
                "try_number": a.try_number,
                "failure_class": a.failure_class,
                "request": a.request.describe(),
                "remedy": a.remedy,
                "checkpoint_step": a.checkpoint_step,
            }
            for a in self.attempts.history(self.task_key(context))
        ]
        escalation = {
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "run_id": ti.run_id,
            "map_index": getattr(ti, "map_index", -1),
            "try_number": ti.try_number,
            "failure_class": classification.failure_class.value,
            "reason": classification.reason,
            "exit_code": classification.exit_code,
            "pod_name": classification.pod_name,
            "last_checkpoint_step": step,
            "log_tail": tail,
            "decision": why,
            "tried": tried,
            "policy": describe_policy(self.escalation),
        }
        notifier = self.escalation_notifier or EscalationNotifier()
        try:
            notifier({**context, ESCALATION_KEY: escalation, MESSAGE_KEY: format_escalation(escalation)})
        except Exception:
            # A broken notifier must not hide the task's own failure.
            self.log.exception("The escalation notifier failed")
