"""The escalation ladder: what to do about each class of failure, declared per task.

==========================  ====================================================================
class                       default remedy
==========================  ====================================================================
preempted, node lost,       ``retry``: retry, resuming from the newest checkpoint
lease lost
out of memory               ``retry_larger``: retry and resume on the next larger slice that the
                            inventory can hold (fraction → bigger fraction → whole GPU; MIG
                            profile → next profile → whole GPU; then a GPU model of
                            ``gpu_models`` with more memory); none left → escalate
image pull                  ``fail``: fail at once, no retry, no page
application error, deadline ``retry``; when the task's retries are spent → escalate
reservation timeout, other  ``retry``; when the task's retries are spent → escalate
GPU fault (XID, ECC, GPU    ``retry``; with the operator's ``cpu_fallback=True``: ``cpu_fallback``
off the bus)
ledger drift (the node      ``retry``: the books were wrong, not the application; the node is
lacked the granted GPUs)    suspect until the controller resyncs it, so the retry goes elsewhere
                            or waits for that
==========================  ====================================================================

``escalate`` fails the task without further retries and calls the task's escalation notifier.
``cpu_fallback`` retries on the task's CPU-only variant (no slice, ``GPUPOOL_DEVICE=cpu``); it needs
the operator's ``cpu_fallback=True``, which also makes it the default for a GPU fault, and the
remedy of an out-of-memory failure on the GPU that no larger slice can hold. Once chosen, the rest of
the task run's tries stay on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.operators.failures import FailureClass
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.placement.verdict import NoFitReason
from airflow_gpupool.resources import MIG_PROFILES, MILLI_PER_GPU, GpuKind, GpuRequest


class Remedy(str, Enum):
    """What the ladder does about one class of failure."""

    RETRY = "retry"
    RETRY_LARGER = "retry_larger"
    FAIL = "fail"
    ESCALATE = "escalate"
    CPU_FALLBACK = "cpu_fallback"


DEFAULT_REMEDIES: dict[FailureClass, Remedy] = {
    FailureClass.PREEMPTED: Remedy.RETRY,
    FailureClass.EVICTED: Remedy.RETRY,
    FailureClass.NODE_LOST: Remedy.RETRY,
    FailureClass.LEASE_LOST: Remedy.RETRY,
    FailureClass.OUT_OF_MEMORY: Remedy.RETRY_LARGER,
    FailureClass.IMAGE_PULL: Remedy.FAIL,
    FailureClass.DEADLINE_EXCEEDED: Remedy.RETRY,
    FailureClass.APPLICATION_ERROR: Remedy.RETRY,
    FailureClass.RESERVATION_TIMEOUT: Remedy.RETRY,
    FailureClass.GPU_FAULT: Remedy.RETRY,
    FailureClass.LEDGER_DRIFT: Remedy.RETRY,
    FailureClass.UNKNOWN: Remedy.RETRY,
}
#: The defaults that ``cpu_fallback=True`` changes: a faulty GPU is no reason to wait for another.
CPU_FALLBACK_REMEDIES: dict[FailureClass, Remedy] = {FailureClass.GPU_FAULT: Remedy.CPU_FALLBACK}


@dataclass(frozen=True)
class EscalationPolicy:
    """A task's ladder: a remedy per failure class.

    :param remedies: remedy per class; classes left out keep the default
    :param escalate_when_exhausted: call the notifier when a retrying class runs out of retries
    """

    remedies: Mapping[FailureClass, Remedy] = field(default_factory=lambda: dict(DEFAULT_REMEDIES))
    escalate_when_exhausted: bool = True

    @classmethod
    def of(
        cls, value: EscalationPolicy | Mapping[str, str] | None, *, cpu_fallback: bool = False
    ) -> EscalationPolicy:
        """Return a policy from a policy, or from ``{"failure class": "remedy"}`` overrides of the default.

        :param value: the operator's ``escalation`` argument
        :param cpu_fallback: the operator's ``cpu_fallback``: the defaults include
            :data:`CPU_FALLBACK_REMEDIES`, and only then may a remedy be ``cpu_fallback``
        :raises ConfigurationError: an unknown class or remedy, or ``cpu_fallback`` without a CPU
            variant (at DAG parse time)
        """
        policy = value if isinstance(value, EscalationPolicy) else cls._from_overrides(value, cpu_fallback)
        if not cpu_fallback:
            chosen = sorted(c.value for c, r in policy.remedies.items() if r is Remedy.CPU_FALLBACK)
            if chosen:
                raise ConfigurationError(
                    f"escalation {chosen}: the remedy 'cpu_fallback' needs the task's cpu_fallback=True "
                    "(a CPU-only variant to run)"
                )
        return policy

    @classmethod
    def _from_overrides(cls, value: Mapping[str, str] | None, cpu_fallback: bool) -> EscalationPolicy:
        remedies = dict(DEFAULT_REMEDIES) | (CPU_FALLBACK_REMEDIES if cpu_fallback else {})
        if value is None:
            return cls(remedies=remedies)
        for key, remedy in value.items():
            try:
                remedies[FailureClass(key)] = Remedy(remedy)
            except ValueError as e:
                raise ConfigurationError(
                    f"escalation {key!r}: {remedy!r}: expected a class among {[c.value for c in FailureClass]} "
                    f"and a remedy among {[r.value for r in Remedy]}"
                ) from e
        return cls(remedies=remedies)

    def remedy(self, failure_class: FailureClass) -> Remedy:
        """Return the remedy of a class."""
        return self.remedies.get(failure_class, DEFAULT_REMEDIES[failure_class])


@dataclass(frozen=True)
class Decision:
    """What to do after a failed try.

    :param remedy: the remedy the policy named for the class
    :param retry: let Airflow retry the task (False: fail without retries)
    :param escalate: notify a person now
    :param next_request: the request the next try makes (None: unchanged)
    :param reason: why, for the log and the notification
    """

    remedy: Remedy
    retry: bool
    escalate: bool
    next_request: GpuRequest | None
    reason: str


def _mig_ladder(request: GpuRequest) -> list[GpuRequest]:
    current = MIG_PROFILES[str(request.mig_profile)]
    bigger = sorted(
        (
            p
            for p in MIG_PROFILES.values()
            if p.family_gb == current.family_gb and p.memory_gb > current.memory_gb
        ),
        key=lambda p: (p.memory_gb, p.compute_slices),
    )
    out = [replace(request, mig_profile=p.name) for p in bigger]
    out.append(replace(request, mig_profile=None, gpus=1))
    return out


def _fraction_ladder(request: GpuRequest) -> list[GpuRequest]:
    out = []
    milli, memory = int(request.gpu_milli or 0), request.gpu_memory_mib
    while milli * 2 < MILLI_PER_GPU:
        milli *= 2
        memory = memory * 2 if memory else None
        out.append(replace(request, gpu_milli=milli, gpu_memory_mib=memory))
    out.append(replace(request, gpu_milli=None, gpu_memory_mib=None, gpus=1))
    return out


def _bigger_models(
    request: GpuRequest, failed_model: str | None, cluster: ClusterSnapshot
) -> list[GpuRequest]:
    memory = {g.model: g.memory_mib for n in cluster.nodes for g in n.gpus}
    if failed_model is None or failed_model not in memory:
        return []
    allowed = request.gpu_models or frozenset(memory)
    bigger = sorted((m for m in allowed if memory.get(m, 0) > memory[failed_model]), key=lambda m: memory[m])
    if not bigger:
        return []
    # Whole GPUs of a model with more memory; a fraction or a slice becomes a whole GPU.
    whole = replace(request, gpu_milli=None, gpu_memory_mib=None, mig_profile=None, gpus=max(request.gpus, 1))
    return [replace(whole, gpu_models=frozenset(bigger))]


def larger_requests(
    request: GpuRequest, failed_model: str | None, cluster: ClusterSnapshot
) -> list[GpuRequest]:
    """Return the rungs above ``request``, smallest first (not yet checked against the inventory).

    :param request: the request that ran out of memory
    :param failed_model: the GPU model it ran on
    :param cluster: the inventory (GPU models and their memory)
    """
    kind = request.kind
    if kind is GpuKind.MIG:
        rungs = _mig_ladder(request)
    elif kind is GpuKind.FRACTION:
        rungs = _fraction_ladder(request)
    else:
        rungs = []
    if kind is GpuKind.NONE:
        return []
    last = rungs[-1] if rungs else request
    return rungs + _bigger_models(last, failed_model, cluster)


def fits_somewhere(request: GpuRequest, cluster: ClusterSnapshot) -> bool:
    """Return whether some node of an empty ``cluster`` could hold ``request``."""
    return any(not isinstance(choices(node, request), NoFitReason) for node in cluster.nodes)


def next_larger(request: GpuRequest, failed_model: str | None, cluster: ClusterSnapshot) -> GpuRequest | None:
    """Return the smallest larger request the inventory can hold, or None.

    :param request: the request that ran out of memory
    :param failed_model: the GPU model it ran on
    :param cluster: the inventory as if nothing were granted (:meth:`Ledger.empty_cluster`)
    """
    return next(
        (r for r in larger_requests(request, failed_model, cluster) if fits_somewhere(r, cluster)), None
    )


def decide(
    policy: EscalationPolicy,
    failure_class: FailureClass,
    request: GpuRequest,
    *,
    retries_left: bool,
    failed_model: str | None = None,
    cluster: ClusterSnapshot | None = None,
    cpu_fallback: bool = False,
) -> Decision:
    """Return what to do after a failed try.

    :param policy: the task's ladder
    :param failure_class: how the try failed
    :param request: the request the try ran with
    :param retries_left: whether Airflow would retry the task
    :param failed_model: the GPU model the try ran on
    :param cluster: the inventory as if nothing were granted (needed for ``retry_larger``)
    :param cpu_fallback: whether the task has a CPU variant that can take over from a GPU that ran
        out of memory when no larger slice fits
    """
    remedy = policy.remedy(failure_class)
    exhausted = policy.escalate_when_exhausted
    if remedy is Remedy.FAIL:
        return Decision(
            remedy, False, False, None, f"{failure_class.value}: retrying cannot help; failing now"
        )
    if remedy is Remedy.ESCALATE:
        return Decision(remedy, False, True, None, f"{failure_class.value}: escalating to a person")
    next_request = None
    if remedy is Remedy.RETRY_LARGER:
        next_request = next_larger(request, failed_model, cluster or ClusterSnapshot(()))
        if next_request is None and cpu_fallback:
            remedy = Remedy.CPU_FALLBACK
        elif next_request is None:
            return Decision(
                remedy,
                False,
                True,
                None,
                f"{failure_class.value}: no larger slice fits the inventory; escalating",
            )
    if not retries_left:
        return Decision(remedy, False, exhausted, None, f"{failure_class.value}: retries exhausted")
    if remedy is Remedy.CPU_FALLBACK:
        # The CPU variant is not handed the GPU try's checkpoints: nothing to resume from.
        why = f"{failure_class.value}: retrying on the CPU fallback (GPUPOOL_DEVICE=cpu)"
        return Decision(remedy, True, False, None, why)
    what = f"with {next_request.describe()}" if next_request else "as before"
    return Decision(remedy, True, False, next_request, f"{failure_class.value}: retrying {what}, resuming")


def describe_policy(policy: EscalationPolicy) -> dict[str, Any]:
    """Return the ladder as ``{class: remedy}`` primitives (logs, notifications)."""
    return {c.value: policy.remedy(c).value for c in FailureClass}
