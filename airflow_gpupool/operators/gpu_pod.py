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
from airflow_gpupool.exceptions import (
    ConfigurationError,
    GpuPoolError,
    InvalidRequestError,
    ReservationTimeoutError,
)
from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.ledger.models import Grant, ReservationState
from airflow_gpupool.operators.binding import SliceFacts, binding_for, check_binding_name
from airflow_gpupool.operators.pod_spec import pin_pod
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.triggers.pod import LeasedPodTrigger
from airflow_gpupool.triggers.reservation import ReservationEventStatus, ReservationTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s

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
        self, hook: GpuPoolHook, reservation_id: str, ttl: float, log: Any, reconcile: Callable[[], str | None]
    ) -> None:
        super().__init__(name=f"gpupool-lease-{reservation_id}", daemon=True)
        self._hook, self._id, self._ttl, self._log, self._reconcile = hook, reservation_id, ttl, log, reconcile
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
    """

    template_fields: Sequence[str] = (
        *KubernetesPodOperator.template_fields,
        "gpus",
        "gpu_milli",
        "gpu_memory_mib",
        "mig_profile",
        "gpu_models",
        "node_labels",
        "priority",
        "team",
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
        self._grant: Grant | None = None
        self._held_id: str | None = None
        for name, value in (("reservation_timeout", reservation_timeout), ("lease_ttl", lease_ttl)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                raise InvalidRequestError(name, value, "a positive number of seconds")
        # Parse-time validation, no I/O: fail the DAG import, not the run, on a bad request.
        if not any(_templated(getattr(self, f)) for f in self._request_fields()):
            request = self.gpu_request()
            if binding is not None:
                binding_for(request, binding, f"task {self.task_id}")
        elif binding is not None:
            check_binding_name(binding, f"task {self.task_id}")

    @staticmethod
    def _request_fields() -> tuple[str, ...]:
        return ("gpus", "gpu_milli", "gpu_memory_mib", "mig_profile", "gpu_models", "node_labels", "priority", "team")

    def gpu_request(self) -> GpuRequest:
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
                trigger=ReservationTrigger(rid, self.ledger_conn_id, poll_interval=options.poll_interval_seconds),
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
                raise ReservationTimeoutError(rid, time.time() - reservation.created_at, [reservation.message])
            if reservation.state.ended:
                raise GpuPoolError(f"reservation {rid} ended as {reservation.state.value}: {reservation.message}")
            self.log.info("Waiting for a GPU slice; %s", self.gpu_hook.ledger.explain(rid))
            time.sleep(poll_interval)

    def execute_granted(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after ReservationTrigger: run the pod, or fail with what blocked the request."""
        rid = event["reservation_id"]
        status = event["status"]
        if status == ReservationEventStatus.GRANTED.value:
            return self._run_granted(context, rid, Grant.from_dict(event["grant"]))
        self.gpu_hook.release(rid, reason=f"reservation {status}")
        if status == ReservationEventStatus.TIMEOUT.value:
            reservation = self.gpu_hook.get(rid)
            raise ReservationTimeoutError(rid, time.time() - reservation.created_at, [event["message"]])
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
        self.log.info("Granted %s on node %s GPU %s; launching the pod", request.describe(), grant.node, where)
        context["ti"].xcom_push(key=XCOM_GRANT_KEY, value={"reservation_id": rid, **grant.to_dict()})
        ttl = self.lease_ttl or self.gpu_hook.options.lease_ttl_seconds
        renewer = _LeaseRenewer(self.gpu_hook, rid, ttl, self.log, lambda: self._reconcile_own_grant(rid))
        renewer.start()
        try:
            result = super().execute(context)
        except TaskDeferred:
            raise  # the pod runs on; LeasedPodTrigger renews the lease, trigger_reentry releases
        except BaseException as e:
            self._release(rid, f"task failed: {type(e).__name__}")
            raise
        finally:
            renewer.stop()
        self._release(rid, "pod succeeded")
        return result

    def _reconcile_own_grant(self, rid: str) -> str | None:
        from airflow_gpupool.inventory.kubernetes import reconcile_grant

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
        return pin_pod(
            pod,
            reservation_id=self._held_id,
            grant=grant,
            request=request,
            binding=self._binding_for(request, grant).bind(facts),
            container_name=self.base_container_name,
            checkpoint_dir=self.checkpoint_dir,
            priority_class=settings.workload_priority_classes().get(request.workload_class.value),
        )

    def defer(
        self,
        *,
        trigger: Any,
        method_name: str,
        kwargs: dict[str, Any] | None = None,
        timeout: timedelta | int | float | None = None,
    ) -> Any:
        """Defer; a pod trigger is swapped for one that also renews the grant's lease."""
        if isinstance(trigger, KubernetesPodTrigger) and not isinstance(trigger, LeasedPodTrigger) and self._held_id:
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
        try:
            result = super().trigger_reentry(context, event)
        except TaskDeferred:
            raise
        except BaseException as e:
            self._release(rid, f"pod failed: {type(e).__name__}")
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
