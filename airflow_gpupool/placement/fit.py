"""Feasibility: which ways a request can be placed on one node, or why it cannot.

Every policy calls these functions (or, vectorized, the same rules in
:mod:`~airflow_gpupool.placement.scored`), so all of them agree on what "fits" means.

When a node rejects a request, the reason names the *first* dimension that does not fit,
checked in this documented order (what the ledger's ``explain`` tells a user):

1. **health**: the node is cordoned, draining or quarantined (the reason says which);
2. **workload class**: training and inference never share a node;
3. **binding**: the node pool's slice binding cannot express the request (``whole`` and a
   fraction, see :mod:`~airflow_gpupool.placement.pools`);
4. **GPU model**: the node lacks a required label (the capacity type named as such: spot or
   on-demand), has no GPU, none of an accepted model, none that is not MIG-partitioned or
   quarantined (said so: the model matches, MIG or the quarantine is the blocker), or (with
   ``gpu_memory_mib``) none that large;
5. **MIG availability**: for a MIG request, the node has no MIG-partitioned GPU (such a
   node is never "close"), or no free slice of the profile;
6. **GPU milli**: not enough free GPUs, or no GPU with the milli-GPU a fraction needs;
7. **GPU memory**: no GPU with that milli free also has the fraction's GPU memory free;
8. **CPU**, then 9. **memory** of the node.

The ledger adds a 10th, **held for a starving request**, for a node the queue keeps for a
request whose overtake budget is spent (:mod:`~airflow_gpupool.placement.queue`).
A reason's ``shortfall`` orders the nodes: 2.0 for a node that can never fit, 1.5 for a
class conflict, else the missing share of the dimension that failed (0 < s <= 1).
"""

from __future__ import annotations

from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFitReason
from airflow_gpupool.resources import MIG_PROFILES, MILLI_PER_GPU, GpuKind, GpuRequest, WorkloadClass

#: Workload classes that may not share a node with each other.
EXCLUSIVE_CLASSES = {
    WorkloadClass.TRAINING.value: WorkloadClass.INFERENCE.value,
    WorkloadClass.INFERENCE.value: WorkloadClass.TRAINING.value,
}

#: Shortfall of a node that can never take the request as it is configured.
NEVER = 2.0


def fraction_memory(request: GpuRequest, gpu: GpuState) -> int:
    """GPU memory a fraction takes: what it asked for, else its share of the GPU's memory."""
    if request.gpu_memory_mib is not None:
        return request.gpu_memory_mib
    return (request.gpu_milli or 0) * gpu.memory_mib // MILLI_PER_GPU


def _short(need: float, have: float) -> float:
    return (need - have) / need if need > 0 else 1.0


def check_node(
    node: NodeState, request: GpuRequest, bindings: PoolBindings = UNCONSTRAINED
) -> NoFitReason | None:
    """Return why ``request`` cannot go on ``node`` for its health, class, binding or labels, or None."""
    if not node.schedulable:
        which = node.health or "cordoned, draining or quarantined"
        return NoFitReason(NEVER, node.name, f"node is not schedulable ({which})")
    conflicting = EXCLUSIVE_CLASSES.get(request.workload_class.value)
    if conflicting is not None and conflicting in node.classes:
        return NoFitReason(
            1.5,
            node.name,
            f"node runs {conflicting} work, which {request.workload_class.value} may not share",
        )
    unbindable = bindings.reason(node.node_pool, request)
    if unbindable is not None:
        return NoFitReason(NEVER, node.name, unbindable)
    for key, value in request.node_labels:
        if (key, value) not in node.labels:
            return NoFitReason(NEVER, node.name, _label_reason(node, key, value))
    return None


def _label_reason(node: NodeState, key: str, value: str) -> str:
    """Say which required label the node lacks; the capacity type as what it is (spot, on-demand)."""
    if key == CAPACITY_TYPE_LABEL:
        have = dict(node.labels).get(key)
        if have:
            return f"node is {have} capacity, the request needs {value} ({key}={value})"
    return f"node lacks label {key}={value}"


def host_reason(node: NodeState, request: GpuRequest) -> NoFitReason | None:
    """Return why the node's free CPU or memory cannot hold ``request``, or None."""
    if request.cpu_milli > node.cpu_free:
        return NoFitReason(
            _short(request.cpu_milli, node.cpu_free),
            node.name,
            f"needs {request.cpu_milli}m CPU, {node.cpu_free}m free",
        )
    if request.memory_mib > node.memory_free:
        return NoFitReason(
            _short(request.memory_mib, node.memory_free),
            node.name,
            f"needs {request.memory_mib} MiB memory, {node.memory_free} MiB free",
        )
    return None


def gpu_model_ok(request: GpuRequest, gpu: GpuState) -> bool:
    """Whether the request accepts this GPU's model."""
    return not request.gpu_models or gpu.model in request.gpu_models


def choices(
    node: NodeState, request: GpuRequest, bindings: PoolBindings = UNCONSTRAINED
) -> list[Assignment] | NoFitReason:
    """Return every distinct way ``request`` fits ``node`` now, or why it does not.

    Whole GPUs yield one choice (the lowest free indices: free GPUs are interchangeable),
    a fraction one choice per GPU it fits, a MIG request one choice per GPU with a free
    slice of its profile. A rejection names the first dimension that fails, in the order
    of this module's docstring.

    :param bindings: the binding of each node pool (default: none, every pool takes any kind)
    """
    rejected = check_node(node, request, bindings)
    if rejected is not None:
        return rejected
    kind = request.kind
    out: list[Assignment] | NoFitReason
    if kind is GpuKind.NONE:
        out = [Assignment(node.name, (), 0, 0)]
    elif kind is GpuKind.WHOLE:
        out = _whole(node, request)
    elif kind is GpuKind.FRACTION:
        out = _fraction(node, request)
    else:
        out = _mig(node, request)
    if isinstance(out, NoFitReason):
        return out
    return host_reason(node, request) or out


