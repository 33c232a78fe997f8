"""GpuJobOperator: reserve a gang of GPU slices, then run an Indexed Job whose pods are pinned to it.

The gang (``members`` slices of one shape, all or nothing) is reserved before the Job exists and
waited for exactly as :class:`~airflow_gpupool.operators.gpu_pod.GpuPodOperator` waits for a
slice (deferred in :class:`~airflow_gpupool.triggers.reservation.ReservationTrigger`, or in
place). Granted, the Job is created with ``completions = parallelism = members`` and a gated pod
template (:func:`~airflow_gpupool.operators.pod.pod_spec.gang_template`); each pod, as it appears, is
bound to its member and pinned (:mod:`~airflow_gpupool.operators.gang.gang_pins`), so no pod of the Job
is ever scheduled outside the gang. The gang's lease is renewed while the Job runs (in the worker,
or by :class:`~airflow_gpupool.triggers.job.LeasedJobTrigger` when deferred) and the whole gang is
released on every exit path: success, failure, timeout, kill.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from airflow.providers.common.compat.sdk import TaskDeferred

from airflow_gpupool import settings
from airflow_gpupool.controller.gang_pods import JOB_NAME_LABEL
from airflow_gpupool.controller.pod_deletion import settle_deleted_pod
from airflow_gpupool.exceptions import ConfigurationError, GpuPoolError, ReservationTimeoutError
from airflow_gpupool.forecast.deadlines import dag_deadlines
from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.labels import ANNOTATION_PREFIX, GANG_RESERVATION_ANNOTATION
from airflow_gpupool.ledger import ReservationState
from airflow_gpupool.operators.gang.gang_grants import GangLease, describe_members, member_binding
from airflow_gpupool.operators.gang.gang_pins import GangPodPinner, ReplacementPinning
from airflow_gpupool.operators.gang.rendezvous import DEFAULT_RENDEZVOUS_PORT, rendezvous_env
from airflow_gpupool.operators.pod.lease import LeaseRenewer
from airflow_gpupool.operators.pod.pod_spec import gang_template
from airflow_gpupool.operators.pod.waiting import deferral_after_deadline, reservation_deferral, wait_in_place
from airflow_gpupool.operators.request import REQUEST_FIELDS, build_request, check_seconds, templated
from airflow_gpupool.operators.steps.run_admission import check_gpu_admission, run_need
from airflow_gpupool.resources import GangSpec, GpuRequest
from airflow_gpupool.task_try import TaskTry
from airflow_gpupool.triggers.job import LeasedJobTrigger
from airflow_gpupool.triggers.lease import LEASE_LOST_STATUS, lost_from_event
from airflow_gpupool.triggers.reservation import ReservationEventStatus

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s

    from airflow_gpupool.binding import PodBinding
    from airflow_gpupool.ledger import Gang

__all__ = ["GpuJobOperator"]

#: The Job parameters the gang decides; any other value is refused.
_GANG_FIXED = ("completion_mode", "completions", "parallelism")


class GpuJobOperator(KubernetesJobOperator):
    """Reserve a gang of GPU slices, then run an Indexed Job of one pod per member, pinned to it.

    Takes every argument of :class:`KubernetesJobOperator` (``completion_mode``, ``completions``
    and ``parallelism`` are the gang's: ``Indexed``, ``members``, ``members``), plus the request of
    one member. Each member's container gets the rendezvous environment of
    :mod:`~airflow_gpupool.operators.gang.rendezvous` (``MASTER_ADDR``, ``WORLD_SIZE``, ``RANK``,
    torchrun's ``PET_*``) and its own slice in ``GPUPOOL_RESERVATION_ID``, ``GPUPOOL_NODE`` and
    ``GPUPOOL_GPU_INDICES``.

    :param members: pods in the gang, each with one slice; all are granted or none
    :param gpus: whole GPUs per member
    :param gpu_milli: a fraction of one GPU per member, in milli-GPU
    :param gpu_memory_mib: GPU memory for a fraction
    :param mig_profile: a MIG profile per member
    :param gpu_models: GPU models allowed
    :param node_labels: labels every member's node must carry
    :param prefer_node_labels: labels a member's node should carry
    :param topology_keys: node label keys (zone, rack, NVLink domain) whose shared values the
        gang's placement prefers (default ``[gpupool] gang_topology_keys``; ``()`` for none)
    :param workload_class: ``training`` (default), ``inference`` or ``batch``
    :param priority: queue priority of the gang, higher first
    :param team: the team the slices are accounted to
    :param preemptible: whether higher-priority work may take the slices back
    :param reservation_timeout: seconds the gang may wait (default ``[gpupool] reservation_timeout_seconds``)
    :param lease_ttl: lease seconds, renewed while the Job runs (default ``[gpupool] lease_ttl_seconds``)
    :param ledger_conn_id: the ``gpupool`` connection; None for the ``[gpupool]`` configuration alone
    :param binding: slice binding strategy (one for every member); default per node pool
    :param reservation_deferrable: wait for the gang deferred; default ``deferrable``
    :param rendezvous_port: member 0's rendezvous port (``MASTER_PORT``)
    :param rendezvous_subdomain: the pods' subdomain, the name of a headless Service selecting
        ``batch.kubernetes.io/job-name=<job>`` (default: the Job's name)
    :param pin_timeout: seconds the Job controller may take to create every member's pod
    :param gpu_admission: ``task`` or ``run`` (the run admitted as a whole, as
        :class:`~airflow_gpupool.operators.GpuPodOperator`'s)

    ``backoff_limit`` defaults to 0: a failed member fails the Job and the try, whose retry
    reserves a fresh gang. With ``backoff_limit > 0`` (trainers that take a rank back, such as
    torchrun or Horovod elastic) the Job replaces a failed member's pod with a new one of the
    same completion index, which is pinned to the same member once the old pod ended.
    """

    template_fields: Sequence[str] = (*KubernetesJobOperator.template_fields, *REQUEST_FIELDS)
    ui_color = "#76b900"

    def __init__(
        self,
        *,
        members: int,
        gpus: int | str = 0,
        gpu_milli: int | str | None = None,
        gpu_memory_mib: int | str | None = None,
        mig_profile: str | None = None,
        gpu_models: Sequence[str] | str = (),
        node_labels: Mapping[str, str] | None = None,
        prefer_node_labels: Mapping[str, str] | None = None,
        topology_keys: Sequence[str] | None = None,
        workload_class: str = "training",
        priority: int | str = 0,
        team: str = "default",
        preemptible: bool = False,
        reservation_timeout: float | None = None,
        lease_ttl: float | None = None,
        ledger_conn_id: str | None = GpuPoolHook.default_conn_name,
        binding: str | None = None,
        reservation_deferrable: bool | None = None,
        rendezvous_port: int = DEFAULT_RENDEZVOUS_PORT,
        rendezvous_subdomain: str | None = None,
        pin_timeout: float = 60.0,
        gpu_admission: str = "task",
        **kwargs: Any,
    ) -> None:
        keys = settings.gang_topology_keys() if topology_keys is None else tuple(topology_keys)
        gang = GangSpec(members=members, min_members=members, topology_keys=keys)
        fixed: dict[str, Any] = {"completion_mode": "Indexed", "completions": members, "parallelism": members}
        for name in _GANG_FIXED:
            if kwargs.get(name) not in (None, fixed[name]):
                raise ConfigurationError(
                    f"GpuJobOperator sets {name}={fixed[name]!r} for a gang of {members}"
                )
            kwargs.pop(name, None)
        kwargs.setdefault("wait_until_job_complete", True)
        # A failed member fails the Job, and the try: most collectives (static torchrun, NCCL) cannot
        # take a rank back, and a retry takes a fresh gang. Elastic trainers may set backoff_limit.
        kwargs.setdefault("backoff_limit", 0)
        super().__init__(**fixed, **kwargs)
        if not self.wait_until_job_complete:
            raise ConfigurationError(
                "GpuJobOperator holds the gang until the Job ends: keep wait_until_job_complete"
            )
        self.members, self.gang_spec = members, gang
        self.gpus, self.gpu_milli, self.gpu_memory_mib = gpus, gpu_milli, gpu_memory_mib
        self.mig_profile, self.gpu_models = mig_profile, gpu_models
        self.node_labels, self.prefer_node_labels = node_labels, prefer_node_labels
        self.workload_class, self.priority, self.team, self.preemptible = (
            workload_class,
            priority,
            team,
            preemptible,
        )
        self.reservation_timeout, self.lease_ttl = reservation_timeout, lease_ttl
        self.ledger_conn_id, self.binding = ledger_conn_id, binding
        self.reservation_deferrable = reservation_deferrable
        self.rendezvous_port, self.rendezvous_subdomain = rendezvous_port, rendezvous_subdomain
        self.pin_timeout = pin_timeout
        self.gpu_admission = check_gpu_admission(gpu_admission)
        self._gang: Gang | None = None
        self._held_id: str | None = None
        self._replacements: ReplacementPinning | None = None
        check_seconds("reservation_timeout", reservation_timeout)
        check_seconds("lease_ttl", lease_ttl)
        check_seconds("pin_timeout", pin_timeout)
        fields = [getattr(self, f) for f in REQUEST_FIELDS] + [self.container_resources]
        if not any(templated(value) for value in fields):
            self.gpu_request()  # parse-time validation, no I/O

    def gpu_request(self) -> GpuRequest:
        """Return the gang's request: one member's shape and the gang."""
        member = build_request(
            {name: getattr(self, name) for name in REQUEST_FIELDS},
            workload_class=self.workload_class,
            preemptible=self.preemptible,
            container_resources=self.container_resources,
        )
        return dataclasses.replace(member, gang=self.gang_spec)

    @cached_property
    def gpu_hook(self) -> GpuPoolHook:
        """The ledger hook, created on first use (never at parse time)."""
        if self.binding is not None:
            return GpuPoolHook(self.ledger_conn_id, binding=self.binding, node_pool_bindings={})
        return GpuPoolHook(self.ledger_conn_id)

    # -- the gang ------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Reserve the gang, wait for it (deferred or in place), then run the Job pinned to it."""
        task = TaskTry.from_context(context)
        rid, options = task.reservation_id, self.gpu_hook.options
        request = self.gpu_request()
        timeout = self.reservation_timeout or options.reservation_timeout_seconds
        self.log.info("Reserving %s from the GPU ledger as %s", request.describe(), rid)
        need = run_need(self, context, self.log)
        reservation = self.gpu_hook.reserve(
            request, task.holder, reservation_id=rid, ttl=self.lease_ttl, timeout=timeout, run_need=need
        )
        if reservation.state is ReservationState.GRANTED:
            return self._run_gang(context, rid)
        if reservation.state is not ReservationState.WAITING:
            raise GpuPoolError(f"gang {rid} is {reservation.state.value}: {reservation.message}")
        self.log.info("The gang does not fit now; %s", self.gpu_hook.explain(rid))
        deadlines = dag_deadlines(context, self.log)
        if self.deferrable if self.reservation_deferrable is None else self.reservation_deferrable:
            self.defer(
                **reservation_deferral(
                    rid,
                    self.ledger_conn_id,
                    timeout,
                    options.poll_interval_seconds,
                    deadlines=[d.to_dict() for d in deadlines],
                )
            )
        try:
            wait_in_place(
                self.gpu_hook,
                rid,
                options.poll_interval_seconds,
                self.log,
                deadlines=deadlines,
                ti=context["ti"],
            )
        except BaseException:
            self._release(rid, "the gang was not granted")
            raise
        return self._run_gang(context, rid)

    def execute_granted(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after ReservationTrigger: run the Job, or fail with what blocked the gang."""
        rid, status = event["reservation_id"], event["status"]
        if status == ReservationEventStatus.GRANTED.value:
            return self._run_gang(context, rid)
        if status == ReservationEventStatus.DEADLINE.value:  # said once; the gang keeps its place
            self.defer(
                **deferral_after_deadline(self.gpu_hook, self.ledger_conn_id, context["ti"], event, self.log)
            )
        self._release(rid, f"reservation {status}")
        if status == ReservationEventStatus.TIMEOUT.value:
            raise ReservationTimeoutError(rid, self.gpu_hook.get(rid).waited_seconds, [event["message"]])
        raise GpuPoolError(f"waiting for gang {rid} failed: {event['message']}")

    def _run_gang(self, context: Context, rid: str) -> Any:
        self._held_id = rid
        try:
            self._gang = self.gpu_hook.gang(rid)
            self._member_binding()  # one binding for every member, or a clear error before the Job exists
        except BaseException:
            self._release(rid, "the gang cannot be bound to the job's pods")
            raise
        self.log.info("Gang %s granted: %s", rid, describe_members(self._gang))
        ttl = self.lease_ttl or self.gpu_hook.options.lease_ttl_seconds
        renewer = LeaseRenewer(
            GangLease(self.gpu_hook),
            rid,
            ttl,
            self.log,
            lambda: None,
            on_lost=lambda lost: self._delete_job(),
        )
        renewer.start()
        try:
            run = lambda: super(GpuJobOperator, self).execute(context)  # noqa: E731
            return self._run_then_release(rid, lambda: renewer.guard(run), "job")
        finally:
            renewer.stop()
            if self._replacements is not None:  # deferred: LeasedJobTrigger pins them from now on
                self._replacements.stop()

    def _member_binding(self) -> PodBinding:
        """Return the binding of the gang's slices (one for every member: env is per Job)."""
        assert self._gang is not None
        options = self.gpu_hook.options
        return member_binding(
            self._gang,
            self.gpu_request(),
            lambda pool: self.binding or options.node_pool_bindings.get(pool) or options.binding,
            self.task_id,
        )

    def _release(self, rid: str, reason: str) -> None:
        result = self.gpu_hook.release(rid, reason)
        if result is not None:
            self.log.info("GPU gang %s: %s", rid, result.message)
        self._held_id = None

    def _run_then_release(self, rid: str, run: Callable[[], Any], what: str) -> Any:
        """Run the Job part, then release the gang, on every path but deferral."""
        try:
            result = run()
        except TaskDeferred:
            raise  # LeasedJobTrigger renews the lease; execute_complete releases
        except BaseException as e:
            self._settle_job_pods(f"{what} failed: {type(e).__name__}")
            self._release(rid, f"{what} failed: {type(e).__name__}")
            raise
        self._release(rid, f"{what} succeeded")
        return result

    def _settle_job_pods(self, why: str) -> None:
        """Wait until the Job's pods being deleted (its deletion took them) are gone: the gang's
        slices are released next, and a terminating pod still runs on its GPUs."""
        job = getattr(self, "job", None)
        if job is None:
            return
        namespace, name = job.metadata.namespace, job.metadata.name
        try:
            pods = self.client.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={name}").items
            for pod in pods:
                settle_deleted_pod(self.client, namespace, pod.metadata.name, why=why)
        except Exception:
            # The release must still come: a gang held forever is worse than one freed early.
            self.log.exception("Could not tell whether the pods of Job %s/%s are gone", namespace, name)

    # -- the Job -------------------------------------------------------------------------------

    def build_job_request_obj(self, context: Context | None = None) -> k8s.V1Job:
        """Build the parent's Job, then make its pod template the gang's (gated, same for every member)."""
        leader = self._held_id
        if leader is None:
            return super().build_job_request_obj(context)
        # Marked before the parent builds the pod, so an executor hook (pod_mutation_hook) leaves it alone.
        self.annotations = {
            **(self.annotations or {}),
            f"{ANNOTATION_PREFIX}reservation-id": leader,
            GANG_RESERVATION_ANNOTATION: leader,
        }
        job = super().build_job_request_obj(context)
        request = self.gpu_request()
        subdomain = self.rendezvous_subdomain or job.metadata.name
        template = job.spec.template
        template.spec.subdomain = template.spec.subdomain or subdomain
        gang_template(
            template,
            leader_id=leader,
            request=request,
            binding=self._member_binding(),
            container_name=self.base_container_name,
            priority_class=settings.workload_priority_classes().get(request.workload_class.value),
            extra_env=rendezvous_env(
                job.metadata.name, template.spec.subdomain, self.members, self.rendezvous_port, request.gpus
            ),
        )
        return job

    def create_job(self, job_request_obj: k8s.V1Job) -> k8s.V1Job:
        """Create the Job like the parent, then pin each member's pod; a Job that cannot be pinned is deleted."""
        job = super().create_job(job_request_obj)
        if self._gang is None:
            return job
        self.job = job  # on_kill and the lease's loss delete it from now on
        pinner = GangPodPinner(self.client, self.gpu_hook.bind_pod, self._gang, self.log)
        try:
            pinner.pin_all(job.metadata.namespace, job.metadata.name, timeout=self.pin_timeout)
        except BaseException:
            self._delete_job()
            raise
        if self.backoff_limit:  # the Job replaces a failed member's pod: pin the new one to the member
            self._replacements = ReplacementPinning(
                pinner, job.metadata.namespace, job.metadata.name, self.job_poll_interval, self.log
            )
            self._replacements.start()
        return job

    def _delete_job(self) -> None:
        job = getattr(self, "job", None)
        if job is None:
            return
        from kubernetes.client.exceptions import ApiException

        try:
            self.job_client.delete_namespaced_job(
                job.metadata.name, job.metadata.namespace, propagation_policy="Foreground"
            )
        except ApiException as e:
            if e.status != 404:
                self.log.exception("Deleting job %s failed", job.metadata.name)

    def defer(
        self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = None, timeout: Any = None
    ) -> Any:
        """Defer; the Job trigger is swapped for one that also renews the gang's lease."""
        if (
            isinstance(trigger, KubernetesJobTrigger)
            and not isinstance(trigger, LeasedJobTrigger)
            and self._held_id
        ):
            trigger = LeasedJobTrigger.wrap(
                trigger,
                reservation_id=self._held_id,
                ledger_conn_id=self.ledger_conn_id,
                lease_ttl=self.lease_ttl or self.gpu_hook.options.lease_ttl_seconds,
                pin_replacements=bool(self.backoff_limit),
            )
        return super().defer(trigger=trigger, method_name=method_name, kwargs=kwargs, timeout=timeout)

    def execute_complete(self, context: Context, event: dict[str, Any], **kwargs: Any) -> Any:
        """Finish the deferred Job like the parent, then release the gang."""
        rid = event.get("reservation_id") or TaskTry.from_context(context).reservation_id
        if event.get("status") == LEASE_LOST_STATUS:
            return self._run_then_release(rid, lambda: self._lease_lost(event), "job")
        return self._run_then_release(
            rid, lambda: super(GpuJobOperator, self).execute_complete(context, event, **kwargs), "job"
        )

    def _lease_lost(self, event: dict[str, Any]) -> Any:
        """LeasedJobTrigger lost the gang's lease (and deleted the Job): make sure it is gone, fail the try."""
        from kubernetes.client import V1Job, V1ObjectMeta

        self.job = V1Job(metadata=V1ObjectMeta(name=event["name"], namespace=event["namespace"]))
        self._delete_job()
        self.log.error("Job %s/%s deleted: the gang's lease was lost", event["namespace"], event["name"])
        raise lost_from_event(event, None)

    def on_kill(self) -> None:
        """Delete the Job like the parent, wait until its pods are gone, then release the gang."""
        try:
            super().on_kill()
        finally:
            if self._held_id:
                self._settle_job_pods("the task was killed")
                self._release(self._held_id, "task killed")