def _model_reason(node: NodeState, request: GpuRequest) -> NoFitReason:
    if not node.gpus:
        return NoFitReason(NEVER, node.name, "node has no GPUs")
    accepted = [g for g in node.gpus if gpu_model_ok(request, g)]
    partitioned = [g for g in accepted if g.partitioned and not g.quarantined]
    if partitioned and request.kind is not GpuKind.MIG:
        # The model matches: what rules the node out is MIG, which only a MIG profile can use.
        return NoFitReason(
            NEVER,
            node.name,
            f"node's {partitioned[0].model} GPUs are MIG-partitioned: only a MIG profile "
            "(mig_profile) can use them",
        )
    if any(g.quarantined for g in accepted):
        return _quarantined_reason(node, accepted)
    models = "|".join(sorted(request.gpu_models))
    have = "|".join(sorted(node.models))
    return NoFitReason(NEVER, node.name, f"needs GPU model {models}, node has {have}")


def _quarantined_reason(node: NodeState, accepted: list[GpuState]) -> NoFitReason:
    """Say that the GPUs of an accepted model that could take the request are quarantined."""
    bad = [g for g in accepted if g.quarantined]
    indices = ", ".join(str(g.index) for g in bad)
    return NoFitReason(NEVER, node.name, f"node's {bad[0].model} GPU(s) {indices} are quarantined")


def _usable(node: NodeState, request: GpuRequest) -> list[GpuState] | NoFitReason:
    """The unpartitioned GPUs of an accepted model and large enough, or why there are none."""
    usable = [g for g in node.gpus if gpu_model_ok(request, g) and not g.partitioned]
    if not usable:
        return _model_reason(node, request)
    need = request.gpu_memory_mib
    if need is not None:
        usable = [g for g in usable if g.memory_mib >= need]
        if not usable:
            return NoFitReason(NEVER, node.name, f"no GPU with {need} MiB memory")
    return usable


def _whole(node: NodeState, request: GpuRequest) -> list[Assignment] | NoFitReason:
    usable = _usable(node, request)
    if isinstance(usable, NoFitReason):
        return usable
    if len(usable) < request.gpus:
        return NoFitReason(NEVER, node.name, f"needs {request.gpus} GPUs, node has {len(usable)}")
    free = [g for g in usable if g.free_milli == MILLI_PER_GPU]
    if len(free) < request.gpus:
        return NoFitReason(
            _short(request.gpus, len(free)),
            node.name,
            f"needs {request.gpus} free GPUs, {len(free)} free of {len(usable)}",
        )
    taken = tuple(g.index for g in free[: request.gpus])
    memory = min(g.memory_mib for g in free[: request.gpus])
    return [Assignment(node.name, taken, MILLI_PER_GPU, memory)]


def _fraction(node: NodeState, request: GpuRequest) -> list[Assignment] | NoFitReason:
    milli = request.gpu_milli or 0
    usable = _usable(node, request)
    if isinstance(usable, NoFitReason):
        return usable
    usable = [g for g in usable if fraction_memory(request, g) <= g.memory_mib]
    with_milli = [g for g in usable if g.free_milli >= milli]
    if not with_milli:
        best_free = max((g.free_milli for g in usable), default=0)
        return NoFitReason(
            _short(milli, best_free),
            node.name,
            f"needs {milli} milli-GPU on one GPU, the freest GPU has {best_free}",
        )
    out = [
        Assignment(node.name, (g.index,), milli, fraction_memory(request, g))
        for g in with_milli
        if g.free_memory_mib >= fraction_memory(request, g)
    ]
    if out:
        return out
    most = max(with_milli, key=lambda g: g.free_memory_mib)
    need = fraction_memory(request, most)
    return NoFitReason(
        _short(need, most.free_memory_mib),
        node.name,
        f"needs {need} MiB GPU memory on one GPU with {milli} milli-GPU free, "
        f"the most such a GPU has is {most.free_memory_mib} MiB",
    )


def _mig(node: NodeState, request: GpuRequest) -> list[Assignment] | NoFitReason:
    profile = str(request.mig_profile)
    milli = MIG_PROFILES[profile].milli
    memory = MIG_PROFILES[profile].memory_gb * 1024
    accepted = [g for g in node.gpus if gpu_model_ok(request, g)]
    if not accepted:
        return _model_reason(node, request)
    partitioned = [g for g in accepted if g.partitioned or g.mig_free]
    if not partitioned:
        return NoFitReason(NEVER, node.name, "node has no MIG-partitioned GPU")
    if all(g.quarantined for g in partitioned):
        return _quarantined_reason(node, partitioned)
    out = []
    for gpu in partitioned:
        for slice_id, slice_profile in gpu.mig_free:
            if slice_profile == profile:
                out.append(Assignment(node.name, (gpu.index,), milli, memory, mig_slice=slice_id))
                break
    if out:
        return out
    return NoFitReason(1.0, node.name, f"no free MIG slice {profile}")
